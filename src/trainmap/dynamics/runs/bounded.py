"""The 14 metrics of one large checkpoint in memory bounded by its counted weights' own size.

:func:`trainmap.dynamics.metrics.weights.trajectory_metrics` holds every counted matrix of a checkpoint in
float64 at once (and, for the pooled statistics, a float64 copy of all their entries side by
side): for a language model's checkpoint in float16, several times the file. Here one checkpoint
is measured entry by entry (:func:`~trainmap.dynamics.runs.layouts.read_entries`): each entry
read alone and taken to float64 once, each of its matrices (a fused attention matrix's heads one by
one, views of that copy) reduced to its per-matrix statistics by the same functions the trajectory
path calls, then dropped, and the heap's freed pages returned; only the entries' values are kept,
in their own dtype (float16 and float32 as they are, bfloat16 as float32), for the pooled mean,
median and variance (convention (e)). Peak memory is then about the counted weights in their own
dtype (half a Pythia checkpoint's file: the embeddings are left out) plus one entry in float64
(bench/suite_read.py).

The numbers are the trajectory path's: the per-matrix statistics and their means over matrices
come from the same functions on the same float64 values; the pooled median is the same order
statistic of the same values (a float16 value is exact in float64, and the two middle values are
averaged in float64); the pooled mean and variance are sums in float64 over chunks of the kept
values, equal to numpy's over the float64 copy up to summation order (tests: within 1e-12
relative). A matrix or bias that is not finite is left out of the pooled statistics and counted
in ``skipped_matrices``, as the trajectory path's repair does.
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from trainmap.dynamics.metrics.weights import (
    MATRIX_MEANS,
    MatrixSlice,
    PendingMetrics,
    WeightLayout,
    _clean_matrix,
    _matrix_statistics,
    _mean_over_matrices,
    _pooled_rows,
    metric_frames,
    statistics_rules,
    with_history,
)
from trainmap.dynamics.runs.layouts import read_entries

#: Values summed at a time for the pooled mean and variance (float64 work space: 32 MB).
SUM_CHUNK = 2**22


def bounded_checkpoint_metrics(
    path: Path, step: int, layout: WeightLayout, shapes: Mapping[str, tuple[int, ...]],
    history: pd.DataFrame, convention: str = "paper",
) -> pd.DataFrame:  # fmt: skip
    """One checkpoint's row of :func:`trainmap.dynamics.metrics.weights.collect_run_metrics`'s table
    (``step``, the 14 metrics, ``n_matrices``, ``skipped_matrices`` and the history columns at
    ``step`` from ``history``), computed entry by entry (module docstring). ``shapes``: the
    checkpoint's entries' shapes (its header), which size the kept values once."""
    rules = statistics_rules(convention)
    by_name: dict[str, list[MatrixSlice]] = {}
    for matrix in layout.matrices:
        by_name.setdefault(matrix.name, []).append(matrix)
    pooled = _PooledEntries(sum(math.prod(shapes[name]) for name in by_name))
    measured: dict[int, dict] = {}  # id of the matrix -> its statistics
    for name, tensor in read_entries(path, list(by_name)):
        # float64 once per entry: each head slice of a fused matrix is then a view of one copy
        state = {name: tensor.to(torch.float64).unsqueeze(0)}
        for matrix in by_name[name]:
            finite, clean = _clean_matrix(state, matrix, None)
            found = _matrix_statistics(finite, clean, matrix.kind, rules)
            entries = found.pop("entries")
            if bool(finite[0]):
                pooled.add(entries[0].to(tensor.dtype))
            measured[id(matrix)] = found
        del state, tensor, entries
        _release_freed_memory()
    stats = [measured[id(matrix)] for matrix in layout.matrices]  # the layout's order, as summed
    values = {key: _mean_over_matrices(stats, key) for key in MATRIX_MEANS[rules]}
    biases = [
        b.to(torch.float64).reshape(1, -1) for _, b in read_entries(path, list(layout.biases))
    ]
    kept_biases = [b for b in biases if bool(torch.isfinite(b).all())]
    if rules == "extended":
        valid = [s["singular"] for s in stats if bool(s["finite"][0])]
        values["sv_mean"], _, values["sv_var"] = _pooled_rows(valid, 1)
    values["w_mean"], values["w_median"], values["w_var"] = pooled.statistics()
    values["b_mean"], values["b_median"], values["b_var"] = _pooled_rows(kept_biases, 1)
    values["finite_matrices"] = torch.stack([s["finite"] for s in stats]).sum(dim=0)
    values["clean"] = np.ones(1, dtype=bool)  # the pooled statistics already leave out the rest
    frame = metric_frames([PendingMetrics(values, len(stats), _no_repair)])[0]
    frame.insert(0, "step", [step])
    return with_history(frame, history)


def _release_freed_memory() -> None:
    """Give the pages of the entry just measured back to the system (glibc's ``malloc_trim``;
    elsewhere nothing): its float64 copies, tens of MB each, are freed into the heap, whose
    threshold for mapping large blocks grows with them, and the heap keeps what it frees."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library this process runs on, when it has ``malloc_trim`` (glibc), else None."""
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols, the C library's among them
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def _no_repair(t: int) -> dict[str, np.ndarray]:
    raise AssertionError(
        "the bounded path's pooled statistics already leave out non-finite tensors"
    )


class _PooledEntries:
    """The counted matrices' entries, kept in one array of their own dtype (bfloat16 as float32,
    which numpy has; widened if a later entry needs it) of room for ``capacity`` values, for the
    pooled statistics (convention (e): mean, median, variance without Bessel)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.values: np.ndarray | None = None
        self.size = 0

    def add(self, entries: torch.Tensor) -> None:
        if entries.dtype == torch.bfloat16:
            entries = entries.to(torch.float32)
        part = entries.contiguous().numpy()
        if self.values is None:
            self.values = np.empty(self.capacity, dtype=part.dtype)
        elif not np.can_cast(part.dtype, self.values.dtype, "safe"):
            self.values = self.values.astype(np.result_type(self.values, part))
        self.values[self.size : self.size + part.size] = part
        self.size += part.size

    def statistics(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``[1]`` arrays of the mean, median and variance of every entry kept (NaN without
        any)."""
        if self.values is None or not self.size:
            return np.full(1, np.nan), np.full(1, np.nan), np.full(1, np.nan)
        values, n = self.values[: self.size], self.size
        mean = sum(_chunks(values, lambda x: x.sum())) / n
        variance = sum(_chunks(values, lambda x: np.square(x - mean).sum())) / n
        values.partition(sorted({(n - 1) // 2, n // 2}))  # in place: the values' order statistics
        median = (np.float64(values[(n - 1) // 2]) + np.float64(values[n // 2])) / 2
        self.values = None
        return np.array([mean]), np.array([median]), np.array([variance])


def _chunks(values: np.ndarray, reduce: Callable[[np.ndarray], float]) -> list[float]:
    """``reduce`` of each :data:`SUM_CHUNK` of ``values`` taken to float64."""
    return [float(reduce(values[i : i + SUM_CHUNK].astype(np.float64)))
            for i in range(0, values.size, SUM_CHUNK)]  # fmt: skip
