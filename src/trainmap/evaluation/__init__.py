"""Evaluation of trained runs and the grid-wide summary.

Per run: final test accuracy and loss (recomputed from the saved weights), best test accuracy,
convergence step, parameter count, size on disk and CPU inference latency at a fixed batch size
(``evaluate.<task>``'s ``latency``, ``latency_batch`` and ``latency_repeats``, whose defaults are the
config schema's: :data:`EVALUATE_DEFAULTS`, :func:`latency_probe`).
Convergence step follows Hu et al. (training-dynamics paper, sec. 4): the first checkpoint whose test
accuracy reaches the task's threshold, set slightly below the final accuracy; a run that never gets
there is reported with ``converged: false`` and no step, never silently dropped.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from trainmap.data import TaskData
from trainmap.dynamics.metrics.columns import DIRECTIONS
from trainmap.models import count_parameters
from trainmap.schema import section_defaults
from trainmap.training.augment import evaluation_inputs, recipe_of_record
from trainmap.training.checkpoints import load_model
from trainmap.training.loop import evaluate_split

GROUP_KEYS = ["task", "arch", "method"]
#: The defaults of ``evaluate.<task>``'s settings: the schema's.
EVALUATE_DEFAULTS: dict[str, Any] = section_defaults("evaluate")


def latency_probe(settings: Mapping[str, Any]) -> tuple[int, int]:
    """``(latency_batch, latency_repeats)`` of a task's evaluation ``settings``
    (``evaluate.<task>``): the batch whose forward pass is timed and how many passes are; an
    omitted one takes the schema's default."""
    given = {**EVALUATE_DEFAULTS, **settings}
    return given["latency_batch"], given["latency_repeats"]


def convergence_step(
    history: pd.DataFrame, threshold: float, direction: str = "rising", curve: str = "test_acc"
) -> int | None:
    """First checkpoint step whose ``curve`` column reaches ``threshold``: at or above it for a
    ``rising`` curve (an accuracy, the paper's), at or below it for a ``falling`` one (a held-out
    loss); ``None`` if there is none."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r}: choose one of {', '.join(DIRECTIONS)}")
    values = history[curve]
    reached = history.loc[values >= threshold if direction == "rising" else values <= threshold,
                          "step"]  # fmt: skip
    return int(reached.iloc[0]) if len(reached) else None


@torch.no_grad()
def measure_latency_ms(model: nn.Module, example: torch.Tensor, batch: int, repeats: int) -> float:
    """Median wall time (ms) of one forward pass on ``batch`` copies of ``example``, after warm-up,
    on ``example``'s device (a GPU's queue is drained before and after each pass)."""
    inputs = example.unsqueeze(0).expand(batch, *example.shape).contiguous()
    model.eval()
    for _ in range(3):
        model(inputs)
    times = []
    for _ in range(repeats):
        _synchronize(inputs.device)
        start = time.perf_counter()
        model(inputs)
        _synchronize(inputs.device)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def count_nonzero_weights(model: nn.Module) -> int:
    """Non-zero entries of the weights the model computes with (a sparse layer's masked weights,
    a quantised layer's dequantised ones: their ``effective_weight()``), plus its other parameters."""
    total = 0
    for module in model.modules():
        effective = getattr(module, "effective_weight", None)
        if callable(effective):
            total += int(torch.count_nonzero(effective()))
            others = [p for n, p in module.named_parameters(recurse=False) if n != "weight"]
        else:
            others = list(module.parameters(recurse=False))
        total += sum(int(torch.count_nonzero(p)) for p in others)
    return total


def quantized_weight_count(model: nn.Module) -> int:
    """Weights stored as integers (quantised layers keep them as buffers, not parameters)."""
    return sum(b.numel() for name, b in model.named_buffers() if name.endswith("qweight"))


def evaluate_form(
    form: str,
    model_path: str | Path,
    data: TaskData,
    latency_batch: int = EVALUATE_DEFAULTS["latency_batch"],
    latency_repeats: int = EVALUATE_DEFAULTS["latency_repeats"],
    bytes_path: str | Path | None = None,
    latency: str = EVALUATE_DEFAULTS["latency"],
    prepare: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Accuracy, size and latency of one form of a run's model (trained, deploy, sparse, int8...).

    Accuracy and loss on ``data``'s device (the training device, :func:`trainmap.training.setup.
    on_device`); latency on the CPU (``latency="cpu"``), on that device (``"device"``) or not at
    all (``"none"``: None). ``bytes_path`` is the file whose size is reported when it is not the
    checkpoint itself (a packed storage format). ``prepare``: what the test inputs go through
    first (the run's normalisation, :func:`trainmap.training.augment.evaluation_inputs`).
    """
    device = data.x_test.device
    model = load_model(model_path).to(device)
    test_loss, test_acc = evaluate_split(model, data.x_test, data.y_test, prepare)
    example = data.x_test[:1] if prepare is None else prepare(data.x_test[:1])
    if latency == "none":
        latency_ms = None
    elif latency == "cpu":
        latency_ms = measure_latency_ms(model.cpu(), example[0].cpu(), latency_batch,
                                        latency_repeats)  # fmt: skip
    else:
        latency_ms = measure_latency_ms(model, example[0], latency_batch, latency_repeats)
    return {
        "form": form,
        "test_acc": test_acc,
        "test_loss": test_loss if math.isfinite(test_loss) else math.nan,
        "n_params": count_parameters(model) + quantized_weight_count(model),
        "nonzero_weights": count_nonzero_weights(model),
        "bytes_on_disk": Path(bytes_path or model_path).stat().st_size,
        "latency_ms": latency_ms,
    }


def evaluate_run(
    model_path: str | Path,
    history: pd.DataFrame,
    train_summary: dict[str, Any],
    data: TaskData,
    threshold: float,
    latency_batch: int = EVALUATE_DEFAULTS["latency_batch"],
    latency_repeats: int = EVALUATE_DEFAULTS["latency_repeats"],
    form: str = "trained",
    other_forms: list[dict[str, Any]] | None = None,
    latency: str = EVALUATE_DEFAULTS["latency"],
) -> dict[str, Any]:
    """Everything the evaluation table reports about one run: its final model (``form``), its
    convergence, and the same measurements for its other forms (``other_forms``: dicts of
    :func:`evaluate_form` arguments ``form``, ``model_path`` and optionally ``bytes_path``). Every
    form sees the test inputs as the run's training evaluated them (its recorded ``augment``'s
    normalisation, ``train_summary``)."""
    prepare = evaluation_inputs(recipe_of_record(train_summary.get("augment")), data.x_test.dtype)
    primary = evaluate_form(form, model_path, data, latency_batch, latency_repeats, latency=latency,
                            prepare=prepare)  # fmt: skip
    forms = [primary] + [
        evaluate_form(
            data=data,
            latency_batch=latency_batch,
            latency_repeats=latency_repeats,
            latency=latency,
            prepare=prepare,
            **other,
        )  # fmt: skip
        for other in other_forms or []
    ]
    step = convergence_step(history, threshold)
    return {
        "status": train_summary["status"],
        "diverged_step": train_summary["diverged_step"],
        "steps_done": train_summary["steps_done"],
        "test_acc": primary["test_acc"],
        "test_loss": primary["test_loss"],
        "best_test_acc": float(history["test_acc"].max()),
        "threshold": threshold,
        "converged": step is not None,
        "convergence_step": step,
        "n_params": primary["n_params"],
        "nonzero_weights": primary["nonzero_weights"],
        "bytes_on_disk": primary["bytes_on_disk"],
        "latency_ms": primary["latency_ms"],
        "latency_batch": latency_batch,
        "train_wall_time_s": train_summary.get("wall_time_s"),  # None: its timing file is gone
        "forms": forms,
    }


def compression_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per form of each run: the compression view (accuracy against bytes)."""
    rows = [
        {key: record[key] for key in (*GROUP_KEYS, "seed")} | form
        for record in records
        for form in record.get("forms", [])
    ]
    return pd.DataFrame(rows)


def summarise(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per run, sorted by grid cell (its final model's measurements)."""
    frame = pd.DataFrame([{k: v for k, v in r.items() if k != "forms"} for r in records])
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
