"""Evaluation of trained runs and the grid-wide summary.

Per run: final test accuracy and loss (recomputed from the saved weights), best test accuracy,
convergence step, parameter count, size on disk and CPU inference latency at a fixed batch size.
Convergence step follows Hu et al. (training-dynamics paper, sec. 4): the first checkpoint whose test
accuracy reaches the task's threshold, set slightly below the final accuracy; a run that never gets
there is reported with ``converged: false`` and no step, never silently dropped.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from trainmap.data import TaskData
from trainmap.io import load_torch
from trainmap.models import build_model, count_parameters
from trainmap.train import evaluate_split

GROUP_KEYS = ["task", "arch", "method"]


def convergence_step(history: pd.DataFrame, threshold: float) -> int | None:
    """First checkpoint step whose ``test_acc >= threshold``; ``None`` if there is none."""
    reached = history.loc[history["test_acc"] >= threshold, "step"]
    return int(reached.iloc[0]) if len(reached) else None


def load_trained_model(path: str | Path) -> nn.Module:
    """Rebuild a model saved by the ``train`` rule (architecture, options and data meta in the file)."""
    saved = load_torch(path)
    model = build_model(saved["arch"], saved["meta"], **saved["model_options"])
    model.load_state_dict(saved["state_dict"])
    return model.eval()


@torch.no_grad()
def measure_latency_ms(model: nn.Module, example: torch.Tensor, batch: int, repeats: int) -> float:
    """Median wall time (ms) of one forward pass on ``batch`` copies of ``example``, after warm-up."""
    inputs = example.unsqueeze(0).expand(batch, *example.shape).contiguous()
    model.eval()
    for _ in range(3):
        model(inputs)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(inputs)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def evaluate_run(
    model_path: str | Path,
    history: pd.DataFrame,
    train_summary: dict[str, Any],
    data: TaskData,
    threshold: float,
    latency_batch: int = 256,
    latency_repeats: int = 20,
) -> dict[str, Any]:
    """Everything the evaluation table reports about one trained run."""
    model = load_trained_model(model_path)
    test_loss, test_acc = evaluate_split(model, data.x_test, data.y_test)
    step = convergence_step(history, threshold)
    return {
        "status": train_summary["status"],
        "diverged_step": train_summary["diverged_step"],
        "steps_done": train_summary["steps_done"],
        "test_acc": test_acc,
        "test_loss": test_loss if math.isfinite(test_loss) else math.nan,
        "best_test_acc": float(history["test_acc"].max()),
        "threshold": threshold,
        "converged": step is not None,
        "convergence_step": step,
        "n_params": count_parameters(model),
        "bytes_on_disk": Path(model_path).stat().st_size,
        "latency_ms": measure_latency_ms(model, data.x_test[0], latency_batch, latency_repeats),
        "latency_batch": latency_batch,
        "train_wall_time_s": train_summary["wall_time_s"],
    }


def summarise(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per run, sorted by grid cell."""
    frame = pd.DataFrame(records)
    return frame.sort_values([*GROUP_KEYS, "seed"]).reset_index(drop=True)


def group_metrics(frame: pd.DataFrame) -> dict[str, Any]:
    """Per (task, arch, method): runs, diverged, converged fraction, accuracy and convergence stats.

    Nested as ``{task: {arch: {method: {...}}}}`` so ``dvc metrics show`` prints one row per group.
    """
    metrics: dict[str, Any] = {}
    for (task, arch, method), group in frame.groupby(GROUP_KEYS, sort=True):
        converged = group.loc[group["converged"], "convergence_step"]
        entry = {
            "runs": len(group),
            "diverged": int((group["status"] == "diverged").sum()),
            "converged_frac": float(group["converged"].mean()),
            "test_acc_mean": float(group["test_acc"].mean()),
            "test_acc_std": float(group["test_acc"].std(ddof=1)) if len(group) > 1 else 0.0,
            "convergence_step_median": float(converged.median()) if len(converged) else None,
        }
        metrics.setdefault(task, {}).setdefault(arch, {})[method] = entry
    return metrics
