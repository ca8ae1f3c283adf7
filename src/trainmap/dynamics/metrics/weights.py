"""The 14 weight metrics of a checkpoint (Hu et al., "Latent state models of training dynamics",
appendix B), computed for every checkpoint of a run's trajectory.

Three conventions (``convention``; params.yaml ``analysis.metrics``; :data:`CONVENTIONS`):

``paper`` (default): the authors' conventions, which the paper describes, plus two corrections
    the paper itself asks for. Checked against a re-implementation of the authors' per-layer loop
    (``get_matrix_metrics`` / ``get_tensor_metrics`` / ``get_distribution_stats`` and the ResNet
    walker ``get_metrics_resnet18`` of michahu/modeling-training, ``src/metrics.py``;
    :mod:`trainmap.dynamics.metrics.reference`) on MLP, transformer, VGG and ResNet checkpoints
    (tests/test_dynamics_metrics.py; bench/metrics_cost.py):

    (a) Singular-value statistics per matrix, then averaged over matrices. Paper sec. 2.1: "the
        means and variances of each weight matrix's singular values"; the code averages each
        matrix's ``mean_singular_value`` / ``var_singular_value`` over matrices.
    (b) Convolution kernels: only L1, L2 and L1/L2, each the mean over the kernel's (out, in)
        kh x kw slices (the code's ``get_tensor_metrics``: norms over dims (2, 3), averaged); those
        enter the L1, L2 and L1/L2 averages beside the Linear matrices. Trace, spectral norm, their
        ratio and the singular-value statistics come from Linear matrices only (the code computes
        ``get_matrix_metrics`` only for Linear layers). Conv kernels still count in the weight
        mean/median/variance, and conv biases in the bias statistics.
    (c) Embedding matrices are ignored (paper sec. 3: "we ignore embedding matrices and layer
        norms"), the unembedding (a token model's readout Linear) included: the authors'
        transformer metrics take W_K, W_Q, W_V per head, W_O, W_in and W_out, never W_U.

    and trainmap's two corrections, which keep the numbers the paper defines:

    (d) variances without Bessel's correction, as appendix B states ("sample variance ... without
        Bessel's correction"; the code's ``torch.var`` divides by n - 1);
    (e) the median is the usual one (mean of the two middle values), not ``torch.median``'s lower
        middle value.

    and, for residual networks, the layers the authors' code reads (as (c), a choice of layers):

    (f) The 1x1 shortcut (projection) convs of residual blocks are left out, with their biases
        (normalisation layers, their BN included, are ignored anyway): the paper is silent, and
        the authors' ResNet walker (``get_metrics_resnet18``) reads the stem conv, each block's
        ``conv1`` and ``conv2`` and the ``fc`` weight and bias, never a block's ``downsample``.
        Counting them moves trainmap's resnet_bn metrics by up to 20 % (l1), 17 % (l2), 16 %
        (l1_l2), 35 % (w_var), 124 % (w_mean) and 147 % (w_median) (8x8 and 32x32 inputs,
        drifting random weights); ``paper`` and the authors' loop re-implemented
        (:mod:`trainmap.dynamics.metrics.reference`) agree to 1e-14.
        A shortcut conv is a Conv2d with a 1x1 kernel inside a module named ``shortcut`` or
        ``downsample`` (:func:`is_shortcut_conv`: trainmap's ``stage2.0.shortcut.conv`` and
        ``blocks.3.shortcut``, torchvision's ``layer2.0.downsample.0``). A RepVGG block's 1x1
        branch (``conv1x1.conv``) is part of the block's own conv, not a shortcut, and counts.

``paper_shortcuts``: ``paper`` with the shortcut convs of (f) counted like the block's other
    convs (kernel slice L1, L2 and L1/L2; weights and biases in the pooled statistics). For a
    model without shortcut convs it equals ``paper``.

``extended``: trainmap's earlier convention. Every Linear and Conv2d weight (a conv kernel as the
    (out, in * kh * kw) map from an input patch to an output channel) gets all matrix metrics;
    the singular values of all matrices are pooled for ``sv_mean`` / ``sv_var``; a token model's
    readout and the shortcut convs are counted. Values differ from the paper's by 22-66 % (sv
    statistics) and by 40x (l1 of a CNN).

All conventions: ``nn.Linear`` weights are (out, in) matrices; attention
(``trainmap.models.MultiHeadAttention``) counts one (d_head, d_model) matrix per head for the
query, key and value projections (as the authors did) and the output projection whole; embeddings
and normalisation layers (BatchNorm, LayerNorm) are ignored. Each matrix's singular values are
computed once per checkpoint in float64, batched over the trajectory and over the matrices of one
shape (:func:`grouped_singular_values`); singular values below 1e-5 count as 0 (the authors'
code). The values stay on the weights' device until :func:`metric_frames` copies them to the host
at once. A matrix with a NaN or Inf
entry at a checkpoint is skipped there (the code returns None for it) and counted in
``skipped_matrices``; a ratio of an all-zero matrix or slice is left out of that ratio's mean; a
model without biases gets NaN bias metrics (the HMM then drops those features with a warning).

=================  ====================================================================
``l1``             (1/K) sum_k ||W_k||_1 (entry-wise; paper: a conv kernel's mean slice L1)
``l2``             (1/K) sum_k ||W_k||_2 (Frobenius; paper: a conv kernel's mean slice L2)
``l1_l2``          (1/K) sum_k ||W_k||_1 / ||W_k||_2 (dispersion; lower is sparser)
``trace``          (1/K) sum_k tr(W_k) (sum of the main diagonal, also for rectangular W_k)
``spectral``       (1/K) sum_k ||W_k||_2,op (largest singular value)
``trace_spectral`` (1/K) sum_k tr(W_k) / ||W_k||_2,op
``sv_mean``        paper: (1/K) sum_k mean(sigma(W_k)); extended: mean of all sigma, pooled
``sv_var``         paper: (1/K) sum_k var(sigma(W_k)); extended: variance of all sigma, pooled
``w_mean``         mean of all weights (every entry of every counted matrix or kernel)
``w_median``       median of all weights
``w_var``          variance of all weights
``b_mean``         mean of all biases of the counted layers
``b_median``       median of all biases
``b_var``          variance of all biases
=================  ====================================================================

The per-run table (:func:`collect_run_metrics`, written as ``metrics.csv`` by the workflow) has one
row per checkpoint: ``step``, the 14 metric columns in :data:`METRIC_NAMES` order,
``n_matrices``, ``skipped_matrices``, then the run's ``train_loss``, ``train_acc``, ``test_loss`` and
``test_acc`` at that checkpoint (from its history).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from trainmap.dynamics.metrics.columns import (
    CONVENTIONS,
    HISTORY_COLUMNS,
    METRIC_NAMES,
    PAPER_CONVENTIONS,
    RATIOS,
)

SINGULAR_VALUE_FLOOR = 1e-5
#: Metrics that are means over matrices, by statistics rules (:func:`statistics_rules`); the rest
#: are statistics of pooled values.
MATRIX_MEANS = {
    "paper": ("l1", "l2", "l1_l2", "trace", "spectral", "trace_spectral", "sv_mean", "sv_var"),
    "extended": ("l1", "l2", "l1_l2", "trace", "spectral", "trace_spectral"),
}
#: Module names that hold a residual block's shortcut (projection) conv: trainmap's ``shortcut``,
#: torchvision's ``downsample`` (convention (f)).
SHORTCUT_NAMES = ("shortcut", "downsample")


def check_convention(convention: str) -> None:
    """Raise ValueError naming the bad convention and the allowed ones."""
    if convention not in CONVENTIONS:
        raise ValueError(f"analysis.metrics: {convention!r} is not a metric convention; choose "
                         f"one of {', '.join(CONVENTIONS)}")  # fmt: skip


def statistics_rules(convention: str) -> str:
    """How ``convention`` computes the statistics: ``"paper"`` (conventions (a), (b), (d), (e)) for
    ``paper`` and ``paper_shortcuts``, which differ only in the counted layers, else
    ``"extended"``."""
    check_convention(convention)
    return "paper" if convention in PAPER_CONVENTIONS else "extended"


def counts_shortcuts(convention: str) -> bool:
    """Whether ``convention`` counts the 1x1 shortcut convs of residual blocks: all but ``paper``
    (convention (f): the authors' ``get_metrics_resnet18`` never reads a block's ``downsample``)."""
    check_convention(convention)
    return convention != "paper"


def is_shortcut_conv(module_name: str, kernel: tuple[int, ...]) -> bool:
    """Whether a conv named ``module_name`` with spatial kernel size ``kernel`` is a residual
    block's shortcut (projection) conv: a 1x1 kernel inside a module named one of
    :data:`SHORTCUT_NAMES` (trainmap's ``stage2.0.shortcut.conv``, FixUp's ``blocks.3.shortcut``,
    torchvision's ``layer2.0.downsample.0``). The 1x1 test keeps main-path convs that a model
    calls ``downsample`` (a strided 3x3) counted."""
    return tuple(kernel) == (1, 1) and any(
        part in SHORTCUT_NAMES for part in module_name.split(".")
    )


@dataclass(frozen=True)
class MatrixSlice:
    """One counted matrix: rows ``rows`` of the state entry ``name``, reshaped to 2-D.

    ``kind`` is ``"linear"`` (a Linear weight or one attention head's slice of it) or ``"conv"``.
    """

    name: str
    rows: slice | None = None
    kind: str = "linear"


def unembedding(model: nn.Module) -> str | None:
    """The readout Linear of a token model (one with an ``nn.Embedding``): the unembedding, which
    the paper's convention ignores with the embeddings. ``None`` for other models."""
    if not any(isinstance(module, nn.Embedding) for module in model.modules()):
        return None
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    return linears[-1] if linears else None


def weight_matrices(
    model: nn.Module, convention: str = "paper"
) -> tuple[list[MatrixSlice], list[str]]:
    """The counted weight matrices and the counted bias entries of ``model``'s state dict; the
    modules :func:`left_out_modules` names are not counted."""
    from trainmap.models import MultiHeadAttention

    skipped = left_out_modules(model, convention)
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
        elif isinstance(module, nn.Linear | nn.Conv2d) and name not in per_head | skipped:
            kind = "conv" if isinstance(module, nn.Conv2d) else "linear"
            matrices.append(MatrixSlice(f"{prefix}weight", kind=kind))
            if module.bias is not None:
                biases.append(f"{prefix}bias")
    return matrices, biases


def left_out_modules(model: nn.Module, convention: str) -> set[str]:
    """The Linear and Conv2d modules of ``model`` that ``convention`` leaves out: the unembedding
    under the paper conventions (convention (c)), the shortcut convs under ``paper`` (f)."""
    left_out: set[str] = set()
    readout = unembedding(model)
    if statistics_rules(convention) == "paper" and readout is not None:
        left_out.add(readout)
    if not counts_shortcuts(convention):
        for name, module in model.named_modules():
            if isinstance(module, nn.Conv2d) and is_shortcut_conv(name, module.kernel_size):
                left_out.add(name)
    return left_out


#: Name parts of embedding tables in common checkpoints (trainmap's ``embed``/``pos_embed``, GPT-2's
#: ``wte``/``wpe``, BERT's ``word_embeddings``/``position_embeddings``/``token_type_embeddings``).
EMBEDDING_NAMES = ("embed", "wte", "wpe", "tok_emb", "pos_emb", "token_type")
#: Module names of separate query/key/value projections, split per head when the head count is
#: given (trainmap's ``q``/``k``/``v``, ``q_proj``..., BERT's ``query``/``key``/``value``).
QKV_NAMES = {"q": "q", "k": "k", "v": "v", "q_proj": "q", "k_proj": "k", "v_proj": "v",
             "query": "q", "key": "k", "value": "v", "w_q": "q", "w_k": "k", "w_v": "v"}  # fmt: skip
#: State entries of a fused (3 d, d) query/key/value projection (``nn.MultiheadAttention``).
FUSED_QKV = ("in_proj_weight", "qkv.weight", "Wqkv.weight")


@dataclass(frozen=True)
class WeightLayout:
    """Which state entries the metrics count: matrices (and heads), biases, and the entries left
    out with the reason (``ignored``: name -> why), from a model or from a state dict alone."""

    matrices: tuple[MatrixSlice, ...]
    biases: tuple[str, ...]
    ignored: dict[str, str]


def state_dict_layout(
    shapes: Mapping[str, tuple[int, ...]], convention: str = "paper", heads: int | None = None
) -> WeightLayout:
    """The counted matrices of a state dict without its model, by name and shape.

    Rules, in state-dict order: a 1-D ``weight`` is a normalisation layer's scale (left out with
    its bias); a 2-D ``weight`` is a Linear (out, in) matrix unless its name holds an embedding
    part (:data:`EMBEDDING_NAMES`); a 4-D ``weight`` is a Conv2d kernel; other ranks are left out.
    With ``heads``, a separate query/key/value projection (:data:`QKV_NAMES`) counts one
    (d_head, d_model) matrix per head and a fused one (:data:`FUSED_QKV`) is split into q, k, v and
    heads, their biases left out (as :func:`weight_matrices` does for trainmap's attention); without
    ``heads`` they are whole matrices. Under the paper conventions a token model's readout (the
    last Linear of a state dict with an embedding) is the unembedding and left out. Under
    ``paper`` a 4-D weight with a 1x1 kernel under a ``shortcut``/``downsample`` module
    (:func:`is_shortcut_conv`) is a residual block's shortcut conv and left out with its bias. For
    trainmap's own models this gives :func:`weight_matrices`'s layout (tests/test_external_runs.py).
    """
    skip_shortcuts = not counts_shortcuts(convention)
    matrices: list[MatrixSlice] = []
    biases: list[str] = []
    ignored: dict[str, str] = {}
    has_embedding = False
    for name, shape in shapes.items():
        module, _, leaf = name.rpartition(".")
        if any(name == fused or name.endswith(f".{fused}") for fused in FUSED_QKV):
            if heads is None:
                matrices.append(MatrixSlice(name))
            else:
                matrices += _head_slices(name, shape, heads, parts=3)
            continue
        if leaf != "weight":
            continue
        projection = QKV_NAMES.get(module.rpartition(".")[2].lower())
        if len(shape) == 2 and any(part in name.lower() for part in EMBEDDING_NAMES):
            ignored[name], has_embedding = "embedding", True
        elif len(shape) == 2 and projection is not None and heads is not None:
            matrices += _head_slices(name, shape, heads, parts=1)
        elif len(shape) == 4 and skip_shortcuts and is_shortcut_conv(module, shape[2:]):
            ignored[name] = "shortcut conv of a residual block (and its bias; convention (f))"
        elif len(shape) in (2, 4):
            kind = "linear" if len(shape) == 2 else "conv"
            matrices.append(MatrixSlice(name, kind=kind))
            bias = f"{module}.bias" if module else "bias"
            if bias in shapes:
                biases.append(bias)
        else:
            ignored[name] = "normalisation scale" if len(shape) == 1 else f"{len(shape)}-D weight"
    if statistics_rules(convention) == "paper" and has_embedding:
        readout = next((m for m in reversed(matrices) if m.kind == "linear" and m.rows is None),
                       None)  # fmt: skip
        if readout is not None:
            matrices.remove(readout)
            ignored[readout.name] = "unembedding (readout of a token model)"
            biases = [b for b in biases if b.rpartition(".")[0] != readout.name.rpartition(".")[0]]
    return WeightLayout(tuple(matrices), tuple(biases), ignored)


def _head_slices(name: str, shape: tuple[int, ...], heads: int, parts: int) -> list[MatrixSlice]:
    """One (d_head, d_model) slice per head of each of ``parts`` stacked projections."""
    rows = shape[0] // parts
    if shape[0] % parts or rows % heads:
        raise ValueError(f"state entry {name} has {shape[0]} rows, which {parts} projection(s) of "
                         f"{heads} heads cannot split evenly; check the head count")  # fmt: skip
    d_head = rows // heads
    return [MatrixSlice(name, slice(start, start + d_head))
            for start in range(0, shape[0], d_head)]  # fmt: skip


def layout_of_model(model: nn.Module, convention: str = "paper") -> WeightLayout:
    """:func:`weight_matrices` of ``model`` as a :class:`WeightLayout`."""
    matrices, biases = weight_matrices(model, convention)
    return WeightLayout(tuple(matrices), tuple(biases), {})


def _stacked_matrix(state: Mapping[str, torch.Tensor], matrix: MatrixSlice) -> torch.Tensor:
    """In float64: ``[n_checkpoints, rows, cols]`` for a Linear matrix (or head),
    ``[n_checkpoints, out, in, kh * kw]`` for a conv kernel."""
    tensor = state[matrix.name].to(torch.float64)
    if matrix.kind == "conv":
        return tensor.reshape(*tensor.shape[:3], -1)
    return tensor if matrix.rows is None else tensor[:, matrix.rows]


def _finite_part(stacked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which checkpoints of ``stacked`` are finite, and ``stacked`` with the others zeroed
    (skipped, but kept in shape). On an accelerator the zeroing is done unconditionally, so
    nothing is read back to the host."""
    finite = torch.isfinite(stacked).flatten(1).all(dim=1)
    if stacked.device.type == "cpu" and bool(finite.all()):  # a read costs nothing on the CPU
        return finite, stacked
    mask = finite.view(-1, *[1] * (stacked.dim() - 1))
    return finite, torch.where(mask, stacked, torch.zeros_like(stacked))


def _needs_singular_values(matrix: MatrixSlice, rules: str) -> bool:
    """Whether ``rules`` computes singular values of ``matrix`` (not of a conv kernel under
    ``paper``: convention (b))."""
    return not (matrix.kind == "conv" and rules == "paper")


def _clean_matrix(
    state: Mapping[str, torch.Tensor], matrix: MatrixSlice, cache: dict | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_finite_part` of ``matrix``'s :func:`_stacked_matrix`, kept in ``cache`` for the
    other conventions over the same weights."""
    key = f"clean {matrix!r}"
    if cache is None:
        return _finite_part(_stacked_matrix(state, matrix))
    if key not in cache:
        cache[key] = _finite_part(_stacked_matrix(state, matrix))
    return cache[key]


def singular_inputs(
    state: Mapping[str, torch.Tensor], layout: WeightLayout, rules: str, cache: dict
) -> dict[str, torch.Tensor]:
    """The ``[n_checkpoints, rows, cols]`` matrices (non-finite checkpoints zeroed) whose singular
    values ``rules`` needs for ``layout`` and ``cache`` does not hold yet, by matrix key."""
    found: dict[str, torch.Tensor] = {}
    for matrix in layout.matrices:
        key = repr(matrix)
        if key in cache or not _needs_singular_values(matrix, rules):
            continue
        _, clean = _clean_matrix(state, matrix, cache)
        found[key] = clean.reshape(clean.shape[0], clean.shape[1], -1)
    return found


def _matrix_statistics(
    finite: torch.Tensor,
    clean: torch.Tensor,
    kind: str,
    rules: str,
    singular: torch.Tensor | None = None,
) -> dict:
    """Per-checkpoint statistics of one matrix over the trajectory (:func:`_clean_matrix`'s
    ``finite`` and ``clean``).

    ``rules`` is :func:`statistics_rules`'s. Under ``paper`` a conv kernel (``kind="conv"``) gets
    only its mean slice L1, L2 and L1/L2; under ``extended`` it is the (out, in * kh * kw) matrix.
    ``singular``: the matrix's singular values (:func:`grouped_singular_values` of its
    :func:`singular_inputs`), computed here when not given.
    """
    stats: dict = {"finite": finite, "entries": clean.flatten(1)}
    if kind == "conv" and rules == "paper":
        return stats | _conv_slice_statistics(clean)
    matrix = clean.reshape(clean.shape[0], clean.shape[1], -1)
    if singular is None:
        singular = singular_values(matrix)
    singular = torch.where(singular < SINGULAR_VALUE_FLOOR, torch.zeros_like(singular), singular)
    l1 = matrix.abs().flatten(1).sum(dim=1)
    l2 = matrix.flatten(1).norm(dim=1)
    trace = torch.diagonal(matrix, dim1=1, dim2=2).sum(dim=1)
    spectral = singular[:, 0]
    stats |= {"l1": l1, "l2": l2, "l1_l2": l1 / l2, "trace": trace, "spectral": spectral,
              "trace_spectral": trace / spectral, "singular": singular}  # fmt: skip
    if rules == "paper":  # convention (a), variance without Bessel (d)
        stats |= {"sv_mean": singular.mean(dim=1), "sv_var": singular.var(dim=1, correction=0)}
    return stats


#: The Gram route (:func:`singular_values`) for matrices at least this many times wider than tall
#: (or taller than wide) and with at least :data:`GRAM_MIN_SIDE` rows and columns.
GRAM_MIN_RATIO = 4
GRAM_MIN_SIDE = 64
#: The Gram route is kept only where every singular value is at least this fraction of the largest.
GRAM_MIN_CONDITION = 1e-3


def _takes_gram_route(rows: int, cols: int) -> bool:
    short, long = min(rows, cols), max(rows, cols)
    return short >= GRAM_MIN_SIDE and long >= GRAM_MIN_RATIO * short


def singular_values(matrix: torch.Tensor) -> torch.Tensor:
    """The singular values of a batch of matrices ``[n, rows, cols]`` (float64), largest first, by
    the fastest route that keeps them exact to 1e-12 of the largest.

    ``torch.linalg.svdvals`` in general. A wide (or tall) matrix, whose long side is at least
    :data:`GRAM_MIN_RATIO` times its short side of at least :data:`GRAM_MIN_SIDE`, takes the Gram
    route: sigma_i = sqrt(lambda_i(W W^T)) over the short side (``eigvalsh``), 5-11x faster for
    ResNet-18's reshaped convs (bench/metrics_cost.py). Squaring loses the small singular values'
    relative accuracy: the error of sigma_i is about eps * sigma_max^2 / sigma_i, so the route is
    kept only where every sigma_i >= :data:`GRAM_MIN_CONDITION` * sigma_max (error <= 2.2e-13 of
    sigma_max); a batch with a smaller one falls back to ``svdvals`` (tests/test_streamed_metrics.py).
    """
    return grouped_singular_values({"": matrix})[""]


def grouped_singular_values(
    matrices: Mapping[str, torch.Tensor], batched: bool | None = None
) -> dict[str, torch.Tensor]:
    """:func:`singular_values` of each ``[n, rows, cols]`` matrix of ``matrices``, with the Gram
    route's condition of every matrix read back to the host at once. ``batched``: the matrices of
    one shape in one call (a checkpoint's same-shape layers together; None: on an accelerator,
    where a call costs a launch and a copy of the group costs little, not on the CPU). The values
    equal one call per matrix: the route and its fallback are decided per matrix, and batched
    LAPACK calls on the CPU compute each matrix alone (tests/unit/dynamics/metrics/test_streamed_metrics.py,
    bit for bit)."""
    groups: dict[tuple, list[str]] = {}
    for key, matrix in matrices.items():
        together = matrix.device.type != "cpu" if batched is None else batched
        shape = (tuple(matrix.shape), matrix.dtype, matrix.device)
        groups.setdefault(shape if together else (*shape, key), []).append(key)
    found: dict[str, torch.Tensor] = {}
    gram: list[tuple[str, torch.Tensor]] = []
    for (shape, *_), keys in groups.items():
        stacked = torch.cat([matrices[key] for key in keys]) if len(keys) > 1 else matrices[keys[0]]
        rows, cols = shape[-2:]
        if not _takes_gram_route(rows, cols):
            found.update(zip(keys, torch.linalg.svdvals(stacked).split(shape[0]), strict=True))
            continue
        transposed = stacked.transpose(-1, -2)
        product = stacked @ transposed if rows <= cols else transposed @ stacked
        values = torch.linalg.eigvalsh(product).clamp(min=0).sqrt().flip(-1)
        gram += zip(keys, values.split(shape[0]), strict=True)
    if gram:  # which matrices keep the Gram route: one read for all of them
        kept = torch.stack([(values >= GRAM_MIN_CONDITION * values[:, :1]).all()
                            for _, values in gram]).tolist()  # fmt: skip
        for (key, values), keep in zip(gram, kept, strict=True):
            found[key] = values if keep else torch.linalg.svdvals(matrices[key])
    return found


def _conv_slice_statistics(kernel: torch.Tensor) -> dict[str, torch.Tensor]:
    """Convention (b): the mean over a kernel's (out, in) slices of their L1 and L2 norms and of
    L1/L2 (slices that are all zero left out of the ratio); ``kernel`` is [n, out, in, kh * kw]."""
    l1 = kernel.abs().sum(dim=3)
    l2 = kernel.square().sum(dim=3).sqrt()
    nonzero = l2 > 0
    ratio = torch.where(nonzero, l1 / torch.where(nonzero, l2, torch.ones_like(l2)), 0.0)
    counts = nonzero.flatten(1).sum(dim=1)
    return {
        "l1": l1.flatten(1).mean(dim=1),
        "l2": l2.flatten(1).mean(dim=1),
        "l1_l2": torch.where(
            counts > 0, ratio.flatten(1).sum(dim=1) / counts.clamp(min=1), torch.nan
        ),  # fmt: skip
    }


#: Values of a trajectory's metrics before they reach the host: ``[n]`` tensors on the weights'
#: device, or numpy arrays where they were computed on the host.
Values = torch.Tensor | np.ndarray


def _mean_over_matrices(stats: list[dict], key: str) -> Values:
    """(1/K) sum over the matrices that have ``key`` and are finite (and, for a ratio, have a
    non-zero denominator) at each checkpoint; NaN where none does."""
    having = [s for s in stats if key in s]
    if not having:
        n = len(stats[0]["finite"])
        return np.full(n, np.nan)
    values = torch.stack([s[key] for s in having])
    used = torch.stack([s["finite"] for s in having]) & torch.isfinite(values)
    if key in RATIOS:
        used &= torch.stack([s[RATIOS[key]] for s in having]) > 0
    summed = torch.where(used, values, torch.zeros_like(values)).sum(dim=0)
    counts = used.sum(dim=0)
    return torch.where(counts > 0, summed / counts.clamp(min=1), torch.nan)


def _pooled_rows(parts: list[torch.Tensor], n: int) -> tuple[Values, Values, Values]:
    """Per checkpoint (row): mean, median and variance (no Bessel) of the ``[n, k_i]`` parts side
    by side; NaN where there are no values (a model without biases)."""
    width = sum(part.shape[1] for part in parts)
    if width == 0:
        return np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    pooled = torch.cat(parts, dim=1)
    if pooled.device.type != "cpu":  # on the training device, without copying the weights back
        return _pooled_rows_torch(pooled)
    pooled = pooled.numpy()
    mean, variance = pooled.mean(axis=1), pooled.var(axis=1)
    # The usual median (convention (e)), partitioning this fresh copy in place.
    return mean, np.median(pooled, axis=1, overwrite_input=True), variance


def _pooled_rows_torch(pooled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_pooled_rows` in torch, on ``pooled``'s device (a GPU): the same mean and variance up
    to summation order (~1e-16 relative) and the same median (the mean of the two middle values,
    convention (e); sorting is exact)."""
    width = pooled.shape[1]
    ordered = pooled.sort(dim=1).values
    median = (ordered[:, (width - 1) // 2] + ordered[:, width // 2]) / 2
    return pooled.mean(dim=1), median, pooled.var(dim=1, correction=0)


def _on_host(value: Values) -> np.ndarray:
    return value.cpu().numpy() if isinstance(value, torch.Tensor) else value


@dataclass
class PendingMetrics:
    """A trajectory's metrics before they cross to the host (:func:`pending_metrics`).

    ``values``: every metric of :data:`METRIC_NAMES`, ``finite_matrices`` (per checkpoint, how
    many counted matrices are finite) and ``clean`` (1 where every counted matrix and bias is
    finite), each ``[n_checkpoints]``; ``repair(t)``: the pooled statistics of checkpoint ``t``
    without its non-finite tensors, for the checkpoints that are not clean.
    """

    values: dict[str, Values]
    n_matrices: int
    repair: Callable[[int], dict[str, np.ndarray]]


def pending_metrics(
    state: Mapping[str, torch.Tensor],
    model: nn.Module | WeightLayout,
    convention: str = "paper",
    singular_cache: dict | None = None,
) -> PendingMetrics:
    """:func:`trajectory_metrics`'s values, left where they were computed (the weights' device).
    ``singular_cache``: a dict shared by calls on the same ``state``; singular values already in it
    (:func:`grouped_singular_values` of :func:`singular_inputs`) are not computed again."""
    rules = statistics_rules(convention)
    layout = model if isinstance(model, WeightLayout) else layout_of_model(model, convention)
    matrices, bias_names = list(layout.matrices), list(layout.biases)
    if not matrices:
        raise ValueError("the model has no Linear or Conv2d weight to compute metrics on")
    cache = {} if singular_cache is None else singular_cache
    cache.update(grouped_singular_values(singular_inputs(state, layout, rules, cache)))
    stats = [
        _matrix_statistics(*_clean_matrix(state, m, cache), m.kind, rules, cache.get(repr(m)))
        for m in matrices
    ]
    n_checkpoints = next(iter(state.values())).shape[0]
    values: dict[str, Values] = {key: _mean_over_matrices(stats, key)
                                 for key in MATRIX_MEANS[rules]}  # fmt: skip
    biases = [state[name].to(torch.float64).reshape(n_checkpoints, -1) for name in bias_names]
    finite = torch.stack([s["finite"] for s in stats])  # [K, n]
    clean = finite.all(dim=0)
    for bias in biases:
        clean &= torch.isfinite(bias).all(dim=1)

    def pooled(
        rows: slice, n: int, matrix_stats: list[dict], bias_rows: list[torch.Tensor],
        cache: dict | None = None,
    ) -> dict:  # fmt: skip
        """The pooled statistics of ``rows`` (checkpoints) over the given matrices and biases
        (``cache``: shared with other conventions over the same weights and biases)."""
        found = {}
        if rules == "extended":
            found["sv_mean"], _, found["sv_var"] = _pooled_rows(
                [s["singular"][rows] for s in matrix_stats], n
            )
        for prefix, parts, names in (("w", [s["entries"][rows] for s in matrix_stats], matrices),
                                     ("b", bias_rows, bias_names)):  # fmt: skip
            key = repr((prefix, names))
            if cache is None:
                statistics = _pooled_rows(parts, n)
            else:  # host arrays copied: a non-finite checkpoint's row is patched in place
                if key not in cache:
                    cache[key] = _pooled_rows(parts, n)
                statistics = tuple(v.copy() if isinstance(v, np.ndarray) else v
                                   for v in cache[key])  # fmt: skip
            found[f"{prefix}_mean"], found[f"{prefix}_median"], found[f"{prefix}_var"] = statistics
        return found

    def repair(t: int) -> dict[str, np.ndarray]:
        """Checkpoint ``t`` pooled alone, leaving out its non-finite matrices and biases."""
        row = slice(t, t + 1)
        valid = [s for s in stats if bool(s["finite"][t])]
        finite_biases = [b[row] for b in biases if bool(torch.isfinite(b[t]).all())]
        return {key: _on_host(value) for key, value in pooled(row, 1, valid, finite_biases).items()}

    # Pooled over all checkpoints at once; the checkpoints where a matrix or bias is not finite
    # (none, in a healthy run) are repaired one at a time on the host.
    values.update(pooled(slice(None), n_checkpoints, stats, biases, singular_cache))
    values["finite_matrices"] = finite.sum(dim=0)
    values["clean"] = clean
    return PendingMetrics(values, len(matrices), repair)


def metric_frames(pending: Sequence[PendingMetrics]) -> list[pd.DataFrame]:
    """The metric tables of ``pending`` (:func:`trajectory_metrics`'s format), every tensor value
    copied to the host in one transfer per device (float64 holds the counts exactly)."""
    host = [{name: value for name, value in p.values.items() if isinstance(value, np.ndarray)}
            for p in pending]  # fmt: skip
    tensors: dict[torch.device, list[tuple[int, str, torch.Tensor]]] = {}
    for index, p in enumerate(pending):
        for name, value in p.values.items():
            if isinstance(value, torch.Tensor):
                tensors.setdefault(value.device, []).append((index, name, value))
    for found in tensors.values():
        copied = torch.cat([value.to(torch.float64) for _, _, value in found]).cpu().numpy()
        ends = np.cumsum([value.numel() for _, _, value in found])
        for (index, name, _), part in zip(found, np.split(copied, ends[:-1]), strict=True):
            host[index][name] = part
    frames = []
    for p, values in zip(pending, host, strict=True):
        for t in np.flatnonzero(~values["clean"].astype(bool)):
            for key, value in p.repair(int(t)).items():
                values[key][t] = value[0]
        frame = pd.DataFrame({name: values[name] for name in METRIC_NAMES})
        frame["n_matrices"] = p.n_matrices
        frame["skipped_matrices"] = p.n_matrices - values["finite_matrices"].astype(np.int64)
        frames.append(frame)
    return frames


def trajectory_metrics(
    state: Mapping[str, torch.Tensor],
    model: nn.Module | WeightLayout,
    convention: str = "paper",
    singular_cache: dict | None = None,
) -> pd.DataFrame:
    """The 14 metrics (appendix B) of every checkpoint of a stacked trajectory ``state``.

    ``state`` maps state-dict names to ``[n_checkpoints, *shape]`` tensors; ``model`` only tells
    which entries are Linear/Conv/attention tensors (:func:`weight_matrices`), or is the layout
    itself (:func:`state_dict_layout` for checkpoints without their model); ``convention`` is one
    of :data:`CONVENTIONS` (module docstring). ``singular_cache``: a dict shared by calls on the
    same ``state`` (the conventions of one checkpoint), so each matrix's singular values are
    computed once.
    """
    return metric_frames([pending_metrics(state, model, convention, singular_cache)])[0]


def collect_run_metrics(
    trajectory: Mapping[str, object],
    model: nn.Module | WeightLayout,
    history: pd.DataFrame,
    convention: str = "paper",
) -> pd.DataFrame:
    """The per-run metrics table: one row per checkpoint (see the module docstring for columns).

    ``trajectory`` is a saved trajectory (``{"step": LongTensor[n], "state": {...}}``), ``history``
    the run's ``history.csv`` (same steps).
    """
    frame = trajectory_metrics(trajectory["state"], model, convention)
    frame.insert(0, "step", trajectory["step"].tolist())
    return with_history(frame, history)


def with_history(frame: pd.DataFrame, history: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (a ``step`` column and the metrics) with the run's history columns at its steps."""
    steps = frame["step"].tolist()
    by_step = history.set_index("step")
    missing = sorted(set(steps) - set(by_step.index))
    if missing:
        raise ValueError(f"history has no rows for checkpoint steps {missing[:5]}; the files "
                         "belong to different runs")  # fmt: skip
    for column in HISTORY_COLUMNS:
        frame[column] = by_step.loc[steps, column].to_numpy() if column in by_step else np.nan
    return frame
