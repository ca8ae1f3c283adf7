"""The authors' metric loop, re-implemented for one checkpoint at a time: the reference that
:func:`trainmap.dynamics.metrics.weights.trajectory_metrics` (``convention="paper"``; with
``shortcuts=True``, ``convention="paper_shortcuts"``) must equal.

It follows the structure of michahu/modeling-training's ``src/metrics.py`` and ``src/utils.py``
(re-written here from their behaviour, not copied): for every checkpoint and every layer,

* a Linear weight (or one attention head's query/key/value slice) gets ``get_matrix_metrics``:
  entry-wise L1, L2 (``vector_norm``), trace, spectral norm (``matrix_norm(ord=2)``), L1/L2,
  trace/spectral, and the mean and variance of its singular values (``svd``, values below 1e-5
  set to 0);
* a conv kernel gets ``get_tensor_metrics``: L1 and L2 of each (out, in) slice (norms over the
  kernel's spatial dims), averaged, and the mean of the slices' L1/L2;
* every key is averaged over the layers that have it (``get_stats_for_cnn``: conv layers enter
  only the L1, L2 and L1/L2 averages);
* weight and bias statistics (``get_distribution_stats``) over the concatenated counted tensors;
* a residual block counts its own convs but not the convs of its shortcut (projection) branch, as
  the authors' ResNet walker ``get_metrics_resnet18`` reads the stem conv, each block's ``conv1``
  and ``conv2`` and ``fc``, never a block's ``downsample``. The reference finds those convs by
  structure, every Conv2d inside a block's ``shortcut`` (or ``downsample``) submodule
  (:func:`shortcut_convs`), not by trainmap's name-and-kernel rule, so the two check each other;
  ``shortcuts=True`` counts them (trainmap's ``paper_shortcuts``).

Two switches reproduce the authors' numbers exactly: ``bessel=True`` divides variances by n - 1
(``torch.var``), ``lower_median=True`` takes ``torch.median``'s lower middle value. trainmap's
``paper`` convention uses neither (appendix B: no Bessel's correction; the usual median).

Slow on purpose (one SVD per matrix per metric, Python loops): tests and bench/metrics_cost.py use
it; the workflow never does.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch
from torch import nn

from trainmap.dynamics.metrics.weights import METRIC_NAMES, SINGULAR_VALUE_FLOOR, weight_matrices

#: Attributes of a residual block that hold its shortcut branch (trainmap's, torchvision's).
SHORTCUT_ATTRIBUTES = ("shortcut", "downsample")


def _variance(values: torch.Tensor, bessel: bool) -> float:
    return float(torch.var(values, correction=1 if bessel else 0))


def _median(values: torch.Tensor, lower: bool) -> float:
    return float(torch.median(values)) if lower else float(np.median(values.numpy()))


def matrix_metrics(matrix: torch.Tensor, bessel: bool = False) -> dict[str, float] | None:
    """``get_matrix_metrics`` of one 2-D weight; None when it is not finite (the layer is skipped)."""
    if not torch.isfinite(matrix).all():
        return None
    l1 = float(torch.linalg.vector_norm(matrix, ord=1))
    l2 = float(torch.linalg.vector_norm(matrix, ord=2))
    trace = float(torch.trace(matrix))
    spectral = float(torch.linalg.matrix_norm(matrix, ord=2))
    singular = torch.linalg.svd(matrix, full_matrices=False).S
    singular[singular < SINGULAR_VALUE_FLOOR] = 0.0
    return {
        "l1": l1,
        "l2": l2,
        "trace": trace,
        "spectral": spectral,
        "l1_l2": l1 / l2,
        "trace_spectral": trace / spectral,
        "sv_mean": float(singular.mean()),
        "sv_var": _variance(singular, bessel),
    }


def kernel_metrics(kernel: torch.Tensor) -> dict[str, float] | None:
    """``get_tensor_metrics`` of one conv kernel [out, in, kh, kw]."""
    if not torch.isfinite(kernel).all():
        return None
    l1 = torch.linalg.vector_norm(kernel, ord=1, dim=(2, 3)).flatten()
    l2 = torch.linalg.vector_norm(kernel, ord=2, dim=(2, 3)).flatten()
    return {"l1": float(l1.mean()), "l2": float(l2.mean()), "l1_l2": float((l1 / l2).mean())}


def shortcut_convs(model: nn.Module) -> set[str]:
    """The names of the Conv2d modules inside any module's shortcut branch (its ``shortcut`` or
    ``downsample`` submodule, or that submodule itself): what ``get_metrics_resnet18`` never
    reads."""
    inside: set[int] = set()
    for block in model.modules():
        for attribute in SHORTCUT_ATTRIBUTES:
            branch = getattr(block, attribute, None)
            if isinstance(branch, nn.Module):
                inside |= {id(m) for m in branch.modules() if isinstance(m, nn.Conv2d)}
    return {name for name, module in model.named_modules() if id(module) in inside}


def counted_layers(model: nn.Module, shortcuts: bool) -> tuple[list, list[str]]:
    """The matrices and biases the authors' loop reads: every Linear/Conv2d weight (attention
    split per head, the unembedding left out) but, unless ``shortcuts``, the
    :func:`shortcut_convs`."""
    matrices, bias_names = weight_matrices(model, "paper_shortcuts")
    if shortcuts:
        return matrices, bias_names
    skipped = shortcut_convs(model)
    return ([m for m in matrices if m.name.rpartition(".")[0] not in skipped],
            [b for b in bias_names if b.rpartition(".")[0] not in skipped])  # fmt: skip


def checkpoint_metrics(
    state: Mapping[str, torch.Tensor],
    model: nn.Module,
    bessel: bool = False,
    lower_median: bool = False,
    shortcuts: bool = False,
) -> dict[str, float]:
    """The 14 metrics of one checkpoint ``state`` (a state dict) by the authors' loop; with
    ``shortcuts`` the shortcut convs of residual blocks count too."""
    matrices, bias_names = counted_layers(model, shortcuts)
    per_layer: dict[str, list[float]] = {}
    weights = []
    for matrix in matrices:
        tensor = state[matrix.name].to(torch.float64)
        if matrix.rows is not None:
            tensor = tensor[matrix.rows]
        values = kernel_metrics(tensor) if matrix.kind == "conv" else matrix_metrics(tensor, bessel)
        if values is None:
            continue
        weights.append(tensor.flatten())
        for key, value in values.items():
            per_layer.setdefault(key, []).append(value)
    row = {key: float(np.mean(values)) for key, values in per_layer.items()}
    everything = torch.cat(weights)
    row |= {"w_mean": float(everything.mean()), "w_median": _median(everything, lower_median),
            "w_var": _variance(everything, bessel)}  # fmt: skip
    if bias_names:
        biases = torch.cat([state[name].to(torch.float64).flatten() for name in bias_names])
        row |= {"b_mean": float(biases.mean()), "b_median": _median(biases, lower_median),
                "b_var": _variance(biases, bessel)}  # fmt: skip
    return {name: row.get(name, float("nan")) for name in METRIC_NAMES}


def trajectory_metrics_reference(
    state: Mapping[str, torch.Tensor], model: nn.Module, **switches: bool
) -> pd.DataFrame:
    """:func:`checkpoint_metrics` of every checkpoint of a stacked trajectory, one at a time."""
    n = next(iter(state.values())).shape[0]
    rows = [checkpoint_metrics({k: v[t] for k, v in state.items()}, model, **switches)
            for t in range(n)]  # fmt: skip
    return pd.DataFrame(rows, columns=list(METRIC_NAMES))
