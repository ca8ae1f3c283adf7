"""Runs trained with the real ``transformers.Trainer`` (a small MLP on the CPU, an evaluation and a
checkpoint every 4 steps), read as the Trainer leaves them: ``checkpoint-<step>/model.safetensors``
beside the optimizer's and scheduler's files, and ``trainer_state.json`` with the
``eval_accuracy`` of each evaluation. Mapped unchanged through the command line; the metrics
equal those of the same weights in the plain layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import Trainer, TrainingArguments

from trainmap.dynamics.__main__ import find_runs, main
from trainmap.dynamics.runs.external import (
    external_run_metrics,
    read_external_run,
    run_hyperparameters,
)
from trainmap.dynamics.runs.layouts import is_hf_run
from trainmap.recorder.huggingface import MetricCallback

STEPS, EVERY = 12, 4


class Net(nn.Module):
    """A small MLP with the Trainer's calling convention (a dict with ``loss`` and ``logits``)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x, labels=None):
        logits = self.net(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


class Points(torch.utils.data.Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(128, 8, generator=generator)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict:
        return {"x": self.x[index], "labels": self.y[index]}


def accuracy(prediction) -> dict[str, float]:
    return {
        "accuracy": float((np.argmax(prediction.predictions, 1) == prediction.label_ids).mean())
    }


def train(out: Path, seed: int, lr: float) -> Path:
    torch.manual_seed(seed)
    arguments = TrainingArguments(str(out), max_steps=STEPS, per_device_train_batch_size=16,
                                  learning_rate=lr, eval_strategy="steps", eval_steps=EVERY,
                                  save_strategy="steps", save_steps=EVERY, logging_steps=EVERY,
                                  report_to=[], seed=seed, use_cpu=True, disable_tqdm=True)  # fmt: skip
    trainer = Trainer(model=Net(), args=arguments, train_dataset=Points(),
                      eval_dataset=Points(), compute_metrics=accuracy,
                      callbacks=[MetricCallback(out.parent / f"recorded/{out.name}")])  # fmt: skip
    trainer.train()
    trainer.save_state()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root, threads = tmp_path_factory.mktemp("trainer"), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for lr in (0.1, 0.01):
            for seed in (0, 1):
                train(root / f"lr{lr}_seed{seed}", seed, lr)
    finally:
        torch.set_num_threads(threads)
    return root


def test_a_trainer_run_reads_as_it_is(runs: Path) -> None:
    directory = runs / "lr0.1_seed0"
    assert is_hf_run(directory)
    run = read_external_run(directory)
    assert list(run.checkpoints) == [4, 8, 12]
    assert all(path.name == "model.safetensors" for path in run.checkpoints.values())
    history = json.loads((directory / "trainer_state.json").read_text())["log_history"]
    evaluations = [entry for entry in history if "eval_accuracy" in entry]
    assert run.evaluation["test_acc"].tolist() == [e["eval_accuracy"] for e in evaluations]
    assert run.evaluation["test_loss"].tolist() == [e["eval_loss"] for e in evaluations]
    assert run_hyperparameters(directory)["train_batch_size"] == "16"


def test_its_metrics_equal_the_same_weights_in_the_plain_layout(runs: Path, tmp_path) -> None:
    trainer_run = read_external_run(runs / "lr0.01_seed1")
    plain = tmp_path / "plain"
    plain.mkdir()
    for step, path in trainer_run.checkpoints.items():
        torch.save(load_file(path), plain / f"step_{step}.pt")
    trainer_run.evaluation.to_csv(plain / "evaluation.csv", index=False)
    expected = external_run_metrics(read_external_run(plain))
    pd.testing.assert_frame_equal(external_run_metrics(trainer_run), expected)


def test_the_recorders_callback_equals_the_checkpoints(runs: Path) -> None:
    """MetricCallback in the same Trainer: its table holds the metrics of the checkpoints saved
    at the same steps, and the evaluation's accuracy and loss."""
    from trainmap.dynamics.metrics.columns import METRIC_NAMES

    run = read_external_run(runs / "lr0.1_seed1")
    expected = external_run_metrics(run)
    recorded = pd.read_csv(runs / "recorded/lr0.1_seed1/metrics.csv")
    assert recorded["step"].tolist() == [4, 8, 12] == expected["step"].tolist()
    difference = (recorded[list(METRIC_NAMES)] - expected[list(METRIC_NAMES)]).abs().to_numpy()
    assert difference.max() <= 1e-12 * max(1.0, expected[list(METRIC_NAMES)].abs().to_numpy().max())
    assert recorded["test_acc"].tolist() == pytest.approx(run.evaluation["test_acc"].tolist())
    assert recorded["test_loss"].tolist() == pytest.approx(run.evaluation["test_loss"].tolist())


def test_the_command_line_maps_the_runs_by_learning_rate(runs: Path, tmp_path: Path) -> None:
    assert sorted(find_runs([runs])) == [f"lr{lr}_seed{seed}"
                                         for lr in ("0.01", "0.1") for seed in (0, 1)]  # fmt: skip
    out = tmp_path / "out"
    assert main([str(runs), "--out", str(out), "--threshold", "0.8", "--group-by-path",
                 r"^lr([\d.]+)_", "--k-max", "2", "--restarts", "1", "--bootstrap", "0",
                 "--stability", "0"]) == 0  # fmt: skip
    assert len(list((out / "metrics").rglob("metrics.csv"))) == 4
    verdicts = pd.read_csv(out / "joint/verdicts.csv", dtype={"first": str, "second": str})
    assert set(verdicts["second"]) | set(verdicts["first"]) == {"0.1", "0.01"}
