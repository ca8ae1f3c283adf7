"""A job server that keeps the heavy imports warm, so a short workflow job starts in milliseconds.

Every Snakemake job is a fresh Python process, and a trainmap job imports torch, pandas, matplotlib
and MLflow before it does anything (measured: ~1.6 s + ~1.2 s, more under load), which is longer
than many jobs compute. When Snakemake executes jobs on this machine, the Snakefile's ``onstart``
starts one server per workflow run (:func:`start_server`); it imports those libraries once and
then, for every job, forks a child that already has them. The job's Snakemake script stays a thin
client (:func:`run_job`): it sends the job (a ``module:function`` name and JSON keyword arguments)
over a Unix socket and exits with the child's exit status, so Snakemake sees success and failure
exactly as before.

Safety:

* The server is single-threaded and never runs torch operations, so forking it is safe; each child
  sets its own thread count, working directory, environment and log file (stdout and stderr at the
  file-descriptor level, so native libraries' output lands in the log too).
* If the client dies (Snakemake killed or cancelled the job), the child notices the closed socket
  and kills itself: a killed job never keeps running behind Snakemake's back. Training then resumes
  from its last resume state on the rerun, as without the server.
* Without a server (cluster executors, ``TRAINMAP_WORKER=off``, or a server that cannot be
  reached), :func:`run_job` runs the function in its own process: slower to start, same result.
* Portable mode (:mod:`trainmap.portable`, ``$TRAINMAP_PORTABLE``): the server sets its pins before
  its imports and every job sets them from its own environment before its first torch operation,
  in the forked child or in its own process alike; a job that cannot have them fails.

Access: the socket is created 0600 inside a fresh 0700 directory (``tempfile.mkdtemp``), whatever
the umask, and the server only answers clients of its own user (``SO_PEERCRED``). It runs only job
functions: public functions named ``*_job`` defined in :data:`JOB_MODULES` (``trainmap.jobs.*``); any
other ``module:function`` a client names (``os:mkdir``) is refused before anything runs.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainmap.jobs import JOB_MODULES
from trainmap.portable import apply_portable_mode

SOCKET_ENV = "TRAINMAP_WORKER_SOCKET"
SWITCH_ENV = "TRAINMAP_WORKER"  # "off" disables the server
#: When set, every job appends {"function", "seconds", "threads", "log", "finished"} (its own
#: compute time, the cores it was given, and when it ended, in seconds since the epoch) to this file.
TIMES_ENV = "TRAINMAP_JOB_TIMES"
#: What the server imports before it forks: everything a job would otherwise import itself. Every
#: trainmap module is loaded at start, so all jobs of a workflow run use one snapshot of the code.
WARM_MODULES = (
    "torch",
    "pandas",
    "matplotlib.pyplot",
    "mlflow",
    "hmmlearn.hmm",
    "statsmodels.api",
    "sklearn.cluster",
    *JOB_MODULES,
    "trainmap.methods.gradinit",
    "trainmap.models.repvgg",
    "trainmap.methods.sparse",
    "trainmap.methods.quantize",
    "trainmap.dynamics.pipeline",
)
START_TIMEOUT_S = 120
SOCKET_DIR_PREFIX = "trainmap-worker-"


class RefusedJobError(ValueError):
    """A client named a function that is not a job function of the allowed modules."""


def job_function(name: str, modules: tuple[str, ...] = JOB_MODULES) -> Callable[..., Any]:
    """The job function named ``module:function``, if ``module`` is one of ``modules`` and the
    function is public, defined there and named ``*_job``; else :class:`RefusedJobError`."""
    module_name, _, function_name = name.partition(":")
    if module_name not in modules or not function_name.endswith("_job"):
        raise RefusedJobError(
            f"refused to run {name!r}: the job server runs only job functions "
            f"(<module>:<name>_job) of {', '.join(modules)}"
        )
    function = getattr(importlib.import_module(module_name), function_name, None)
    if (
        function_name.startswith("_")
        or not inspect.isfunction(function)
        or function.__module__ != module_name
    ):
        raise RefusedJobError(f"refused to run {name!r}: {module_name} defines no such job")
    return function


def resolve(name: str) -> Callable[..., Any]:
    """The function named ``module:function``."""
    module_name, function_name = name.split(":")
    return getattr(importlib.import_module(module_name), function_name)


def run_job(function: str, log: str, **kwargs: Any) -> None:
    """Run ``function(**kwargs)`` with stdout/stderr in ``log``: on the server if one is up, else here.

    Exits the process with the job's status when it ran on the server (the calling script is a
    Snakemake job, whose exit status Snakemake reads).
    """
    status = _submit(function, log, kwargs)
    if status is None:  # no server: run in this process
        from trainmap.jobs.common import logged_to
        from trainmap.plugins import load_exported_plugins  # deferred: the client stays torch-free

        load_exported_plugins()  # the workflow's plugins, as the server would have them
        with logged_to(log):
            apply_portable_mode(strict=True)  # before the job's first torch operation
            call_timed(function, log, kwargs)
        return
    if status != 0:
        sys.exit(status)


def call_timed(
    function: str, log: str, kwargs: dict[str, Any], run: Callable[..., Any] | None = None
) -> None:
    """Call the job (``run``, else the function ``function`` names); with ``$TRAINMAP_JOB_TIMES``
    set, append its own wall time, the cores it was given (``threads``) and when it finished
    (``finished``, seconds since the epoch: the workflow's timeline) to that file."""
    started = time.perf_counter()
    (run or resolve(function))(**kwargs)
    path = os.environ.get(TIMES_ENV)
    if path:
        line = json.dumps({"function": function, "seconds": time.perf_counter() - started,
                           "threads": int(kwargs.get("threads", 1)), "log": str(log),
                           "finished": time.time()})  # fmt: skip
        with open(path, "a") as stream:  # one short line per write: appends do not interleave
            stream.write(line + "\n")


def _submit(function: str, log: str, kwargs: dict[str, Any]) -> int | None:
    path = os.environ.get(SOCKET_ENV)
    if not path or os.environ.get(SWITCH_ENV) == "off":
        return None
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(path)
    except OSError:
        client.close()
        return None
    request = {
        "function": function,
        "kwargs": kwargs,
        "log": str(Path(log).resolve()),
        "cwd": os.getcwd(),
        "env": dict(os.environ),
    }
    with client:
        client.sendall(json.dumps(request).encode() + b"\n")
        reply = client.makefile("rb").readline()
    if not reply:
        print(f"trainmap worker: the job {function} ended without a status; see {log}")
        return 1
    answer = json.loads(reply)
    if answer.get("error"):
        print(f"trainmap worker: {answer['error']}", file=sys.stderr)
    return int(answer["status"])


# --- the server -------------------------------------------------------------------------------


def serve(
    path: str, tracking_uris: tuple[str, ...] = (), job_modules: tuple[str, ...] = JOB_MODULES
) -> None:
    """Import the warm modules (and open the tracking stores), then fork one child per job.

    ``path`` must lie in a directory only this user can enter (:func:`start_server` makes one).
    Runs until SIGTERM or until the process that started it (Snakemake) is gone.
    """
    owner = os.getppid()
    _check_private_directory(Path(path).parent)
    apply_portable_mode()  # before any import could run a torch operation
    for module in WARM_MODULES:
        importlib.import_module(module)
    # The workflow's plugins ($TRAINMAP_PLUGINS, inherited from Snakemake), before any fork: every
    # job sees the architectures, data kinds and methods the config check saw.
    from trainmap.plugins import load_exported_plugins  # deferred: clients import this module

    load_exported_plugins()
    _open_tracking_stores(tracking_uris)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    Path(path).unlink(missing_ok=True)
    previous_umask = os.umask(0o177)  # the socket is created 0600, never briefly wider
    try:
        server.bind(path)
    finally:
        os.umask(previous_umask)
    os.chmod(path, 0o600)
    server.listen(64)
    server.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    signal.signal(signal.SIGTERM, lambda *_: (Path(path).unlink(missing_ok=True), os._exit(0)))
    while os.getppid() == owner:
        try:
            connection, _ = server.accept()
        except TimeoutError:
            continue
        if not _same_user(connection):
            connection.close()
            continue
        if os.fork() == 0:
            server.close()
            _run_child(connection, job_modules)
        connection.close()
    Path(path).unlink(missing_ok=True)


def _open_tracking_stores(uris: tuple[str, ...]) -> None:
    """Open each SQL tracking store once (engine, schema check: ~1 s per process otherwise); the
    children inherit MLflow's cached store and open their own database connections."""
    from mlflow import MlflowClient

    for uri in uris:
        if uri.startswith(("http://", "https://")):
            continue  # nothing to open: every request is its own HTTP call
        try:
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        except Exception as error:  # noqa: BLE001 - a job will report the real problem
            print(f"trainmap worker: could not open tracking store {uri}: {error}")


def _fresh_database_connections() -> None:
    """After fork: drop the inherited pooled connections (they belong to the server), keep the
    engines; SQLAlchemy's recipe for forked processes (``dispose(close=False)``)."""
    try:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    except ImportError:
        return
    for engine in list(SqlAlchemyStore._engine_map.values()):
        engine.dispose(close=False)


def _check_private_directory(directory: Path) -> None:
    """Refuse to serve from a directory another user could enter or replace."""
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(
            f"trainmap worker: {directory} must be a directory of this user with mode 0700 (it is "
            f"{stat.filemode(info.st_mode)}, uid {info.st_uid}); start the server with start_server"
        )


def _same_user(connection: socket.socket) -> bool:
    """Whether the client runs as this user (Linux SO_PEERCRED; elsewhere the 0700 directory)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return True
    credentials = connection.getsockopt(
        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
    )
    _pid, uid, _gid = struct.unpack("3i", credentials)
    return uid == os.getuid()


def _run_child(connection: socket.socket, job_modules: tuple[str, ...] = JOB_MODULES) -> None:
    """In the forked child: read the request, run the job, send its status, exit."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # subprocess.run must be able to wait again
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _fresh_database_connections()
    line = connection.makefile("rb").readline()
    if not line:  # a reachability probe
        os._exit(0)
    try:
        request = json.loads(line)
        function = job_function(request["function"], job_modules)
    except (RefusedJobError, ValueError, KeyError, TypeError, ImportError) as error:
        # Refused before anything runs or is written (no log, no chdir): tell the client why.
        reply = {"status": 2, "error": str(error) if isinstance(error, RefusedJobError)
                 else f"malformed job request ({type(error).__name__}: {error})"}  # fmt: skip
        connection.sendall(json.dumps(reply).encode() + b"\n")
        os._exit(2)
    status = 1
    try:
        connection.settimeout(None)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _redirect_output(request["log"])
        apply_portable_mode(strict=True)  # the job's own $TRAINMAP_PORTABLE; torch has not run yet
        threading.Thread(target=_die_with_client, args=(connection,), daemon=True).start()
        call_timed(request["function"], request["log"], request["kwargs"], run=function)
        status = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            connection.sendall(json.dumps({"status": status}).encode() + b"\n")
        finally:
            os._exit(status)


def _redirect_output(log: str) -> None:
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def _die_with_client(connection: socket.socket) -> None:
    """The client sends nothing after its request; EOF means it was killed: stop the job too."""
    try:
        connection.recv(1)
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


# --- starting and stopping it from the Snakefile ----------------------------------------------


def start_server(
    directory: str | os.PathLike,
    tracking_uris: tuple[str, ...] = (),
    job_modules: tuple[str, ...] = JOB_MODULES,
) -> subprocess.Popen | None:
    """Start a server for this workflow run; set its socket in the environment jobs inherit.

    ``directory``: where its log goes. ``tracking_uris``: SQL tracking stores to open once in the
    server. ``job_modules``: whose ``*_job`` functions it runs. Returns None (and jobs run in their
    own processes) when disabled with ``TRAINMAP_WORKER=off``.
    """
    if os.environ.get(SWITCH_ENV) == "off":
        return None
    # Unix socket paths are limited to ~100 bytes: a short fresh directory in /tmp, created 0700
    # by mkdtemp (atomically, with a random name: nobody else can have prepared it).
    path = str(Path(tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX, dir="/tmp")) / "jobs.sock")
    log = Path(directory) / "worker.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as stream:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainmap.worker",
                "--jobs",
                ",".join(job_modules),
                path,
                *tracking_uris,
            ],  # fmt: skip
            stdout=stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _reachable(path):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            _remove_socket_directory(path)
            print(f"trainmap worker did not start (see {log}); jobs run in their own processes")
            return None
        time.sleep(0.05)
    os.environ[SOCKET_ENV] = path
    return process


def stop_server(process: subprocess.Popen | None) -> None:
    """Stop a server started by :func:`start_server` (its running jobs are not affected)."""
    if process is None:
        return
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
    _remove_socket_directory(os.environ.pop(SOCKET_ENV, None))


def _remove_socket_directory(path: str | None) -> None:
    if path and Path(path).parent.name.startswith(SOCKET_DIR_PREFIX):
        shutil.rmtree(Path(path).parent, ignore_errors=True)


def _reachable(path: str) -> bool:
    if not os.path.exists(path):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def main(argv: list[str]) -> None:
    """``python -m trainmap.worker [--jobs MODULE[,MODULE]] SOCKET [TRACKING_URI ...]``."""
    job_modules = JOB_MODULES
    if argv[:1] == ["--jobs"]:
        job_modules, argv = tuple(argv[1].split(",")), argv[2:]
    serve(argv[0], tuple(argv[1:]), job_modules)


if __name__ == "__main__":
    main(sys.argv[1:])
