"""What the training loop keeps of each checkpoint: its metric rows and its archived weights.

At each checkpoint the loop hands :meth:`CheckpointRecorder.capture` the block's state (seed
dimension first, on the training device). The recorder

* computes the 14 metrics of every convention for every active seed at once
  (:class:`trainmap.dynamics.metrics.streamed.StreamedMetrics`) and appends each seed's rows to its
  ``checkpoint_metrics.csv`` as training goes (at least every :data:`FLUSH_S` seconds, whenever
  the resume file is written, and at the end), formatted as pandas writes them;
* writes the checkpoint of every active seed to its archive when ``train.<task>.archive`` keeps
  that step (:mod:`trainmap.training.archive`: one safetensors file per checkpoint and seed).

Nothing else is kept: rows wait in memory only until the next append, and the resume file holds
only how many rows each table had when it was written (:meth:`CheckpointRecorder.state_dict`), so
neither grows with the number of checkpoints. A resumed run cuts each table back to that many rows
(rows a killed run appended after its resume point come again) and goes on appending, so a
finished table's bytes do not depend on where the run was resumed.
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

from trainmap.dynamics.metrics.streamed import STREAMED_COLUMNS, StreamedMetrics
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
        self.rows: list[list[dict[str, Any]]] = [[] for _ in self.tables]  # not yet on disk
        self.written = [0] * len(self.tables)  # rows of each table already in its file
        self.started = [False] * len(self.tables)  # whether each table's file was begun
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
        if time.monotonic() - self.flushed_at >= FLUSH_S or not all(self.started):
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
        """Append each table's new rows to its file (the first time, write it whole, header
        included) and let go of them. Called at least every :data:`FLUSH_S` seconds of
        checkpoints, when the resume file is written, and at the end."""
        for index, rows in enumerate(self.rows):
            if not self.started[index]:
                frame = pd.DataFrame(rows, columns=STREAMED_COLUMNS)
                self.tables[index].parent.mkdir(parents=True, exist_ok=True)
                write_atomic(self.tables[index], lambda tmp, f=frame: f.to_csv(tmp, index=False))
                self.started[index] = True
            elif rows:  # to this process's own file (the first write renamed it into place)
                if not self.tables[index].exists():
                    raise FileNotFoundError(
                        f"{self.tables[index]} was removed while its run was training; its rows "
                        "so far are lost: rerun the job (the block then starts over from step 0)"
                    )
                with open(self.tables[index], "a", newline="") as stream:
                    csv.writer(stream, lineterminator="\n").writerows(
                        [_cell(row.get(column)) for column in STREAMED_COLUMNS] for row in rows
                    )
            self.written[index] += len(rows)
            self.rows[index] = []
        self.flushed_at = time.monotonic()

    def start_fresh(self) -> None:
        """Before a run's first step: remove what an earlier run of these seeds left (its table and
        archive), so no file of another configuration stays beside the new run's."""
        for table, directory in zip(self.tables, self.run_directories, strict=True):
            table.unlink(missing_ok=True)
            shutil.rmtree(archive_directory(directory), ignore_errors=True)

    def finish(self, index: int) -> None:
        """Bring seed ``index``'s table up to its last row (a header alone when it has none)."""
        if self.rows[index] or not self.started[index]:
            self.flush()

    def state_dict(self) -> dict[str, Any]:
        """How many rows each table holds (for a resume file: the tables are flushed first)."""
        self.flush()
        return {"written": list(self.written)}

    def load_state_dict(self, state: Mapping[str, Any]) -> bool:
        """Continue from :meth:`state_dict`: each table is cut back to the rows it held then (rows
        a killed run appended after its resume point are dropped; they will come again). False,
        and nothing changed, when a table no longer holds those rows (cut short or removed since:
        the run starts over instead)."""
        counts = list(state.get("written", ()))
        if len(counts) != len(self.tables):
            return False
        prefixes = []
        for table, count in zip(self.tables, counts, strict=True):
            prefix = _first_lines(table, count + 1) if count else b""
            if count and prefix.count(b"\n") < count + 1:
                return False
            prefixes.append(prefix)
        for index, (table, count, prefix) in enumerate(zip(self.tables, counts, prefixes,
                                                           strict=True)):  # fmt: skip
            self.rows[index], self.written[index], self.started[index] = [], count, count > 0
            if count == 0:
                table.unlink(missing_ok=True)
            else:
                write_atomic(table, lambda tmp, kept=prefix: Path(tmp).write_bytes(kept))
        return True


def _first_lines(table: Path, lines: int) -> bytes:
    """The first ``lines`` lines of ``table`` (fewer when it is shorter; none without a file),
    read no further."""
    if not table.exists():
        return b""
    with open(table, "rb") as stream:
        return b"".join(line for _, line in zip(range(lines), stream, strict=False))


def _cell(value: Any) -> Any:
    """A value as pandas writes it (a float by its shortest exact repr, NaN as an empty cell)."""
    if isinstance(value, float):  # numpy's float64 too: its repr would be 'np.float64(...)'
        return "" if math.isnan(value) else float.__repr__(float(value))
    return "" if value is None else value
