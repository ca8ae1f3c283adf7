"""Seed groups: per checkpoint step the mean over seeds and its 95 % t-interval,
checked against numpy/scipy, and logged to MLflow as step-indexed series that MLflow gives back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from scipy import stats

from trainmap.dynamics.metrics.weights import METRIC_NAMES
from trainmap.seed_groups import SERIES, log_group, log_joint, seed_chart_urls, seed_statistics
from trainmap.tracking import METRICS_PER_BATCH, init_tracking


def known_runs() -> dict[str, pd.DataFrame]:
    """Three seeds; seed2 diverged after step 10 (no checkpoint at 20, its loss NaN at 10)."""
    return {
        "seed0": pd.DataFrame({"step": [0, 10, 20], "test_acc": [0.5, 0.7, 0.9],
                               "test_loss": [2.0, 1.0, 0.5]}),
        "seed1": pd.DataFrame({"step": [0, 10, 20], "test_acc": [0.4, 0.8, 0.95],
                               "test_loss": [2.2, 0.9, 0.4]}),
        "seed2": pd.DataFrame({"step": [0, 10], "test_acc": [0.6, 0.5],
                               "test_loss": [2.1, np.nan]}),
    }  # fmt: skip


def t_interval(values: list[float]) -> tuple[float, float, float]:
    mean = float(np.mean(values))
    lo, hi = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=stats.sem(values))
    return mean, lo, hi


def test_mean_and_interval_match_scipy_on_a_known_table() -> None:
    table = seed_statistics(known_runs(), columns=("test_acc", "test_loss", "l1"))
    assert list(table.columns) == ["step", "metric", "n_seeds", "n", "mean", "lo", "hi"]
    assert set(table["metric"]) == {"test_acc", "test_loss"}  # no run has an l1 column
    rows = table.set_index(["metric", "step"])
    assert rows.loc["test_acc", "n_seeds"].tolist() == [3, 3, 2]  # the union of the steps
    expected = {
        ("test_acc", 0): [0.5, 0.4, 0.6],
        ("test_acc", 10): [0.7, 0.8, 0.5],
        ("test_acc", 20): [0.9, 0.95],
        ("test_loss", 0): [2.0, 2.2, 2.1],
        ("test_loss", 10): [1.0, 0.9],  # seed2's NaN left out
        ("test_loss", 20): [0.5, 0.4],
    }
    for key, values in expected.items():
        row = rows.loc[key]
        assert row["n"] == len(values), key
        assert [row["mean"], row["lo"], row["hi"]] == pytest.approx(t_interval(values)), key
    assert rows.loc[("test_loss", 10), "n_seeds"] == 3


def test_random_tables_match_scipy_and_one_seed_has_no_interval() -> None:
    rng = np.random.default_rng(0)
    runs = {f"seed{s}": pd.DataFrame({"step": np.arange(0, 50, 5) + (5 if s == 4 else 0),
                                      "test_acc": rng.random(10)}) for s in range(5)}  # fmt: skip
    table = seed_statistics(runs).set_index("step")
    assert list(table.index) == list(range(0, 55, 5))
    for step, row in table.iterrows():
        values = [t.set_index("step").loc[step, "test_acc"] for t in runs.values()
                  if step in set(t["step"])]  # fmt: skip
        assert row["n_seeds"] == row["n"] == len(values)
        if len(values) == 1:  # step 50: seed4 alone
            assert row["mean"] == values[0] and np.isnan(row["lo"]) and np.isnan(row["hi"])
        else:
            assert [row["mean"], row["lo"], row["hi"]] == pytest.approx(t_interval(values))


def test_repeated_step_is_refused() -> None:
    runs = {"seed0": pd.DataFrame({"step": [0, 10, 10], "test_acc": [0.1, 0.2, 0.3]})}
    with pytest.raises(ValueError, match="seed0.*step 10"):
        seed_statistics(runs)


# --------------------------------------------------------------------------------------------------
# MLflow


@pytest.fixture(scope="module")
def tracking(tmp_path_factory) -> dict[str, str]:
    uri = f"sqlite:///{tmp_path_factory.mktemp('seeds') / 'mlflow.db'}"
    init_tracking(uri, "seeds")
    return {"uri": uri, "experiment": "seeds"}


def metric_tables(n_seeds: int, steps: np.ndarray, seed: int) -> dict[str, pd.DataFrame]:
    """Tables of every series in :data:`SERIES` (the last seed stops halfway, as a diverged run)."""
    rng = np.random.default_rng(seed)
    runs = {}
    for s in range(n_seeds):
        kept = steps if s < n_seeds - 1 else steps[: len(steps) // 2]
        runs[f"seed{s}"] = pd.DataFrame({"step": kept} | {name: rng.normal(size=len(kept))
                                                          for name in SERIES})  # fmt: skip
    runs["seed0"].loc[0, "test_loss"] = np.nan  # a non-finite loss at step 0
    return runs


def history(client: MlflowClient, run_id: str, key: str) -> tuple[list[int], list[float]]:
    points = sorted(client.get_metric_history(run_id, key), key=lambda metric: metric.step)
    return [metric.step for metric in points], [metric.value for metric in points]


def test_group_run_carries_series_figure_and_seed_count(tracking, tmp_path: Path) -> None:
    steps = np.arange(0, 300, 10)  # 30 checkpoints x (18 series x 3 + n_seeds): > one batch
    runs = metric_tables(4, steps, seed=1)
    assert len(steps) * (3 * len(SERIES) + 1) > METRICS_PER_BATCH
    figure = tmp_path / "stability.png"
    figure.write_bytes(b"\x89PNG\r\n\x1a\n")
    status = {"seed0": "completed", "seed1": "completed", "seed2": "completed", "seed3": "diverged"}
    run_id = log_group(tracking, "sparse_parity/mlp/kaiming", runs, status,
                       stability_figure=figure, config_hash="abc")  # fmt: skip

    client = MlflowClient(tracking_uri=tracking["uri"])
    logged = client.get_run(run_id)
    assert logged.info.status == "FINISHED"
    tags = logged.data.tags
    assert {key: tags[key] for key in ("role", "group", "task", "arch", "method", "config_hash")} == {
        "role": "seed_group", "group": "sparse_parity/mlp/kaiming", "task": "sparse_parity",
        "arch": "mlp", "method": "kaiming", "config_hash": "abc"}  # fmt: skip
    assert tags["mlflow.runName"] == "seeds sparse_parity/mlp/kaiming"
    assert "95% Student-t confidence interval" in tags["mlflow.note.content"] and "rule" not in tags
    assert logged.data.params["n_seeds"] == "4" and logged.data.params["n_diverged"] == "1"
    assert [artifact.path for artifact in client.list_artifacts(run_id)] == ["stability.png"]

    expected = seed_statistics(runs).set_index(["metric", "step"])
    half = len(steps) // 2
    assert history(client, run_id, "n_seeds") == (list(steps), [4.0] * half + [3.0] * half)
    for name in ("test_acc", "test_loss", *METRIC_NAMES):
        for column in ("mean", "lo", "hi"):
            logged_steps, values = history(client, run_id, f"{name}/{column}")
            assert logged_steps == list(steps), (column, name)
            assert values == pytest.approx(expected.loc[name, column].tolist()), (column, name)
    # Where a seed has no finite value at a step, the count per metric is logged; elsewhere not.
    assert history(client, run_id, "test_loss/n")[1][:2] == [3.0, 4.0]
    assert client.get_metric_history(run_id, "test_acc/n") == []
    assert len(logged.data.metrics) == 1 + 3 * len(SERIES) + 1


def test_joint_runs_one_child_per_group_with_the_same_metric_names(tracking, tmp_path) -> None:
    steps = np.arange(0, 50, 10)
    runs = {f"{label}/{seed}": table for label in ("a/x", "a/y")
            for seed, table in metric_tables(3, steps, seed=len(label)).items()}  # fmt: skip
    groups = {run_id: run_id.rsplit("/", 1)[0] for run_id in runs}
    figure = tmp_path / "stability.png"
    figure.write_bytes(b"\x89PNG\r\n\x1a\n")
    parent_id = log_joint(tracking, "cmp", runs, groups, dict.fromkeys(runs, "completed"),
                          task="digits", stability_figure=figure)  # fmt: skip

    client = MlflowClient(tracking_uri=tracking["uri"])
    parent = client.get_run(parent_id)
    assert parent.data.tags["role"] == "seed_joint" and parent.data.tags["joint"] == "cmp"
    assert parent.data.params["n_seeds"] == "6" and parent.data.params["n_seeds.a/x"] == "3"
    assert [artifact.path for artifact in client.list_artifacts(parent_id)] == ["stability.png"]
    experiment = client.get_experiment_by_name("seeds").experiment_id
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent_id}'")
    assert sorted(child.data.tags["group"] for child in children) == ["a/x", "a/y"]
    keys = [set(child.data.metrics) for child in children]
    assert keys[0] == keys[1] and "test_acc/mean" in keys[0]
    for child in children:
        tags = child.data.tags
        assert (tags["role"], tags["arch"], tags["task"]) == ("seed_group", "a", "digits")
        assert tags["method"] == tags["group"].split("/")[1]
        subset = {run_id: runs[run_id] for run_id in runs if groups[run_id] == tags["group"]}
        expected = seed_statistics(subset).set_index(["metric", "step"])
        assert history(client, child.info.run_id, "l2/hi") == (
            list(steps), pytest.approx(expected.loc["l2", "hi"].tolist()))  # fmt: skip


def test_the_chart_link_names_the_latest_comparisons_method_runs(tmp_path) -> None:
    """``make mlflow-ui``'s chart per comparison: MLflow's metric page with the latest seed-group
    children (one per method) and the metric's mean and bounds as the plotted keys."""
    import json
    import time
    import urllib.parse

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert seed_chart_urls(uri, "http://ui") == []  # no store yet
    setting = {"uri": uri, "experiment": "study"}
    init_tracking(uri, "study")
    runs = metric_tables(2, np.arange(0, 30, 10), seed=3)
    both = {f"{method}/{seed}": table for method in ("kaiming", "gradinit")
            for seed, table in runs.items()}  # fmt: skip
    groups = {run_id: run_id.split("/")[0] for run_id in both}
    status = dict.fromkeys(both, "completed")
    log_joint(setting, "cmp", both, groups, status, task="t")
    time.sleep(0.01)
    latest = log_joint(setting, "cmp", both, groups, status, task="t")  # a rerun: the newer
    (line,) = seed_chart_urls(uri, "http://ui/", metric="l2")
    prefix = "study cmp (l2, every method): http://ui/#/metric/l2%2Fmean?"
    assert line.startswith(prefix)
    query = urllib.parse.parse_qs(line.removeprefix(prefix))
    assert line.removeprefix(prefix).startswith("runs=")  # the page reads it first
    client = MlflowClient(tracking_uri=uri)
    children = {run.info.run_id for run in client.search_runs(
        [client.get_experiment_by_name("study").experiment_id],
        f"tags.mlflow.parentRunId = '{latest}'")}  # fmt: skip
    assert set(json.loads(query["runs"][0])) == children and len(children) == 2
    assert json.loads(query["plot_metric_keys"][0]) == ["l2/mean", "l2/lo", "l2/hi"]
    assert json.loads(query["metric"][0]) == "l2/mean" and query["x_axis"] == ["step"]
