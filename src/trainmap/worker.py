"""A job server that keeps the heavy imports warm, so a short workflow job starts in milliseconds.

Every Snakemake job is a fresh Python process, and a trainmap job imports torch, pandas, matplotlib
and MLflow before it does anything (FACTS.md: ~1.6 s + ~1.2 s, more under load), which is longer
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
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

SOCKET_ENV = "TRAINMAP_WORKER_SOCKET"
SWITCH_ENV = "TRAINMAP_WORKER"  # "off" disables the server
#: When set, every job appends {"function", "seconds", "log"} (its own compute time) to this file.
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
    "trainmap.jobs",
    "trainmap.gradinit",
    "trainmap.reparam",
    "trainmap.sparse",
    "trainmap.quantize",
    "trainmap.dynamics.pipeline",
)
START_TIMEOUT_S = 120


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
        from trainmap.jobs import logged_to

        with logged_to(log):
            call_timed(function, log, kwargs)
        return
    if status != 0:
        sys.exit(status)


def call_timed(function: str, log: str, kwargs: dict[str, Any]) -> None:
    """Call the job; with ``$TRAINMAP_JOB_TIMES`` set, append its own wall time to that file."""
    started = time.perf_counter()
    resolve(function)(**kwargs)
    path = os.environ.get(TIMES_ENV)
    if path:
        line = json.dumps({"function": function, "seconds": time.perf_counter() - started,
                           "log": str(log)})  # fmt: skip
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
    return int(json.loads(reply)["status"])


# --- the server -------------------------------------------------------------------------------


def serve(path: str, tracking_uris: tuple[str, ...] = ()) -> None:
    """Import the warm modules (and open the tracking stores), then fork one child per job.

    Runs until SIGTERM or until the process that started it (Snakemake) is gone.
    """
    owner = os.getppid()
    for module in WARM_MODULES:
        importlib.import_module(module)
    _open_tracking_stores(tracking_uris)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    Path(path).unlink(missing_ok=True)
    server.bind(path)
    server.listen(64)
    server.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    signal.signal(signal.SIGTERM, lambda *_: (Path(path).unlink(missing_ok=True), os._exit(0)))
    while os.getppid() == owner:
        try:
            connection, _ = server.accept()
        except TimeoutError:
            continue
        if os.fork() == 0:
            server.close()
            _run_child(connection)
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


def _run_child(connection: socket.socket) -> None:
    """In the forked child: read the request, run the job, send its status, exit."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # subprocess.run must be able to wait again
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _fresh_database_connections()
    line = connection.makefile("rb").readline()
    if not line:  # a reachability probe
        os._exit(0)
    status = 1
    try:
        request = json.loads(line)
        connection.settimeout(None)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _redirect_output(request["log"])
        threading.Thread(target=_die_with_client, args=(connection,), daemon=True).start()
        call_timed(request["function"], request["log"], request["kwargs"])
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
    directory: str | os.PathLike, tracking_uris: tuple[str, ...] = ()
) -> subprocess.Popen | None:
    """Start a server for this workflow run; set its socket in the environment jobs inherit.

    ``tracking_uris``: SQL tracking stores to open once in the server. Returns None (and jobs run
    in their own processes) when disabled with ``TRAINMAP_WORKER=off``.
    """
    if os.environ.get(SWITCH_ENV) == "off":
        return None
    # Unix socket paths are limited to ~100 bytes: use a short name in /tmp, unique per process.
    path = f"/tmp/trainmap-{os.getpid()}-{os.urandom(4).hex()}.sock"
    log = Path(directory) / "worker.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as stream:
        process = subprocess.Popen(
            [sys.executable, "-m", "trainmap.worker", path, *tracking_uris],
            stdout=stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _reachable(path):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
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
    os.environ.pop(SOCKET_ENV, None)


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


if __name__ == "__main__":
    serve(sys.argv[1], tuple(sys.argv[2:]))
