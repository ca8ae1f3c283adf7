"""Which GPU of a node a training job runs on, when Snakemake runs several at once on one machine.

Snakemake's ``gpu`` resource only counts jobs (``--resources gpu=4``); it does not say which device
each job gets, so without help every job of a multi-GPU node would train on ``cuda:0``. A job whose
task trains on ``cuda`` therefore claims a GPU before torch starts CUDA (:func:`gpu_slot`): among
the node's GPUs (``nvidia-smi``), the one with the least memory reserved by running trainmap jobs
that still has room for this job's planned device memory (``trainmap.plan``; several small blocks
share a GPU where the plan says they fit), and sets ``CUDA_VISIBLE_DEVICES`` to it for the job.
The reservations live in a ledger beside a lock file (one per user and node, in the temporary
directory); a reservation whose process has died is dropped, so a killed job frees its GPU.

Nothing is claimed where a scheduler or the user already chose (``CUDA_VISIBLE_DEVICES`` set, as
SLURM does for ``--gpus``), for an explicit ``cuda:<i>``, or on the CPU.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from trainmap.processes import process_alive

VISIBLE = "CUDA_VISIBLE_DEVICES"


def node_gpus() -> list[tuple[int, int]]:
    """``(index, memory in MB)`` of each GPU ``nvidia-smi`` lists; none without it."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [tuple(int(part) for part in line.split(",")) for line in listed.splitlines() if line]


def default_ledger() -> Path:
    """This user's reservations on this node."""
    return Path(tempfile.gettempdir()) / f"trainmap-gpus-{os.getuid()}" / "reserved.json"


@contextmanager
def gpu_slot(
    device: str,
    planned_mb: int,
    *,
    gpus: Sequence[tuple[int, int]] | None = None,
    ledger: Path | None = None,
    wait_s: float = 3600.0,
    poll_s: float = 5.0,
) -> Iterator[int | None]:
    """Run the block within: on a node's GPU with room for ``planned_mb`` (see the module
    docstring); yields the GPU's index, or None where nothing is claimed. Waits up to ``wait_s``
    for room; a job the largest GPU cannot hold is an error naming the key."""
    if device != "cuda" or os.environ.get(VISIBLE) is not None:
        yield None
        return
    gpus = list(node_gpus() if gpus is None else gpus)
    if not gpus:  # no nvidia-smi: torch decides (and says so if there is no GPU)
        yield None
        return
    largest = max(memory for _, memory in gpus)
    if planned_mb > largest:
        raise ValueError(
            f"train.<task>.seed_block: the plan puts this job at {planned_mb:,} MB of device "
            f"memory, more than this node's largest GPU holds ({largest:,} MB); make the block "
            "smaller or use a larger GPU"
        )
    ledger = ledger or default_ledger()
    ledger.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    claim = f"{os.getpid()}:{time.monotonic_ns()}"
    deadline = time.monotonic() + wait_s
    while (index := _reserve(ledger, gpus, claim, planned_mb)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no GPU of this node had {planned_mb:,} MB free for {wait_s:g} s")
        time.sleep(poll_s)
    before = os.environ.get(VISIBLE)
    os.environ[VISIBLE] = str(index)
    try:
        yield index
    finally:
        if before is None:
            os.environ.pop(VISIBLE, None)
        else:
            os.environ[VISIBLE] = before
        with _locked(ledger) as reservations:
            reservations.pop(claim, None)


def _reserve(
    ledger: Path, gpus: Sequence[tuple[int, int]], claim: str, planned_mb: int
) -> int | None:
    """Reserve ``planned_mb`` on the least reserved GPU with room; its index, or None."""
    with _locked(ledger) as reservations:
        used = {index: 0 for index, _ in gpus}
        for owner, (index, megabytes) in list(reservations.items()):
            if not process_alive(int(owner.split(":")[0])):
                del reservations[owner]  # a job that died without releasing its GPU
            elif index in used:
                used[index] += megabytes
        room = [
            (used[index], index) for index, memory in gpus if used[index] + planned_mb <= memory
        ]
        if not room:
            return None
        index = min(room)[1]
        reservations[claim] = (index, planned_mb)
        return index


@contextmanager
def _locked(ledger: Path) -> Iterator[dict[str, tuple[int, int]]]:
    """The ledger's reservations, read and written back under an exclusive lock."""
    with open(ledger.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            reservations = (
                {k: tuple(v) for k, v in json.loads(ledger.read_text()).items()}
                if ledger.exists()
                else {}
            )
            yield reservations
            temporary = ledger.with_suffix(".tmp")
            temporary.write_text(json.dumps(reservations))
            temporary.replace(ledger)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
