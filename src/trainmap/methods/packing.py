"""Packed storage of quantised models: N:M groups as 4-bit nibbles and pattern indices (AST sec. 5).

Per group of M weights of an N:M layer (AST sec. 5, fig. 1c): the N kept values as 4-bit nibbles
(two per byte) and the index of the kept pattern among the C(M, N) patterns in lexicographic order
(itertools.combinations), in ceil(log2 C(M, N)) bits, bit-packed, or Huffman-coded for equally
likely patterns. Per-channel scales are stored separately (fp32) and counted separately.
C_n = (4n + ceil(log2 C(2n, n))) / (2n * 32) of dense fp32 (sec. 5; with Huffman, table 1: 7.81,
8.33, 8.66, 8.93, 9.10, 9.22 %). Groups are stored in the order of the layer's N:M group layout
(``trainmap.methods.nm``), named in each entry's header as ``group_layout``: for a conv kernel by
default ``input_channels``, i.e. the M consecutive input channels at each kernel position, groups
ordered (out, kh, kw, in // M); ``flattened`` stores groups along the (out, in*kh*kw) rows. Linear
weights have one layout (groups along each row).

:func:`save_packed` writes a quantised model (:mod:`trainmap.methods.quantize`) in the packed
format (N:M layers nibble- and index-packed, other quantised layers as int4 nibbles or int8 bytes,
SLoRB integers as int8 bytes, everything else fp32); :func:`load_packed` reads the integer weights
back bit-exactly.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import nn

from trainmap.io import write_atomic
from trainmap.methods.nm import LEGACY_LAYOUT, from_nm_groups, nm_groups
from trainmap.methods.quantize import SLORB_BITS, quantized_layers

PACK_MAGIC = b"TMPK1\n"


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
