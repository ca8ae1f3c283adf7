"""Per-run metric tables, read strictly: a damaged table stops the analysis and says where.

Every analysis step reads the tables of :mod:`trainmap.dynamics.metrics.weights` (``metrics.csv``: ``step``,
the 14 metric columns, ``n_matrices``, ``skipped_matrices``, the run's history columns) through
:func:`read_metric_table`: the workflow's jobs (``trainmap.jobs``) and ``python -m
trainmap.dynamics``. It raises :class:`MetricTableError` naming the file, the column, the step and
the fix when

* a required column (``step`` and the metric columns the analysis uses) is missing;
* a cell of a numeric column holds text;
* a ``step`` is not a whole number;
* a metric is NaN or infinite in a run that did not diverge.

A metric may be non-finite without damage in three ways, and only these pass:

* the run diverged (its evaluation's status ``diverged``): its last checkpoints may hold NaN or
  infinite weights, whose metrics are then NaN (:mod:`trainmap.dynamics.metrics.weights` skips
  non-finite matrices, and a checkpoint where all are non-finite has none left);
* a ratio (``l1_l2``, ``trace_spectral``) at a checkpoint where every counted matrix is zero, so its
  denominator (``l2``, ``spectral``) is 0: e.g. ``trace_spectral`` at step 0 of a FixUp ResNet,
  whose only Linear matrix, the classifier, starts at zero;
* a metric the architecture leaves undefined, NaN at *every* checkpoint of the run
  (:data:`UNDEFINED_BY_ARCHITECTURE`): the bias statistics of a model without biases.

Such a feature is then unusable for a map of every run, and the HMM leaves it out by name
(:meth:`trainmap.dynamics.maps.hmm.estimator.TrainingHMM.fit`: ``dropped_features_``, with the reason), never
because one run's table was damaged: that error comes here first.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from trainmap.dynamics.metrics.columns import HISTORY_COLUMNS, METRIC_NAMES, RATIOS
from trainmap.schema import section_defaults

#: The fix a :class:`MetricTableError` names when the caller knows no better one.
REGENERATE = (
    "the table is damaged; regenerate it (workflow rule collect_metrics, or "
    "trainmap.dynamics.metrics.weights.collect_run_metrics on the run's trajectory)"
)
#: Metrics an architecture can leave undefined (NaN at every checkpoint of its runs), and why.
UNDEFINED_BY_ARCHITECTURE = {
    **dict.fromkeys(("b_mean", "b_median", "b_var"), "the model has no biases"),
    **dict.fromkeys(
        ("trace", "spectral", "trace_spectral", "sv_mean", "sv_var"),
        "the model has no Linear weight (paper convention: these come from Linear matrices only)",
    ),
}
#: Columns of the table format that hold numbers (a history column may be NaN: ``train_loss`` at
#: step 0, before any training step).
NUMERIC_COLUMNS = ("step", *METRIC_NAMES, "n_matrices", "skipped_matrices", *HISTORY_COLUMNS)


class MetricTableError(ValueError):
    """A metric table the analysis cannot use; the message names the file, the column, the step
    and the fix."""


def read_metric_table(
    path: str | os.PathLike, columns: Sequence[str] = METRIC_NAMES, *, diverged: bool = False,
    fix: str = REGENERATE,
) -> pd.DataFrame:  # fmt: skip
    """The metric table at ``path``, checked (module docstring).

    ``columns``: the metric columns the analysis uses; each must be present, numeric and finite
    (unless ``diverged``, or in the two ways of the module docstring). ``step`` is always required.
    ``diverged``: the run diverged (its evaluation's status), so its metrics may be NaN or
    infinite. ``fix``: what the reader of the error should do (the workflow names the block's
    manifest to delete). Raises :class:`MetricTableError`.
    """
    path = Path(path)
    try:
        table = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise MetricTableError(f"{path}: not a readable CSV table ({error}); {fix}") from error
    required = list(dict.fromkeys(["step", *columns]))
    missing = [column for column in required if column not in table]
    if missing:
        names = ", ".join(repr(column) for column in missing)
        subject = f"column {names} is" if len(missing) == 1 else f"columns {names} are"
        raise MetricTableError(f"{path}: {subject} missing; {fix}")
    if table.empty:
        raise MetricTableError(f"{path}: no checkpoint rows; {fix}")
    steps = _whole_steps(table, path, fix)
    table["step"] = steps
    for column in dict.fromkeys([*required[1:], *(c for c in NUMERIC_COLUMNS[1:] if c in table)]):
        table[column] = _numbers(table, column, steps, path, fix)
    if not diverged:
        for column in required[1:]:
            _check_finite(table, column, path, fix)
    return table


def _whole_steps(table: pd.DataFrame, path: Path, fix: str) -> pd.Series:
    values = pd.to_numeric(table["step"], errors="coerce")
    whole = np.isfinite(values) & (values == values.round())
    if not whole.all():
        row = int(np.flatnonzero(~whole.to_numpy())[0])
        raise MetricTableError(f"{path}: column 'step' holds {_cell(table['step'].iloc[row])} in "
                               f"data row {row + 1}, not a checkpoint step; {fix}")  # fmt: skip
    return values.astype(np.int64)


def _numbers(table: pd.DataFrame, column: str, steps: pd.Series, path: Path, fix: str) -> pd.Series:
    """``column`` as numbers (as read when it holds only numbers); an error at its first text."""
    if pd.api.types.is_numeric_dtype(table[column]):
        return table[column]
    values = pd.to_numeric(table[column], errors="coerce")
    text = (table[column].notna() & values.isna()).to_numpy()
    if text.any():
        row = int(np.flatnonzero(text)[0])
        raise MetricTableError(
            f"{path}: column {column!r} at step {steps.iloc[row]} holds "
            f"{_cell(table[column].iloc[row])}, not a number{_more(text)}; {fix}"
        )
    return values


def _check_finite(table: pd.DataFrame, column: str, path: Path, fix: str) -> None:
    """Raise unless ``column`` is finite, or NaN in one of the ways a healthy run has (module
    docstring)."""
    values = table[column].to_numpy()
    bad = ~np.isfinite(values)
    if not bad.any():
        return
    if column in UNDEFINED_BY_ARCHITECTURE and np.isnan(values).all():
        return
    if column in RATIOS and RATIOS[column] in table:  # every counted matrix zero: no ratio term
        bad &= ~(np.isnan(values) & (table[RATIOS[column]].to_numpy() == 0))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise MetricTableError(
            f"{path}: column {column!r} is {_cell(values[row])} at step {table['step'].iloc[row]}"
            f"{_more(bad)}, but the run did not diverge; {fix}"
        )


def _cell(value: object) -> str:
    """A cell as the error shows it: text quoted, a missing or non-finite number by name."""
    if isinstance(value, str):
        return repr(value)
    if pd.isna(value):
        return "NaN"
    return str(value)


def _more(flags: np.ndarray) -> str:
    """`` (and N more such cells)`` when there are more than one."""
    extra = int(flags.sum()) - 1
    return f" (and {extra} more such cell{'s' * (extra > 1)})" if extra else ""


#: How a run with a non-finite metric enters a map (analysis setting ``nan_runs``): ``features``
#: (default) keeps every run and the HMM leaves the feature out by name
#: (:meth:`trainmap.dynamics.maps.hmm.estimator.TrainingHMM.fit`); ``runs`` leaves out every run with a NaN or
#: infinite value among the features, as the training-maps authors' ``make_hmm_data`` does
#: (``dfs = [df for df in dfs if not df.isnull().values.any()]``, after its row cut).
NAN_RUNS = ("features", "runs")


def checkpoint_rows(n_rows: int, per_run: int | None, first_n: int | None) -> np.ndarray:
    """The row indices of a run of ``n_rows`` checkpoints that a map sees.

    ``per_run``: that many checkpoints spread evenly over the run, the first and the last kept
    (``round(linspace(0, n_rows - 1, per_run))``): the cadence of a run checkpointed more
    sparsely over the same training. ``first_n``: then only the first ``first_n`` of those (the
    training-maps authors' ``df.head(first_n)``, which keeps a shorter run whole; the config check
    refuses a ``first_n`` beyond the grid's runs before any job). None: no change. A run with
    fewer than ``per_run`` checkpoints cannot be spread to it: ValueError naming the setting.
    """
    rows = np.arange(n_rows)
    if per_run is not None:
        if per_run > n_rows:
            raise ValueError(f"analysis.checkpoints_per_run: {per_run} is more than the run's "
                             f"{n_rows} checkpoints; lower it or leave it null")  # fmt: skip
        rows = np.unique(np.round(np.linspace(0, n_rows - 1, per_run)).astype(int))
    if first_n is not None:
        rows = rows[:first_n]
    return rows


def analysis_tables(
    runs: dict[str, pd.DataFrame],
    features: Sequence[str],
    per_run: int | None = None,
    first_n: int | None = None,
    nan_runs: str = section_defaults("analysis")["nan_runs"],
) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:
    """``(tables, left_out)``: each run's checkpoints the map sees (:func:`checkpoint_rows`) and,
    with ``nan_runs="runs"``, without the runs that have a non-finite value among ``features``
    in those rows (run -> why, for the map's files). Every table keeps its columns."""
    if nan_runs not in NAN_RUNS:
        raise ValueError(f"analysis.nan_runs: {nan_runs!r} is not allowed; choose one of "
                         f"{', '.join(NAN_RUNS)}")  # fmt: skip
    cut = {}
    for run, table in runs.items():
        rows = checkpoint_rows(len(table), per_run, first_n)
        cut[run] = table if len(rows) == len(table) else table.iloc[rows].reset_index(drop=True)
    left_out = {}
    if nan_runs == "runs":
        for run, table in cut.items():
            values = table[[f for f in features if f in table]].to_numpy(dtype=float)
            if not np.isfinite(values).all():
                left_out[run] = "a metric is NaN or infinite at some checkpoint (nan_runs: runs)"
        cut = {run: table for run, table in cut.items() if run not in left_out}
    return cut, left_out
