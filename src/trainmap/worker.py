"""A job server that keeps the heavy imports warm, so a short workflow job starts in milliseconds.

Every Snakemake job is a fresh Python process, and a trainmap job imports torch, pandas, matplotlib
and MLflow before it does anything (measured: ~1.6 s + ~1.2 s, more under load), which is longer
than many jobs compute. When Snakemake executes jobs on this machine, the Snakefile's ``onstart``
starts one server per workflow run (:func:`launch_server`, then :func:`await_server` once the
plan is checked; :func:`start_server` does both); it imports those libraries once and
then, for every job, forks a child that already has them. The job's Snakemake script stays a thin
client (:func:`run_job`): it sends the job (a ``module:function`` name and JSON keyword arguments)
over a Unix socket and exits with the child's exit status, so Snakemake sees success and failure
exactly as before.

Safety:

* The server is single-threaded and never runs torch operations, so forking it is safe; each child
  sets its own thread count, working directory, environment and log file (stdout and stderr at the
  file-descriptor level, so native libraries' output lands in the log too).
* **Process groups.** Each job runs in a process group of its own: the forked child makes itself
  its group's leader at once (and tells the client its pid, the group's id); without a server,
  :func:`run_job` makes its own process the leader (that takes it out of Snakemake's group, so a
  Ctrl-C in the terminal reaches it through the workflow watch below, not directly). Whatever the
  job starts (loky/joblib workers and their resource tracker, subprocesses) is in that group, and
  ending a job ends the group (:func:`end_group`: SIGTERM, a grace, then SIGKILL). The client ends
  it after every job, once it has the job's status, with a short grace (:data:`END_GRACE_S`): the
  helpers a finished job left behind (the child ends with ``os._exit``, which skips joblib's
  shutdown) do not outlive it. Without a server the job's process exits normally (joblib shuts
  its workers down) and ends the rest of its group at exit; a program that ignores SIGTERM (a
  resource tracker) is left to end by itself, which it does once that process has exited.
* **The grace.** SIGTERM to a job process is a stop request (:mod:`trainmap.stopping`): in the
  training loop it stops after the step in progress with that step's resume state saved (a rerun
  continues bit-identical), elsewhere the job stops at once; it exits 143. A group still there
  after :data:`STOP_GRACE_S` seconds (``$TRAINMAP_STOP_GRACE_S``) is SIGKILLed. A client that gets
  SIGTERM or SIGINT (Snakemake cancelling the job) ends the job's group with that grace and exits
  143 or 130. If the client dies (SIGKILL), the child notices the closed socket and ends its own
  group with the same grace, itself last. A killed job never keeps running behind Snakemake's back.
* **The workflow watch.** ``$TRAINMAP_WORKFLOW_PID`` (:data:`WORKFLOW_PID_ENV`, set by the
  Snakefile's ``onstart``) names Snakemake's process. While it waits, the client looks about once
  a second (:data:`WATCH_INTERVAL_S`) whether that process is still alive and whether its own
  parent is still the one it started with; without a server a thread of the job process does the
  same. When the workflow is gone (``kill -9`` on Snakemake), the job is ended as above and the
  client exits non-zero saying so on its stderr (1; without a server 143, the job's own process
  having stopped). The pid is watched only if it is one of the client's ancestors when it starts
  (Linux: ``/proc``): a cluster job inherits the variable from a workflow on another machine, and
  a pid there means nothing here.
* **The job lock.** A job first takes an exclusive ``flock`` on
  ``.snakemake/trainmap/locks/<sha256 of its key>.lock`` in its working directory (the project;
  Snakemake deletes a job's outputs before it starts, so the lock is none of them). The key
  (:func:`job_key`) is the job's log path relative to that directory: every trainmap job has one
  log, named from the same wildcards as its outputs. A second run of the same job while one is
  alive is refused at once (exit 1, naming the holder's pid, host and start time, which the holder
  writes into the file). The client passes the locked file to the server's child (``SCM_RIGHTS``),
  so the lock lasts as long as the job does, also when the client died: ``flock`` belongs to the
  open file, and the kernel releases it when the last process holding it is gone. The process that
  runs the job gets the key as ``$TRAINMAP_JOB`` (:data:`JOB_ENV`; MLflow runs are tagged with
  it) and, holding the lock, marks the job's MLflow runs a dead holder left RUNNING as KILLED
  before the job, and retires its superseded FINISHED runs after a success
  (:mod:`trainmap.tracking`).
* Without a server (cluster executors, ``TRAINMAP_WORKER=off``, or a server that cannot be
  reached), :func:`run_job` runs the function in its own process: slower to start, same result,
  same lock, group, stop request and workflow watch. Under a cluster executor each job runs so, on
  its node, and its lock file lives on the project's file system that the nodes share: ``flock``
  over NFS may not be honoured (Linux emulates it with NFS byte-range locks, which need a working
  lock service; some mounts use ``nolock`` or ``local_lock``), and then two runs of one job on two
  nodes are not excluded. The cluster's own job control (``scancel`` sends SIGTERM) gives the
  training its stop point as above.
* Portable mode (:mod:`trainmap.portable`, ``$TRAINMAP_PORTABLE``): the server sets its pins before
  its imports and every job sets them from its own environment before its first torch operation,
  in the forked child or in its own process alike; a job that cannot have them fails.

Access: the socket is created 0600 inside a fresh 0700 directory (``tempfile.mkdtemp``), whatever
the umask, and the server only answers clients of its own user (``SO_PEERCRED``). It runs only job
functions: public functions named ``*_job`` defined in :data:`JOB_MODULES` (``trainmap.jobs.*``); any
other ``module:function`` a client names (``os:mkdir``) is refused before anything runs.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from trainmap.jobs import JOB_MODULES
from trainmap.locks import LockHeld, hold, write_holder
from trainmap.portable import apply_portable_mode
from trainmap.processes import live_group_members, process_alive, stat_fields
from trainmap.stopping import STOP_STATUS, JobStopped, install_stop_handler

SOCKET_ENV = "TRAINMAP_WORKER_SOCKET"
SWITCH_ENV = "TRAINMAP_WORKER"  # "off" disables the server
#: When set, every job appends {"function", "seconds", "threads", "log", "finished"} (its own
#: compute time, the cores it was given, and when it ended, in seconds since the epoch) to this file.
TIMES_ENV = "TRAINMAP_JOB_TIMES"
#: Snakemake's pid, set by the Snakefile's ``onstart``: a job whose workflow is gone ends itself.
WORKFLOW_PID_ENV = "TRAINMAP_WORKFLOW_PID"
#: The job's key (:func:`job_key`), set in the process that runs the job; trainmap.tracking reads
#: it under the same name to tag MLflow runs.
JOB_ENV = "TRAINMAP_JOB"
#: Seconds a job has to stop after SIGTERM (a training saves its resume state at its next step)
#: before its process group is SIGKILLed; ``$TRAINMAP_STOP_GRACE_S`` overrides it.
STOP_GRACE_S = 30.0
STOP_GRACE_ENV = "TRAINMAP_STOP_GRACE_S"
#: The grace the client gives a job's group once it has the job's status: only helpers the job
#: left behind are still there (loky workers and their resource tracker stop in well under this).
END_GRACE_S = 5.0
#: How often a client (or, without a server, the job's watch thread) looks at its workflow.
WATCH_INTERVAL_S = 1.0
#: The job locks' directory, relative to the job's working directory (the project).
LOCK_DIRECTORY = Path(".snakemake") / "trainmap" / "locks"
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


class JobAlreadyRunningError(RuntimeError):
    """Another live process holds the job's lock: the same job is running already."""


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

    First takes the job's lock (:func:`lock_job`); a job that is running already is refused: exit
    status 1 and a line on stderr naming the holder. Exits the process with the job's status when
    it ran on the server (the calling script is a Snakemake job, whose exit status Snakemake
    reads): 143 when it stopped on SIGTERM, 1 when its workflow ended first; SIGTERM or SIGINT to
    this process ends the job's process group (with :func:`stop_grace_s`) and exits 143 or 130.
    Without a server the job runs in this process, which then leads its own process group, takes
    SIGTERM as a stop request (exit 143) and watches its workflow (see the module docstring).
    """
    key = job_key(log)
    previous_sigint = signal.getsignal(signal.SIGINT)
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, _cancel)
    try:
        try:
            lock = lock_job(key)
        except JobAlreadyRunningError as error:
            print(f"trainmap: {error}", file=sys.stderr)
            sys.exit(1)
        status = _submit(function, log, kwargs, lock)
        if status is None:  # no server: run in this process, as the job's own process group
            install_stop_handler()
            signal.signal(signal.SIGINT, previous_sigint)
    except _Cancelled as cancelled:
        sys.exit(128 + cancelled.signum)
    if status is None:
        _run_here(function, log, kwargs, lock)
        return
    lock.release()
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


def _call_job(
    function: str, log: str, kwargs: dict[str, Any], key: str,
    run: Callable[..., Any] | None = None,
) -> None:  # fmt: skip
    """The job, in the process that holds its lock: with MLflow tracking (a ``tracking`` keyword
    argument), first mark KILLED the job's runs that a dead holder left RUNNING, and after the job
    succeeded retire its FINISHED runs that this one superseded (:mod:`trainmap.tracking`)."""
    tracking = kwargs.get("tracking")
    if isinstance(tracking, Mapping):
        from trainmap.tracking import end_dead_runs  # deferred: the client imports no MLflow code

        end_dead_runs(tracking, key)
    call_timed(function, log, kwargs, run)
    if isinstance(tracking, Mapping):
        from trainmap.tracking import retire_superseded_runs

        retire_superseded_runs(tracking, key)


def _run_here(function: str, log: str, kwargs: dict[str, Any], lock: JobLock) -> None:
    """Run the job in this process (no server), holding ``lock`` until this process exits: as
    its process group's leader, with SIGTERM a stop request, a thread that ends the group when the
    workflow is gone, and the programs it left running ended at exit."""
    from trainmap.jobs.common import logged_to
    from trainmap.plugins import load_exported_plugins  # deferred: the client stays torch-free

    try:
        os.setpgid(0, 0)  # the job's own group: helpers it starts join it, and end with it
    except OSError:  # a session leader cannot move, and it leads its own group already
        pass
    os.environ[JOB_ENV] = lock.key
    # The lock stays held until this process exits, after the helpers are ended at exit. atexit
    # handlers run after threading's, where joblib shuts its loky workers down itself.
    atexit.register(_end_helpers_at_exit)
    threading.Thread(target=_stop_here_when_gone, args=(_WorkflowWatch(),), daemon=True).start()
    try:
        load_exported_plugins()  # the workflow's plugins, as the server would have them
        with logged_to(log):
            apply_portable_mode(strict=True)  # before the job's first torch operation
            _call_job(function, log, kwargs, lock.key)
    except JobStopped as stopped:
        print(f"trainmap: job {lock.key}: {stopped}", file=sys.stderr)
        sys.exit(STOP_STATUS)


def _stop_here_when_gone(watch: _WorkflowWatch) -> None:
    """The in-process job's watch thread: when the workflow is gone, SIGTERM to the job's group
    (this process too: its stop request), and SIGKILL to the group after the grace if this
    process is still there (when it ends first, the thread ends with it)."""
    while (reason := watch.gone()) is None:
        time.sleep(WATCH_INTERVAL_S)
    for stream in {sys.__stderr__, sys.stderr} - {None}:  # the client's stderr and the job's log
        print(f"trainmap: {reason}; stopping this job", file=stream, flush=True)
    _signal_own_group(signal.SIGTERM)
    time.sleep(stop_grace_s())
    _signal_own_group(signal.SIGKILL)


def _end_helpers_at_exit() -> None:
    """At the exit of an in-process job: end the programs it started and left running (the rest
    of its process group), as :func:`end_group` would, with :data:`END_GRACE_S`. Those that
    ignore SIGTERM are left alone: a resource tracker (loky's, multiprocessing's) ignores it and
    ends by itself once this process has exited, which is later than this runs. Needs ``/proc``
    to find them; does nothing where this process does not lead its group."""
    group = os.getpid()
    if os.getpgrp() != group:
        return

    def others() -> list[int]:
        members = live_group_members(group) or []
        return [pid for pid in members if pid != group and not _ignores_sigterm(pid)]

    for pid in others():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + END_GRACE_S
    while (left := others()) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _ignores_sigterm(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGTERM (``SigIgn`` in ``/proc/<pid>/status``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def _signal_own_group(number: int) -> None:
    """Send ``number`` to this process's group when it leads one (it is then the job's group),
    else to this process alone (the group is someone else's: Snakemake's)."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), number)
    else:
        os.kill(os.getpid(), number)


# --- ending a job: process groups, the grace, the workflow watch ------------------------------


def stop_grace_s() -> float:
    """The grace a stopping job gets: ``$TRAINMAP_STOP_GRACE_S`` seconds if set to a number,
    else :data:`STOP_GRACE_S` (a value that is no number is ignored: this is read while a job is
    being ended, where an error would leave it running)."""
    try:
        return float(os.environ[STOP_GRACE_ENV])
    except (KeyError, ValueError):
        return STOP_GRACE_S


def end_group(pgid: int, grace_s: float) -> None:
    """End the process group ``pgid``: SIGTERM to it, up to ``grace_s`` seconds for it to empty,
    then SIGKILL to whatever is left. Returns once the group is empty or SIGKILLed. A member that
    has exited and waits for its parent to reap it (a zombie) counts as gone. A group that is gone
    already, or that is not this user's (its id reused), is left alone. Refuses (ValueError) this
    process's own group and ids that ``killpg`` reads as something else (0, 1, negative)."""
    if pgid <= 1 or pgid == os.getpgrp():
        raise ValueError(f"end_group: {pgid} is not another process group")
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace_s
    pause = 0.002
    while _group_alive(pgid):
        if time.monotonic() >= deadline:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _group_alive(pgid: int) -> bool:
    """Whether the group ``pgid`` has a member that has not exited (Linux: a group of zombies
    counts as empty; elsewhere zombies count as members)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    members = live_group_members(pgid)
    return members is None or bool(members)


class _WorkflowWatch:
    """Whether the workflow that started this process is gone: its parent changed, or the process
    ``$TRAINMAP_WORKFLOW_PID`` names (when it is an ancestor of this process) ended."""

    def __init__(self) -> None:
        self.parent = os.getppid()
        self.workflow = _watched_workflow_pid()

    def gone(self) -> str | None:
        """Why the workflow is gone, or None while it is there."""
        if os.getppid() != self.parent:
            return f"the workflow ended (this job's parent process {self.parent} is gone)"
        if self.workflow is not None and not process_alive(self.workflow):
            return f"the workflow ended (Snakemake, pid {self.workflow}, is gone)"
        return None


def _watched_workflow_pid() -> int | None:
    """``$TRAINMAP_WORKFLOW_PID`` if it names an ancestor of this process. A cluster job inherits
    the variable from the workflow's machine, where the pid means nothing; on a system without
    ``/proc`` the variable is trusted."""
    try:
        pid = int(os.environ.get(WORKFLOW_PID_ENV, ""))
    except ValueError:
        return None
    if pid <= 1:
        return None
    ancestors = _ancestors()
    return pid if ancestors is None or pid in ancestors else None


def _ancestors() -> set[int] | None:
    """This process's ancestors (``/proc``), or None where ``/proc`` is missing."""
    if not Path("/proc/self/stat").exists():
        return None
    found: set[int] = set()
    pid = os.getppid()
    while pid > 1 and pid not in found:
        found.add(pid)
        fields = stat_fields(pid)
        if fields is None:
            break
        pid = int(fields[1])
    return found


class _Cancelled(BaseException):
    """The client got SIGTERM or SIGINT (raised by its handler: it interrupts the wait at once)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _cancel(signum: int, frame: FrameType | None) -> None:
    raise _Cancelled(signum)


class _WorkflowGone(Exception):
    """The client's workflow ended while the job ran (the message says how)."""


# --- the job lock -----------------------------------------------------------------------------


def job_key(log: str | os.PathLike[str]) -> str:
    """The job's key: its log path relative to the working directory (the project), normalised.
    Every trainmap job has exactly one log, named from the wildcards its outputs are named from."""
    return os.path.normpath(os.path.relpath(os.path.abspath(log)))


def lock_path(key: str) -> Path:
    """The lock file of the job ``key``, relative to the working directory."""
    return LOCK_DIRECTORY / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.lock"


@dataclass
class JobLock:
    """A job's lock, held (``flock``) through the open file ``fd`` for as long as it is open in
    any process: this one, and the server's child it was passed to."""

    key: str
    fd: int
    started: str  # ISO time the lock was taken

    def record(self, pid: int, client: int | None = None) -> None:
        """Write who holds the lock into its file, one JSON line: ``pid`` (the process that runs
        the job), host, job key, start time, and the ``client`` when another process runs it."""
        write_holder(self.fd, {"pid": pid, "host": socket.gethostname(), "job": self.key,
                               "started": self.started, **({"client": client} if client else {})})  # fmt: skip

    def release(self) -> None:
        """Close this process's hold (the lock is free once no process holds it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def lock_job(key: str) -> JobLock:
    """Take the job's exclusive lock (:func:`lock_path`, created with its directory), without
    waiting, and record this process as its holder; :class:`JobAlreadyRunningError` (its message
    names the holder) when a live process holds it. The kernel releases it when every process
    holding it has closed it or died (:mod:`trainmap.locks`)."""
    path = lock_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    started = datetime.now().astimezone().isoformat(timespec="seconds")
    try:
        fd = hold(path, {"pid": os.getpid(), "host": socket.gethostname(), "job": key,
                         "started": started})  # fmt: skip
    except LockHeld as held:
        raise JobAlreadyRunningError(_already_running(key, path, held.holder)) from None
    return JobLock(key, fd, started)


def _already_running(key: str, path: Path, holder: dict[str, Any] | None) -> str:
    if holder is None:
        return f"job {key} is already running (its lock {path} is held); wait for it"
    pid, host = holder.get("pid"), holder.get("host")
    where = "" if host == socket.gethostname() else f" on host {host}"
    return (f"job {key} is already running (pid {pid} on host {host} since "
            f"{holder.get('started')}); wait for it or end it (kill {pid}{where})")  # fmt: skip


# --- the client ---------------------------------------------------------------------------------


def _submit(
    function: str, log: str, kwargs: dict[str, Any], lock: JobLock | None = None
) -> int | None:
    """Send the job to the server and wait for its status (None: no server to send it to).

    The locked file ``lock`` goes with the request (``SCM_RIGHTS``), so the server's child holds
    the lock too. The child answers its pid (its process group's id) first, then the status. After
    the status, or when the workflow is gone (then 1), or on SIGTERM/SIGINT (:class:`_Cancelled`,
    re-raised), the job's group is ended."""
    path = os.environ.get(SOCKET_ENV)
    if not path or os.environ.get(SWITCH_ENV) == "off":
        return None
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(path)
    except OSError:
        client.close()
        return None
    key = lock.key if lock is not None else job_key(log)
    request = {
        "function": function,
        "kwargs": kwargs,
        "log": str(Path(log).resolve()),
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "job": key,
    }
    payload = json.dumps(request).encode() + b"\n"
    watch = _WorkflowWatch()
    group = None
    with client:
        try:
            sent = 0 if lock is None else socket.send_fds(client, [payload], [lock.fd])
            client.sendall(payload[sent:])
            status = None
            for answer in _answers(client, watch):
                if "status" not in answer:  # the child's first line: its pid, its group's id
                    group = int(answer["pid"])
                    if lock is not None:
                        lock.record(group, client=os.getpid())
                    continue
                if answer.get("error"):
                    print(f"trainmap worker: {answer['error']}", file=sys.stderr)
                status = int(answer["status"])
                break
            if status is None:
                print(f"trainmap worker: the job {function} ended without a status; see {log}")
                status = 1
            if group is not None:  # what the job left behind (loky workers) ends with it
                end_group(group, END_GRACE_S)
            return status
        except _WorkflowGone as gone:
            print(f"trainmap: {gone}; ending the job {key}", file=sys.stderr, flush=True)
            _ignore_cancelling()
            if group is not None:
                end_group(group, stop_grace_s())
            return 1
        except _Cancelled:
            # The group is ended while the socket is still open: on EOF the child's watcher
            # would SIGTERM it a second time.
            _ignore_cancelling()
            if group is not None:
                end_group(group, stop_grace_s())
            raise


def _ignore_cancelling() -> None:
    """While the client ends its job, a further SIGTERM or SIGINT must not cut that short (when
    the client runs in the main thread, as a job script does: only it can change handlers)."""
    if threading.current_thread() is threading.main_thread():
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, signal.SIG_IGN)


def _answers(connection: socket.socket, watch: _WorkflowWatch) -> Iterator[dict[str, Any]]:
    """The child's reply lines, as they come; between them, the workflow watch
    (:class:`_WorkflowGone`) every :data:`WATCH_INTERVAL_S`. Ends at EOF."""
    connection.settimeout(WATCH_INTERVAL_S)
    buffer = b""
    while True:
        if b"\n" in buffer:
            line, _, buffer = buffer.partition(b"\n")
            yield json.loads(line)
            continue
        try:
            chunk = connection.recv(65536)
        except TimeoutError:
            reason = watch.gone()
            if reason is not None:
                raise _WorkflowGone(reason) from None
            continue
        if not chunk:
            return
        buffer += chunk


# --- the server -------------------------------------------------------------------------------


def serve(
    path: str,
    tracking_uris: tuple[str, ...] = (),
    job_modules: tuple[str, ...] = JOB_MODULES,
    experiment: str | None = None,
) -> None:
    """Import the warm modules (and open the tracking stores), then fork one child per job.

    ``path`` must lie in a directory only this user can enter (:func:`start_server` makes one).
    With ``experiment``, each store's schema and that experiment are created before the socket
    exists (:func:`trainmap.tracking.init_tracking`), so no job can start before them; a store that
    cannot be set up ends the server (exit 2, the reason in its log) before it serves anything.
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
    if experiment is None:
        _open_tracking_stores(tracking_uris)
    else:
        _init_tracking_stores(tracking_uris, experiment)
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
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # never the server's handler
                os.setpgid(0, 0)  # the job's own process group, before anything can join it
                server.close()
                _run_child(connection, job_modules)
            finally:
                os._exit(1)  # whatever happened, never back into the server's loop
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


def _init_tracking_stores(uris: tuple[str, ...], experiment: str) -> None:
    """Create each store's schema and ``experiment`` (what the Snakefile's ``onstart`` would do
    itself without a server); on any error, say so and exit 2 without serving."""
    from trainmap.tracking import init_tracking  # deferred: clients import this module

    for uri in uris:
        try:
            init_tracking(uri, experiment)
        except Exception as error:  # noqa: BLE001 - the workflow sets it up itself and reports it
            print(f"trainmap worker: could not set up tracking store {uri}: {error}", flush=True)
            sys.exit(2)


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


def _run_child(connection: socket.socket, job_modules: tuple[str, ...] = JOB_MODULES) -> NoReturn:
    """In the forked child (its process group's leader): read the request and the job's lock,
    answer this process's pid, run the job with SIGTERM a stop request, send its status, exit."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # subprocess.run must be able to wait again
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _fresh_database_connections()
    line, _lock_fd = _read_request(connection)  # the lock is held while this process lives
    if not line:  # a reachability probe
        os._exit(0)
    try:
        connection.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
    except OSError:  # the client is gone already: nothing has run
        os._exit(1)
    try:
        request = json.loads(line)
        function = job_function(request["function"], job_modules)
    except (RefusedJobError, ValueError, KeyError, TypeError, ImportError) as error:
        # Refused before anything runs or is written (no log, no chdir): tell the client why.
        reply = {"status": 2, "error": str(error) if isinstance(error, RefusedJobError)
                 else f"malformed job request ({type(error).__name__}: {error})"}  # fmt: skip
        connection.sendall(json.dumps(reply).encode() + b"\n")
        os._exit(2)
    status, finished, watcher = 1, threading.Event(), None
    key = str(request.get("job") or request["log"])
    try:
        connection.settimeout(None)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[JOB_ENV] = key
        _redirect_output(request["log"])
        apply_portable_mode(strict=True)  # the job's own $TRAINMAP_PORTABLE; torch has not run yet
        install_stop_handler()
        watcher = threading.Thread(target=_end_with_client, args=(connection, finished),
                                   daemon=True)  # fmt: skip
        watcher.start()
        _call_job(request["function"], request["log"], request["kwargs"], key, run=function)
        status = 0
    except JobStopped as stopped:
        print(f"trainmap: job {key}: {stopped}", file=sys.stderr)
        status = STOP_STATUS
    except BaseException:
        traceback.print_exc()
    finally:
        _end_child(connection, status, finished, watcher)


def _read_request(connection: socket.socket) -> tuple[bytes, int | None]:
    """The request line and the locked file that came with it (None: a client that sent none);
    (b"", None) when the client sent nothing (a probe)."""
    data, fds, _flags, _address = socket.recv_fds(connection, 65536, 1)
    for fd in fds:
        os.set_inheritable(fd, False)  # programs the job starts do not hold its lock
    buffer = data
    while data and b"\n" not in buffer:
        data = connection.recv(65536)
        buffer += data
    return buffer.partition(b"\n")[0], (fds[0] if fds else None)


def _end_child(
    connection: socket.socket, status: int, finished: threading.Event,
    watcher: threading.Thread | None,
) -> NoReturn:  # fmt: skip
    """Send the job's status and exit. If the client is gone, its watcher thread ends this
    process's group (after the grace, this process with it): wait for that instead."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the job is over: SIGTERM now just ends it
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    finished.set()
    try:
        connection.sendall(json.dumps({"status": status}).encode() + b"\n")
    except OSError:
        if watcher is not None:
            watcher.join(stop_grace_s() + 10)
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


def _end_with_client(connection: socket.socket, finished: threading.Event) -> None:
    """The child's watcher thread. The client sends nothing after its request: EOF means it is
    gone (killed, or it gave up). End the job then, as a client would, but from inside the group:
    SIGTERM to the group (the job's stop request; its helpers' SIGTERM), wait for the main thread
    to finish the job or for the grace to pass, then SIGKILL the group, this process included."""
    try:
        connection.recv(1)
    except OSError:
        pass
    _signal_own_group(signal.SIGTERM)
    finished.wait(stop_grace_s())
    _signal_own_group(signal.SIGKILL)


# --- starting and stopping it from the Snakefile ----------------------------------------------


@dataclass
class PendingServer:
    """A server :func:`launch_server` started that :func:`await_server` has not yet waited for."""

    process: subprocess.Popen
    path: str
    log: Path


def launch_server(
    directory: str | os.PathLike,
    tracking_uris: tuple[str, ...] = (),
    job_modules: tuple[str, ...] = JOB_MODULES,
    experiment: str | None = None,
) -> PendingServer | None:
    """Start a server for this workflow run and return at once, while it imports.

    ``directory``: where its log goes. ``tracking_uris``: tracking stores to open once in the
    server; with ``experiment`` the server also creates each store's schema and that experiment
    (:func:`trainmap.tracking.init_tracking`) before it answers any job, and exits without serving
    when it cannot. ``job_modules``: whose ``*_job`` functions it runs. Returns None (jobs run in
    their own processes) when disabled with ``TRAINMAP_WORKER=off``. The caller does other work
    meanwhile, then calls :func:`await_server` (or :func:`stop_server` to give up on it).
    """
    if os.environ.get(SWITCH_ENV) == "off":
        return None
    # Unix socket paths are limited to ~100 bytes: a short fresh directory in /tmp, created 0700
    # by mkdtemp (atomically, with a random name: nobody else can have prepared it).
    path = str(Path(tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX, dir="/tmp")) / "jobs.sock")
    log = Path(directory) / "worker.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    options = ["--jobs", ",".join(job_modules)]
    if experiment is not None:
        options += ["--experiment", experiment]
    with open(log, "w") as stream:
        process = subprocess.Popen(
            [sys.executable, "-m", "trainmap.worker", *options, path, *tracking_uris],
            stdout=stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return PendingServer(process, path, log)


def await_server(pending: PendingServer | None) -> subprocess.Popen | None:
    """Wait until a server :func:`launch_server` started answers; set its socket in the
    environment jobs inherit and return its process. None (jobs then run in their own processes)
    when there is none, or when it exited or did not answer within :data:`START_TIMEOUT_S`; with
    an ``experiment`` that means the tracking store was not set up either."""
    if pending is None:
        return None
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _reachable(pending.path):
        if pending.process.poll() is not None or time.monotonic() > deadline:
            pending.process.kill()
            pending.process.wait()
            _remove_socket_directory(pending.path)
            print(f"trainmap worker did not start (see {pending.log}); jobs run in their own "
                  "processes")  # fmt: skip
            return None
        time.sleep(0.05)
    os.environ[SOCKET_ENV] = pending.path
    return pending.process


def start_server(
    directory: str | os.PathLike,
    tracking_uris: tuple[str, ...] = (),
    job_modules: tuple[str, ...] = JOB_MODULES,
) -> subprocess.Popen | None:
    """Start a server for this workflow run and wait until it answers; set its socket in the
    environment jobs inherit (:func:`launch_server` then :func:`await_server`)."""
    return await_server(launch_server(directory, tracking_uris, job_modules))


def stop_server(process: subprocess.Popen | PendingServer | None) -> None:
    """Stop a server started by :func:`start_server`, or one :func:`launch_server` started and
    nobody waited for (its running jobs are not affected)."""
    if process is None:
        return
    if isinstance(process, PendingServer):
        path, process = process.path, process.process
    else:
        path = os.environ.get(SOCKET_ENV)
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
    if os.environ.get(SOCKET_ENV) == path:
        os.environ.pop(SOCKET_ENV)
    _remove_socket_directory(path)


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
    """``python -m trainmap.worker [--jobs MODULE[,MODULE]] [--experiment NAME] SOCKET
    [TRACKING_URI ...]``."""
    job_modules, experiment = JOB_MODULES, None
    while argv[:1] in (["--jobs"], ["--experiment"]):
        if argv[0] == "--jobs":
            job_modules = tuple(argv[1].split(","))
        else:
            experiment = argv[1]
        argv = argv[2:]
    serve(argv[0], tuple(argv[1:]), job_modules, experiment)


if __name__ == "__main__":
    main(sys.argv[1:])
