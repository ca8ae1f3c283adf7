"""The recorder in a plain training loop: one ``recorder.log(model, step, test_acc=...)`` per
evaluation writes the run's metric table as training goes; its numbers equal the metrics of the
same weights saved as checkpoints and read back, and the tables map directly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from trainmap.dynamics.__main__ import find_runs
from trainmap.dynamics.metrics.columns import METRIC_NAMES
from trainmap.dynamics.metrics.tables import read_metric_table
from trainmap.dynamics.runs.external import external_run_metrics, read_external_run
from trainmap.recorder import MetricRecorder


def plain_loop(recorded: Path, saved: Path, seed: int, every: int = 10, steps: int = 30) -> None:
    """A PyTorch loop that records its metrics and, for comparison, also saves each checkpoint
    (``saved/step_<n>.pt`` and ``evaluation.csv``)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 2))  # fmt: skip
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(128, 8, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    recorder = MetricRecorder(recorded)
    saved.mkdir(parents=True)
    rows = []
    for step in range(steps + 1):
        if step % every == 0:
            with torch.no_grad():
                accuracy = (model(x).argmax(1) == y).float().mean()
            recorder.log(model, step, test_acc=accuracy)
            torch.save(model.state_dict(), saved / f"step_{step}.pt")
            rows.append({"step": step, "test_acc": float(accuracy)})
        if step < steps:
            optimiser.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimiser.step()
    pd.DataFrame(rows).to_csv(saved / "evaluation.csv", index=False)


def test_recorded_metrics_equal_those_of_the_saved_checkpoints(tmp_path: Path) -> None:
    plain_loop(tmp_path / "recorded/seed0", tmp_path / "saved/seed0", seed=0)
    recorded = read_metric_table(
        tmp_path / "recorded/seed0/metrics.csv", [*METRIC_NAMES, "test_acc"]
    )
    expected = external_run_metrics(read_external_run(tmp_path / "saved/seed0"))
    assert recorded["step"].tolist() == [0, 10, 20, 30]
    difference = (recorded[list(METRIC_NAMES)] - expected[list(METRIC_NAMES)]).abs().to_numpy()
    scale = np.maximum(1.0, expected[list(METRIC_NAMES)].abs().to_numpy())
    assert (difference / scale).max() <= 1e-12
    assert recorded["test_acc"].tolist() == expected["test_acc"].tolist()
    assert (recorded["n_matrices"] == expected["n_matrices"]).all()


def test_recorded_runs_map_directly(tmp_path: Path) -> None:
    for seed in (0, 1):
        plain_loop(tmp_path / f"recorded/seed{seed}", tmp_path / f"saved/seed{seed}", seed=seed)
    found = find_runs([tmp_path / "recorded"])
    assert sorted(found) == ["seed0", "seed1"]
    assert all(path.name == "metrics.csv" for path in found.values())


def test_a_resumed_run_extends_its_table_and_a_step_is_recorded_once(tmp_path: Path) -> None:
    model = nn.Linear(4, 2)
    MetricRecorder(tmp_path).log(model, 0, test_acc=0.5)
    resumed = MetricRecorder(tmp_path)  # a new process after a restart
    resumed.log(model.state_dict(), 10, test_acc=0.75, train_loss=torch.tensor(0.3))
    table = pd.read_csv(tmp_path / "metrics.csv")
    assert table["step"].tolist() == [0, 10] and table["train_loss"].iloc[1] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="step 10 is already recorded"):
        resumed.log(model, 10, test_acc=0.8)
    with pytest.raises(ValueError, match=r"unknown evaluation column\(s\) \['val_acc'\]"):
        resumed.log(model, 20, val_acc=0.8)
    assert pd.read_csv(tmp_path / "metrics.csv")["step"].tolist() == [0, 10]  # left as it was
