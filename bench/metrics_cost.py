"""collect-metrics vs a naive per-metric computation, on the same checkpoints, side by side.

trainmap's :func:`trainmap.dynamics.metrics.trajectory_metrics` computes each matrix's singular values
once per checkpoint, batched over the whole trajectory, and reuses them for the spectral norm and the
singular-value statistics. The naive reference below does what a straightforward implementation
does: for every checkpoint, for every metric, loop over the matrices one at a time, with a separate
SVD for the spectral norm (``torch.linalg.matrix_norm(ord=2)``) and another for the singular-value
mean and variance. Both run on the same trajectories (random weights drifting over 60 checkpoints)
of a small CNN (``vgg_bn``, 8x8 inputs) and of the 1-layer transformer (d_model 128, 4 heads), and
must agree: the max relative difference is printed (target <= 1e-6) with the speed ratio (target >=
2x).

Usage::

    .venv/bin/python bench/metrics_cost.py           # ~1 minute
    .venv/bin/python bench/metrics_cost.py --quick

Last line: ``metrics_cost_ratio=... max_rel_diff=... (targets >= 2, <= 1e-6)``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pandas as pd
import torch

from trainmap.dynamics.metrics import (
    METRIC_NAMES,
    SINGULAR_VALUE_FLOOR,
    trajectory_metrics,
    weight_matrices,
)
from trainmap.models import build_model

MODELS = {
    "vgg_bn on 8x8": ("vgg_bn", {"input_kind": "image", "input_shape": [1, 8, 8],
                                 "num_classes": 10}),
    "transformer p=113": ("transformer", {"input_kind": "tokens", "input_shape": [3],
                                          "num_classes": 113, "vocab_size": 114}),
}  # fmt: skip


def trajectory(model: torch.nn.Module, checkpoints: int, seed: int) -> dict[str, torch.Tensor]:
    """Stacked states that drift by small random steps from the model's initial weights."""
    generator = torch.Generator().manual_seed(seed)
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}
    stacked = {k: [v] for k, v in state.items()}
    for _ in range(checkpoints - 1):
        for k in state:
            state[k] = state[k] + 0.01 * torch.randn(state[k].shape, generator=generator)
            stacked[k].append(state[k])
    return {k: torch.stack(v) for k, v in stacked.items()}


def naive_metrics(state: dict[str, torch.Tensor], model: torch.nn.Module) -> pd.DataFrame:
    """One matrix at a time, one metric at a time, a separate SVD for each SVD-based metric."""
    matrices, bias_names = weight_matrices(model)
    rows = []
    n = next(iter(state.values())).shape[0]
    for t in range(n):
        mats = []
        for matrix in matrices:
            tensor = state[matrix.name][t].to(torch.float64)
            tensor = tensor.reshape(tensor.shape[0], -1)
            mats.append(tensor if matrix.rows is None else tensor[matrix.rows])
        row = {
            "l1": np.mean([float(w.abs().sum()) for w in mats]),
            "l2": np.mean([float(w.norm()) for w in mats]),
            "l1_l2": np.mean([float(w.abs().sum() / w.norm()) for w in mats]),
            "trace": np.mean([float(torch.diagonal(w).sum()) for w in mats]),
            "spectral": np.mean([float(torch.linalg.matrix_norm(w, ord=2)) for w in mats]),
            "trace_spectral": np.mean(
                [float(torch.diagonal(w).sum() / torch.linalg.matrix_norm(w, ord=2)) for w in mats]
            ),
        }
        singular = []
        for w in mats:
            values = torch.linalg.svdvals(w)
            singular.append(torch.where(values < SINGULAR_VALUE_FLOOR, 0.0, values).numpy())
        pooled = np.concatenate(singular)
        row["sv_mean"], row["sv_var"] = pooled.mean(), pooled.var()
        weights = np.concatenate([w.reshape(-1).numpy() for w in mats])
        row["w_mean"], row["w_median"], row["w_var"] = (
            weights.mean(),
            np.median(weights),
            weights.var(),
        )
        biases = np.concatenate([state[b][t].to(torch.float64).numpy().ravel() for b in bias_names])
        row["b_mean"], row["b_median"], row["b_var"] = (
            biases.mean(),
            np.median(biases),
            biases.var(),
        )
        rows.append(row)
    return pd.DataFrame(rows)[list(METRIC_NAMES)]


def timed(function, *args) -> tuple[float, object]:
    started = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - started, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 checkpoints, 2 rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    checkpoints, rounds = (20, 2) if args.quick else (60, 3)
    ratios, differences = [], []
    print(
        f"{'model':20}{'matrices':>9}{'trainmap s':>12}{'naive s':>10}{'ratio':>8}{'max rel diff':>14}"
    )
    for label, (arch, meta) in MODELS.items():
        torch.manual_seed(0)
        model = build_model(arch, meta)
        state = trajectory(model, checkpoints, seed=1)
        fast_times, naive_times = [], []
        for index in range(rounds):
            order = ("fast", "naive") if index % 2 == 0 else ("naive", "fast")
            for which in order:
                if which == "fast":
                    seconds, fast = timed(trajectory_metrics, state, model)
                    fast_times.append(seconds)
                else:
                    seconds, naive = timed(naive_metrics, state, model)
                    naive_times.append(seconds)
        fast_values = fast[list(METRIC_NAMES)].to_numpy()
        naive_values = naive.to_numpy()
        scale = np.maximum(np.abs(naive_values), 1e-12)
        difference = float(np.max(np.abs(fast_values - naive_values) / scale))
        ratio = statistics.median(naive_times) / statistics.median(fast_times)
        ratios.append(ratio)
        differences.append(difference)
        print(f"{label:20}{len(weight_matrices(model)[0]):>9}{statistics.median(fast_times):>12.3f}"
              f"{statistics.median(naive_times):>10.3f}{ratio:>8.2f}{difference:>14.2e}")  # fmt: skip
    print(f"({checkpoints} checkpoints each, median of {rounds} alternating rounds)")
    print(f"metrics_cost_ratio={min(ratios):.2f} max_rel_diff={max(differences):.1e} "
          "(targets >= 2, <= 1e-6)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
