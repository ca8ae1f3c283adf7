"""The resume file: a block's whole training state (stacked model and optimiser state, every
seed's batch order, RNG, histories so far, how many rows each metric table holds, the hooks'
state), written atomically every ``resume_every`` steps with the wall time so far in its timing
sidecar, and read back by a rerun under the same configuration fingerprint."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from trainmap.io import load_resume_or_none, load_timing, save_timing, save_torch
from trainmap.training.divergence import SeedRecord
from trainmap.training.hooks import TrainHooks
from trainmap.training.record import CheckpointRecorder
from trainmap.training.scores import RunningMeans
from trainmap.training.seed_block import SeedBlock
from trainmap.training.step import BlockBatches


def training_state(block: SeedBlock, optimizer: torch.optim.Optimizer,
                   batches: BlockBatches, running: RunningMeans, records: list[SeedRecord],
                   hooks: TrainHooks, *, kept: bool = False) -> dict[str, Any]:  # fmt: skip
    """The block's training state: stacked model and optimiser state, every seed's batch order,
    RNG, running means, per-seed records and the hooks' state. What the resume file holds besides
    the metric row counts; with ``kept``, what an interval whose losses are checked late runs
    again from: held in memory, so the optimiser's and the hooks' state are copied (the file
    serialises them at once), and without the histories (nothing appends to them between
    checks)."""
    held = copy.deepcopy if kept else (lambda value: value)
    return {
        "block": {key: value.detach().clone() for key, value in block.state().items()},
        "optimizer": held(optimizer.state_dict()),
        "samplers": batches.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
        "running": running.state_dict(),
        "records": [
            {key: value for key, value in vars(record).items() if not kept or key != "history"}
            for record in records
        ],
        "hooks": held(hooks.state_dict()),
    }


def save_resume(path: Path, fingerprint: str, step: int, block: SeedBlock,
                optimizer: torch.optim.Optimizer, batches: BlockBatches,
                recorder: CheckpointRecorder, running: RunningMeans, records: list[SeedRecord],
                hooks: TrainHooks, elapsed: float) -> None:  # fmt: skip
    """Write the block's training state after ``step`` optimiser steps to the resume file ``path``
    (atomically, under the configuration's ``fingerprint``), and the wall time so far,
    ``elapsed`` seconds, to the file's timing sidecar."""
    # The time so far goes beside the file (seeds0-31.resume.timing.json), so the resume file of
    # a step is the same bytes in every run, like every other file trainmap writes.
    save_timing({"elapsed_s": elapsed}, path)
    state = training_state(block, optimizer, batches, running, records, hooks)
    save_torch({"fingerprint": fingerprint, "step": step, **state,
                "recorder": recorder.state_dict()}, path)  # fmt: skip


def load_resume(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """The training state :func:`save_resume` wrote to ``path`` under ``fingerprint``, with its
    ``elapsed_s``; None when there is no file, it is damaged, or it holds another configuration or
    an older trainmap's state (the run then starts from step 0)."""
    saved = load_resume_or_none(path)  # none, or a damaged file (deleted): start from step 0
    if saved is None or saved.get("fingerprint") != fingerprint or "recorder" not in saved:
        # A different configuration, or a resume file of an older trainmap (one seed, no block
        # state, or every checkpoint's weights): start over; the file is replaced later.
        return None
    # Resume files of an older trainmap held the time themselves; a missing sidecar costs only
    # the reported wall time of the part before the resume.
    saved.setdefault("elapsed_s", load_timing(path).get("elapsed_s", 0.0))
    return saved
