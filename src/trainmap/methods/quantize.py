"""Weight quantisation (round-to-nearest and AWQ-style) and packed storage for N:M + 4-bit models.

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
* Packed storage (AST sec. 5, fig. 1c): per group of M weights of an N:M layer, the N kept values as
  4-bit nibbles (two per byte) and the index of the kept pattern among the C(M, N) patterns in
  lexicographic order (itertools.combinations), in ceil(log2 C(M, N)) bits, bit-packed, or
  Huffman-coded for equally likely patterns. Per-channel scales are stored separately (fp32) and
  counted separately. C_n = (4n + ceil(log2 C(2n, n))) / (2n * 32) of dense fp32 (sec. 5; with
  Huffman, table 1: 7.81, 8.33, 8.66, 8.93, 9.10, 9.22 %). Groups are stored in the order of the
  layer's N:M group layout (``trainmap.methods.nm``), named in each entry's header as ``group_layout``: for
  a conv kernel by default ``input_channels``, i.e. the M consecutive input channels at each kernel
  position, groups ordered (out, kh, kw, in // M); ``flattened`` stores groups along the
  (out, in*kh*kw) rows. Linear weights have one layout (groups along each row).

Schemes (:data:`SCHEMES`): ``int8``, ``int4`` (round-to-nearest) and ``awq_int8``, ``awq_int4``.
A quantised model holds :class:`QuantizedLinear` / :class:`QuantizedConv2d` modules with integer
weights (int8 tensors, int4 values in [-7, 7]), per-channel scales and AWQ's input divisors; it
computes with the dequantised weights. :func:`save_packed` writes the whole model in the packed
format (N:M layers nibble- and index-packed, other quantised layers as int4 nibbles or int8 bytes,
everything else fp32); :func:`load_packed` reads the integer weights back bit-exactly.

AST-Boosted layers (SLoRB, sec. 4.4) keep their N:M structure: the masked weight W * m is quantised
and packed as N:M, and the SLoRB matrix S (N x d/k, 12.5 % extra values at 2:4 and k = 16) is
quantised separately to int8 (:data:`SLORB_BITS`) per row, whatever the weights' bits, and stored
beside them; the layer computes (Q(W * m) + Q8(S) P) x. Each S_ij acts on k inputs at once, so its
rounding error counts k times: with 4-bit S the int4 AST-Boosted digits CNN scored 0.947 against
0.979 with int8 S (5 seeds), for one extra bit per kept weight at 2:4 and k = 16 instead of half
a bit (the paper does not say how it stores S).
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainmap.io import save_torch, write_atomic
from trainmap.methods.nm import LEGACY_LAYOUT, from_nm_groups, nm_groups
from trainmap.models import eval_forward_with_hooks

SCHEMES = {"int8": (8, False), "int4": (4, False), "awq_int8": (8, True), "awq_int4": (4, True)}
AWQ_GRID = tuple(i / 20 for i in range(21))
PACK_MAGIC = b"TMPK1\n"
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
        _replace(quantized, name, layer)
        notes[name] = note
    return quantized.eval(), notes


def _copy_model(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model).eval()


def _replace(model: nn.Module, name: str, layer: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, layer)


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
        _replace(skeleton, name, layer)
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


# --- packed storage -------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def patterns(n: int, m: int) -> tuple[tuple[int, ...], ...]:
    """The C(M, N) kept-position patterns of a group, in lexicographic order."""
    return tuple(itertools.combinations(range(m), n))


def index_bits(n: int, m: int) -> int:
    """ceil(log2 C(M, N)): bits of a plain pattern index."""
    return max(1, math.ceil(math.log2(math.comb(m, n))))


def uniform_huffman_lengths(symbols: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """A Huffman code for ``symbols`` equally likely symbols: ``((k, count), (k + 1, count))``.

    Optimal codes for a uniform source are complete and their lengths differ by at most one:
    with k = floor(log2 C), 2^(k+1) - C codewords have k bits and the other 2C - 2^(k+1) have k + 1
    (what Huffman's algorithm builds, without a heap of C entries: C(32, 16) is 6e8).
    """
    if symbols == 1:
        return (1, 1), (2, 0)
    k = symbols.bit_length() - 1
    short = 2 ** (k + 1) - symbols
    return (k, short), (k + 1, symbols - short)


def huffman_code_lengths(symbols: int) -> tuple[int, ...]:
    """Per-symbol code lengths of :func:`uniform_huffman_lengths` (symbol order; for packing)."""
    if symbols > 2**20:
        raise ValueError(f"{symbols} patterns are too many to tabulate; use M <= 16")
    (short_length, short), (long_length, _) = uniform_huffman_lengths(symbols)
    return tuple(short_length if i < short else long_length for i in range(symbols))


def canonical_codes(lengths: tuple[int, ...]) -> list[tuple[int, int]]:
    """Canonical Huffman ``(code, length)`` per symbol."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    codes: list[tuple[int, int]] = [(0, 0)] * len(lengths)
    code, previous = 0, lengths[order[0]]
    for rank, symbol in enumerate(order):
        length = lengths[symbol]
        if rank:
            code = (code + 1) << (length - previous)
        codes[symbol] = (code, length)
        previous = length
    return codes


def compression_ratio(n: int, m: int, huffman: bool = False, bits: int = 4) -> float:
    """Bits of an N:M group (N values at ``bits`` + its pattern index) over M fp32 weights.

    AST sec. 5: C_n = (4n + ceil(log2 C(2n, n))) / (2n * 32) for n:2n at 4 bits; with Huffman coding
    of equally likely patterns the index costs the code's mean length (table 1).
    """
    if huffman:
        symbols = math.comb(m, n)
        (short_length, short), (long_length, long) = uniform_huffman_lengths(symbols)
        per_group = n * bits + (short_length * short + long_length * long) / symbols
    else:
        per_group = n * bits + index_bits(n, m)
    return per_group / (m * 32)


def _pack_bits(values: np.ndarray, lengths: np.ndarray) -> bytes:
    """Concatenate ``values[i]`` written in ``lengths[i]`` bits, most significant bit first."""
    total = int(lengths.sum())
    bits = np.zeros(total, dtype=np.uint8)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for bit in range(int(lengths.max()) if len(lengths) else 0):
        has = lengths > bit
        positions = offsets[has] + bit
        shift = (lengths[has] - 1 - bit).astype(np.int64)
        bits[positions] = (values[has] >> shift) & 1
    return np.packbits(bits).tobytes()


def _unpack_fixed(data: bytes, count: int, width: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8))[: count * width].reshape(count, width)
    weights = 1 << np.arange(width - 1, -1, -1)
    return (bits * weights).sum(axis=1)


def _unpack_huffman(data: bytes, count: int, codes: list[tuple[int, int]]) -> np.ndarray:
    table = {(length, code): symbol for symbol, (code, length) in enumerate(codes)}
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    out, code, length, position = np.empty(count, dtype=np.int64), 0, 0, 0
    for index in range(count):
        code, length = 0, 0
        while (length, code) not in table:
            code = (code << 1) | int(bits[position])
            length += 1
            position += 1
        out[index] = table[(length, code)]
    return out


def _pack_nibbles(values: np.ndarray) -> bytes:
    """Signed 4-bit values (-8..7) two per byte, the first in the high nibble."""
    nibbles = (values.astype(np.int16) & 0xF).astype(np.uint8)
    if len(nibbles) % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return (nibbles[0::2] << 4 | nibbles[1::2]).astype(np.uint8).tobytes()


def _unpack_nibbles(data: bytes, count: int) -> np.ndarray:
    raw = np.frombuffer(data, dtype=np.uint8)
    nibbles = np.empty(len(raw) * 2, dtype=np.int16)
    nibbles[0::2], nibbles[1::2] = raw >> 4, raw & 0xF
    nibbles = nibbles[:count]
    return np.where(nibbles >= 8, nibbles - 16, nibbles).astype(np.int8)


@dataclass
class PackedLayer:
    """One layer in packed form: sections of bytes and what they mean."""

    meta: dict[str, Any]
    sections: dict[str, bytes]


def pack_nm(q: torch.Tensor, mask: torch.Tensor, n: int, m: int, bits: int = 4,
            huffman: bool = False, layout: str = "input_channels") -> PackedLayer:  # fmt: skip
    """Pack an N:M quantised weight: kept values (nibbles at 4 bits, bytes at 8) in group order of
    ``layout`` (``trainmap.methods.nm.nm_groups``), and each group's pattern index (fixed-width bits or
    canonical Huffman codes)."""
    rows = nm_groups(q, m, layout).numpy().astype(np.int16)
    groups_keep = nm_groups(mask, m, layout).numpy().reshape(-1, m) > 0
    if not (groups_keep.sum(axis=1) == n).all():
        raise ValueError(f"the mask is not {n}:{m}: some group does not keep exactly {n}")
    lookup = {pattern: index for index, pattern in enumerate(patterns(n, m))}
    positions = np.nonzero(groups_keep)[1].reshape(-1, n)
    indices = np.array([lookup[tuple(p)] for p in positions.tolist()], dtype=np.int64)
    kept = rows.reshape(-1, m)[groups_keep].astype(np.int8)
    if huffman:
        codes = canonical_codes(huffman_code_lengths(math.comb(m, n)))
        code_values = np.array([codes[i][0] for i in indices], dtype=np.int64)
        code_lengths = np.array([codes[i][1] for i in indices], dtype=np.int64)
        index_bytes = _pack_bits(code_values, code_lengths)
    else:
        width = index_bits(n, m)
        index_bytes = _pack_bits(indices, np.full(len(indices), width, dtype=np.int64))
    values = _pack_nibbles(kept) if bits == 4 else kept.tobytes()
    meta = {"layout": "nm", "n": n, "m": m, "bits": bits, "huffman": huffman,
            "group_layout": layout, "shape": list(q.shape), "groups": len(indices)}  # fmt: skip
    return PackedLayer(meta, {"values": values, "indices": index_bytes})


def unpack_nm(layer: PackedLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """The quantised weight and its mask back from :func:`pack_nm`, bit-exact."""
    meta = layer.meta
    n, m, groups = meta["n"], meta["m"], meta["groups"]
    if meta["huffman"]:
        codes = canonical_codes(huffman_code_lengths(math.comb(m, n)))
        indices = _unpack_huffman(layer.sections["indices"], groups, codes)
    else:
        indices = _unpack_fixed(layer.sections["indices"], groups, index_bits(n, m))
    count = groups * n
    kept = (_unpack_nibbles(layer.sections["values"], count) if meta["bits"] == 4
            else np.frombuffer(layer.sections["values"], dtype=np.int8)[:count])  # fmt: skip
    table = np.array(patterns(n, m))
    keep = np.zeros((groups, m), dtype=bool)
    keep[np.arange(groups)[:, None], table[indices]] = True
    values = np.zeros((groups, m), dtype=np.int8)
    values[keep] = kept
    shape, layout = meta["shape"], meta.get("group_layout", LEGACY_LAYOUT)
    q = from_nm_groups(torch.from_numpy(values), shape, layout)
    return q, from_nm_groups(torch.from_numpy(keep.astype(np.float32)), shape, layout)


def pack_dense(q: torch.Tensor, bits: int) -> PackedLayer:
    """A quantised weight without N:M structure: int4 nibbles or int8 bytes."""
    flat = q.reshape(-1).numpy().astype(np.int8)
    values = _pack_nibbles(flat) if bits == 4 else flat.tobytes()
    return PackedLayer(
        {"layout": "dense", "bits": bits, "shape": list(q.shape)}, {"values": values}
    )


def unpack_dense(layer: PackedLayer) -> torch.Tensor:
    """Inverse of :func:`pack_dense`."""
    shape, count = layer.meta["shape"], math.prod(layer.meta["shape"])
    values = (_unpack_nibbles(layer.sections["values"], count) if layer.meta["bits"] == 4
              else np.frombuffer(layer.sections["values"], dtype=np.int8)[:count])  # fmt: skip
    return torch.from_numpy(values.reshape(shape).copy())


def save_packed(model: nn.Module, path: str | os.PathLike, huffman: bool = False) -> dict[str, int]:
    """Write a quantised model in the packed format; returns the bytes of each kind of content.

    Layout: ``TMPK1\\n``, a little-endian uint32 header length, a JSON header (per entry: name,
    kind, meta, section sizes), then the sections back to back. Quantised layers are N:M packed
    when they have an N:M mask, else nibble/byte packed; SLoRB integers are bytes and, with their
    scales, counted as ``slorb``; scales, AWQ divisors and every other state entry
    (biases, BN, embeddings) are raw little-endian fp32 (``scales`` / ``extra``).
    """
    entries, payload = [], io.BytesIO()
    sizes = {"weights": 0, "indices": 0, "scales": 0, "slorb": 0, "extra": 0}
    qlayers = quantized_layers(model)
    for name, layer in qlayers.items():
        if layer.nm is not None and layer.weight_mask is not None:
            packed = pack_nm(layer.qweight, layer.weight_mask, *layer.nm, bits=layer.bits,
                             huffman=huffman, layout=layer.nm_layout)  # fmt: skip
        else:
            packed = pack_dense(layer.qweight, layer.bits)
        entries.append(_entry(f"{name}.qweight", "qweight", packed, payload, sizes))
        if layer.slorb_qweight is not None:
            packed = pack_dense(layer.slorb_qweight, SLORB_BITS)
            entries.append(_entry(f"{name}.slorb_qweight", "slorb", packed, payload, sizes))
    for name, value in model.state_dict().items():
        owner, _, leaf = name.rpartition(".")
        if owner in qlayers and leaf in ("qweight", "weight_mask", "slorb_qweight"):
            continue
        raw = value.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        kind = _packed_kind(leaf) if owner in qlayers else "extra"
        packed = PackedLayer({"layout": "fp32", "shape": list(value.shape),
                              "dtype": str(value.dtype)}, {"values": raw})  # fmt: skip
        entries.append(_entry(name, kind, packed, payload, sizes))
    header = json.dumps({"entries": entries}).encode()
    data = PACK_MAGIC + struct.pack("<I", len(header)) + header + payload.getvalue()
    write_atomic(path, lambda tmp: tmp.write_bytes(data))
    sizes["header"] = len(PACK_MAGIC) + 4 + len(header)
    sizes["total"] = len(data)
    return sizes


def _packed_kind(leaf: str) -> str:
    """The size bucket of a quantised layer's fp32 entry."""
    return {"scale": "scales", "input_divisor": "scales", "slorb_scale": "slorb"}.get(leaf, "extra")


def _entry(name: str, kind: str, packed: PackedLayer, payload: io.BytesIO,
           sizes: dict[str, int]) -> dict[str, Any]:  # fmt: skip
    lengths = {}
    for section, data in packed.sections.items():
        payload.write(data)
        lengths[section] = len(data)
        bucket = "indices" if section == "indices" else ("weights" if kind == "qweight" else kind)
        sizes[bucket] += len(data)
    return {"name": name, "kind": kind, "meta": packed.meta, "sections": lengths}


def load_packed(path: str | os.PathLike) -> dict[str, Any]:
    """Read a packed file: ``{name: tensor}`` with quantised weights as int8 and, for N:M layers,
    their masks as ``<name>.weight_mask``; fp32 entries back in their dtype."""
    data = open(path, "rb").read()
    if not data.startswith(PACK_MAGIC):
        raise ValueError(f"{path} is not a trainmap packed file (bad magic)")
    (length,) = struct.unpack("<I", data[len(PACK_MAGIC) : len(PACK_MAGIC) + 4])
    start = len(PACK_MAGIC) + 4
    header = json.loads(data[start : start + length])
    position, tensors = start + length, {}
    for entry in header["entries"]:
        sections = {}
        for section, size in entry["sections"].items():
            sections[section] = data[position : position + size]
            position += size
        layer = PackedLayer(entry["meta"], sections)
        layout = entry["meta"]["layout"]
        if layout == "nm":
            q, mask = unpack_nm(layer)
            tensors[entry["name"]] = q
            tensors[entry["name"].replace("qweight", "weight_mask")] = mask
        elif layout == "dense":
            tensors[entry["name"]] = unpack_dense(layer)
        else:
            values = np.frombuffer(sections["values"], dtype="<f4").reshape(entry["meta"]["shape"])
            dtype = getattr(torch, entry["meta"]["dtype"].removeprefix("torch."))
            tensors[entry["name"]] = torch.from_numpy(values.copy()).to(dtype)
    return tensors


# --- int8 CPU inference (the speed figure) --------------------------------------------------------


def int8_inference_model(model: nn.Module) -> nn.Module:
    """torch's dynamic int8 quantisation of every nn.Linear (int8 GEMMs on the CPU, fbgemm/x86)."""
    import copy

    from torch.ao.quantization import quantize_dynamic

    return quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear}, dtype=torch.qint8)
