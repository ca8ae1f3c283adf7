"""Weight quantisation: round-to-nearest and AWQ-style schemes, the quantised layers and checkpoint.

* Round-to-nearest, per output channel, symmetric: q = round(w / s), s = max|w_row| / qmax,
  qmax = 2^(b-1) - 1 (127 for int8, 7 for int4); dequantised w^ = q * s, so |w - w^| <= s / 2 per
  entry, and zeros stay exactly zero (N:M sparsity survives quantisation). Conv kernels are
  (out, in*kh*kw) rows.
* AWQ (Lin et al. 2023, "Activation-aware weight quantization"; used after AST's sparsity, AST
  appendix A.3): per input channel scale s_j = a_j^alpha with a_j the mean |x_j| of the layer's input
  over a calibration batch (normalised by sqrt(max s * min s)); the layer computes Q(W diag(s))
  (x / s), and alpha in {0, 0.05, ..., 1} is searched to minimise ||Q(W s)(x / s) - W x||^2 on the
  calibration batch. alpha = 0 is plain round-to-nearest. A conv's input channel scales all its
  kh*kw kernel columns.

Schemes (:data:`SCHEMES`): ``int8``, ``int4`` (round-to-nearest) and ``awq_int8``, ``awq_int4``.
A quantised model holds :class:`QuantizedLinear` / :class:`QuantizedConv2d` modules with integer
weights (int8 tensors, int4 values in [-7, 7]), per-channel scales and AWQ's input divisors; it
computes with the dequantised weights. The packed storage of a quantised model (N:M layers nibble-
and index-packed, AST sec. 5) is :mod:`trainmap.methods.packing`.

AST-Boosted layers (SLoRB, sec. 4.4) keep their N:M structure: the masked weight W * m is quantised
and packed as N:M, and the SLoRB matrix S (N x d/k, 12.5 % extra values at 2:4 and k = 16) is
quantised separately to int8 (:data:`SLORB_BITS`) per row, whatever the weights' bits, and stored
beside them; the layer computes (Q(W * m) + Q8(S) P) x. Each S_ij acts on k inputs at once, so its
rounding error counts k times (why int8: docs/decisions/quantisation.md).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainmap.io import save_torch
from trainmap.methods.nm import LEGACY_LAYOUT
from trainmap.models import eval_forward_with_hooks

SCHEMES = {"int8": (8, False), "int4": (4, False), "awq_int8": (8, True), "awq_int4": (4, True)}
AWQ_GRID = tuple(i / 20 for i in range(21))
SLORB_BITS = 8


def qmax(bits: int) -> int:
    """The largest level of a symmetric b-bit quantiser: 2^(b-1) - 1."""
    return 2 ** (bits - 1) - 1


def quantize_rows(weight: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest symmetric per-output-channel quantisation: ``(q as int8, scale per row)``."""
    rows = weight.detach().reshape(weight.shape[0], -1).to(torch.float32)
    scale = rows.abs().amax(dim=1) / qmax(bits)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays zero
    q = torch.clamp(torch.round(rows / scale[:, None]), -qmax(bits), qmax(bits))
    return q.to(torch.int8).reshape(weight.shape), scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w^ = q * s per output row."""
    shape = [q.shape[0]] + [1] * (q.dim() - 1)
    return q.to(torch.float32) * scale.reshape(shape)


# --- quantised layers --------------------------------------------------------------------------


class QuantizedLayer:
    """Integer weights, per-row scales and the optional AWQ input divisor (shared by both kinds)."""

    def setup_quantized(self, q: torch.Tensor, scale: torch.Tensor, divisor: torch.Tensor | None,
                        bias: torch.Tensor | None, bits: int,
                        mask: torch.Tensor | None, nm: tuple[int, int] | None,
                        slorb: QuantizedSlorb | None = None,
                        nm_layout: str | None = None) -> None:  # fmt: skip
        self.bits, self.nm = bits, nm
        self.nm_layout = (nm_layout or LEGACY_LAYOUT) if nm is not None else None
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)
        self.register_buffer("input_divisor", divisor)
        self.register_buffer("weight_mask", mask)
        self.register_buffer("bias", None if bias is None else bias.detach().clone().float())
        self.slorb_k = None if slorb is None else slorb.k
        self.register_buffer("slorb_qweight", None if slorb is None else slorb.q)
        self.register_buffer("slorb_scale", None if slorb is None else slorb.scale)

    def effective_weight(self) -> torch.Tensor:
        """The dequantised weight the layer computes with: Q(W s) / s (s = 1 without AWQ), plus
        the dequantised SLoRB term Q(S) P when the source layer had one."""
        weight = dequantize_rows(self.qweight, self.scale)
        if self.input_divisor is not None:
            weight = weight / _column_scale(self.input_divisor, weight)
        if self.slorb_qweight is not None:
            # Imported here: trainmap.methods.sparse brings the training stack (pandas, trainmap.training.loop),
            # which the config check's `from trainmap.methods.quantize import SCHEMES` must not load at
            # every Snakefile parse (+0.6 s).
            from trainmap.methods.sparse import expand_slorb

            slorb = dequantize_rows(self.slorb_qweight, self.slorb_scale)
            weight = weight + expand_slorb(slorb, self.slorb_k, weight.shape)
        return weight


@dataclass
class QuantizedSlorb:
    """A layer's SLoRB matrix S, quantised per row to :data:`SLORB_BITS`: integers, scales, k."""

    q: torch.Tensor
    scale: torch.Tensor
    k: int

    @classmethod
    def of(cls, module: nn.Module) -> QuantizedSlorb | None:
        """``module``'s S quantised (round-to-nearest), or None without SLoRB."""
        if getattr(module, "slorb_weight", None) is None:
            return None
        q, scale = quantize_rows(module.slorb_weight.detach(), SLORB_BITS)
        return cls(q, scale, module.slorb_k)


def _column_scale(per_channel: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A per-input-channel vector broadcast to a weight's columns (a conv's kh*kw columns share it)."""
    if weight.dim() == 2:
        return per_channel[None, :]
    return per_channel[None, :, None, None]


class QuantizedLinear(QuantizedLayer, nn.Module):
    """A quantised ``nn.Linear``."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """x @ W^T + b with the dequantised weight."""
        return F.linear(inputs, self.effective_weight(), self.bias)


class QuantizedConv2d(QuantizedLayer, nn.Module):
    """A quantised ``nn.Conv2d``."""

    def __init__(self, conv: nn.Conv2d | Mapping[str, Any]) -> None:
        super().__init__()
        spec = conv_spec(conv) if isinstance(conv, nn.Conv2d) else dict(conv)
        self.stride, self.padding = tuple(spec["stride"]), tuple(spec["padding"])
        self.dilation, self.groups = tuple(spec["dilation"]), spec["groups"]

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The convolution with the dequantised kernel."""
        return F.conv2d(inputs, self.effective_weight(), self.bias, self.stride, self.padding,
                        self.dilation, self.groups)  # fmt: skip


def conv_spec(conv: nn.Conv2d) -> dict[str, Any]:
    """What a quantised conv needs of the original to compute the same convolution."""
    return {"stride": list(conv.stride), "padding": list(conv.padding),
            "dilation": list(conv.dilation), "groups": conv.groups}  # fmt: skip


# --- AWQ -----------------------------------------------------------------------------------------


@torch.no_grad()
def layer_inputs(
    model: nn.Module, names: list[str], inputs: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The input of each named layer on a calibration batch (forward pre-hooks, eval mode)."""
    captured: dict[str, torch.Tensor] = {}
    handles = [
        model.get_submodule(name).register_forward_pre_hook(
            lambda module, args, name=name: captured.__setitem__(name, args[0].detach())
        )
        for name in names
    ]
    eval_forward_with_hooks(model, inputs, handles)
    return captured


def _layer_output(module: nn.Module, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if isinstance(module, nn.Conv2d):
        return F.conv2d(x, weight, None, module.stride, module.padding, module.dilation,
                        module.groups)  # fmt: skip
    return F.linear(x, weight)


def activation_magnitude(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Mean |x_j| per input channel j (over batch, and positions for a conv)."""
    if isinstance(module, nn.Conv2d):
        return x.abs().mean(dim=(0, 2, 3))
    return x.abs().reshape(-1, x.shape[-1]).mean(dim=0)


@torch.no_grad()
def awq_search(
    module: nn.Module, weight: torch.Tensor, x: torch.Tensor, bits: int
) -> tuple[torch.Tensor, float, float]:
    """The AWQ input scale s = a^alpha (normalised) minimising the output error on ``x``.

    Returns ``(s, alpha, error)``; alpha = 0 (s = 1) is round-to-nearest.
    """
    reference = _layer_output(module, weight, x)
    magnitude = activation_magnitude(module, x).clamp(min=1e-8)
    best = (torch.ones_like(magnitude), 0.0, math.inf)
    for alpha in AWQ_GRID:
        s = magnitude**alpha
        s = s / torch.sqrt(s.max() * s.min())
        q, scale = quantize_rows(weight * _column_scale(s, weight), bits)
        approx = dequantize_rows(q, scale) / _column_scale(s, weight)
        error = float(((_layer_output(module, approx, x) - reference) ** 2).sum())
        if error < best[2]:
            best = (s, alpha, error)
    return best


# --- quantising a model ---------------------------------------------------------------------------


def quantizable_layers(model: nn.Module) -> list[str]:
    """Every Linear and Conv2d (the N:M sparse subclasses included)."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear | nn.Conv2d)]


def _source_weight(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, tuple | None]:
    """``(weight to quantise, N:M mask, (n, m))``: a sparse layer's masked weight W * m (its SLoRB
    term is quantised apart, :class:`QuantizedSlorb`), else the weight."""
    mask = getattr(module, "weight_mask", None)
    if mask is None:
        return module.weight.detach(), None, None
    return module.masked_weight().detach(), mask.detach().clone(), (module.n, module.m)


@torch.no_grad()
def quantize_model(
    model: nn.Module, scheme: str, calibration_inputs: torch.Tensor | None = None
) -> tuple[nn.Module, dict[str, dict[str, Any]]]:
    """A NEW model with every Linear/Conv2d quantised by ``scheme``; and per-layer notes
    (bits, AWQ alpha and output errors). AWQ schemes need ``calibration_inputs``."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantisation scheme {scheme!r}; known: {sorted(SCHEMES)}")
    bits, awq = SCHEMES[scheme]
    if awq and calibration_inputs is None:
        raise ValueError(f"scheme {scheme!r} needs calibration inputs (activation-aware)")
    quantized = _copy_model(model)
    names = quantizable_layers(quantized)
    captured = layer_inputs(quantized, names, calibration_inputs) if awq else {}
    notes = {}
    for name in names:
        module = quantized.get_submodule(name)
        weight, mask, nm = _source_weight(module)
        divisor, note = None, {"bits": bits, "alpha": 0.0}
        if awq:
            divisor, note["alpha"], note["output_error"] = awq_search(module, weight,
                                                                       captured[name], bits)  # fmt: skip
            weight = weight * _column_scale(divisor, weight)
        q, scale = quantize_rows(weight, bits)
        layer = (QuantizedLinear(module.in_features, module.out_features)
                 if isinstance(module, nn.Linear) else QuantizedConv2d(module))  # fmt: skip
        layer.setup_quantized(q, scale, divisor, module.bias, bits, mask, nm,
                              QuantizedSlorb.of(module),
                              getattr(module, "group_layout", None))  # fmt: skip
        quantized.set_submodule(name, layer)
        notes[name] = note
    return quantized.eval(), notes


def _copy_model(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model).eval()


def quantized_layers(model: nn.Module) -> dict[str, QuantizedLayer]:
    """The quantised layers by name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantizedLayer)}


# --- the quantised checkpoint (format "quantized") ------------------------------------------------


def save_quantized(model: nn.Module, path: str | os.PathLike, scheme: str,
                   source: Mapping[str, Any]) -> None:  # fmt: skip
    """Write a quantised model: the source checkpoint's structure (its format and build info, the
    state of its non-quantised parts) and each quantised layer's integers and scales."""
    layers = {}
    for name, layer in quantized_layers(model).items():
        layers[name] = {"kind": "linear" if isinstance(layer, QuantizedLinear) else "conv2d",
                        "bits": layer.bits, "nm": list(layer.nm) if layer.nm else None,
                        "nm_layout": layer.nm_layout,
                        "shape": list(layer.qweight.shape), "slorb_k": layer.slorb_k}  # fmt: skip
        if isinstance(layer, QuantizedConv2d):
            layers[name]["conv"] = {"stride": list(layer.stride), "padding": list(layer.padding),
                                    "dilation": list(layer.dilation), "groups": layer.groups}  # fmt: skip
    structure = {k: v for k, v in source.items() if k not in ("state_dict", "format")}
    save_torch({"format": "quantized", "scheme": scheme, "source_format": source.get("format", "dense"),
                "source": structure, "layers": layers, "state_dict": model.state_dict()}, path)  # fmt: skip


def model_from_quantized(saved: dict[str, Any]) -> nn.Module:
    """Rebuild a quantised model: the source form's network, its quantised layers swapped in, then
    the saved state (integer weights bit-exact)."""
    skeleton = _skeleton(saved["source_format"], saved["source"])
    for name, spec in saved["layers"].items():
        if spec["kind"] == "linear":
            layer = QuantizedLinear(spec["shape"][1], spec["shape"][0])
        else:
            layer = QuantizedConv2d(spec["conv"])
        state = {k.removeprefix(f"{name}."): v for k, v in saved["state_dict"].items()
                 if k.startswith(f"{name}.")}  # fmt: skip
        slorb = (QuantizedSlorb(state["slorb_qweight"], state["slorb_scale"], spec["slorb_k"])
                 if "slorb_qweight" in state else None)  # fmt: skip
        layer.setup_quantized(state["qweight"], state["scale"], state.get("input_divisor"),
                              state.get("bias"), spec["bits"], state.get("weight_mask"),
                              tuple(spec["nm"]) if spec["nm"] else None, slorb,
                              spec.get("nm_layout"))  # fmt: skip
        skeleton.set_submodule(name, layer)
    skeleton.load_state_dict(saved["state_dict"])
    return skeleton.eval()


def _skeleton(source_format: str, source: Mapping[str, Any]) -> nn.Module:
    """The source form's network structure (weights not loaded). Every Linear/Conv is replaced by
    its quantised layer, so a sparse source needs only its dense architecture."""
    if source_format == "deploy":
        from trainmap.models.repvgg import deploy_skeleton

        return deploy_skeleton(source["layers"])
    from trainmap.models import build_model

    return build_model(source["arch"], source["meta"], **source["model_options"])


# --- int8 CPU inference (the speed figure) --------------------------------------------------------


def int8_inference_model(model: nn.Module) -> nn.Module:
    """torch's dynamic int8 quantisation of every nn.Linear (int8 GEMMs on the CPU, fbgemm/x86)."""
    import copy

    from torch.ao.quantization import quantize_dynamic

    return quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear}, dtype=torch.qint8)
