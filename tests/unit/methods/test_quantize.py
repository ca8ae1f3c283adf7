"""Quantisation (trainmap.methods.quantize, .packing): error bounds, AWQ, packed N:M + 4-bit storage, table 1."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainmap.methods.packing import (
    compression_ratio,
    index_bits,
    load_packed,
    pack_nm,
    patterns,
    save_packed,
    unpack_nm,
)
from trainmap.methods.quantize import (
    dequantize_rows,
    quantize_model,
    quantize_rows,
    quantized_layers,
    save_quantized,
)
from trainmap.methods.sparse_layers import nm_mask, save_sparse, sparsify
from trainmap.training.checkpoints import load_model

TABLE_1 = {1: 7.81, 2: 8.33, 4: 8.66, 8: 8.93, 16: 9.10, 32: 9.22}  # %, Huffman


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("n", sorted(TABLE_1))
def test_compression_ratio_reproduces_table_1(n):
    assert round(100 * compression_ratio(n, 2 * n, huffman=True), 2) == TABLE_1[n]
    plain = (4 * n + math.ceil(math.log2(math.comb(2 * n, n)))) / (2 * n * 32)
    assert compression_ratio(n, 2 * n) == pytest.approx(plain)
    assert compression_ratio(n, 2 * n) <= 3 / 32  # the upper bound C* = 9.375 %


def test_plain_index_formula_examples():
    assert compression_ratio(2, 4) == pytest.approx((8 + 3) / 128)  # 8.59 %
    assert index_bits(2, 4) == 3 and index_bits(4, 8) == 7 and index_bits(1, 2) == 1


@pytest.mark.parametrize("bits", [8, 4])
def test_round_to_nearest_error_is_at_most_half_a_step_and_keeps_zeros(bits):
    torch.manual_seed(bits)
    weight = torch.randn(16, 3, 3, 3)
    weight[weight.abs() < 0.3] = 0.0
    q, scale = quantize_rows(weight, bits)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 2 ** (bits - 1) - 1
    error = (dequantize_rows(q, scale) - weight).abs().reshape(16, -1)
    assert (error <= scale[:, None] / 2 + 1e-7).all()
    assert torch.equal(
        dequantize_rows(q, scale)[weight == 0], torch.zeros(int((weight == 0).sum()))
    )


def outlier_layer(seed: int = 0):
    """A Linear whose inputs have a few channels 50x larger than the rest (AWQ's setting)."""
    torch.manual_seed(seed)
    layer = nn.Linear(64, 32, bias=False)
    inputs = torch.randn(256, 64)
    inputs[:, :4] *= 50.0
    return nn.Sequential(layer), inputs


def test_awq_beats_round_to_nearest_int4_on_outlier_channels():
    model, inputs = outlier_layer()
    reference = model(inputs)
    errors = {}
    for scheme in ("int4", "awq_int4"):
        quantized, notes = quantize_model(model, scheme, inputs)
        errors[scheme] = float(((quantized(inputs) - reference).detach() ** 2).sum())
    assert errors["awq_int4"] < 0.8 * errors["int4"]
    assert notes["0"]["alpha"] > 0


def test_awq_with_alpha_zero_is_round_to_nearest(monkeypatch):
    import trainmap.methods.quantize as quantize

    model, inputs = outlier_layer(1)
    monkeypatch.setattr(quantize, "AWQ_GRID", (0.0,))
    awq, _ = quantize_model(model, "awq_int4", inputs)
    rtn, _ = quantize_model(model, "int4", inputs)
    assert torch.equal(awq[0].qweight, rtn[0].qweight)
    assert torch.allclose(awq(inputs), rtn(inputs))


@pytest.mark.parametrize(("n", "m"), [(1, 2), (2, 4), (4, 8)])
@pytest.mark.parametrize("huffman", [False, True])
def test_pack_unpack_is_bit_exact(n, m, huffman):
    torch.manual_seed(n + m)
    weight = torch.randn(12, 4 * m)
    mask = nm_mask(weight, n, m)
    q, _ = quantize_rows(weight * mask, 4)
    packed = pack_nm(q, mask, n, m, huffman=huffman)
    q_back, mask_back = unpack_nm(packed)
    assert torch.equal(q_back, q) and torch.equal(mask_back, mask)


@pytest.mark.parametrize("layout", ["input_channels", "flattened"])
def test_conv_kernels_pack_in_their_group_layout(layout):
    """A conv kernel's groups are packed in the layer's layout and named in the header; the
    input-channel layout's first group is 4 channels at kernel position (0, 0)."""
    torch.manual_seed(7)
    weight = torch.randn(6, 8, 3, 3)
    mask = nm_mask(weight, 2, 4, layout)
    q, _ = quantize_rows(weight * mask, 4)
    packed = pack_nm(q, mask, 2, 4, layout=layout)
    assert packed.meta["group_layout"] == layout and packed.meta["groups"] == 6 * 8 * 9 // 4
    q_back, mask_back = unpack_nm(packed)
    assert torch.equal(q_back, q) and torch.equal(mask_back, mask)
    first_group = mask[0, 0:4, 0, 0] if layout == "input_channels" else mask[0].reshape(-1)[:4]
    first_pattern = tuple(int(i) for i in torch.nonzero(first_group).flatten())
    index = int.from_bytes(packed.sections["indices"][:1], "big") >> 5  # the first 3-bit index
    assert patterns(2, 4)[index] == first_pattern


def test_packed_files_without_a_layout_read_as_flattened():
    """Packed N:M entries written before the layout was recorded used the flattened rows."""
    torch.manual_seed(8)
    weight = torch.randn(4, 8, 2, 2)
    mask = nm_mask(weight, 2, 4, "flattened")
    q, _ = quantize_rows(weight * mask, 4)
    packed = pack_nm(q, mask, 2, 4, layout="flattened")
    del packed.meta["group_layout"]
    q_back, mask_back = unpack_nm(packed)
    assert torch.equal(q_back, q) and torch.equal(mask_back, mask)


def test_pattern_index_maps_to_the_kept_positions():
    assert patterns(2, 4) == ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))
    q = torch.tensor([[0, 3, 0, -2]], dtype=torch.int8)
    mask = torch.tensor([[0.0, 1.0, 0.0, 1.0]])
    packed = pack_nm(q, mask, 2, 4)
    index = int.from_bytes(packed.sections["indices"], "big") >> 5  # 3 bits, most significant first
    assert patterns(2, 4)[index] == (1, 3)


@pytest.mark.slow  # in-process, seconds
def test_packed_large_layer_is_within_one_percent_of_the_formula(tmp_path):
    torch.manual_seed(0)
    model = sparsify(nn.Sequential(nn.Linear(4096, 1024, bias=False)), 2, 4, layers=["0"])
    quantized, _ = quantize_model(model, "int4")
    for huffman in (False, True):
        sizes = save_packed(quantized, tmp_path / "layer.packed", huffman=huffman)
        formula_bytes = compression_ratio(2, 4, huffman=huffman) * 4096 * 1024 * 32 / 8
        packed_bytes = sizes["weights"] + sizes["indices"]
        assert packed_bytes == pytest.approx(formula_bytes, rel=0.01)
        assert sizes["scales"] == 1024 * 4  # fp32 per-channel scales, counted separately
        whole = (tmp_path / "layer.packed").stat().st_size
        assert whole == sizes["total"] and whole <= 1.01 * formula_bytes + sizes["scales"] + 2048


@pytest.mark.parametrize("slorb_k", [None, 16])
def test_sparse_quantised_checkpoint_and_packed_file_round_trip(tmp_path, slorb_k):
    from trainmap.training.loop import build_cell_model

    meta = {"input_kind": "image", "input_shape": [1, 8, 8], "num_classes": 10}
    dense = build_cell_model("vgg_bn", "kaiming", 0, meta, {"widths": [8, 16],
                                                            "convs_per_stage": [2, 2]}).eval()  # fmt: skip
    model = sparsify(dense, 2, 4, slorb_k=slorb_k).eval()
    info = {"arch": "vgg_bn", "model_options": {"widths": [8, 16], "convs_per_stage": [2, 2]},
            "meta": meta, "method": "ast", "seed": 0}  # fmt: skip
    save_sparse(model, tmp_path / "sparse.pt", **info)
    source = torch.load(tmp_path / "sparse.pt", weights_only=True)
    inputs = torch.rand(16, 1, 8, 8)
    quantized, _ = quantize_model(model, "awq_int4", inputs)
    save_quantized(quantized, tmp_path / "q.pt", "awq_int4", source)
    loaded = load_model(tmp_path / "q.pt")
    for (name, a), b in zip(quantized_layers(quantized).items(),
                            quantized_layers(loaded).values(), strict=True):  # fmt: skip
        assert torch.equal(a.qweight, b.qweight), name
        assert torch.equal(a.scale, b.scale)
        assert a.slorb_k == b.slorb_k == (slorb_k if a.nm else None)
        assert a.nm_layout == b.nm_layout == ("input_channels" if a.nm else None)
        if a.slorb_k is not None:
            assert torch.equal(a.slorb_qweight, b.slorb_qweight)
    assert torch.equal(loaded(inputs), quantized(inputs))
    # Sparsity survives: every quantised N:M layer keeps its zeros.
    for layer in quantized_layers(quantized).values():
        if layer.nm is not None:
            assert torch.equal(layer.qweight[layer.weight_mask == 0],
                               torch.zeros_like(layer.qweight[layer.weight_mask == 0]))  # fmt: skip
    save_packed(quantized, tmp_path / "q.packed", huffman=True)
    unpacked = load_packed(tmp_path / "q.packed")
    for name, layer in quantized_layers(quantized).items():
        assert torch.equal(unpacked[f"{name}.qweight"], layer.qweight)
    assert torch.equal(unpacked["stage1.bn1.running_var"], quantized.stage1.bn1.running_var)


def test_slorb_layers_stay_nm_sparse_with_s_quantised_beside_them(tmp_path):
    """AST-Boosted keeps strict N:M weights plus the small S (N x d/k, AST sec. 4.4): quantising
    must not fold S P into the weight (that would make it dense and lose the packed format)."""
    torch.manual_seed(0)
    dense = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    model = sparsify(dense, 2, 4, slorb_k=16, layers=["0", "2"]).eval()
    with torch.no_grad():  # a trained S differs from its init: give it its own values
        model[0].slorb_weight.add_(0.05 * torch.randn_like(model[0].slorb_weight))
    inputs = torch.randn(64, 64)
    reference = model(inputs)
    for scheme in ("int8", "int4", "awq_int4"):
        quantized, _ = quantize_model(model, scheme, inputs)
        for name, layer in quantized_layers(quantized).items():
            source = model.get_submodule(name)
            assert layer.nm == (2, 4) and layer.slorb_k == 16
            kept = layer.weight_mask.reshape(-1, 4).sum(dim=1)
            assert torch.equal(kept, torch.full_like(kept, 2)), name
            assert torch.all(layer.qweight[layer.weight_mask == 0] == 0), name
            s_error = (dequantize_rows(layer.slorb_qweight, layer.slorb_scale)
                       - source.slorb_weight).abs()  # fmt: skip
            assert torch.all(s_error <= layer.slorb_scale[:, None] / 2 + 1e-7), name
        if scheme == "int8":  # S P is in the forward: int8 stays close to the fp32 sparse model
            assert (quantized(inputs) - reference).abs().max() < 0.02 * reference.abs().max()
    sizes = save_packed(quantized, tmp_path / "q.packed")
    s_values = 32 * math.ceil(64 / 16) + 10 * math.ceil(32 / 16)
    assert sizes["slorb"] == s_values + (32 + 10) * 4  # int8 S (SLORB_BITS) + fp32 row scales
    assert sizes["indices"] > 0  # both layers N:M packed
    unpacked = load_packed(tmp_path / "q.packed")
    for name, layer in quantized_layers(quantized).items():
        assert torch.equal(unpacked[f"{name}.slorb_qweight"], layer.slorb_qweight)
        assert torch.equal(unpacked[f"{name}.weight_mask"], layer.weight_mask)
