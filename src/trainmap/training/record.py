"""What the training loop keeps of each checkpoint: its metric rows and its archived weights.

At each checkpoint the loop hands :meth:`CheckpointRecorder.capture` the block's state (seed
dimension first, on the training device). The recorder

* computes the 14 metrics of every convention for every active seed at once
  (:class:`trainmap.dynamics.streamed.StreamedMetrics`) and appends each seed's rows to its
  ``checkpoint_metrics.csv`` as training goes (at least every :data:`FLUSH_S` seconds, and
  whenever the resume file is written);
* writes the checkpoint of every active seed to its archive when ``train.<task>.archive`` keeps
  that step (:mod:`trainmap.training.archive`: one safetensors file per checkpoint and seed).

Nothing else is kept: a block's memory and its resume file (which holds the metric rows so far,
:meth:`CheckpointRecorder.state_dict`) do not grow with the number of checkpoints beyond those rows
(about 20 numbers per variant and checkpoint). A resumed run rewrites each seed's table from the
rows in its resume file and goes on appending; the table a finished run leaves is written whole at
the end (:meth:`CheckpointRecorder.finish`), so its bytes do not depend on where it was resumed.
"""

from __future__ import annotations

import csv
import math
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from trainmap.dynamics.streamed import STREAMED_COLUMNS, StreamedMetrics
from trainmap.io import write_atomic
from trainmap.training.archive import (
    ArchivePolicy,
    archive_directory,
    checkpoint_file,
    write_checkpoint,
)

#: The longest a table's new rows wait in memory before they are appended to its file (seconds).
FLUSH_S = 30.0


class CheckpointRecorder:
    """The metric rows and archive files of a block's checkpoints.

    ``structure``: a model of the runs' architecture (its layout decides which weights count; the
    dense architecture for a sparse run); ``tables`` and ``run_directories``: per seed, its
    ``checkpoint_metrics.csv`` and its run directory (the archive goes in its ``checkpoints/``);
    ``checkpoints``: every step the loop will checkpoint; ``policy``: which of them are archived.
    """

    def __init__(
        self,
        structure: nn.Module,
        tables: Sequence[Path],
        run_directories: Sequence[Path],
        checkpoints: Sequence[int],
        policy: ArchivePolicy,
    ) -> None:
        self.metrics = StreamedMetrics(structure, deploy=not policy.full)
        self.tables = [Path(path) for path in tables]
        self.run_directories = [Path(path) for path in run_directories]
        self.policy = policy
        self.archived = set(policy.kept_steps(list(checkpoints)))
        self.rows: list[list[dict[str, Any]]] = [[] for _ in self.tables]
        self.written = [0] * len(self.tables)  # rows of each table already in its file
        self.flushed_at = time.monotonic()
        # seconds spent on the metrics and on writing the archive, in this process (timing only)
        self.metrics_s = self.archive_s = 0.0

    @torch.no_grad()
    def capture(self, step: int, state: Mapping[str, torch.Tensor], active: Sequence[int]) -> None:
        """Record checkpoint ``step`` of the ``active`` seeds (``state``: every seed's, stacked)."""
        active = list(active)
        if not active:
            return
        size = next(iter(state.values())).shape[0]
        started = time.perf_counter()
        chosen = state if len(active) == size else {k: v[active] for k, v in state.items()}
        for index, rows in zip(active, self.metrics.rows(chosen, step), strict=True):
            self.rows[index] += rows
        if time.monotonic() - self.flushed_at >= FLUSH_S or not any(self.written):
            self.flush()
        archiving = time.perf_counter()
        self.metrics_s += archiving - started
        if step in self.archived:
            for position, index in enumerate(active):
                seed_state = {name: value[position] for name, value in chosen.items()}
                write_checkpoint(checkpoint_file(self.run_directories[index], step), seed_state,
                                 self.policy.torch_dtype)  # fmt: skip
        self.archive_s += time.perf_counter() - archiving

    def flush(self) -> None:
        """Append each table's new rows to its file (the first time, write it whole). Called at
        least every :data:`FLUSH_S` seconds of checkpoints and when the resume file is written."""
        for index, rows in enumerate(self.rows):
            new = rows[self.written[index] :]
            if not new:
                continue
            if not self.written[index] or not self.tables[index].exists():
                self._rewrite(index)
            else:  # to this process's own file (the first write renamed it into place); the
                # table is rewritten whole, atomically, at the end
                with open(self.tables[index], "a", newline="") as stream:
                    csv.writer(stream).writerows(
                        [_cell(row.get(column)) for column in STREAMED_COLUMNS] for row in new
                    )
            self.written[index] = len(rows)
        self.flushed_at = time.monotonic()

    def _rewrite(self, index: int) -> None:
        frame = pd.DataFrame(self.rows[index], columns=STREAMED_COLUMNS)
        self.tables[index].parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.tables[index], lambda tmp: frame.to_csv(tmp, index=False))

    def start_fresh(self) -> None:
        """Before a run's first step: remove what an earlier run of these seeds left (its table and
        archive), so no file of another configuration stays beside the new run's."""
        for table, directory in zip(self.tables, self.run_directories, strict=True):
            table.unlink(missing_ok=True)
            shutil.rmtree(archive_directory(directory), ignore_errors=True)

    def finish(self, index: int) -> None:
        """Write seed ``index``'s final table whole (the same bytes however the run went)."""
        self._rewrite(index)
        self.written[index] = len(self.rows[index])

    def state_dict(self) -> dict[str, Any]:
        """The rows so far (for a resume file; the tables on disk are brought up to them)."""
        self.flush()
        return {"rows": [list(rows) for rows in self.rows]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`: each table is rewritten to the rows it holds (rows a
        killed run appended after its resume point are dropped; they will come again)."""
        self.rows = [list(rows) for rows in state["rows"]]
        for index, rows in enumerate(self.rows):
            if rows:
                self._rewrite(index)
            self.written[index] = len(rows)


def _cell(value: Any) -> Any:
    """A value as pandas writes it (a float by its shortest exact repr, NaN as an empty cell)."""
    if isinstance(value, float):  # numpy's float64 too: its repr would be 'np.float64(...)'
        return "" if math.isnan(value) else float.__repr__(float(value))
    return "" if value is None else value
