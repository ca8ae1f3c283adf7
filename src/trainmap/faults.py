"""Named fault points, armed by ``$TRAINMAP_FAULT``: the fault tier (``make test-faults``) stops a
study at an exact place of its work, not after a wall-clock delay.

``TRAINMAP_FAULT`` holds one or more comma-separated specs ``POINT:N[:ACTION][@JOB]``: the ``N``-th
time (counted from 1, per process) a process passes fault point ``POINT`` while running a job whose
key (``$TRAINMAP_JOB``: its log path) contains ``JOB``, it does ``ACTION``:

* ``kill`` (the default): SIGKILL the workflow that started the job (``$TRAINMAP_WORKFLOW_PID``,
  the Snakemake process), then this process: the machine's view of a crash at that point.
* ``fsize``: cap the size of any file this process writes from here on at :data:`FSIZE_LIMIT`
  bytes (``RLIMIT_FSIZE``; SIGXFSZ ignored, so a write past it fails with ``EFBIG``): a disk
  that fills during the write that follows.
* ``pause``: write this process's pid into the file ``$TRAINMAP_FAULT_GATE`` and wait until that
  file is removed: a run held open while another is started beside it.

The points (:data:`POINTS`) sit in the code they name; with ``$TRAINMAP_FAULT`` unset a point costs
one environment lookup.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

FAULT_ENV = "TRAINMAP_FAULT"
GATE_ENV = "TRAINMAP_FAULT_GATE"
#: The job the process runs (its log path; set by :func:`trainmap.worker.run_job`).
JOB_ENV = "TRAINMAP_JOB"
#: The workflow process that started the job (set by the Snakefile's ``onstart``).
WORKFLOW_PID_ENV = "TRAINMAP_WORKFLOW_PID"
#: The file-size cap of the ``fsize`` action: below a checkpoint's size (the smoke study's smallest,
#: 24 kB), above a failing job's log (its traceback and the tracking store's errors).
FSIZE_LIMIT = 16384

#: Every fault point, by name: where it sits.
POINTS = {
    "checkpoint": "trainmap.training.archive.write_checkpoint: a checkpoint of one seed, before "
    "its bytes are written to the temporary file",
    "torch-write": "trainmap.io.save_torch: a checkpoint, resume state or model file, before its "
    "bytes are written to the temporary file",
    "rename": "trainmap.io.atomic_path: a result file fully written to its temporary name, "
    "before the rename that publishes it",
    "analysis": "trainmap.jobs.analysis.fit_hmm_job: a group's map fitted and written, before "
    "its MLflow run ends",
    "dvc-commit": "trainmap.grid.dvc_record.commit_outputs: inside `dvc commit`, once N files "
    "of the run are in DVC's cache",
}
ACTIONS = ("kill", "fsize", "pause")


@dataclass(frozen=True)
class FaultSpec:
    """One armed fault: at the ``n``-th pass of ``point`` in a job whose key contains ``job``."""

    point: str
    n: int
    action: str = "kill"
    job: str = ""

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """``POINT:N[:ACTION][@JOB]``; a ValueError names the bad part."""
        where, _, job = text.strip().partition("@")
        parts = where.split(":")
        if len(parts) not in (2, 3) or parts[0] not in POINTS or not parts[1].isdigit():
            raise ValueError(f"${FAULT_ENV}: {text!r} is not POINT:N[:ACTION][@JOB] with POINT in "
                             f"{', '.join(POINTS)} and N a positive integer")  # fmt: skip
        action = parts[2] if len(parts) == 3 else "kill"
        if action not in ACTIONS or int(parts[1]) < 1:
            raise ValueError(f"${FAULT_ENV}: {text!r}: ACTION is one of {', '.join(ACTIONS)} "
                             "and N counts from 1")  # fmt: skip
        return cls(parts[0], int(parts[1]), action, job)


_passes: dict[tuple[int, str], int] = {}


def armed(point: str) -> list[FaultSpec]:
    """The specs of ``$TRAINMAP_FAULT`` at ``point`` for the job this process runs."""
    text = os.environ.get(FAULT_ENV)
    if not text:
        return []
    job = os.environ.get(JOB_ENV, "")
    specs = [FaultSpec.parse(part) for part in text.split(",") if part.strip()]
    return [spec for spec in specs if spec.point == point and spec.job in job]


def fault_point(point: str) -> None:
    """Count a pass of ``point`` in this process and do the action of a spec it reaches."""
    specs = armed(point)
    if not specs:
        return
    key = (os.getpid(), point)  # a forked job process counts from its own start
    _passes[key] = _passes.get(key, 0) + 1
    for spec in specs:
        if spec.n == _passes[key]:
            act(spec)


def act(spec: FaultSpec) -> None:
    """Do ``spec.action`` now."""
    if spec.action == "fsize":
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, hard))
    elif spec.action == "pause":
        gate = Path(os.environ[GATE_ENV])
        gate.write_text(str(os.getpid()))
        while gate.exists():
            time.sleep(0.05)
    else:
        kill_workflow_and_self()


def kill_workflow_and_self() -> None:
    """SIGKILL the workflow that started this job (if known), then this process."""
    workflow = os.environ.get(WORKFLOW_PID_ENV)
    if workflow and int(workflow) != os.getpid():
        try:
            os.kill(int(workflow), signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def kill_when_cached(process: subprocess.Popen, cache: Path) -> None:
    """Point ``dvc-commit``: once ``process`` (a ``dvc commit``) has put N files into the DVC
    cache ``cache`` (counted as it goes, not after a delay), SIGKILL it, then the workflow and
    this process. Returns only if the commit ended first (the fault did not fire)."""
    spec = armed("dvc-commit")[0]
    before = _cached_files(cache)
    while process.poll() is None:
        if _cached_files(cache) - before >= spec.n:
            process.kill()
            process.wait()
            kill_workflow_and_self()
        time.sleep(0.005)


def _cached_files(cache: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(cache))
