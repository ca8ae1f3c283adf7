"""N:M sparse retraining: AST (annealed SR-STE, distillation, SLoRB) and the one-shot baselines.

Huang et al., "Pruning Large Language Models with Semi-Structural Adaptive Sparse Training"
(AST), with SR-STE from Zhou et al. (2021) and Wanda from Sun et al. (2023):

* N:M mask (sec. 3.1): in every group of M consecutive input weights of an output row keep the N
  with the largest score (|W| for magnitude, |W| * ||x_j||_2 for Wanda). Ties keep the lower index.
  Conv kernels group M consecutive input channels at each kernel position by default (setting
  ``conv_groups: input_channels``, the SR-STE authors' sparse conv and the layout N:M tensor cores
  accelerate); ``conv_groups: flattened`` groups the (out, in*kh*kw) rows instead (``trainmap.methods.nm``).
* Straight-through estimator (sec. 3.2): the forward pass uses W * m, the backward pass hands the
  gradient with respect to W * m to all of W unmasked.
* SR-STE (sec. 3.2): the update of W uses g + lambda_W * (1 - m) * W, so pruned weights decay while
  kept weights' updates are unchanged. (1 - m) on a float mask, never a bitwise not on an int mask:
  the authors' code computes ~mask on int tensors (-2 / -1), which flips the sign and decays kept
  weights too.
* Annealed SR-STE (sec. 4.3): lambda_t = lambda * t / T0 for t < T0, then lambda (default T0 = all
  retraining steps); ``decay: static`` keeps lambda throughout, ``none`` disables it.
* Where retraining starts (setting ``start``): AST retrains the converged dense model (``final``,
  the paper's recipe); ``{step: N}`` prunes the dense run's checkpoint at step N instead (``init``:
  its initialisation, N:M sparse training from the start), while the teacher distilled from stays
  the converged model. On a task whose dense runs are past the accuracy threshold when they
  converge, this is what lets the methods' paths differ at all.
* Masks are recomputed from the dense weights every ``mask_every`` optimiser steps; the flip rate
  r_t = ||m_t - m_{t-1}||_1 / D and the initial flip rate i_t = ||m_t - m_0||_1 / D (sec. 3.3, D the
  weights of all sparse layers) are recorded at each refresh.
* Distillation (sec. 4.2): loss = task loss + alpha * T^2 * KL(teacher || student) on logits softened
  by temperature T, the dense teacher frozen in eval mode; the KL is averaged per token (per
  example for (batch, classes) logits, per position for (batch, sequence, vocabulary) logits).
* SLoRB (sec. 4.4): an extra term S(Px): P sums each group of k consecutive inputs, S (out x d/k) is
  initialised to the mean of the pruned weights of each group, S_ij = (1/k) sum_p W_ip (1 - M_ip),
  so each group's mean of W * M plus the SLoRB contribution equals the dense group's mean (a last,
  partial group of d mod k inputs divides by its own size). It is computed as a dense matrix S
  expanded over each group's k inputs, added to W * M. The paper defines SLoRB for Linear layers;
  on a conv its groups are k consecutive entries of the flattened (in*kh*kw) row, whatever the N:M
  layout (S is stored apart from the N:M weights, so the two need not align).

Methods (``trainmap.methods``): ``ast`` (annealed SR-STE + distillation, AST-Naive), ``ast_slorb``
(AST-Boosted), ``ast_static`` (static lambda), ``oneshot`` (magnitude, no retraining), ``oneshot_ft``
(magnitude, then fine-tuning with the mask frozen) and ``wanda`` (Wanda scores, no retraining).
Retraining runs through ``trainmap.training.loop.train_block`` with :class:`SparseHooks`, a block of seeds at
once (each seed with its own masks and its own teacher); its trajectory records every layer's
effective weight under the dense architecture's names.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from trainmap.data import TaskData
from trainmap.io import save_json, save_torch, write_atomic
from trainmap.methods.nm import (
    GROUP_LAYOUTS,
    LEGACY_LAYOUT,
    from_nm_groups,
    grouped_axis_size,
    nm_groups,
)
from trainmap.models import eval_forward_with_hooks
from trainmap.training.archive import ArchivePolicy
from trainmap.training.loop import (
    BlockCheckpointHook,
    TrainConfig,
    TrainHooks,
    TrainPaths,
    evaluate_split,
    metric_structure,
    train_block,
)
from trainmap.training.record import CheckpointRecorder
from trainmap.training.seed_block import SeedBlock

#: Defaults of the ``sparse.<task>`` settings. srste_lambda is far above the LLM values (1e-4 with
#: Adam over 40k steps): with SGD the decay shrinks a pruned weight by lr * lambda per step, and a
#: retraining of a few hundred steps needs lr * lambda * steps ~ 1 for the decay to act at all.
DEFAULT_SETTINGS: dict[str, Any] = {
    "n": 2,
    "m": 4,
    "mask_every": 10,
    "srste_lambda": 0.05,
    "srste_t0": None,
    "distill_alpha": 2.0,
    "temperature": 2.0,
    "slorb_k": 16,
    "calibration_batch": 256,
    "dense_layers": "first_last",
    "conv_groups": "input_channels",
    "start": "final",
    "train": {},
}
DENSE_LAYER_CHOICES = ("first_last", "none")
START_CHOICES = ("final", "init")


def check_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings completed with defaults; unknown keys and bad values raise ValueError."""
    unknown = sorted(set(settings) - set(DEFAULT_SETTINGS))
    if unknown:
        raise ValueError(f"unknown sparse settings {unknown}; allowed: {sorted(DEFAULT_SETTINGS)}")
    cfg = {**DEFAULT_SETTINGS, **settings}
    n, m = cfg["n"], cfg["m"]
    if not (isinstance(n, int) and isinstance(m, int) and 1 <= n < m):
        raise ValueError(f"N:M needs integers 1 <= n < m, got n={n!r}, m={m!r}")
    for key in ("mask_every", "calibration_batch", "slorb_k"):
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ValueError(f"{key} must be a positive integer, got {cfg[key]!r}")
    for key in ("srste_lambda", "distill_alpha"):
        if cfg[key] < 0:
            raise ValueError(f"{key} must be >= 0, got {cfg[key]!r}")
    if not cfg["temperature"] > 0:
        raise ValueError(f"temperature must be > 0, got {cfg['temperature']!r}")
    if cfg["dense_layers"] not in DENSE_LAYER_CHOICES:
        raise ValueError(
            f"dense_layers {cfg['dense_layers']!r} is not one of {DENSE_LAYER_CHOICES}"
        )
    if cfg["conv_groups"] not in GROUP_LAYOUTS:
        raise ValueError(f"conv_groups {cfg['conv_groups']!r} is not one of {GROUP_LAYOUTS}")
    start_step(cfg["start"])  # a bad start is named there
    TrainConfig.from_dict(cfg["train"])  # unknown training keys are named there
    return cfg


def start_step(start: str | Mapping[str, Any]) -> int | None:
    """The step of the dense run's checkpoint a student is pruned from (setting ``start``): None
    for ``final`` (the converged model, AST's recipe), 0 for ``init``, N for ``{step: N}``."""
    if isinstance(start, str) and start in START_CHOICES:
        return None if start == "final" else 0
    if isinstance(start, Mapping) and set(start) == {"step"}:
        step = start["step"]
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            return step
        raise ValueError(f"start.step: {step!r} is not a step; allowed: an integer >= 0, a "
                         "checkpoint step of the dense run")  # fmt: skip
    raise ValueError(f"start: {start!r} is not a start; allowed: final, init or {{step: N}}")


# --- masks ------------------------------------------------------------------------------------


def nm_mask_from_scores(
    scores: torch.Tensor, n: int, m: int, layout: str = "input_channels"
) -> torch.Tensor:
    """Keep the N highest scores in every group of M consecutive inputs of each output row.

    ``scores`` has the weight's shape; groups follow ``layout`` (:mod:`trainmap.methods.nm`: a conv's M
    consecutive input channels at each kernel position, or its flattened rows). Ties keep the lower
    index (a stable sort). Returns a 0/1 mask of the scores' shape and dtype.
    """
    groups = nm_groups(scores, m, layout)
    order = torch.sort(groups, dim=-1, descending=True, stable=True).indices
    mask = torch.zeros_like(groups)
    mask.scatter_(-1, order[..., :n], 1.0)
    return from_nm_groups(mask, scores.shape, layout)


def nm_mask(weight: torch.Tensor, n: int, m: int, layout: str = "input_channels") -> torch.Tensor:
    """The magnitude N:M mask of ``weight`` (keep the N largest |w| of every group of M inputs)."""
    return nm_mask_from_scores(weight.detach().abs(), n, m, layout)


class _StraightThrough(torch.autograd.Function):
    """Forward W * m; backward passes the gradient to all of W (STE). Vectorises over seed blocks
    (``torch.func.vmap``)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(weight: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return weight * mask

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def expand_slorb(slorb_weight: torch.Tensor, k: int, shape: torch.Size) -> torch.Tensor:
    """SLoRB's S P as a weight of ``shape`` (AST sec. 4.4): S (N x ceil(d/k)) times the projection P
    that sums each group of k consecutive inputs, i.e. S_ij repeated on group j's k inputs (conv
    kernels as (out, in*kh*kw) rows; a last partial group keeps its first d mod k)."""
    inputs = math.prod(shape[1:])
    return slorb_weight.repeat_interleave(k, dim=1)[:, :inputs].reshape(shape)


class SparseLayer:
    """What the sparse Linear and Conv2d layers share: the mask, SLoRB and the masked forward."""

    weight: nn.Parameter
    weight_mask: torch.Tensor

    def setup_sparsity(self, n: int, m: int, slorb_k: int | None,
                       layout: str = "input_channels") -> None:  # fmt: skip
        self.n, self.m, self.slorb_k, self.group_layout = n, m, slorb_k, layout
        self.straight_through = True
        self.register_buffer("weight_mask", torch.ones_like(self.weight))
        if slorb_k is not None:
            inputs = self.weight[0].numel()
            self.slorb_weight = nn.Parameter(
                torch.zeros(
                    self.weight.shape[0], math.ceil(inputs / slorb_k), dtype=self.weight.dtype
                )
            )
        else:
            self.slorb_weight = None

    def masked_weight(self) -> torch.Tensor:
        """W * m (with the straight-through gradient while retraining a refreshable mask)."""
        if self.straight_through:
            return _StraightThrough.apply(self.weight, self.weight_mask)
        return self.weight * self.weight_mask

    def slorb_dense(self) -> torch.Tensor:
        """S expanded to the weight's shape: S_ij on each of group j's k inputs (= S P)."""
        return expand_slorb(self.slorb_weight, self.slorb_k, self.weight.shape)

    def effective_weight(self) -> torch.Tensor:
        """The weight the layer computes with: W * m, plus the SLoRB term when it has one."""
        weight = self.masked_weight()
        return weight if self.slorb_weight is None else weight + self.slorb_dense()

    @torch.no_grad()
    def refresh_mask(self, scores: torch.Tensor | None = None) -> None:
        """Recompute the N:M mask from the dense weights (or from ``scores``)."""
        source = self.weight.abs() if scores is None else scores
        self.weight_mask.copy_(nm_mask_from_scores(source, self.n, self.m, self.group_layout))

    @torch.no_grad()
    def init_slorb(self) -> None:
        """SLoRB init: S_ij = (1/k_j) sum over group j of W_ip * (1 - M_ip) (sec. 4.4), k_j = k,
        or d mod k for a last, partial group (so S_ij is that group's mean pruned weight)."""
        pruned = (self.weight * (1 - self.weight_mask)).reshape(self.weight.shape[0], -1)
        inputs, k = pruned.shape[1], self.slorb_k
        padded = F.pad(pruned, (0, self.slorb_weight.shape[1] * k - inputs))
        sizes = torch.full((self.slorb_weight.shape[1],), float(k), dtype=pruned.dtype)
        sizes[-1] = inputs - k * (self.slorb_weight.shape[1] - 1)
        self.slorb_weight.copy_(padded.reshape(pruned.shape[0], -1, k).sum(dim=-1) / sizes)


class SparseLinear(SparseLayer, nn.Linear):
    """An ``nn.Linear`` whose weight is N:M masked (see :class:`SparseLayer`)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """x @ (W * m + S P)^T + b."""
        return F.linear(inputs, self.effective_weight(), self.bias)


class SparseConv2d(SparseLayer, nn.Conv2d):
    """An ``nn.Conv2d`` whose kernel is N:M masked (groups per :attr:`group_layout`)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The convolution with the masked (+ SLoRB) kernel."""
        return self._conv_forward(inputs, self.effective_weight(), self.bias)


def _sparse_copy(module: nn.Module, n: int, m: int, slorb_k: int | None,
                 layout: str) -> nn.Module:  # fmt: skip
    """A sparse layer with ``module``'s configuration and parameters (mask all ones)."""
    if isinstance(module, nn.Linear):
        layer = SparseLinear(module.in_features, module.out_features, module.bias is not None,
                             dtype=module.weight.dtype)  # fmt: skip
    else:
        layer = SparseConv2d(module.in_channels, module.out_channels, module.kernel_size,
                             module.stride, module.padding, module.dilation, module.groups,
                             module.bias is not None, module.padding_mode,
                             dtype=module.weight.dtype)  # fmt: skip
    layer.setup_sparsity(n, m, slorb_k, layout)
    with torch.no_grad():
        layer.weight.copy_(module.weight)
        if module.bias is not None:
            layer.bias.copy_(module.bias)
    return layer


def sparsifiable_layers(model: nn.Module, m: int, dense_layers: str = "first_last",
                        layout: str = "input_channels") -> list[str]:  # fmt: skip
    """Names of the Linear/Conv2d layers to make N:M sparse: grouped input size (in ``layout``)
    divisible by M, and (with ``dense_layers="first_last"``) not the first weight layer nor the
    classifier (kept dense, as most N:M works on CNNs do)."""
    sizes = grouped_input_sizes(model, layout)
    names = list(sizes)[1:-1] if dense_layers == "first_last" else list(sizes)
    return [name for name in names if sizes[name] % m == 0]


def grouped_input_sizes(model: nn.Module, layout: str = "input_channels") -> dict[str, int]:
    """Each Linear/Conv2d layer's input size along which N:M groups run (``layout``), in order."""
    return {name: grouped_axis_size(module.weight.shape, layout)
            for name, module in model.named_modules()
            if isinstance(module, nn.Linear | nn.Conv2d)}  # fmt: skip


def _replace(model: nn.Module, name: str, layer: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, layer)


def sparse_layers(model: nn.Module) -> dict[str, SparseLayer]:
    """The model's sparse layers by name."""
    return {name: mod for name, mod in model.named_modules() if isinstance(mod, SparseLayer)}


def sparsify(
    model: nn.Module,
    n: int,
    m: int,
    slorb_k: int | None = None,
    scores: Mapping[str, torch.Tensor] | None = None,
    layers: Iterable[str] | None = None,
    layout: str = "input_channels",
) -> nn.Module:
    """A NEW model with ``layers`` (default: :func:`sparsifiable_layers`) replaced by N:M sparse
    layers grouped by ``layout``: masks from the dense weights' magnitude or from ``scores``
    (Wanda); SLoRB initialised from the pruned weights when ``slorb_k`` is given."""
    sparse = copy.deepcopy(model)
    names = list(layers) if layers is not None else sparsifiable_layers(model, m, layout=layout)
    for name in names:
        layer = _sparse_copy(sparse.get_submodule(name), n, m, slorb_k, layout)
        layer.refresh_mask(None if scores is None else scores[name])
        if slorb_k is not None:
            layer.init_slorb()
        _replace(sparse, name, layer)
    return sparse


# --- Wanda scores ---------------------------------------------------------------------------------


@torch.no_grad()
def input_norms(
    model: nn.Module, names: Iterable[str], inputs: torch.Tensor
) -> dict[str, torch.Tensor]:
    """||x_j||_2 of every input feature j of each named layer over a calibration batch.

    For a conv the features are its unfolded patches (in*kh*kw), matching the kernel's rows.
    """
    names = list(names)
    norms: dict[str, torch.Tensor] = {}

    def hook_for(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple) -> None:
            x = args[0]
            if isinstance(module, nn.Conv2d):
                patches = F.unfold(x, module.kernel_size, module.dilation, module.padding,
                                   module.stride)  # fmt: skip
                features = patches.transpose(1, 2).reshape(-1, patches.shape[1])
            else:
                features = x.reshape(-1, x.shape[-1])
            norms[name] = features.norm(dim=0)

        return hook

    handles = [model.get_submodule(n).register_forward_pre_hook(hook_for(n)) for n in names]
    eval_forward_with_hooks(model, inputs, handles)
    return norms


def wanda_scores(
    model: nn.Module, names: Iterable[str], inputs: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Wanda: |W_ij| * ||x_j||_2 (per output row i, input feature j) for each named layer."""
    names = list(names)
    norms = input_norms(model, names, inputs)
    scores = {}
    for name in names:
        weight = model.get_submodule(name).weight.detach()
        rows = weight.abs().reshape(weight.shape[0], -1) * norms[name][None, :]
        scores[name] = rows.reshape(weight.shape)
    return scores


# --- training hooks -----------------------------------------------------------------------------


def srste_lambda(step: int, base: float, t0: int, decay: str) -> float:
    """Annealed SR-STE: lambda * t / T0 until T0, then lambda; static: lambda; none: 0."""
    if decay == "none":
        return 0.0
    if decay == "static":
        return base
    return base * min(step, t0) / t0


def distillation_loss(
    student: torch.Tensor, teacher: torch.Tensor, temperature: float
) -> torch.Tensor:
    """T^2 * KL(teacher || student) of temperature-softened distributions, averaged per token.

    Logits are (..., classes): (batch, classes) averages over the batch, (batch, sequence, vocab)
    over batch * sequence tokens, as the paper's per-token loss and the authors' code do (a plain
    ``batchmean`` on 3-D logits would divide by the batch only, S times too large).
    """
    classes = student.shape[-1]
    log_student = F.log_softmax(student.reshape(-1, classes) / temperature, dim=-1)
    log_teacher = F.log_softmax(teacher.reshape(-1, classes) / temperature, dim=-1)
    kl = F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean")
    return temperature**2 * kl


def seed_distillation_losses(
    student: torch.Tensor, teacher: torch.Tensor, temperature: float
) -> torch.Tensor:
    """:func:`distillation_loss` of each seed of a block: ``(S, B, ..., classes)`` logits give
    ``(S,)``, each the per-token average of T^2 * KL(teacher || student) of that seed."""
    classes = student.shape[-1]
    log_student = F.log_softmax(student / temperature, dim=-1).reshape(
        student.shape[0], -1, classes
    )
    log_teacher = F.log_softmax(teacher / temperature, dim=-1).reshape(
        teacher.shape[0], -1, classes
    )
    kl = F.kl_div(log_student, log_teacher, log_target=True, reduction="none").sum(dim=-1)
    return temperature**2 * kl.mean(dim=1)


def mask_vector(model: nn.Module) -> torch.Tensor:
    """All sparse layers' masks, flattened and concatenated (in module order), on the CPU."""
    return torch.cat(
        [layer.weight_mask.reshape(-1).cpu() for layer in sparse_layers(model).values()]
    )


def block_mask_vectors(block: SeedBlock, names: Iterable[str]) -> torch.Tensor:
    """Each seed's masks of the named sparse layers, flattened and concatenated: ``(S, D)``."""
    return torch.cat(
        [block.tensor(f"{name}.weight_mask").reshape(block.size, -1).cpu() for name in names],
        dim=1,
    )


class SparseHooks(TrainHooks):
    """AST's additions to the training loop (marked ``# hook:`` in ``train_block``), for a block of
    seeds: each seed has its own masks, its own teacher and its own flip history."""

    def __init__(self, teachers: SeedBlock | None, settings: Mapping[str, Any],
                 options: Mapping[str, Any], total_steps: int,
                 log_metrics: BlockCheckpointHook | None = None) -> None:  # fmt: skip
        self.teachers = teachers.eval() if teachers is not None else None
        self.settings, self.options = settings, options
        self.t0 = settings["srste_t0"] or total_steps
        self.log_metrics = log_metrics
        self.frozen = bool(options.get("frozen_mask"))

    def attach(self, block: SeedBlock) -> None:
        """The block's sparse layers, their straight-through mode, and the masks m_0."""
        super().attach(block)
        self.layers = list(sparse_layers(block.models[0]))
        for module in (block.module, *block.models):
            for layer in sparse_layers(module).values():
                layer.straight_through = not self.frozen
        self.initial_mask = block_mask_vectors(block, self.layers).clone()
        self.previous_mask = self.initial_mask.clone()
        self.flips: list[list[dict[str, float]]] = [[] for _ in range(block.size)]

    def extra_loss(self, logits: torch.Tensor, inputs: torch.Tensor,
                   targets: torch.Tensor) -> torch.Tensor | None:  # fmt: skip
        """alpha * T^2 * KL(teacher || student) per seed, each seed's own teacher (AST sec. 4.2)."""
        if not self.options.get("distill") or self.teachers is None:
            return None
        with torch.no_grad():
            teacher_logits = self.teachers(inputs)
        return self.settings["distill_alpha"] * seed_distillation_losses(
            logits, teacher_logits, self.settings["temperature"]
        )

    @torch.no_grad()
    def after_backward(self, step: int) -> None:
        """SR-STE: g += lambda_t * (1 - m) * W on every sparse layer (pruned weights decay)."""
        lam = srste_lambda(step, self.settings["srste_lambda"], self.t0, self.options["decay"])
        if lam == 0.0 or self.frozen:
            return
        for name in self.layers:
            grad = self.block.grad(f"{name}.weight")
            if grad is not None:
                weight = self.block.tensor(f"{name}.weight")
                grad.add_(lam * (1 - self.block.tensor(f"{name}.weight_mask")) * weight)

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        """Every ``mask_every`` steps: each seed's new masks from its dense weights, its flip rates."""
        done = step + 1
        if self.frozen or done % self.settings["mask_every"]:
            return
        template = sparse_layers(self.block.models[0])
        for name in self.layers:
            layer, weight = template[name], self.block.tensor(f"{name}.weight")
            rows = weight.abs().reshape(-1, *weight.shape[2:])  # seeds folded into the rows
            mask = nm_mask_from_scores(rows, layer.n, layer.m, layer.group_layout)
            self.block.tensor(f"{name}.weight_mask").copy_(mask.reshape(weight.shape))
        current = block_mask_vectors(self.block, self.layers)
        total = current.shape[1]
        flip_rates = ((current - self.previous_mask).abs().sum(dim=1) / total).tolist()
        initial_rates = ((current - self.initial_mask).abs().sum(dim=1) / total).tolist()
        for index in range(self.block.size):
            row = {"step": done, "flip_rate": flip_rates[index],
                   "initial_flip_rate": initial_rates[index]}  # fmt: skip
            self.flips[index].append(row)
            if self.log_metrics is not None:
                self.log_metrics(index, {k: v for k, v in row.items() if k != "step"}, done)
        self.previous_mask = current.clone()

    @torch.no_grad()
    def snapshot(self, block: SeedBlock) -> dict[str, torch.Tensor]:
        """The dense architecture's state-dict keys, each sparse layer's weight = its effective
        weight (what the layer computes); masks and SLoRB factors are not separate entries."""
        template = sparse_layers(block.models[0])
        state = {}
        for key, value in block.state().items():
            owner, _, leaf = key.rpartition(".")
            if owner in template and leaf in ("weight_mask", "slorb_weight"):
                continue
            if owner in template and leaf == "weight":
                value = block_effective_weight(block, owner, template[owner])
            state[key] = value.detach()
        return state

    def save_model(self, model: nn.Module, path: Path, model_info: dict[str, Any]) -> None:
        """The ``sparse`` checkpoint."""
        save_sparse(model, path, **model_info)

    def state_dict(self) -> dict[str, Any]:
        """m_0, m_{t-1} and the flip histories, per seed (the masks are the block's buffers)."""
        return {"initial_mask": self.initial_mask, "previous_mask": self.previous_mask,
                "flips": [list(rows) for rows in self.flips]}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""
        self.initial_mask = state["initial_mask"]
        self.previous_mask = state["previous_mask"]
        self.flips = [list(rows) for rows in state["flips"]]

    def flip_history(self, index: int = 0) -> pd.DataFrame:
        """step, flip_rate, initial_flip_rate at each mask refresh of seed ``index``."""
        return pd.DataFrame(self.flips[index], columns=["step", "flip_rate", "initial_flip_rate"])


def block_effective_weight(block: SeedBlock, name: str, layer: SparseLayer) -> torch.Tensor:
    """Each seed's W * m (+ S P) of the sparse layer ``name``, seed dimension first."""
    weight = block.tensor(f"{name}.weight") * block.tensor(f"{name}.weight_mask")
    if layer.slorb_weight is None:
        return weight
    slorb = block.tensor(f"{name}.slorb_weight")
    rows = slorb.reshape(-1, slorb.shape[-1])  # seeds folded into the rows
    expanded = expand_slorb(rows, layer.slorb_k, (rows.shape[0], *weight.shape[2:]))
    return weight + expanded.reshape(weight.shape)


@torch.no_grad()
def effective_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of the dense architecture: sparse layers contribute their effective weight."""
    layers = sparse_layers(model)
    state = {}
    for name, value in model.state_dict().items():
        owner, _, leaf = name.rpartition(".")
        if owner in layers and leaf in ("weight_mask", "slorb_weight"):
            continue
        if owner in layers and leaf == "weight":
            value = layers[owner].effective_weight()
        state[name] = value.detach().clone()
    return state


# --- the sparse checkpoint ----------------------------------------------------------------------


def save_sparse(model: nn.Module, path: str | os.PathLike, **info: Any) -> None:
    """``{"format": "sparse", "state_dict", "sparse": {n, m, slorb_k, layers}, **info}``."""
    layers = sparse_layers(model)
    first = next(iter(layers.values())) if layers else None
    sparse = {
        "n": first.n if first else None,
        "m": first.m if first else None,
        "slorb_k": first.slorb_k if first else None,
        "group_layout": first.group_layout if first else None,
        "layers": list(layers),
    }
    save_torch({"format": "sparse", "state_dict": model.state_dict(), "sparse": sparse, **info},
               path)  # fmt: skip


def model_from_sparse(saved: dict[str, Any]) -> nn.Module:
    """Rebuild a sparse model: the dense architecture, its listed layers made sparse, the state."""
    from trainmap.models import build_model

    model = build_model(saved["arch"], saved["meta"], **saved["model_options"])
    spec = saved["sparse"]
    layout = spec.get("group_layout") or LEGACY_LAYOUT  # files from before the layout was saved
    for name in spec["layers"]:
        _replace(model, name, _sparse_copy(model.get_submodule(name), spec["n"], spec["m"],
                                           spec["slorb_k"], layout))  # fmt: skip
    model.load_state_dict(saved["state_dict"])
    for layer in sparse_layers(model).values():
        layer.straight_through = False
    return model


def check_nm(model: nn.Module) -> bool:
    """Whether every group of M in every sparse layer keeps exactly N weights."""
    for layer in sparse_layers(model).values():
        groups = nm_groups(layer.weight_mask, layer.m, layer.group_layout)
        if not bool((groups.sum(dim=-1) == layer.n).all()):
            return False
    return True


# --- the sparse stage -----------------------------------------------------------------------------


def run_sparse_method(
    teacher: nn.Module,
    data: TaskData,
    options: Mapping[str, Any],
    settings: Mapping[str, Any],
    seed: int,
    out_dir: str | os.PathLike,
    *,
    log_metrics: Callable[[dict, int], None] | None = None,
    progress: bool = False,
    fingerprint: str = "",
    description: str = "sparse",
    model_info: Mapping[str, Any] | None = None,
    start: nn.Module | None = None,
) -> dict[str, Any]:
    """Make ``teacher`` (a trained dense model) N:M sparse by the method ``options``: one seed,
    :func:`run_sparse_block` with a block of one (``start``: the dense checkpoint to prune instead
    of the teacher itself, see there).

    Writes to ``out_dir``: ``model.pt`` (format ``sparse``), ``history.csv``, ``train.json``,
    ``checkpoint_metrics.csv``, ``checkpoints/`` (the archive) and ``flips.csv``. One-shot methods (no retraining) record a single checkpoint,
    the pruned model at step 0, and an empty flip table.
    """
    hook = None if log_metrics is None else (lambda _, metrics, step: log_metrics(metrics, step))
    out = Path(out_dir)
    return run_sparse_block([teacher], data, options, settings, [seed], [out],
                            resume_path=out / "resume.pt", log_metrics=hook, progress=progress,
                            fingerprint=fingerprint, description=description,
                            model_info=[model_info or {}],
                            starts=None if start is None else [start])[0]  # fmt: skip


def run_sparse_block(
    teachers: list[nn.Module],
    data: TaskData,
    options: Mapping[str, Any],
    settings: Mapping[str, Any],
    seeds: list[int],
    out_dirs: list[Path],
    *,
    resume_path: Path,
    log_metrics: BlockCheckpointHook | None = None,
    progress: bool = False,
    fingerprint: str = "",
    description: str = "sparse",
    model_info: list[Mapping[str, Any]] | None = None,
    starts: list[nn.Module] | None = None,
) -> list[dict[str, Any]]:
    """Make each of ``teachers`` (trained dense models of one architecture, one per seed) N:M sparse
    by the method ``options``; retraining methods retrain the whole block at once (each seed
    distilled from its own teacher). ``starts``: per seed, the dense model that is pruned and
    retrained (setting ``start``: an earlier checkpoint of the teacher's run); default the
    teacher itself. Writes each seed's files to its ``out_dirs`` entry (see
    :func:`run_sparse_method`); returns the per-seed summaries."""
    cfg = check_settings(settings)
    infos = [dict(info) for info in (model_info or [{} for _ in seeds])]
    teachers = [teacher.eval() for teacher in teachers]
    starts = teachers if starts is None else [start.eval() for start in starts]
    layout = cfg["conv_groups"]
    names = sparsifiable_layers(starts[0], cfg["m"], cfg["dense_layers"], layout)
    if not names:
        weight_layers = sum(isinstance(m, nn.Linear | nn.Conv2d) for m in starts[0].modules())
        raise ValueError(
            f"sparse setting dense_layers: {cfg['dense_layers']!r} leaves no layer of this "
            f"{weight_layers}-layer network to make {cfg['n']}:{cfg['m']} sparse (or no layer's "
            f"inputs divide into groups of {cfg['m']}); set sparse.<task>.dense_layers: none"
        )
    slorb_k = cfg["slorb_k"] if options.get("slorb") else None
    students = []
    for start in starts:
        scores = None
        if options["mask"] == "wanda":
            scores = wanda_scores(start, names, data.x_train[: cfg["calibration_batch"]])
        students.append(sparsify(start, cfg["n"], cfg["m"], slorb_k, scores, names, layout))
    paths = [TrainPaths.in_directory(out) for out in out_dirs]
    if options.get("retrain"):
        train_cfg = TrainConfig.from_dict(cfg["train"])
        teacher_block = SeedBlock(teachers).to(train_cfg.device) if options.get("distill") else None
        hooks = SparseHooks(teacher_block, cfg, options, train_cfg.steps, log_metrics)
        summaries = train_block(students, data, train_cfg, seeds, paths, resume_path=resume_path,
                                on_checkpoint=log_metrics, progress=progress,
                                fingerprint=fingerprint, description=description,
                                model_info=infos, hooks=hooks)  # fmt: skip
        flips = [hooks.flip_history(index) for index in range(len(seeds))]
    else:
        policy = ArchivePolicy.from_value(cfg["train"].get("archive"))
        summaries = [_prune_without_training(student, data, seed_paths, info, policy)
                     for student, seed_paths, info in zip(students, paths, infos, strict=True)]  # fmt: skip
        flips = [pd.DataFrame(columns=["step", "flip_rate", "initial_flip_rate"]) for _ in seeds]
    for student, out, seed_paths, summary, table in zip(students, out_dirs, paths, summaries,
                                                         flips, strict=True):  # fmt: skip
        write_atomic(Path(out) / "flips.csv", lambda tmp, t=table: t.to_csv(tmp, index=False))
        summary |= {"nm_valid": check_nm(student), "sparse_layers": names, "n": cfg["n"],
                    "m": cfg["m"], "group_layout": layout, "slorb_k": slorb_k}  # fmt: skip
        save_json(summary, seed_paths.summary)
    return summaries


def _prune_without_training(
    model: nn.Module, data: TaskData, paths: TrainPaths, info: Mapping[str, Any],
    policy: ArchivePolicy,
) -> dict[str, Any]:  # fmt: skip
    """One-shot pruning: the pruned model is the result, and its only checkpoint (step 0: its
    metrics, and its archive file unless ``policy`` keeps none)."""
    test_loss, test_acc = evaluate_split(model, data.x_test, data.y_test)
    row = {"step": 0, "train_loss": math.nan, "train_acc": math.nan, "test_loss": test_loss,
           "test_acc": test_acc, "lr": 0.0}  # fmt: skip
    history = pd.DataFrame([row])
    write_atomic(paths.history, lambda tmp: history.to_csv(tmp, index=False))
    recorder = CheckpointRecorder(metric_structure(model, info), [paths.metrics],
                                  [paths.archive.parent], [0], policy)  # fmt: skip
    recorder.start_fresh()
    recorder.capture(0, {k: v.unsqueeze(0) for k, v in effective_state(model).items()}, [0])
    recorder.finish(0)
    save_sparse(model, paths.model, **info)
    return {"status": "completed", "diverged_step": None, "steps": 0, "steps_done": 0,
            "n_checkpoints": 1, "wall_time_s": 0.0, "steps_per_s": math.nan,
            "resumed_from_step": None, "final": row}  # fmt: skip


def plot_flip_rates(histories: Mapping[str, pd.DataFrame], path: str | os.PathLike,
                    title: str = "") -> str:  # fmt: skip
    """Flip rate and initial flip rate against step, one line per run/method (AST fig. 4)."""
    from trainmap.figures import plt, save_png

    figure, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for label, history in histories.items():
        if len(history):
            axes[0].plot(history["step"], history["flip_rate"], lw=1, label=label)
            axes[1].plot(history["step"], history["initial_flip_rate"], lw=1, label=label)
    axes[0].set(xlabel="step", ylabel="flip rate r_t", yscale="symlog", title="mask changes")
    axes[1].set(xlabel="step", ylabel="initial flip rate i_t", title="distance from the first mask")
    for axis in axes:
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    figure.suptitle(title or "N:M mask flips", fontsize=10)
    figure.tight_layout()
    save_png(figure, path)
    return ("Flip rate (fraction of mask entries that changed since the previous refresh) and "
            "initial flip rate (changed since the first mask) at every mask refresh.")  # fmt: skip
