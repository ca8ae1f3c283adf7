"""N:M sparse layers: the masks (magnitude, Wanda), the straight-through masked forward and SLoRB.

Huang et al., "Pruning Large Language Models with Semi-Structural Adaptive Sparse Training"
(AST), with Wanda from Sun et al. (2023):

* N:M mask (sec. 3.1): in every group of M consecutive input weights of an output row keep the N
  with the largest score (|W| for magnitude, |W| * ||x_j||_2 for Wanda). Ties keep the lower index.
  Conv kernels group M consecutive input channels at each kernel position by default (setting
  ``conv_groups: input_channels``, the SR-STE authors' sparse conv and the layout N:M tensor cores
  accelerate); ``conv_groups: flattened`` groups the (out, in*kh*kw) rows instead (``trainmap.methods.nm``).
* Straight-through estimator (sec. 3.2): the forward pass uses W * m, the backward pass hands the
  gradient with respect to W * m to all of W unmasked.
* SLoRB (sec. 4.4): an extra term S(Px): P sums each group of k consecutive inputs, S (out x d/k) is
  initialised to the mean of the pruned weights of each group, S_ij = (1/k) sum_p W_ip (1 - M_ip),
  so each group's mean of W * M plus the SLoRB contribution equals the dense group's mean (a last,
  partial group of d mod k inputs divides by its own size). It is computed as a dense matrix S
  expanded over each group's k inputs, added to W * M. The paper defines SLoRB for Linear layers;
  on a conv its groups are k consecutive entries of the flattened (in*kh*kw) row, whatever the N:M
  layout (S is stored apart from the N:M weights, so the two need not align).

:func:`sparsify` makes a dense model's layers N:M sparse (:class:`SparseLinear`,
:class:`SparseConv2d`); :func:`save_sparse` / :func:`model_from_sparse` are the sparse checkpoint
(format ``sparse``). The retraining that uses them (SR-STE, distillation, mask refreshes) is
:mod:`trainmap.methods.sparse`.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainmap.io import save_torch
from trainmap.methods.nm import LEGACY_LAYOUT, from_nm_groups, grouped_axis_size, nm_groups
from trainmap.models import eval_forward_with_hooks
from trainmap.schema import section_defaults

#: The sparse stage's defaults (the schema's), for the library functions used without a config.
SPARSE_DEFAULTS = section_defaults("sparse")

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


def sparsifiable_layers(model: nn.Module, m: int,
                        dense_layers: str = SPARSE_DEFAULTS["dense_layers"],
                        layout: str = SPARSE_DEFAULTS["conv_groups"]) -> list[str]:  # fmt: skip
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
        sparse.set_submodule(name, layer)
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


# --- what a sparse model holds -------------------------------------------------------------------


def mask_vector(model: nn.Module) -> torch.Tensor:
    """All sparse layers' masks, flattened and concatenated (in module order), on the CPU."""
    return torch.cat(
        [layer.weight_mask.reshape(-1).cpu() for layer in sparse_layers(model).values()]
    )


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
        layer = _sparse_copy(
            model.get_submodule(name), spec["n"], spec["m"], spec["slorb_k"], layout
        )
        model.set_submodule(name, layer)
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
