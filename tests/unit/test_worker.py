"""The job server (trainmap.worker): jobs fork from a warm process, and behave as if they did not."""

from __future__ import annotations

import json
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
from trainmap.processes import live_group_members

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
    # the pid whole or not at all: a test reads it as soon as the file is there
    Path(pid_file + ".tmp").write_text(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)
    time.sleep(seconds)
    Path(marker).write_text("finished")

def stubborn_job(marker, pid_file, seconds):  # a job that takes its whole grace to end
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    slow_job(marker, pid_file, seconds)

def environment_job(path):
    Path(path).write_text(os.environ.get("TRAINMAP_TEST_VALUE", "") + "|" + os.getcwd())

def helper(path):  # public, but not a job: the server must refuse it
    Path(path).write_text("helper ran")

def key_job(path):
    Path(path).write_text(os.environ.get("TRAINMAP_JOB", "") + "|" + str(os.getpid()))

from trainmap.processes import live_group_members as _group

def helpers_job(path):
    import json, subprocess
    from joblib import Parallel, delayed
    sleeper = subprocess.Popen(["sleep", "60"])  # left running on purpose
    Parallel(n_jobs=2, backend="loky")(delayed(abs)(-i) for i in range(4))  # workers stay idle
    Path(path).write_text(json.dumps({"group": os.getpgrp(), "sleeper": sleeper.pid,
                                      "members": _group(os.getpgrp())}))
"""

#: A stand-in for Snakemake: it sets $TRAINMAP_WORKFLOW_PID to itself (the Snakefile's onstart)
#: and runs the client under a shell, as Snakemake runs a job's script; the shell outlives it and
#: writes the client's exit status. With "direct", no pid and no shell: the client is its child.
WORKFLOW = """
import os, shlex, subprocess, sys, time
mode, status_file, error_file, command = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
with open(error_file, "w") as errors:
    if mode == "shell":
        os.environ["TRAINMAP_WORKFLOW_PID"] = str(os.getpid())
        line = shlex.join(command) + "; echo $? > " + shlex.quote(status_file)
        subprocess.Popen(["sh", "-c", line], stderr=errors)
    else:
        os.environ.pop("TRAINMAP_WORKFLOW_PID", None)
        subprocess.Popen(command, stderr=errors)
time.sleep(600)
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
    (tmp_path / "workflow.py").write_text(textwrap.dedent(WORKFLOW))
    monkeypatch.setenv(worker.STOP_GRACE_ENV, "2")
    monkeypatch.delenv(worker.WORKFLOW_PID_ENV, raising=False)
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


def client_command(directory: Path, function: str, log: Path | str, **kwargs) -> list[str]:
    return [sys.executable, str(directory / "client.py"), function, str(log), json.dumps(kwargs)]


def client(directory: Path, function: str, log: Path | str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        client_command(directory, function, log, **kwargs), env=dict(os.environ), cwd=directory
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


@pytest.mark.integration  # starts a program (a subprocess)
def test_without_a_server_the_job_runs_in_process(jobs_module, monkeypatch):
    """In the client's own process (which it then takes over: its own process group, SIGTERM a
    stop request), so in a subprocess."""
    monkeypatch.delenv(worker.SOCKET_ENV, raising=False)
    out, log = jobs_module / "local.txt", jobs_module / "local.log"
    process = client(jobs_module, "worker_test_jobs:write_job", log, path=str(out), text="local")
    assert process.wait(timeout=60) == 0
    assert int(out.read_text().split("pid=")[1]) == process.pid
    assert "writing" in log.read_text()
    # A socket that nobody serves: the same, with no error.
    monkeypatch.setenv(worker.SOCKET_ENV, str(jobs_module / "nobody.sock"))
    process = client(jobs_module, "worker_test_jobs:write_job", log, path=str(out), text="again")
    assert process.wait(timeout=60) == 0
    assert out.read_text().startswith("again")
    assert int(out.read_text().split("pid=")[1]) == process.pid


def test_switch_off_starts_no_server(jobs_module, monkeypatch):
    monkeypatch.setenv(worker.SWITCH_ENV, "off")
    assert worker.start_server(jobs_module / "state") is None


@pytest.mark.integration  # starts a program (a subprocess)
def test_a_launched_server_sets_up_the_tracking_store_before_it_answers(jobs_module, tmp_path):
    """The Snakefile's onstart launches the server first and checks the plan while it imports:
    launch_server returns before the server answers, and once await_server has it, the tracking
    database and the experiment exist (no job can race to create them)."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    pending = worker.launch_server(jobs_module / "state", (uri,), ("worker_test_jobs",),
                                   experiment="launched")  # fmt: skip
    assert pending is not None
    try:
        assert not worker._reachable(pending.path), "launch_server waited for the server"
        process = worker.await_server(pending)
        assert process is pending.process, (jobs_module / "state" / "worker.log").read_text()
        assert os.environ[worker.SOCKET_ENV] == pending.path
        assert MlflowClient(tracking_uri=uri).get_experiment_by_name("launched") is not None
    finally:
        worker.stop_server(pending.process)
    assert worker.SOCKET_ENV not in os.environ and not Path(pending.path).parent.exists()


@pytest.mark.integration  # starts a program (a subprocess)
def test_a_server_that_cannot_set_up_the_store_serves_nothing(jobs_module, capsys):
    """An unreachable tracking server: the server exits 2 saying so, await_server gives None (the
    workflow then sets the store up itself and reports the real error) and no socket is left."""
    pending = worker.launch_server(jobs_module / "state", ("http://127.0.0.1:9",),
                                   ("worker_test_jobs",), experiment="nowhere")  # fmt: skip
    assert worker.await_server(pending) is None
    assert pending.process.returncode == 2
    log = (jobs_module / "state" / "worker.log").read_text()
    assert "could not set up tracking store http://127.0.0.1:9" in log and "unreachable" in log
    assert "did not start" in capsys.readouterr().out
    assert worker.SOCKET_ENV not in os.environ and not Path(pending.path).parent.exists()


@pytest.mark.integration  # starts a program (a subprocess)
def test_a_launched_server_nobody_waited_for_is_stopped_with_its_socket(jobs_module):
    """The onstart refuses the plan (or the results root) after it launched the server: stopping
    the pending server ends it and removes its socket directory."""
    pending = worker.launch_server(jobs_module / "state", job_modules=("worker_test_jobs",))
    worker.stop_server(pending)
    assert pending.process.poll() is not None
    assert worker.SOCKET_ENV not in os.environ and not Path(pending.path).parent.exists()


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


# --- ending jobs: the workflow watch, process groups, the job lock ------------------------------


def _wait_until(condition, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """One server for the tests of where jobs run (a start imports torch and MLflow: seconds),
    with the test jobs importable; its socket is set per test (:func:`job_path`). A child takes
    its job's working directory and environment from the client, so tests share no state."""
    directory = tmp_path_factory.mktemp("shared_jobs")
    (directory / "worker_test_jobs.py").write_text(textwrap.dedent(JOBS_MODULE))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join([str(directory),
                                                    os.environ.get("PYTHONPATH", "")]))  # fmt: skip
        patch.delenv(worker.SWITCH_ENV, raising=False)
        process = worker.start_server(directory / "state", job_modules=("worker_test_jobs",))
        assert process is not None, (directory / "state" / "worker.log").read_text()
        socket_path = os.environ[worker.SOCKET_ENV]
        yield socket_path
        worker.stop_server(process)  # also unsets the socket's variable


@pytest.fixture(params=["server", "off"])
def job_path(request, jobs_module, monkeypatch):
    """Where jobs run: on a server (shared by these tests), or in the client's own process."""
    if request.param == "off":
        monkeypatch.setenv(worker.SWITCH_ENV, "off")
        return "off"
    monkeypatch.setenv(worker.SOCKET_ENV, request.getfixturevalue("shared_server"))
    return "server"


@pytest.mark.integration  # starts programs (a server, a stand-in for Snakemake, clients)
@pytest.mark.parametrize(("job_path", "watched"),
                         [("server", "pid"), ("off", "pid"), ("server", "parent")],
                         indirect=["job_path"])  # fmt: skip
def test_a_job_ends_when_its_workflow_ends(job_path, jobs_module, watched):
    """Before: after `kill -9` on Snakemake the client and its job trained on to the end. "pid":
    the workflow's pid dies (the shell between, the client's parent, lives on); "parent": the
    client's parent dies (no pid to watch)."""
    marker, pid_file = jobs_module / "marker", jobs_module / "pid"
    status_file, error_file = jobs_module / "status", jobs_module / "client-stderr"
    command = client_command(jobs_module, "worker_test_jobs:slow_job", "logs/slow.log",
                             marker=str(marker), pid_file=str(pid_file), seconds=60)  # fmt: skip
    mode = "shell" if watched == "pid" else "direct"
    workflow = subprocess.Popen(
        [sys.executable, str(jobs_module / "workflow.py"), mode, str(status_file),
         str(error_file), *command],
        env=dict(os.environ), cwd=jobs_module,
    )  # fmt: skip
    try:
        _wait_until(pid_file.exists, 60, "the job never started")
        job_pid = int(pid_file.read_text())
    finally:
        workflow.kill()  # kill -9 on Snakemake
        workflow.wait()
    # the watch looks once a second; the job stops at SIGTERM (grace 2 s)
    _wait_until(lambda: not _alive(job_pid), 10, "the job outlived its workflow")
    assert not marker.exists()
    if watched == "pid":  # the shell that ran the client saw its exit status
        _wait_until(status_file.exists, 10, "the client did not exit")
        status = int(status_file.read_text())
        assert status == (1 if job_path == "server" else 143), error_file.read_text()
    _wait_until(lambda: "the workflow ended" in error_file.read_text(), 10,
                "the client did not say why it ended the job")  # fmt: skip


@pytest.mark.integration  # starts programs (a server, clients)
@pytest.mark.parametrize(("job_path", "number", "status"),
                         [("server", signal.SIGTERM, 143), ("server", signal.SIGINT, 130),
                          ("off", signal.SIGTERM, 143)], indirect=["job_path"])  # fmt: skip
def test_a_cancelled_client_stops_its_job(job_path, jobs_module, number, status):
    """Snakemake cancels a job with SIGTERM or SIGINT to the job's process (the client): the job
    gets SIGTERM, its stop request, and the client exits as a signal would have ended it."""
    marker, pid_file, log = jobs_module / "marker", jobs_module / "pid", jobs_module / "c.log"
    process = client(jobs_module, "worker_test_jobs:slow_job", log, marker=str(marker),
                     pid_file=str(pid_file), seconds=60)  # fmt: skip
    try:
        _wait_until(pid_file.exists, 60, "the job never started")
        job_pid = int(pid_file.read_text())
        process.send_signal(number)
        assert process.wait(timeout=15) == status
    finally:
        process.kill()
        process.wait()
    _wait_until(lambda: not _alive(job_pid), 5, "the job outlived its cancelled client")
    assert not marker.exists()
    if job_path == "server":  # the child's log says how the job ended
        assert "stopped by SIGTERM outside a training step loop" in log.read_text()


@pytest.mark.integration  # starts programs (a server, clients, the job's helpers)
def test_a_finished_job_leaves_no_process_of_its_group(job_path, jobs_module):
    """Before: the forked child ended with os._exit, so loky's workers and resource tracker (and
    any program the job left running) stayed behind with parent 1 after every such job."""
    report = jobs_module / "helpers.json"
    process = client(jobs_module, "worker_test_jobs:helpers_job", "logs/helpers.log",
                     path=str(report))  # fmt: skip
    assert process.wait(timeout=120) == 0, (jobs_module / "logs" / "helpers.log").read_text()
    seen = json.loads(report.read_text())
    # the job, the sleeper and two loky workers were alive in the job's group when it returned
    assert seen["sleeper"] in seen["members"] and len(seen["members"]) >= 4, seen
    if job_path == "server":
        assert seen["group"] != process.pid  # the server's child led the group
    else:
        assert seen["group"] == process.pid  # the client led it: the job ran in it
    if job_path == "server":  # the client ended the group before it returned
        assert live_group_members(seen["group"]) == []
    else:  # the job's process ended the sleeper; its resource tracker ends once it has exited
        assert not _alive(seen["sleeper"]) or _zombie(seen["sleeper"])
        _wait_until(lambda: live_group_members(seen["group"]) == [], 5, "the job's helpers stayed")
    assert not _alive(seen["sleeper"]) or _zombie(seen["sleeper"])


@pytest.mark.integration  # starts programs (a server, clients)
def test_a_second_run_of_a_running_job_is_refused(job_path, jobs_module, monkeypatch):
    """Before: nothing stopped two runs of one job at once (both wrote its outputs). The first
    job here ignores SIGTERM, so on the server it takes its whole grace to end."""
    monkeypatch.setenv(worker.STOP_GRACE_ENV, "6")
    marker, pid_file = jobs_module / "marker", jobs_module / "pid"
    first = client(jobs_module, "worker_test_jobs:stubborn_job", "logs/train/x.log",
                   marker=str(marker), pid_file=str(pid_file), seconds=60)  # fmt: skip

    def run_again(name: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            client_command(jobs_module, "worker_test_jobs:key_job", "logs/train/x.log",
                           path=str(jobs_module / name)),
            cwd=jobs_module, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    try:
        _wait_until(pid_file.exists, 60, "the first job never started")
        job_pid = int(pid_file.read_text())
        assert (job_pid == first.pid) == (job_path == "off")

        started = time.monotonic()
        second = run_again("second")
        assert second.returncode == 1, second.stderr
        assert time.monotonic() - started < 10  # at once: no waiting for the lock
        assert "job logs/train/x.log is already running" in second.stderr
        assert f"pid {job_pid} on host " in second.stderr and f"kill {job_pid}" in second.stderr
        assert not (jobs_module / "second").exists()
        holder = json.loads(next((jobs_module / ".snakemake/trainmap/locks").glob("*.lock"))
                            .read_text())  # fmt: skip
        assert holder["pid"] == job_pid and holder["job"] == "logs/train/x.log"

        # Another job runs, and learns its key.
        other = jobs_module / "other"
        assert client(jobs_module, "worker_test_jobs:key_job", "logs/train/y.log",
                      path=str(other)).wait(timeout=60) == 0  # fmt: skip
        assert other.read_text().split("|")[0] == "logs/train/y.log"

        first.kill()  # SIGKILL to the client
        first.wait(timeout=30)
        if job_path == "server":  # its job lives on through its grace, and holds the lock
            assert _alive(job_pid)
            third = run_again("third")
            assert third.returncode == 1 and f"pid {job_pid} on host " in third.stderr
            assert _alive(job_pid), "the job ended before the lock was tried: the test is void"
        _wait_until(lambda: not _alive(job_pid), 15, "the job outlived its killed client")
        again = run_again("again")
        assert again.returncode == 0, again.stderr
        assert (jobs_module / "again").read_text().split("|")[0] == "logs/train/x.log"
        assert not marker.exists()
    finally:
        first.kill()
        first.wait()


def test_the_job_lock_names_its_holder_and_is_free_once_released(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert worker.job_key("logs/./train/../train/x.log") == "logs/train/x.log"
    assert worker.job_key(tmp_path / "logs" / "x.log") == "logs/x.log"
    lock = worker.lock_job("logs/x.log")
    try:
        path = worker.lock_path("logs/x.log")
        assert path.parent == Path(".snakemake/trainmap/locks") and len(path.stem) == 16
        holder = json.loads(path.read_text())
        assert holder["pid"] == os.getpid() and holder["job"] == "logs/x.log"
        # flock locks belong to the open file: a second open, even in this process, is refused
        with pytest.raises(worker.JobAlreadyRunningError, match=f"pid {os.getpid()} on host"):
            worker.lock_job("logs/x.log")
        worker.lock_job("logs/y.log").release()  # another job's lock is another file
    finally:
        lock.release()
    worker.lock_job("logs/x.log").release()


@pytest.mark.integration  # starts a program (a shell and its sleeps)
def test_end_group_ends_a_group_that_ignores_sigterm_after_the_grace():
    sleeper = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; sleep 60 & sleep 60; wait"], start_new_session=True
    )
    try:
        _wait_until(lambda: len(live_group_members(sleeper.pid)) == 3, 10, "the group never formed")
        started = time.monotonic()
        worker.end_group(sleeper.pid, 0.5)
        took = time.monotonic() - started
        sleeper.wait(timeout=10)
        assert 0.5 <= took < 5
        _wait_until(lambda: live_group_members(sleeper.pid) == [], 5, "the group outlived SIGKILL")
    finally:
        sleeper.kill()
        sleeper.wait()
    with pytest.raises(ValueError, match="not another process group"):
        worker.end_group(os.getpgrp(), 1)


def test_tracking_runs_are_settled_around_the_job(monkeypatch):
    """The process that runs a job, holding its lock, marks the job's dead runs KILLED first and
    retires its superseded runs after a success (trainmap.tracking); never after a failure."""
    import trainmap.tracking

    calls = []
    monkeypatch.setattr(trainmap.tracking, "end_dead_runs",
                        lambda tracking, job: calls.append(("end_dead_runs", job)))  # fmt: skip
    monkeypatch.setattr(trainmap.tracking, "retire_superseded_runs",
                        lambda tracking, job: calls.append(("retire", job)))  # fmt: skip
    tracking = {"uri": "sqlite:///nowhere.db", "experiment": "e"}

    def job(tracking, fail=False):
        calls.append(("job", tracking["experiment"]))
        if fail:
            raise RuntimeError("failed")

    worker._call_job("m:job", "log", {"tracking": tracking}, "logs/a.log", run=job)
    assert calls == [("end_dead_runs", "logs/a.log"), ("job", "e"), ("retire", "logs/a.log")]
    calls.clear()
    with pytest.raises(RuntimeError):
        worker._call_job("m:job", "log", {"tracking": tracking, "fail": True}, "logs/a.log",
                         run=job)  # fmt: skip
    assert calls == [("end_dead_runs", "logs/a.log"), ("job", "e")]
    calls.clear()
    worker._call_job("m:job", "log", {}, "k", run=lambda: calls.append(("untracked", "")))
    assert calls == [("untracked", "")]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return False
