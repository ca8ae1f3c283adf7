"""Metric tables are read strictly (trainmap.dynamics.metrics.tables): the damaged-table cases.

A damaged table stops the job with an error naming the file, the column, the step and the fix; a
diverged run's NaN rows and a model without biases still work, and a feature unusable for every
run is left out by name, never because of one run.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.dynamics.maps.settings import AnalysisSettings
from trainmap.dynamics.maps.synthetic import sample_runs
from trainmap.dynamics.metrics.tables import REGENERATE, MetricTableError, read_metric_table
from trainmap.dynamics.metrics.weights import METRIC_NAMES, trajectory_metrics
from trainmap.dynamics.verdicts.joint import compare_groups
from trainmap.grid import Cell
from trainmap.io import save_json
from trainmap.jobs.analysis import read_group_runs

BIASES = ("b_mean", "b_median", "b_var")
NO_BIASES = "NaN at every checkpoint of every run (the model has no biases)"


@pytest.fixture(scope="module")
def runs() -> dict[str, pd.DataFrame]:
    """Eight healthy metric tables (3 phases, 30 checkpoints at steps 0, 10, ..., 290)."""
    tables, _, _ = sample_runs(3, n_runs=8, length=30, seed=1)
    return {f"seed{i}": table for i, table in enumerate(tables.values())}


def write_group(
    root: Path, runs: dict[str, pd.DataFrame], status: dict[str, str] | None = None
) -> tuple[list, list, list, list, Path]:
    """The workflow's layout of one block (results/metrics/<t>/<a>/<m>/seeds0-7.json and
    seed<i>/metrics.csv, results/evaluate/.../evaluation.json): ``read_group_runs``' arguments and
    the block manifest."""
    block = root / "results" / "metrics" / "sparse_parity" / "mlp" / "kaiming"
    manifest = block / "seeds0-7.json"
    cells, metrics_paths, evaluation_paths = [], [], []
    for label, table in runs.items():
        cell = Cell("sparse_parity", "mlp", "kaiming", int(label.removeprefix("seed")))
        path = block / label / "metrics.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(path, index=False)
        evaluation = root / "results" / "evaluate" / cell.id / "evaluation.json"
        save_json({"status": (status or {}).get(label, "completed"), "convergence_step": None},
                  evaluation)  # fmt: skip
        cells.append(cell.to_dict())
        metrics_paths.append(str(path))
        evaluation_paths.append(str(evaluation))
    save_json({"rule": "collect_metrics", "cells": []}, manifest)
    return cells, metrics_paths, evaluation_paths, list(runs), manifest


def rerun(manifest: Path) -> str:
    return (f"rerun collect_metrics for this block: delete its manifest {manifest} and run the "
            "workflow again")  # fmt: skip


def damaged(runs: dict[str, pd.DataFrame], label: str, change) -> dict[str, pd.DataFrame]:
    """``runs`` with ``change`` applied to a copy of one run's table."""
    return runs | {label: change(runs[label].copy())}


# --- damaged tables: NaN and infinite values, missing columns, text, damaged steps ------------


def test_nan_in_one_healthy_runs_l2_names_the_file_the_column_the_step_and_the_block(
    tmp_path, runs
):
    def nan_at_step_50(table):
        table.loc[table["step"] == 50, "l2"] = np.nan
        return table

    cells, paths, evaluations, labels, manifest = write_group(
        tmp_path, damaged(runs, "seed3", nan_at_step_50)
    )  # fmt: skip
    with pytest.raises(MetricTableError) as error:
        read_group_runs(paths, evaluations, labels)
    assert str(error.value) == (
        f"{paths[3]}: column 'l2' is NaN at step 50, but the run did not diverge; {rerun(manifest)}"
    )
    with pytest.raises(MetricTableError) as error:  # outside the workflow: the generic fix
        read_metric_table(paths[3])
    assert str(error.value) == (
        f"{paths[3]}: column 'l2' is NaN at step 50, but the run did not diverge; {REGENERATE}"
    )
    assert isinstance(error.value, ValueError)


def test_infinite_values_are_counted_and_the_first_named(tmp_path, runs):
    def inf_from_step_100(table):
        table.loc[table["step"] >= 100, "w_var"] = np.inf
        return table

    path = tmp_path / "metrics.csv"
    inf_from_step_100(runs["seed0"].copy()).to_csv(path, index=False)
    with pytest.raises(MetricTableError) as error:
        read_metric_table(path)
    assert str(error.value) == (f"{path}: column 'w_var' is inf at step 100 (and 19 more such "
                                f"cells), but the run did not diverge; {REGENERATE}")  # fmt: skip


def test_a_deleted_column_names_the_file_and_the_column(tmp_path, runs):
    cells, paths, evaluations, labels, manifest = write_group(
        tmp_path, damaged(runs, "seed5", lambda table: table.drop(columns="spectral"))
    )  # fmt: skip
    with pytest.raises(MetricTableError) as error:
        read_group_runs(paths, evaluations, labels)
    assert str(error.value) == f"{paths[5]}: column 'spectral' is missing; {rerun(manifest)}"
    two = tmp_path / "two.csv"
    runs["seed0"].drop(columns=["l1", "sv_var"]).to_csv(two, index=False)
    with pytest.raises(MetricTableError, match="columns 'l1', 'sv_var' are missing; the table"):
        read_metric_table(two)


def test_text_in_a_numeric_column_names_the_file_the_column_and_the_step(tmp_path, runs):
    def text_at_step_20(table):
        table["l2"] = table["l2"].astype(object)
        table.loc[table["step"] == 20, "l2"] = "abc"
        return table

    cells, paths, evaluations, labels, manifest = write_group(
        tmp_path, damaged(runs, "seed1", text_at_step_20)
    )  # fmt: skip
    with pytest.raises(MetricTableError) as error:
        read_group_runs(paths, evaluations, labels)
    assert str(error.value) == (
        f"{paths[1]}: column 'l2' at step 20 holds 'abc', not a number; {rerun(manifest)}"
    )


def test_text_is_refused_in_a_diverged_run_and_in_any_numeric_column(tmp_path, runs):
    table = runs["seed0"].copy()
    table["test_acc"] = table["test_acc"].astype(object)
    table.loc[table["step"] == 30, "test_acc"] = "0.5x"
    path = tmp_path / "metrics.csv"
    table.to_csv(path, index=False)
    with pytest.raises(MetricTableError) as error:
        read_metric_table(path, diverged=True)
    assert str(error.value) == (
        f"{path}: column 'test_acc' at step 30 holds '0.5x', not a number; {REGENERATE}"
    )


def test_a_damaged_step_names_the_row(tmp_path, runs):
    table = runs["seed0"].copy()
    table["step"] = table["step"].astype(object)
    table.loc[4, "step"] = "4O"
    path = tmp_path / "metrics.csv"
    table.to_csv(path, index=False)
    with pytest.raises(MetricTableError) as error:
        read_metric_table(path)
    assert str(error.value) == (
        f"{path}: column 'step' holds '4O' in data row 5, not a checkpoint step; {REGENERATE}"
    )


def test_a_diverged_runs_nan_rows_are_still_accepted(tmp_path, runs):
    """A run whose weights turned NaN before it was frozen: its last checkpoints have no metric."""

    def nan_weights_at_the_end(table):
        table.loc[table["step"] >= 280, list(METRIC_NAMES)] = np.nan
        table.loc[table["step"] >= 280, "test_acc"] = np.nan
        return table

    group = damaged(runs, "seed2", nan_weights_at_the_end)
    cells, paths, evaluations, labels, manifest = write_group(
        tmp_path, group, {"seed2": "diverged"}
    )
    tables, outcomes = read_group_runs(paths, evaluations, labels)
    assert outcomes.status["seed2"] == "diverged"
    assert len(tables["seed2"]) == 30 and tables["seed2"]["l2"].isna().sum() == 2
    pd.testing.assert_frame_equal(tables["seed2"], group["seed2"], check_dtype=False)
    # The same table from a run whose evaluation says it completed is damage.
    save_json({"status": "completed", "convergence_step": None}, evaluations[2])
    with pytest.raises(MetricTableError) as error:
        read_group_runs(paths, evaluations, labels)
    assert str(error.value) == (f"{paths[2]}: column 'l1' is NaN at step 280 (and 1 more such "
                                f"cell), but the run did not diverge; {rerun(manifest)}")  # fmt: skip


def test_a_diverged_runs_nan_feature_is_dropped_by_name_not_silently(runs):
    def nan_l2_at_the_end(table):
        table.loc[table["step"] == 290, "l2"] = np.nan
        return table

    group = damaged(runs, "seed2", nan_l2_at_the_end)
    with pytest.warns(UserWarning, match="feature 'l2' is not finite"):
        hmm = TrainingHMM(k_max=2, restarts=1).fit(group)
    assert hmm.dropped_features_ == {
        "l2": "not finite at some checkpoints of run seed2 from step 290 (1 of 8) (a diverged run, "
        "or a ratio where every weight is zero)"
    }
    assert hmm.features_ == [f for f in METRIC_NAMES if f != "l2"]


def test_a_model_without_biases_drops_its_bias_metrics_by_name(tmp_path, runs):
    """collect_run_metrics gives a bias-free model NaN bias metrics; the map leaves them out and
    says so in hmm.json, joint.json, verdicts.md and the warnings."""
    model = nn.Sequential(nn.Linear(4, 3, bias=False), nn.ReLU(), nn.Linear(3, 2, bias=False))
    state = {name: torch.randn(5, *value.shape) for name, value in model.state_dict().items()}
    bias_free = trajectory_metrics(state, model)
    assert bias_free[list(BIASES)].isna().all().all()
    assert bias_free.drop(columns=list(BIASES))[list(METRIC_NAMES[:11])].notna().all().all()

    group = {run: table.assign(**dict.fromkeys(BIASES, np.nan)) for run, table in runs.items()}
    cells, paths, evaluations, labels, _ = write_group(tmp_path, group)
    tables, _ = read_group_runs(paths, evaluations, labels)  # read without an error
    with pytest.warns(UserWarning) as caught:
        hmm = TrainingHMM(k_max=2, restarts=1).fit(tables)
    assert hmm.dropped_features_ == dict.fromkeys(BIASES, NO_BIASES)
    assert hmm.features_ == list(METRIC_NAMES[:11])
    assert [str(w.message) for w in caught if "dropped" in str(w.message)] == [
        f"feature {f!r} is {NO_BIASES}; dropped from the HMM" for f in BIASES
    ]
    hmm.save(tmp_path / "hmm.npz", tmp_path / "hmm.json")
    assert json.loads((tmp_path / "hmm.json").read_text())["dropped_features"] == dict.fromkeys(
        BIASES, NO_BIASES
    )
    assert TrainingHMM.load(tmp_path / "hmm.npz", tmp_path / "hmm.json").dropped_features_ == (
        dict.fromkeys(BIASES, NO_BIASES)
    )

    groups = {run: "even" if int(run[-1]) % 2 == 0 else "odd" for run in tables}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joint = compare_groups(tables, groups, dict.fromkeys(tables), {},
                               TrainingHMM(k_max=2, restarts=1),
                               AnalysisSettings.of({"permutations": 20}).verdict_settings)  # fmt: skip
    summary = joint.summary()
    assert summary["dropped_features"] == dict.fromkeys(BIASES, NO_BIASES)
    assert summary["features"] == list(METRIC_NAMES[:11])
    note = "Features left out of the HMM: " + "; ".join(f"{f}: {NO_BIASES}" for f in BIASES) + "."
    assert note in joint.verdict_markdown()
    assert hmm.dropped_note() == note


def test_a_healthy_group_drops_nothing_and_notes_nothing(runs):
    hmm = TrainingHMM(k_max=2, restarts=1).fit(runs)
    assert hmm.dropped_features_ == {} and hmm.dropped_note() == ""
    assert hmm.features_ == list(METRIC_NAMES)


# --- what else a healthy run may and may not hold ----------------------------------------------


def test_a_ratio_of_all_zero_weights_may_be_nan(tmp_path, runs):
    """FixUp's classifier, its only Linear matrix, starts at zero: trace_spectral is NaN at step 0
    (spectral is 0 there). NaN where the denominator is not 0 is damage."""
    table = runs["seed0"].copy()
    table.loc[0, ["trace", "spectral", "trace_spectral"]] = [0.0, 0.0, np.nan]
    path = tmp_path / "fixup.csv"
    table.to_csv(path, index=False)
    assert np.isnan(read_metric_table(path)["trace_spectral"].iloc[0])
    table.loc[3, "trace_spectral"] = np.nan
    table.to_csv(path, index=False)
    with pytest.raises(MetricTableError, match="column 'trace_spectral' is NaN at step 30, but"):
        read_metric_table(path)


def test_only_a_metric_the_architecture_can_lack_may_be_nan_throughout(tmp_path, runs):
    path = tmp_path / "metrics.csv"
    runs["seed0"].assign(l2=np.nan).to_csv(path, index=False)  # every model has an L2 norm
    with pytest.raises(MetricTableError, match="column 'l2' is NaN at step 0 \\(and 29 more such"):
        read_metric_table(path)
    partly = runs["seed0"].copy()
    partly.loc[partly["step"] >= 200, "b_var"] = np.nan  # biases do not vanish halfway
    partly.to_csv(path, index=False)
    with pytest.raises(MetricTableError, match="column 'b_var' is NaN at step 200 "):
        read_metric_table(path)


def test_history_columns_may_be_nan_but_not_text(tmp_path, runs):
    """train_loss and train_acc are NaN at step 0 (no training step yet) in every healthy run."""
    table = runs["seed0"].assign(train_loss=1.0, train_acc=0.5)
    table.loc[0, ["train_loss", "train_acc"]] = np.nan
    path = tmp_path / "metrics.csv"
    table.to_csv(path, index=False)
    read = read_metric_table(path)
    assert read["train_loss"].isna().sum() == 1
    pd.testing.assert_frame_equal(read, table, check_dtype=False)


def test_an_empty_or_unreadable_file_is_named(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(MetricTableError, match=f"^{empty}: not a readable CSV table"):
        read_metric_table(empty)
    header = tmp_path / "header.csv"
    header.write_text(",".join(["step", *METRIC_NAMES]) + "\n")
    with pytest.raises(MetricTableError) as error:
        read_metric_table(header)
    assert str(error.value) == f"{header}: no checkpoint rows; {REGENERATE}"
