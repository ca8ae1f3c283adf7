"""collect-metrics against the authors' metric loop, on the same checkpoints, side by side.

trainmap's :func:`trainmap.dynamics.metrics.weights.trajectory_metrics` (``paper`` convention) computes each
Linear matrix's singular values once per checkpoint, batched over the whole trajectory, reuses them
for the spectral norm and the per-matrix singular-value statistics, and takes conv kernels' slice
norms in one vectorised pass. The reference is the authors' loop re-implemented
(:mod:`trainmap.dynamics.metrics.reference`: per checkpoint, per layer, ``vector_norm``,
``matrix_norm(ord=2)`` and ``svd`` separately, the authors' conventions). Both run on the same
trajectories (random weights drifting over 60 checkpoints) of the sparse-parity MLP, a small CNN
(``vgg_bn``, 8x8 inputs), ``resnet_bn`` and the 1-layer transformer (d_model 128, 4 heads), and
must agree: the max relative difference is printed (target <= 1e-9) with the speed ratio (target
>= 2x). Also printed: how far the authors' exact numbers (Bessel's correction, torch's lower
median: switched off in the ``paper`` convention) and trainmap's ``extended`` convention are from
the ``paper`` values.

Usage::

    .venv/bin/python bench/metrics_cost.py           # ~1 minute
    .venv/bin/python bench/metrics_cost.py --quick

Last line: ``metrics_cost_ratio=... max_rel_diff=... (targets >= 2, <= 1e-9)``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import TYPE_CHECKING

import numpy as np

from trainmap.dynamics.metrics.columns import METRIC_NAMES

if TYPE_CHECKING:
    import pandas as pd
    import torch

MODELS = {
    "mlp 40-128-2": ("mlp", {"input_kind": "vector", "input_shape": [40], "num_classes": 2}),
    "vgg_bn on 8x8": ("vgg_bn", {"input_kind": "image", "input_shape": [1, 8, 8],
                                 "num_classes": 10}),
    "resnet_bn on 8x8": ("resnet_bn", {"input_kind": "image", "input_shape": [1, 8, 8],
                                       "num_classes": 10}),
    "transformer p=113": ("transformer", {"input_kind": "tokens", "input_shape": [3],
                                          "num_classes": 113, "vocab_size": 114}),
}  # fmt: skip


def trajectory(model: torch.nn.Module, checkpoints: int, seed: int) -> dict[str, torch.Tensor]:
    """Stacked states that drift by small random steps from the model's initial weights."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}
    stacked = {k: [v] for k, v in state.items()}
    for _ in range(checkpoints - 1):
        for k in state:
            state[k] = state[k] + 0.01 * torch.randn(state[k].shape, generator=generator)
            stacked[k].append(state[k])
    return {k: torch.stack(v) for k, v in stacked.items()}


def relative_difference(a: pd.DataFrame, b: pd.DataFrame) -> pd.Series:
    """Per metric, the largest |a - b| / |b| over checkpoints."""
    import pandas as pd

    a, b = a[list(METRIC_NAMES)].to_numpy(), b[list(METRIC_NAMES)].to_numpy()
    return pd.Series(np.nanmax(np.abs(a - b) / np.maximum(np.abs(b), 1e-12), axis=0),
                     index=list(METRIC_NAMES))  # fmt: skip


def timed(function, *args) -> tuple[float, object]:
    started = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - started, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 checkpoints, 2 rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    import torch

    from trainmap.dynamics.metrics.reference import trajectory_metrics_reference
    from trainmap.dynamics.metrics.weights import trajectory_metrics, weight_matrices
    from trainmap.models import build_model

    torch.set_num_threads(args.threads)
    checkpoints, rounds = (20, 2) if args.quick else (60, 3)
    ratios, differences, conventions = [], [], {}
    print(f"{'model':20}{'matrices':>9}{'trainmap s':>12}{'authors s':>11}{'ratio':>8}"
          f"{'max rel diff':>14}")  # fmt: skip
    for label, (arch, meta) in MODELS.items():
        torch.manual_seed(0)
        model = build_model(arch, meta)
        state = trajectory(model, checkpoints, seed=1)
        fast_times, reference_times = [], []
        for index in range(rounds):
            order = ("fast", "reference") if index % 2 == 0 else ("reference", "fast")
            for which in order:
                if which == "fast":
                    seconds, fast = timed(trajectory_metrics, state, model)
                    fast_times.append(seconds)
                else:
                    seconds, reference = timed(trajectory_metrics_reference, state, model)
                    reference_times.append(seconds)
        difference = float(relative_difference(fast, reference).max())
        ratio = statistics.median(reference_times) / statistics.median(fast_times)
        ratios.append(ratio)
        differences.append(difference)
        authors = trajectory_metrics_reference(state, model, bessel=True, lower_median=True)
        extended = trajectory_metrics(state, model, "extended")
        conventions[label] = {"authors exact": relative_difference(authors, fast),
                              "extended": relative_difference(extended, fast)}  # fmt: skip
        print(f"{label:20}{len(weight_matrices(model)[0]):>9}"
              f"{statistics.median(fast_times):>12.3f}{statistics.median(reference_times):>11.3f}"
              f"{ratio:>8.2f}{difference:>14.2e}")  # fmt: skip
    print(f"({checkpoints} checkpoints each, median of {rounds} alternating rounds)")
    print("\nlargest relative difference from the paper convention, per metric:")
    for label, by_convention in conventions.items():
        for name, diff in by_convention.items():
            shown = ", ".join(f"{k} {v:.2g}" for k, v in diff.items() if v > 1e-9) or "none"
            print(f"  {label:20} {name:14} {shown}")
    print(f"metrics_cost_ratio={min(ratios):.2f} max_rel_diff={max(differences):.1e} "
          "(targets >= 2, <= 1e-9)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
