"""Seed groups in MLflow: per checkpoint step, the mean over seeds and its 95 % interval.

MLflow charts one run's metric against step but cannot average runs over seeds, so each training-map
group (rule ``fit_hmm``: one task/arch/method) and each joint comparison gets runs that carry the
across-seed statistics of its runs' metric tables (:mod:`trainmap.dynamics.metrics.weights`: ``test_acc``,
``test_loss``, ``train_acc``, ``train_loss`` and the 14 map metrics per checkpoint step).

**The interval** is the Student-t 95 % confidence interval of the mean over seeds, what researchers
compare between methods: ``mean +/- t(0.975, n - 1) * s / sqrt(n)``, ``s`` the sample standard
deviation over the ``n`` seeds (ddof = 1). It needs two seeds; at a step with one there is a mean and
no interval. It narrows as seeds are added (a spread of single runs would be the 2.5/97.5 percentiles
instead, which this module does not log).

**Which runs**: the runs the analysis maps, diverged ones included (the HMM maps them; only the detour
regression leaves them out). A diverged run stops recording checkpoints where it diverged
(:mod:`trainmap.training.loop`), and runs may have different step grids (sparse retraining, external
runs), so the steps are the union of the runs' steps and each step's statistics are over the runs
with a checkpoint there: ``n_seeds`` per step says how many. A value that is not finite (a metric the
architecture leaves undefined, the loss at a diverged checkpoint) is left out of its metric's
statistics; ``n`` counts the seeds that remain.

**In MLflow** (:func:`log_group`, :func:`log_joint`), one run per group with step-indexed metrics, so
the UI charts each against step:

* ``<metric>/mean``, ``<metric>/lo``, ``<metric>/hi``: mean and interval bounds (the UI groups
  charts into sections by the key's first part, so a metric's mean and interval sit together in
  its section, e.g. ``test_acc``);
* ``n_seeds``: runs with a checkpoint at the step; ``<metric>/n``: seeds with a finite value,
  logged only for a metric where that is fewer at some step;
* params ``n_seeds`` (runs in the group) and ``n_diverged``; the run's description says all of this.

A group's run is named ``seeds <task>/<arch>/<method>``, tagged ``role=seed_group``, ``group``,
``task``, ``arch``, ``method`` and the rule's ``config_hash`` (no ``rule`` tag: it is no rule's
run; the rule's run names it in its tag ``seed_group_run``), and carries the group's
``stability.png``. A joint comparison gets a run ``seeds <name>`` nested under the comparison's
run ``joint <name>`` (``role=seed_joint``, ``joint``, the joint map's ``stability.png`` and seed
counts) and under it one run per compared
group (``seeds <name>: <group>``, ``role=seed_group``, ``joint``, ``group``, ``method`` and, when
the label has it, ``arch``). One run per method, not ``<metric>/<method>/mean`` keys in one
run: the UI draws one chart per metric key with a line per run, so the same keys in every group's
run put the methods on one chart per metric without configuring a chart, its grouping by tag
(``method``, ``arch``, ``joint``) works on them, and they compare with the fit_hmm groups' runs.
Metrics go in batches of :data:`trainmap.tracking.METRICS_PER_BATCH` through
:class:`trainmap.tracking.RuleRun` (one ``log_batch`` per 1000 points: on SQLite about 100 times
faster than one call per point).

**One chart per comparison** (:func:`seed_chart_urls`, printed by ``make mlflow-ui``): MLflow's
metric page plots several metric keys of several runs on one chart, given in its address (the runs,
``plot_metric_keys``); the address of a comparison's latest seed-group runs with
``<metric>/mean``, ``/lo`` and ``/hi`` shows every method's mean and interval together, each method
one colour, the bounds dashed and dotted.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainmap.dynamics.metrics.columns import HISTORY_COLUMNS, METRIC_NAMES
from trainmap.schema import section_defaults
from trainmap.tracking import RuleRun, summary_run

if TYPE_CHECKING:  # imported where the statistics are made: the command (make mlflow-ui) needs none
    import numpy as np
    import pandas as pd

#: The series summarised over seeds: accuracy and loss, then the 14 map metrics.
SERIES = (*HISTORY_COLUMNS, *METRIC_NAMES)
#: The intervals' level: the config schema's default of ``analysis.confidence``.
CONFIDENCE: float = section_defaults("analysis")["confidence"]
STATISTICS_COLUMNS = ("step", "metric", "n_seeds", "n", "mean", "lo", "hi")


def seed_statistics(
    runs: Mapping[str, pd.DataFrame], columns: Sequence[str] = SERIES,
    confidence: float = CONFIDENCE,
) -> pd.DataFrame:  # fmt: skip
    """Per checkpoint step and metric, the mean over ``runs`` (label -> metric table with a
    ``step`` column) and its t-interval at ``confidence`` (module docstring).

    A long table, sorted by metric (in ``columns`` order) then step: ``step``, ``metric``,
    ``n_seeds`` (runs with a checkpoint at the step), ``n`` (of those, runs with a finite value),
    ``mean``, ``lo``, ``hi`` (NaN where ``n`` < 2; ``mean`` NaN where ``n`` = 0). A metric no run
    has a column for is left out.
    """
    import numpy as np
    import pandas as pd

    if not runs:
        raise ValueError("no runs to summarise over seeds")
    indexed = {}
    for label, table in runs.items():
        repeated = table["step"][table["step"].duplicated()]
        if len(repeated):
            raise ValueError(f"run {label!r}: step {repeated.iloc[0]} appears more than once")
        indexed[label] = table.set_index("step")
    steps = np.array(sorted(set().union(*(table.index for table in indexed.values()))), np.int64)
    n_seeds = sum(np.isin(steps, table.index) for table in indexed.values())
    frames = []
    for column in columns:
        present = {label: table[column] for label, table in indexed.items() if column in table}
        if not present:
            continue
        values = pd.concat(present, axis=1).reindex(steps).to_numpy(dtype=float)
        n, mean, lo, hi = _mean_interval(values, confidence)
        frames.append(pd.DataFrame({"step": steps, "metric": column, "n_seeds": n_seeds, "n": n,
                                    "mean": mean, "lo": lo, "hi": hi}))  # fmt: skip
    if not frames:
        return pd.DataFrame(columns=list(STATISTICS_COLUMNS))
    return pd.concat(frames, ignore_index=True)


def _mean_interval(
    values: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row of ``values`` (steps x seeds; NaN or Inf: no value), the count of finite values,
    their mean and the t-interval of the mean."""
    import numpy as np
    from scipy import stats

    finite = np.isfinite(values)
    n = finite.sum(axis=1)
    kept = np.where(finite, values, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = kept.sum(axis=1) / n
        squares = np.where(finite, (values - mean[:, None]) ** 2, 0.0).sum(axis=1)
        sem = np.sqrt(squares / (n - 1) / n)
    enough = n >= 2
    half = np.full(len(n), np.nan)
    half[enough] = stats.t.ppf(0.5 + confidence / 2, n[enough] - 1) * sem[enough]
    return n, mean, mean - half, mean + half


def seed_key(metric: str, statistic: str) -> str:
    """The MLflow key of a metric's across-seed ``statistic`` (mean, lo, hi, n):
    ``<metric>/<statistic>``, so the UI's section of the metric holds all of them."""
    return f"{metric}/{statistic}"


def log_statistics(run: RuleRun, statistics: pd.DataFrame) -> int:
    """Queue ``statistics`` (:func:`seed_statistics`) as step-indexed metrics of ``run`` (module
    docstring); :class:`~trainmap.tracking.RuleRun` sends them in batches. The number of points."""
    import numpy as np

    by_step: dict[int, dict[str, float]] = {}
    counts = statistics.drop_duplicates("step").set_index("step")["n_seeds"]
    for step, count in counts.items():
        by_step[int(step)] = {"n_seeds": float(count)}
    for metric, rows in statistics.groupby("metric", sort=False):
        columns = ["mean", "lo", "hi"] + ["n"] * bool((rows["n"] < rows["n_seeds"]).any())
        for column in columns:
            for step, value in zip(rows["step"], rows[column].astype(float), strict=True):
                if np.isfinite(value):
                    by_step[int(step)][seed_key(metric, column)] = float(value)
    for step in sorted(by_step):
        run.log_metrics(by_step[step], step)
    return sum(len(values) for values in by_step.values())


def log_group(
    tracking: Mapping[str, str], group: str, runs: Mapping[str, pd.DataFrame],
    status: Mapping[str, str], *, stability_figure: str | os.PathLike | None = None,
    config_hash: str = "none",
) -> str:  # fmt: skip
    """The seed-group run of training-map group ``group`` (``task/arch/method``) over ``runs``
    (seed label -> metric table; ``status``: label -> the evaluation's status), with the group's
    stability figure; its run id."""
    task, arch, method = group.split("/")
    tags = {"role": "seed_group", "group": group, "task": task, "arch": arch, "method": method,
            "config_hash": config_hash}  # fmt: skip
    with summary_run(tracking, f"seeds {group}", tags,
                     description=_description(group, runs, status)) as run:  # fmt: skip
        _log_series(run, runs, status)
        if stability_figure is not None:
            run.log_artifact(stability_figure)
        return run.run_id


def log_joint(
    tracking: Mapping[str, str], name: str, runs: Mapping[str, pd.DataFrame],
    groups: Mapping[str, str], status: Mapping[str, str], *, task: str,
    stability_figure: str | os.PathLike | None = None, config_hash: str = "none",
    extra_tags: Mapping[str, object] | None = None, comparison_run_id: str | None = None,
) -> str:  # fmt: skip
    """The seed-group runs of joint comparison ``name``: a parent run with the joint map's stability
    figure and seed counts, and under it one run per compared group (``groups``: run id -> group
    label, ``arch/method`` or ``method``, or an external set's name) with its runs' statistics. The
    parent's run id. ``extra_tags`` go on every run (e.g. an adaptive comparison's round); the
    parent is nested under the comparison's own run ``comparison_run_id`` when given, so the UI
    shows the seed groups inside ``joint <name>``."""
    members: dict[str, list[str]] = {}
    for run_id, label in groups.items():
        members.setdefault(label, []).append(run_id)
    tags = {"role": "seed_joint", "joint": name, "task": task, "config_hash": config_hash}
    tags |= dict(extra_tags or {})
    description = (f"Seed groups of joint comparison {name}: one child run per compared group "
                   f"({', '.join(members)}) with its across-seed statistics.")  # fmt: skip
    with summary_run(tracking, f"seeds {name}", tags, description=description,
                     parent_run_id=comparison_run_id) as parent:  # fmt: skip
        parent.log_params({"n_seeds": len(runs), "n_groups": len(members),
                           "n_diverged": _diverged(runs, status)}
                          | {f"n_seeds.{label}": len(ids) for label, ids in members.items()})  # fmt: skip
        if stability_figure is not None:
            parent.log_artifact(stability_figure)
        for label, ids in members.items():
            subset = {run_id: runs[run_id] for run_id in ids}
            arch, _, method = label.rpartition("/")
            child_tags = tags | {"role": "seed_group", "group": label, "method": method}
            if arch:
                child_tags["arch"] = arch
            with summary_run(tracking, f"seeds {name}: {label}", child_tags,
                             parent_run_id=parent.run_id,
                             description=_description(f"{label} in {name}", subset, status)) as run:  # fmt: skip
                _log_series(run, subset, status)
        return parent.run_id


def _log_series(run: RuleRun, runs: Mapping[str, pd.DataFrame], status: Mapping[str, str]) -> None:
    run.log_params({"n_seeds": len(runs), "n_diverged": _diverged(runs, status),
                    "interval": f"t-interval of the mean, {CONFIDENCE:.0%}"})  # fmt: skip
    log_statistics(run, seed_statistics(runs))


def _diverged(runs: Mapping[str, pd.DataFrame], status: Mapping[str, str]) -> int:
    return sum(status.get(label) == "diverged" for label in runs)


def _description(what: str, runs: Mapping[str, pd.DataFrame], status: Mapping[str, str]) -> str:
    diverged = _diverged(runs, status)
    return (
        f"Across-seed statistics of {what}: {len(runs)} runs ({diverged} diverged). Per checkpoint "
        "step, <metric>/mean is the mean over seeds and <metric>/lo, <metric>/hi "
        f"the {CONFIDENCE:.0%} Student-t confidence interval of that mean (mean +/- t(0.975, n-1) "
        "s/sqrt(n), s the sample SD over seeds; no interval from one seed). n_seeds: runs with a "
        "checkpoint at the step (a diverged run stops at its divergence); <metric>/n: seeds "
        "with a finite value, where fewer. Metrics: test/train accuracy and loss, the 14 map "
        "metrics."
    )


def seed_chart_url(
    address: str, experiment_id: str, run_ids: Sequence[str], metric: str = "test_acc"
) -> str:
    """The MLflow metric page (at ``address``) that plots ``metric``'s mean and interval bounds
    (``<metric>/mean``, ``/lo``, ``/hi``) of the seed-group runs ``run_ids`` on one chart against
    the step. The page reads ``runs`` first, then the metric and the plot's settings, as JSON."""
    keys = [seed_key(metric, statistic) for statistic in ("mean", "lo", "hi")]
    query = {"runs": json.dumps(list(run_ids)), "metric": json.dumps(keys[0]),
             "experiments": json.dumps([experiment_id]), "plot_metric_keys": json.dumps(keys),
             "plot_layout": "{}", "x_axis": "step", "y_axis_scale": "linear",
             "line_smoothness": "1", "show_point": "false", "deselected_curves": "[]",
             "last_linear_y_axis_range": "[]"}  # fmt: skip
    return (f"{address.rstrip('/')}/#/metric/{urllib.parse.quote(keys[0], safe='')}?"
            + urllib.parse.urlencode(query))  # fmt: skip


def seed_chart_urls(uri: str, address: str, metric: str = "test_acc") -> list[str]:
    """``<experiment> <comparison>: <url>`` per joint comparison logged in the store at ``uri``:
    :func:`seed_chart_url` of its latest seed-group parent run's children (one per method).
    Empty when the store does not exist yet or holds no comparison."""
    from mlflow import MlflowClient

    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return []
    client, lines = MlflowClient(tracking_uri=uri), []
    for experiment in client.search_experiments():
        latest: dict[str, str] = {}  # comparison -> its latest parent run
        for parent in client.search_runs([experiment.experiment_id], "tags.role = 'seed_joint'",
                                         order_by=["attributes.start_time DESC"]):  # fmt: skip
            latest.setdefault(parent.data.tags["joint"], parent.info.run_id)
        for name, parent_id in sorted(latest.items()):
            children = client.search_runs([experiment.experiment_id],
                                          f"tags.mlflow.parentRunId = '{parent_id}'")  # fmt: skip
            ids = [run.info.run_id for run in sorted(children, key=lambda r: r.info.run_name)]
            if ids:
                url = seed_chart_url(address, experiment.experiment_id, ids, metric)
                lines.append(f"{experiment.name} {name} ({metric}, every method): {url}")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m trainmap.seed_groups``: the addresses ``make mlflow-ui`` prints."""
    import argparse

    from trainmap.tracking import runs_table_urls

    parser = argparse.ArgumentParser(
        prog="python -m trainmap.seed_groups",
        description="Print MLflow UI addresses: each experiment's runs table, and per joint "
        "comparison one chart of every method's across-seed mean and 95%% interval of a metric.",
    )
    parser.add_argument("--uri", default="sqlite:///mlflow.db", help="the tracking store")
    parser.add_argument("--address", default="http://127.0.0.1:5000", help="where the UI runs")
    parser.add_argument("--metric", default="test_acc",
                        help="the charted metric: test_acc, train_loss, ... or a map metric (l2)")  # fmt: skip
    args = parser.parse_args(argv)
    tables = runs_table_urls(args.uri, args.address)
    charts = seed_chart_urls(args.uri, args.address, args.metric)
    print("\n".join(["runs tables (MLflow opens an experiment on its GenAI overview):", *tables]))
    if charts:
        print("\n".join(["across-seed charts, mean and interval of each method on one chart:",
                         *charts]))  # fmt: skip


if __name__ == "__main__":
    main()
