"""Metrics recorded inside any training loop: a run's metric table written as training goes, so
no checkpoint needs keeping.

One line in a plain loop::

    from trainmap.recorder import MetricRecorder

    recorder = MetricRecorder("runs/seed0")          # once, before training
    recorder.log(model, step, test_acc=accuracy)     # at each evaluation

or one callback in a framework's trainer: :class:`trainmap.recorder.lightning.MetricCallback`
(a Lightning ``Callback``) or :class:`trainmap.recorder.huggingface.MetricCallback` (a
``transformers.TrainerCallback``). Each :meth:`MetricRecorder.log` computes the 14 weight metrics of
the model's current weights and rewrites the run's ``metrics.csv`` atomically: ``step``, the 14
metrics, ``n_matrices``, ``skipped_matrices`` and the evaluation columns logged (``test_acc``,
``test_loss``, ``train_acc``, ``train_loss``) - the table format of
:func:`trainmap.dynamics.metrics.weights.collect_run_metrics`, which ``python -m trainmap.dynamics`` maps
directly (a directory of such runs, or the tables themselves).

The metrics are computed as for checkpoints read afterwards
(:func:`trainmap.dynamics.runs.external.external_run_metrics`): the same layout of the state dict (by
name and shape, with ``heads`` for attention; :func:`trainmap.dynamics.runs.external.run_layout`) and the
same :func:`trainmap.dynamics.metrics.weights.trajectory_metrics` the training loop streams its metrics
with, on the weights in float64. The numbers equal those of the same weights saved and read back
(tests/unit/recorder/test_recorder.py: exactly equal on the CPU, 1e-12 required).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from trainmap import check_torch
from trainmap.dynamics.metrics.columns import CONVENTIONS, HISTORY_COLUMNS, METRIC_NAMES
from trainmap.dynamics.metrics.weights import WeightLayout, trajectory_metrics
from trainmap.io import write_atomic

check_torch(torch.__version__)

#: The recorded table's file name in the run's directory (what the command line looks for).
METRICS_FILE = "metrics.csv"
COLUMNS = ["step", *METRIC_NAMES, "n_matrices", "skipped_matrices", *HISTORY_COLUMNS]


class MetricRecorder:
    """Records one run's metric table in ``directory`` (created if missing) as training goes.

    ``convention``: the metric convention (:data:`trainmap.dynamics.metrics.columns.CONVENTIONS`, default
    ``paper``); ``heads``: attention heads, to split query/key/value projections per head as the
    paper does (default: whole matrices). A step already recorded is refused (a resumed run
    continues its own table: an existing ``metrics.csv`` is read back and extended)."""

    def __init__(self, directory: str | os.PathLike, convention: str = "paper",
                 heads: int | None = None) -> None:  # fmt: skip
        if convention not in CONVENTIONS:
            raise ValueError(f"convention {convention!r}: not one of {', '.join(CONVENTIONS)}")
        self.directory = Path(directory)
        self.path = self.directory / METRICS_FILE
        self.convention, self.heads = convention, heads
        self.layout: WeightLayout | None = None
        self.rows: list[dict[str, Any]] = []
        if self.path.is_file():
            self.rows = pd.read_csv(self.path).to_dict("records")

    def log(
        self, model: nn.Module | dict[str, torch.Tensor], step: int, **evaluation: float
    ) -> dict:
        """Record ``model``'s weights (a module or its state dict) at ``step`` with its
        ``evaluation`` (any of ``test_acc``, ``test_loss``, ``train_acc``, ``train_loss``; a
        tensor is read as a number): compute the 14 metrics, append the row and rewrite the
        table. Returns the row."""
        from trainmap.dynamics.runs.external import run_layout

        unknown = sorted(set(evaluation) - set(HISTORY_COLUMNS))
        if unknown:
            raise ValueError(f"log(): unknown evaluation column(s) {unknown}; use "
                             f"{', '.join(HISTORY_COLUMNS)}")  # fmt: skip
        step = int(step)
        if any(int(row["step"]) == step for row in self.rows):
            raise ValueError(f"{self.path}: step {step} is already recorded; log each step once")
        state = model.state_dict() if isinstance(model, nn.Module) else model
        weights = {name: value.detach().to("cpu")[None] for name, value in state.items()
                   if isinstance(value, torch.Tensor) and value.is_floating_point()}  # fmt: skip
        if self.layout is None:
            shapes = {name: tuple(value.shape[1:]) for name, value in weights.items()}
            self.layout = run_layout(shapes, self.path, self.convention, self.heads, None)
        frame = trajectory_metrics(weights, self.layout, self.convention)
        row = {"step": step, **frame.iloc[0].to_dict()}
        row |= {column: _number(evaluation.get(column)) for column in HISTORY_COLUMNS}
        self.rows.append(row)
        self.directory.mkdir(parents=True, exist_ok=True)
        table = pd.DataFrame(self.rows)[COLUMNS].sort_values("step", kind="stable")
        write_atomic(self.path, lambda tmp: table.to_csv(tmp, index=False))
        return row


def _number(value: Any) -> float:
    if value is None:
        return math.nan
    if isinstance(value, torch.Tensor):
        return float(value.detach().to("cpu").item())
    return float(value)
