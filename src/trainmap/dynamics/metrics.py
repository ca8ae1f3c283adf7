"""The 14 weight metrics of a checkpoint (Hu et al., "Latent state models of training dynamics",
appendix B), computed for every checkpoint of a run's trajectory.

Which tensors count (one place, :func:`weight_matrices`):

* ``nn.Linear`` weights, as (out, in) matrices, and their biases;
* attention (``trainmap.models.MultiHeadAttention``): the query, key and value projections count one
  (d_head, d_model) matrix per head, as the authors did; the output projection counts whole;
* ``nn.Conv2d`` kernels as (out, in/groups * kh * kw) matrices, and their biases. The authors'
  code took only L1/L2 of 3x3 slices of conv kernels; a kernel reshaped to the map from an input
  patch to an output channel gives every metric (norms, trace, singular values) a meaning, so all
  14 are computed on it;
* embeddings and normalisation layers (BatchNorm, LayerNorm) are ignored, as in the paper (sec. 3:
  "we ignore embedding matrices and layer norms").

The metrics of one checkpoint, over its K matrices W_k (appendix B; variances without Bessel's
correction):

=================  ====================================================================
``l1``             (1/K) sum_k ||W_k||_1 (entry-wise)
``l2``             (1/K) sum_k ||W_k||_2 (Frobenius)
``l1_l2``          (1/K) sum_k ||W_k||_1 / ||W_k||_2 (dispersion; lower is sparser)
``trace``          (1/K) sum_k tr(W_k) (sum of the main diagonal, also for rectangular W_k)
``spectral``       (1/K) sum_k ||W_k||_2,op (largest singular value)
``trace_spectral`` (1/K) sum_k tr(W_k) / ||W_k||_2,op
``sv_mean``        mean of the singular values of all matrices, pooled
``sv_var``         variance of the singular values of all matrices, pooled
``w_mean``         mean of all weights (every entry of every counted matrix)
``w_median``       median of all weights
``w_var``          variance of all weights
``b_mean``         mean of all biases of the counted layers
``b_median``       median of all biases
``b_var``          variance of all biases
=================  ====================================================================

Each matrix's singular values are computed once per checkpoint (batched over the trajectory with
``torch.linalg.svdvals`` in float64) and reused for the spectral norm and the singular-value
statistics; singular values below 1e-5 count as 0 (the authors' code). A matrix with a NaN or Inf
entry at a checkpoint is skipped there and counted in ``skipped_matrices``; a model without biases
gets NaN bias metrics (the HMM then drops those features with a warning).

The per-run table (:func:`collect_run_metrics`, written as ``metrics.csv`` by the workflow) has one
row per checkpoint: ``step``, the 14 metric columns in :data:`METRIC_NAMES` order,
``n_matrices``, ``skipped_matrices``, then the run's ``train_loss``, ``train_acc``, ``test_loss`` and
``test_acc`` at that checkpoint (from its history).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

METRIC_NAMES = (
    "l1",
    "l2",
    "l1_l2",
    "trace",
    "spectral",
    "trace_spectral",
    "sv_mean",
    "sv_var",
    "w_mean",
    "w_median",
    "w_var",
    "b_mean",
    "b_median",
    "b_var",
)
HISTORY_COLUMNS = ("train_loss", "train_acc", "test_loss", "test_acc")
SINGULAR_VALUE_FLOOR = 1e-5


@dataclass(frozen=True)
class MatrixSlice:
    """One counted matrix: rows ``rows`` of the state entry ``name``, reshaped to 2-D."""

    name: str
    rows: slice | None = None


def weight_matrices(model: nn.Module) -> tuple[list[MatrixSlice], list[str]]:
    """The counted weight matrices and the counted bias entries of ``model``'s state dict."""
    from trainmap.models import MultiHeadAttention

    matrices: list[MatrixSlice] = []
    biases: list[str] = []
    per_head: set[str] = set()
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, MultiHeadAttention):
            for projection in ("q", "k", "v"):
                per_head.add(f"{prefix}{projection}")
                for head in range(module.n_heads):
                    rows = slice(head * module.d_head, (head + 1) * module.d_head)
                    matrices.append(MatrixSlice(f"{prefix}{projection}.weight", rows))
        elif isinstance(module, nn.Linear | nn.Conv2d) and name not in per_head:
            matrices.append(MatrixSlice(f"{prefix}weight"))
            if module.bias is not None:
                biases.append(f"{prefix}bias")
    return matrices, biases


def _stacked_matrix(state: Mapping[str, torch.Tensor], matrix: MatrixSlice) -> torch.Tensor:
    """``[n_checkpoints, rows, cols]`` in float64 (conv kernels flattened per output channel)."""
    tensor = state[matrix.name].to(torch.float64)
    stacked = tensor.reshape(tensor.shape[0], tensor.shape[1], -1)
    return stacked if matrix.rows is None else stacked[:, matrix.rows]


def _matrix_statistics(stacked: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-checkpoint statistics of one matrix over the trajectory; one SVD per checkpoint."""
    finite = torch.isfinite(stacked).flatten(1).all(dim=1)
    clean = torch.where(finite[:, None, None], stacked, torch.zeros_like(stacked))
    singular = torch.linalg.svdvals(clean)
    singular = torch.where(singular < SINGULAR_VALUE_FLOOR, torch.zeros_like(singular), singular)
    l1 = clean.abs().flatten(1).sum(dim=1)
    l2 = clean.flatten(1).norm(dim=1)
    trace = torch.diagonal(clean, dim1=1, dim2=2).sum(dim=1)
    spectral = singular[:, 0]
    return {
        "finite": finite,
        "l1": l1,
        "l2": l2,
        "l1_l2": l1 / l2,
        "trace": trace,
        "spectral": spectral,
        "trace_spectral": trace / spectral,
        "singular": singular,
        "entries": clean.flatten(1),
    }


def _pooled(values: list[np.ndarray]) -> tuple[float, float, float]:
    """Mean, median and variance (no Bessel) of concatenated values; NaN when there are none."""
    if not values:
        return float("nan"), float("nan"), float("nan")
    pooled = np.concatenate(values)
    if pooled.size == 0:
        return float("nan"), float("nan"), float("nan")
    return float(pooled.mean()), float(np.median(pooled)), float(pooled.var())


def _pooled_rows(parts: list[torch.Tensor], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per checkpoint (row): mean, median and variance of the ``[n, k_i]`` parts side by side;
    NaN where there are no values (a model without biases)."""
    if sum(part.shape[1] for part in parts) == 0:
        return (np.full(n, np.nan),) * 3
    pooled = torch.cat(parts, dim=1).numpy()
    return pooled.mean(axis=1), np.median(pooled, axis=1), pooled.var(axis=1)


def trajectory_metrics(state: Mapping[str, torch.Tensor], model: nn.Module) -> pd.DataFrame:
    """The 14 metrics (appendix B) of every checkpoint of a stacked trajectory ``state``.

    ``state`` maps state-dict names to ``[n_checkpoints, *shape]`` tensors; ``model`` only tells
    which entries are Linear/Conv/attention tensors (:func:`weight_matrices`).
    """
    matrices, bias_names = weight_matrices(model)
    if not matrices:
        raise ValueError("the model has no Linear or Conv2d weight to compute metrics on")
    stats = [_matrix_statistics(_stacked_matrix(state, matrix)) for matrix in matrices]
    n_checkpoints = next(iter(state.values())).shape[0]
    finite = torch.stack([s["finite"] for s in stats])  # [K, n]
    counts = finite.sum(dim=0)
    table: dict[str, np.ndarray] = {}
    # A ratio of an all-zero matrix (FixUp's zero-initialised layers) is undefined: such matrices
    # are left out of that ratio's mean, not turned into NaN.
    denominators = {"l1_l2": "l2", "trace_spectral": "spectral"}
    for key in ("l1", "l2", "l1_l2", "trace", "spectral", "trace_spectral"):
        values = torch.stack([s[key] for s in stats])
        used = finite
        if key in denominators:
            used = finite & (torch.stack([s[denominators[key]] for s in stats]) > 0)
        summed = torch.where(used, values, torch.zeros_like(values)).sum(dim=0)
        table[key] = (summed / used.sum(dim=0)).numpy()
    rows = {name: [] for name in ("sv_mean", "sv_var", "w_mean", "w_median", "w_var",
                                  "b_mean", "b_median", "b_var")}  # fmt: skip
    biases = [state[name].to(torch.float64).reshape(n_checkpoints, -1) for name in bias_names]
    clean = finite.all(dim=0)
    for bias in biases:
        clean &= torch.isfinite(bias).all(dim=1)
    # Checkpoints where every matrix and bias is finite (all, in a healthy run): pooled over all
    # checkpoints at once; the others one at a time, leaving out the non-finite tensors.
    sv_mean, _, sv_var = _pooled_rows([s["singular"] for s in stats], n_checkpoints)
    w_mean, w_median, w_var = _pooled_rows([s["entries"] for s in stats], n_checkpoints)
    b_mean, b_median, b_var = _pooled_rows(biases, n_checkpoints)
    batched = dict(zip(rows, (sv_mean, sv_var, w_mean, w_median, w_var, b_mean, b_median, b_var),
                       strict=True))  # fmt: skip
    for t in range(n_checkpoints):
        if bool(clean[t]):
            for key, values in batched.items():
                rows[key].append(float(values[t]))
            continue
        valid = [s for s in stats if bool(s["finite"][t])]
        singular = [s["singular"][t].numpy() for s in valid]
        sv_mean, _, sv_var = _pooled(singular)
        w_mean, w_median, w_var = _pooled([s["entries"][t].numpy() for s in valid])
        at_t = [bias[t].numpy() for bias in biases]
        b_mean, b_median, b_var = _pooled([b for b in at_t if np.isfinite(b).all()])
        for key, value in zip(rows, (sv_mean, sv_var, w_mean, w_median, w_var,
                                     b_mean, b_median, b_var), strict=True):  # fmt: skip
            rows[key].append(value)
    table.update({key: np.asarray(values) for key, values in rows.items()})
    frame = pd.DataFrame({name: table[name] for name in METRIC_NAMES})
    frame["n_matrices"] = len(matrices)
    frame["skipped_matrices"] = len(matrices) - counts.numpy()
    return frame


def collect_run_metrics(
    trajectory: Mapping[str, object], model: nn.Module, history: pd.DataFrame
) -> pd.DataFrame:
    """The per-run metrics table: one row per checkpoint (see the module docstring for columns).

    ``trajectory`` is a saved trajectory (``{"step": LongTensor[n], "state": {...}}``), ``history``
    the run's ``history.csv`` (same steps).
    """
    steps = trajectory["step"].tolist()
    frame = trajectory_metrics(trajectory["state"], model)
    frame.insert(0, "step", steps)
    by_step = history.set_index("step")
    missing = sorted(set(steps) - set(by_step.index))
    if missing:
        raise ValueError(f"history has no rows for trajectory steps {missing[:5]}; the files "
                         "belong to different runs")  # fmt: skip
    for column in HISTORY_COLUMNS:
        frame[column] = by_step.loc[steps, column].to_numpy() if column in by_step else np.nan
    return frame
