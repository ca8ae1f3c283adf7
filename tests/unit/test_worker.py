"""The job server (trainmap.worker): jobs fork from a warm process, and behave as if they did not."""

from __future__ import annotations

import os
import signal
import stat
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

def write_job(path, text):
    print("writing", path)
    Path(path).write_text(text + " pid=" + str(os.getpid()))

def fail_job(message):
    print("about to fail")
    raise RuntimeError(message)

def slow_job(marker, pid_file, seconds):
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(seconds)
    Path(marker).write_text("finished")

def environment_job(path):
    Path(path).write_text(os.environ.get("TRAINMAP_TEST_VALUE", "") + "|" + os.getcwd())

def helper(path):  # public, but not a job: the server must refuse it
    Path(path).write_text("helper ran")
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
    process = worker.start_server(jobs_module / "state", job_modules=("worker_test_jobs",))
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


@pytest.mark.integration  # starts a program (a subprocess)
def test_job_runs_on_the_server_with_log_and_environment(server, jobs_module, monkeypatch):
    out, log = jobs_module / "out.txt", jobs_module / "logs" / "job.log"
    process = client(jobs_module, "worker_test_jobs:write_job", log, path=str(out), text="hello")
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
        [sys.executable, str(jobs_module / "client.py"), "worker_test_jobs:environment_job",
         str(log), f'{{"path": "{env_file}"}}'],
        env=dict(os.environ), cwd=workdir,
    )  # fmt: skip
    assert process.wait(timeout=60) == 0
    assert env_file.read_text() == f"from-the-client|{workdir}"


@pytest.mark.integration  # starts a program (a subprocess)
def test_failing_job_fails_the_client_with_traceback_in_log(server, jobs_module):
    log = jobs_module / "fail.log"
    process = client(jobs_module, "worker_test_jobs:fail_job", log, message="bad value 42")
    assert process.wait(timeout=60) != 0
    text = log.read_text()
    assert "about to fail" in text and "RuntimeError: bad value 42" in text


@pytest.mark.integration  # starts a program (a subprocess)
def test_killing_the_client_kills_the_job(server, jobs_module):
    marker, pid_file = jobs_module / "marker", jobs_module / "pid"
    process = client(jobs_module, "worker_test_jobs:slow_job", jobs_module / "slow.log",
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
    # this process ran torch long before (other tests): a portable job would be refused here
    monkeypatch.setenv("TRAINMAP_PORTABLE", "0")
    out, log = jobs_module / "local.txt", jobs_module / "local.log"
    worker.run_job("worker_test_jobs:write_job", log=str(log), path=str(out), text="local")
    assert int(out.read_text().split("pid=")[1]) == os.getpid()
    assert "writing" in log.read_text()
    # A socket that nobody serves: the same, with no error.
    monkeypatch.setenv(worker.SOCKET_ENV, str(jobs_module / "nobody.sock"))
    worker.run_job("worker_test_jobs:write_job", log=str(log), path=str(out), text="again")
    assert out.read_text().startswith("again")


def test_switch_off_starts_no_server(jobs_module, monkeypatch):
    monkeypatch.setenv(worker.SWITCH_ENV, "off")
    assert worker.start_server(jobs_module / "state") is None


# --- access ------------------------------------------------------------------


@pytest.mark.integration  # starts a program (a subprocess)
def test_socket_is_private_whatever_the_umask(jobs_module, monkeypatch):
    """Before: the socket took its mode from the umask (connectable by the group under 002)."""
    previous = os.umask(0o002)
    try:
        process = worker.start_server(jobs_module / "state", job_modules=("worker_test_jobs",))
    finally:
        os.umask(previous)
    assert process is not None
    try:
        path = Path(os.environ[worker.SOCKET_ENV])
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        directory = path.parent.lstat()
        assert stat.S_ISDIR(directory.st_mode) and stat.S_IMODE(directory.st_mode) == 0o700
        assert directory.st_uid == os.getuid()
    finally:
        worker.stop_server(process)
    assert not path.parent.exists(), "stop_server removes the socket's directory"


#: What a client may try; each must be refused before anything runs.
NOT_JOBS = ["os:mkdir", "worker_test_jobs:helper", "worker_test_jobs:_private_job",
            "not a name"]  # fmt: skip


@pytest.mark.integration  # starts a program (a subprocess)
def test_the_server_runs_only_job_functions(server, jobs_module, capsys):
    """Before: any `module:function` a client named ran (`os:mkdir` made a directory)."""
    target, log = jobs_module / "made-by-the-server", jobs_module / "refused.log"
    for function in NOT_JOBS:
        status = worker._submit(function, str(log), {"path": str(target)})  # the client's call
        stderr = capsys.readouterr().err
        assert status == 2, (function, stderr)
        assert "refused to run" in stderr or "malformed job request" in stderr, stderr
        assert not target.exists() and not log.exists(), f"{function}: nothing may run"
    # The same server still runs a job function.
    out = jobs_module / "out.txt"
    process = client(jobs_module, "worker_test_jobs:write_job", log, path=str(out), text="ok")
    assert process.wait(timeout=60) == 0 and out.read_text().startswith("ok")


def test_job_function_allows_trainmap_jobs_only():
    import re

    scripts = Path(__file__).resolve().parents[2] / "workflow" / "scripts"
    named = {name for script in scripts.glob("*.py")
             for name in re.findall(r'"(trainmap\.jobs\.\w+:\w+)"', script.read_text())}  # fmt: skip
    assert len(named) >= 10, named
    for name in named:  # every job the workflow's scripts submit is allowed
        assert worker.job_function(name).__name__ == name.split(":")[1]
    for name in ("os:system", "trainmap.jobs.common:logged_to", "trainmap.jobs.common:settings_hash",
                 "trainmap.io:save_torch_job", "builtins:exec"):  # fmt: skip
        with pytest.raises(worker.RefusedJobError, match="refused to run"):
            worker.job_function(name)


def test_a_server_refuses_a_socket_directory_others_can_enter(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    with pytest.raises(PermissionError, match="mode 0700"):
        worker.serve(str(shared / "jobs.sock"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.integration  # starts a program (a subprocess)
def test_the_job_client_imports_neither_torch_nor_mlflow():
    """Each workflow script imports trainmap.worker to hand its job to the server: importing torch
    there would cost every job about a second (plugins load in the server and the job, not here)."""
    code = "import sys, trainmap.worker; print(sorted({'torch', 'mlflow'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout
