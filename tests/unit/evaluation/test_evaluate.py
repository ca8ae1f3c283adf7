"""Tests for run evaluation and the grid summary (trainmap.evaluation)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch

from trainmap.data import TaskData, make_task_data
from trainmap.evaluation import (
    convergence_step,
    evaluate_run,
    group_metrics,
    summarise,
)
from trainmap.io import load_json
from trainmap.models import count_parameters
from trainmap.training.checkpoints import load_model
from trainmap.training.loop import TrainConfig, TrainPaths, build_cell_model, train_model

MODEL_OPTIONS = {"hidden": [32]}


@dataclass
class TrainedRun:
    paths: TrainPaths
    data: TaskData
    history: pd.DataFrame
    summary: dict


def train_run(directory: Path, data: TaskData, cfg: TrainConfig) -> TrainedRun:
    model = build_cell_model("mlp", "kaiming", 0, data.meta, MODEL_OPTIONS)
    paths = TrainPaths.in_directory(directory)
    train_model(
        model, data, cfg, 0, paths, progress=False,
        model_info={"arch": "mlp", "method": "kaiming", "seed": 0,
                    "model_options": MODEL_OPTIONS, "meta": data.meta},
    )  # fmt: skip
    # Read back exactly as the evaluate rule does.
    return TrainedRun(paths, data, pd.read_csv(paths.history), load_json(paths.summary))


@pytest.fixture(scope="module")
def parity() -> TaskData:
    return make_task_data("sparse_parity", {"n_bits": 10, "k": 2, "n_train": 500, "n_test": 200})


@pytest.fixture(scope="module")
def trained(tmp_path_factory, parity) -> TrainedRun:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = TrainConfig(lr=0.1, steps=300, checkpoint_every=25)
        return train_run(tmp_path_factory.mktemp("trained"), parity, cfg)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def diverged(tmp_path_factory, parity) -> TrainedRun:
    cfg = TrainConfig(lr=1e6, steps=50, checkpoint_every=1)
    return train_run(tmp_path_factory.mktemp("diverged"), parity, cfg)


# --- convergence_step -----------------------------------------------------------------------------


def history_of(test_acc: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"step": range(0, 10 * len(test_acc), 10), "test_acc": test_acc})


def test_convergence_step_first_crossing():
    history = history_of([0.1, 0.4, 0.7, 0.95, 0.8, 0.97])
    assert convergence_step(history, 0.9) == 30  # the first crossing, not the later one
    assert convergence_step(history, 0.96) == 50
    assert convergence_step(history, 0.05) == 0
    assert isinstance(convergence_step(history, 0.9), int)


def test_convergence_step_counts_exactly_equal():
    history = history_of([0.25, 0.5, 0.75, 1.0])
    assert convergence_step(history, 0.75) == 20
    assert convergence_step(history, 1.0) == 30


def test_convergence_step_never_reached():
    assert convergence_step(history_of([0.1, 0.5, 0.89, 0.6]), 0.9) is None
    # A NaN accuracy (a diverged checkpoint) never counts as reaching the threshold.
    assert convergence_step(history_of([0.1, math.nan]), 0.0) == 0
    assert convergence_step(history_of([math.nan, math.nan]), 0.0) is None


# --- evaluate_run ---------------------------------------------------------------------------------

FIELDS = {
    "status", "diverged_step", "steps_done", "test_acc", "test_loss", "best_test_acc", "threshold",
    "converged", "convergence_step", "n_params", "bytes_on_disk", "latency_ms", "latency_batch",
    "train_wall_time_s", "nonzero_weights", "forms",
}  # fmt: skip


def evaluate(run: TrainedRun, threshold: float) -> dict:
    return evaluate_run(
        run.paths.model, run.history, run.summary, run.data, threshold,
        latency_batch=8, latency_repeats=3,
    )  # fmt: skip


def test_evaluate_completed_run(trained):
    record = evaluate(trained, threshold=0.9)
    assert set(record) == FIELDS
    assert record["status"] == "completed"
    assert record["diverged_step"] is None
    assert record["steps_done"] == 300
    assert record["threshold"] == 0.9

    # The task is learnt: convergence at the first checkpoint with test_acc >= 0.9.
    rows = zip(trained.history["step"], trained.history["test_acc"], strict=True)
    expected_step = next(int(step) for step, acc in rows if acc >= 0.9)
    assert record["converged"] is True
    assert record["convergence_step"] == expected_step == convergence_step(trained.history, 0.9)
    assert 0 < expected_step <= 300
    assert record["best_test_acc"] == trained.history["test_acc"].max()

    # Accuracy and loss recomputed from the saved weights, independently of evaluate_split.
    model = build_cell_model("mlp", "kaiming", 0, trained.data.meta, MODEL_OPTIONS)
    model.load_state_dict(torch.load(trained.paths.model, weights_only=True)["state_dict"])
    model.eval()
    with torch.no_grad():
        logits = model(trained.data.x_test)
    accuracy = (logits.argmax(dim=1) == trained.data.y_test).float().mean().item()
    loss = torch.nn.functional.cross_entropy(logits, trained.data.y_test).item()
    assert record["test_acc"] == pytest.approx(accuracy, abs=1e-12)
    assert record["test_loss"] == pytest.approx(loss, rel=1e-5)
    # The final checkpoint of the history was evaluated on the same weights.
    assert record["test_acc"] == trained.history["test_acc"].iloc[-1]

    assert record["n_params"] == count_parameters(model) == 10 * 32 + 32 + 32 * 2 + 2
    assert record["bytes_on_disk"] == trained.paths.model.stat().st_size
    assert record["latency_ms"] > 0 and record["latency_batch"] == 8
    assert record["train_wall_time_s"] == trained.summary["wall_time_s"]


def test_latency_is_measured_where_asked_and_accuracy_does_not_depend_on_it(trained):
    """latency: cpu (the default), device (the training device: here the CPU too) or none (not
    measured, empty); the accuracy and loss are the same numbers whichever."""
    records = {
        where: evaluate_run(
            trained.paths.model,
            trained.history,
            trained.summary,
            trained.data,
            0.9,
            latency_batch=8,
            latency_repeats=3,
            latency=where,
        )  # fmt: skip
        for where in ("cpu", "device", "none")
    }
    assert records["none"]["latency_ms"] is None
    assert all(form["latency_ms"] is None for form in records["none"]["forms"])
    assert records["cpu"]["latency_ms"] > 0 and records["device"]["latency_ms"] > 0
    for key in ("test_acc", "test_loss", "nonzero_weights", "bytes_on_disk"):
        assert records["cpu"][key] == records["device"][key] == records["none"][key]


def test_evaluate_unreached_threshold(trained):
    record = evaluate(trained, threshold=1.01)
    assert record["converged"] is False
    assert record["convergence_step"] is None


def test_evaluate_diverged_run(diverged):
    assert diverged.summary["status"] == "diverged"
    record = evaluate(diverged, threshold=0.9)
    assert record["status"] == "diverged"
    assert record["diverged_step"] == diverged.summary["diverged_step"]
    assert record["steps_done"] == diverged.summary["diverged_step"] - 1
    assert record["converged"] is False
    assert record["convergence_step"] is None
    # The NaN/inf weights give a non-finite loss, reported as NaN (null in the JSON record).
    assert math.isnan(record["test_loss"])
    assert 0.0 <= record["test_acc"] <= 1.0


def test_load_model_rebuilds_the_saved_model(trained):
    model = load_model(trained.paths.model)
    assert not model.training
    saved = torch.load(trained.paths.model, weights_only=True)["state_dict"]
    for name, value in model.state_dict().items():
        assert torch.equal(value, saved[name])


# --- group_metrics --------------------------------------------------------------------------------


def record(arch, seed, status, test_acc, step, task="parity", method="kaiming"):
    converged = step is not None
    return {"task": task, "arch": arch, "method": method, "seed": seed, "status": status,
            "test_acc": test_acc, "converged": converged, "convergence_step": step}  # fmt: skip


def test_group_metrics():
    records = [
        record("mlp", 2, "completed", 0.9, 300),
        record("mlp", 0, "completed", 0.8, 100),
        record("mlp", 1, "diverged", 0.1, None),
        record("mlp", 3, "completed", 0.6, 1000),
        record("vgg", 0, "completed", 0.5, None),
        record("vgg", 1, "diverged", 0.2, None),
        record("mlp", 0, "completed", 0.7, 40, task="digits"),
    ]
    metrics = group_metrics(summarise(records))
    assert set(metrics) == {"parity", "digits"}
    assert set(metrics["parity"]) == {"mlp", "vgg"}

    mlp = metrics["parity"]["mlp"]["kaiming"]
    assert mlp["runs"] == 4
    assert mlp["diverged"] == 1
    assert mlp["converged_frac"] == 0.75
    assert mlp["test_acc_mean"] == pytest.approx(0.6)
    assert mlp["test_acc_std"] == pytest.approx(statistics.stdev([0.9, 0.8, 0.1, 0.6]))
    assert mlp["convergence_step_median"] == 300.0  # of 100, 300, 1000 (the mean is 466.7)

    vgg = metrics["parity"]["vgg"]["kaiming"]
    assert (vgg["runs"], vgg["diverged"], vgg["converged_frac"]) == (2, 1, 0.0)
    assert vgg["test_acc_std"] == pytest.approx(statistics.stdev([0.5, 0.2]))
    assert vgg["convergence_step_median"] is None

    single = metrics["digits"]["mlp"]["kaiming"]
    assert single == {"runs": 1, "diverged": 0, "converged_frac": 1.0, "test_acc_mean": 0.7,
                      "test_acc_std": 0.0, "convergence_step_median": 40.0}  # fmt: skip


def test_group_metrics_when_nothing_converged():
    records = [record("mlp", seed, "completed", 0.5, None) for seed in range(3)]
    entry = group_metrics(summarise(records))["parity"]["mlp"]["kaiming"]
    assert entry["converged_frac"] == 0.0
    assert entry["convergence_step_median"] is None
    assert entry["diverged"] == 0


def test_summarise_sorts_by_cell():
    records = [record("vgg", 1, "completed", 0.5, None), record("mlp", 1, "completed", 0.5, None),
               record("mlp", 0, "completed", 0.5, None)]  # fmt: skip
    frame = summarise(records)
    assert list(zip(frame["arch"], frame["seed"], strict=True)) == [
        ("mlp", 0),
        ("mlp", 1),
        ("vgg", 1),
    ]
