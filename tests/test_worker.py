"""The job server (trainmap.worker): jobs fork from a warm process, and behave as if they did not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainmap import worker

JOBS_MODULE = """
import os, sys, time
from pathlib import Path

def write(path, text):
    print("writing", path)
    Path(path).write_text(text + " pid=" + str(os.getpid()))

def fail(message):
    print("about to fail")
    raise RuntimeError(message)

def slow(marker, pid_file, seconds):
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(seconds)
    Path(marker).write_text("finished")

def environment(path):
    Path(path).write_text(os.environ.get("TRAINMAP_TEST_VALUE", "") + "|" + os.getcwd())
"""

CLIENT = """
import sys, json
from trainmap.worker import run_job
function, log, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
run_job(function, log=log, **kwargs)
"""


@pytest.fixture()
def jobs_module(tmp_path: Path, monkeypatch) -> Path:
    """A module of job functions the server (started after this) can import by name."""
    (tmp_path / "worker_test_jobs.py").write_text(textwrap.dedent(JOBS_MODULE))
    (tmp_path / "client.py").write_text(textwrap.dedent(CLIENT))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    )
    monkeypatch.delenv(worker.SWITCH_ENV, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.fixture()
def server(jobs_module: Path, monkeypatch):
    process = worker.start_server(jobs_module / "state")
    assert process is not None, (jobs_module / "state" / "worker.log").read_text()
    yield process
    worker.stop_server(process)
    assert process.poll() is not None


def client(directory: Path, function: str, log: Path, **kwargs) -> subprocess.Popen:
    import json

    return subprocess.Popen(
        [sys.executable, str(directory / "client.py"), function, str(log), json.dumps(kwargs)],
        env=dict(os.environ),
        cwd=directory,
    )


def test_job_runs_on_the_server_with_log_and_environment(server, jobs_module, monkeypatch):
    out, log = jobs_module / "out.txt", jobs_module / "logs" / "job.log"
    process = client(jobs_module, "worker_test_jobs:write", log, path=str(out), text="hello")
    assert process.wait(timeout=60) == 0
    text = out.read_text()
    assert text.startswith("hello")
    job_pid = int(text.split("pid=")[1])
    assert job_pid not in (process.pid, os.getpid()), "the job ran in the client, not on the server"
    assert "writing" in log.read_text()

    monkeypatch.setenv("TRAINMAP_TEST_VALUE", "from-the-client")
    env_file = jobs_module / "env.txt"
    workdir = jobs_module / "elsewhere"
    workdir.mkdir()
    process = subprocess.Popen(
        [sys.executable, str(jobs_module / "client.py"), "worker_test_jobs:environment",
         str(log), f'{{"path": "{env_file}"}}'],
        env=dict(os.environ), cwd=workdir,
    )  # fmt: skip
    assert process.wait(timeout=60) == 0
    assert env_file.read_text() == f"from-the-client|{workdir}"


def test_failing_job_fails_the_client_with_traceback_in_log(server, jobs_module):
    log = jobs_module / "fail.log"
    process = client(jobs_module, "worker_test_jobs:fail", log, message="bad value 42")
    assert process.wait(timeout=60) != 0
    text = log.read_text()
    assert "about to fail" in text and "RuntimeError: bad value 42" in text


def test_killing_the_client_kills_the_job(server, jobs_module):
    marker, pid_file = jobs_module / "marker", jobs_module / "pid"
    process = client(jobs_module, "worker_test_jobs:slow", jobs_module / "slow.log",
                     marker=str(marker), pid_file=str(pid_file), seconds=3)  # fmt: skip
    deadline = time.monotonic() + 60
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.02)
    job_pid = int(pid_file.read_text())
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _alive(job_pid):
        assert time.monotonic() < deadline, "the job outlived its killed client"
        time.sleep(0.05)
    time.sleep(3.5)
    assert not marker.exists()


def test_without_a_server_the_job_runs_in_process(jobs_module, monkeypatch):
    monkeypatch.delenv(worker.SOCKET_ENV, raising=False)
    out, log = jobs_module / "local.txt", jobs_module / "local.log"
    worker.run_job("worker_test_jobs:write", log=str(log), path=str(out), text="local")
    assert int(out.read_text().split("pid=")[1]) == os.getpid()
    assert "writing" in log.read_text()
    # A socket that nobody serves: the same, with no error.
    monkeypatch.setenv(worker.SOCKET_ENV, str(jobs_module / "nobody.sock"))
    worker.run_job("worker_test_jobs:write", log=str(log), path=str(out), text="again")
    assert out.read_text().startswith("again")


def test_switch_off_starts_no_server(jobs_module, monkeypatch):
    monkeypatch.setenv(worker.SWITCH_ENV, "off")
    assert worker.start_server(jobs_module / "state") is None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
