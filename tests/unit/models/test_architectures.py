"""Tests for the architecture registry (trainmap.models)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainmap import models
from trainmap.models import (
    ARCHITECTURES,
    ArchSpec,
    arch_names,
    build_model,
    check_arch,
    count_parameters,
    register_architecture,
)

VECTOR_META = {"input_kind": "vector", "input_shape": [40], "num_classes": 2}
DIGITS_META = {"input_kind": "image", "input_shape": [1, 8, 8], "num_classes": 10}
CIFAR_META = {"input_kind": "image", "input_shape": [3, 32, 32], "num_classes": 10}
TOKENS_META = {"input_kind": "tokens", "input_shape": [3], "num_classes": 7, "vocab_size": 8}
META_BY_KIND = {"vector": VECTOR_META, "image": DIGITS_META, "tokens": TOKENS_META}
#: Architectures that take only RGB images (torchvision's ResNets) get small RGB ones instead.
RGB_META = {"input_kind": "image", "input_shape": [3, 8, 8], "num_classes": 10}
META_BY_ARCH = {"resnet18": RGB_META, "resnet50": RGB_META}
EXPECTED_ARCHS = {
    "mlp",
    "transformer",
    "transformer_ln",
    "vgg",
    "vgg_bn",
    "resnet",
    "resnet_bn",
    "resnet_plain",
    "resnet18",
    "resnet50",
}
# Small sizes keep every test fast; the registry defaults are exercised separately.
SMALL_OPTIONS = {
    "mlp": {"hidden": [16]},
    "transformer": {"d_model": 16, "n_heads": 2, "d_mlp": 32},
    "transformer_ln": {"d_model": 16, "n_heads": 2, "d_mlp": 32},
    "vgg": {"widths": [4, 8], "convs_per_stage": [1, 2]},
    "vgg_bn": {"widths": [4, 8], "convs_per_stage": [1, 2]},
    "resnet": {"widths": [4, 8], "blocks_per_stage": [1, 2]},
    "resnet_bn": {"widths": [4, 8], "blocks_per_stage": [1, 2]},
    "resnet_plain": {"widths": [4, 8], "blocks_per_stage": [1, 2]},
    "resnet_deep": {"widths": [4, 8], "blocks_per_stage": [1, 2]},
    "vgg_deep": {"widths": [4, 8], "convs_per_stage": [1, 2]},
    "fixup_resnet": {"widths": [4, 8], "blocks_per_stage": [1, 2]},
}
BATCH = 5


def example_inputs(meta: dict, batch: int = BATCH) -> torch.Tensor:
    """A random batch in the layout the models take."""
    if meta["input_kind"] == "tokens":
        return torch.randint(0, meta["vocab_size"], (batch, *meta["input_shape"]))
    return torch.randn(batch, *meta["input_shape"])


def meta_for(arch: str, kind: str) -> dict:
    """The small example metadata ``arch`` is tested on for input ``kind``."""
    return META_BY_ARCH.get(arch, META_BY_KIND[kind]) if kind == "image" else META_BY_KIND[kind]


def compatible_cases() -> list[tuple[str, str]]:
    return [
        (arch, kind) for arch in arch_names() for kind in sorted(ARCHITECTURES[arch].input_kinds)
    ]


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # torch.testing.assert_close lazily imports torch.distributed (seconds); allclose is enough.
    assert actual.shape == expected.shape
    assert torch.allclose(actual, expected, rtol=1e-5, atol=1e-6), (actual - expected).abs().max()


def count_modules(model: nn.Module, kind: type) -> int:
    return sum(isinstance(module, kind) for module in model.modules())


def test_registry_holds_every_family() -> None:
    assert EXPECTED_ARCHS <= set(arch_names())
    assert arch_names() == sorted(arch_names())
    assert ARCHITECTURES["mlp"].input_kinds == frozenset({"vector", "image"})
    assert ARCHITECTURES["transformer"].input_kinds == frozenset({"tokens"})
    for name in ("vgg", "vgg_bn", "resnet", "resnet_bn", "resnet_plain", "resnet18", "resnet50"):
        assert ARCHITECTURES[name].input_kinds == frozenset({"image"})


@pytest.mark.parametrize(("arch", "kind"), compatible_cases())
def test_every_arch_gives_logits_and_gradients(arch: str, kind: str) -> None:
    torch.manual_seed(0)
    meta = meta_for(arch, kind)
    model = build_model(arch, meta, **SMALL_OPTIONS.get(arch, {}))
    logits = model(example_inputs(meta))
    assert logits.shape == (BATCH, meta["num_classes"])
    assert torch.isfinite(logits).all()
    nn.functional.cross_entropy(logits, torch.zeros(BATCH, dtype=torch.long)).backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, f"{arch}: no gradient reached {name}"
        assert torch.isfinite(parameter.grad).all(), name


@pytest.mark.parametrize("arch", sorted(EXPECTED_ARCHS))
def test_default_sizes_build_for_larger_inputs(arch: str) -> None:
    kind = sorted(ARCHITECTURES[arch].input_kinds)[0]
    meta = CIFAR_META if kind == "image" else META_BY_KIND[kind]
    model = build_model(arch, meta)
    assert model(example_inputs(meta, batch=2)).shape == (2, meta["num_classes"])


def test_mlp_40_128_2_has_5506_parameters() -> None:
    model = build_model("mlp", VECTOR_META)
    assert count_parameters(model) == 40 * 128 + 128 + 128 * 2 + 2 == 5506
    linears = [module for module in model.layers if isinstance(module, nn.Linear)]
    assert [(layer.in_features, layer.out_features) for layer in linears] == [(40, 128), (128, 2)]


def test_mlp_flattens_images_and_takes_any_depth() -> None:
    model = build_model("mlp", DIGITS_META, hidden=[32, 16])
    expected = 64 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10
    assert count_parameters(model) == expected
    assert build_model("mlp", VECTOR_META, hidden=[])(example_inputs(VECTOR_META)).shape == (5, 2)


def test_count_parameters_skips_frozen_tensors() -> None:
    model = build_model("mlp", VECTOR_META)
    model.layers[1].weight.requires_grad_(False)
    assert count_parameters(model) == 5506 - 40 * 128


def test_unknown_arch_is_named_with_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="vgg16") as error:
        check_arch("vgg16")
    assert "resnet_bn" in str(error.value)
    with pytest.raises(ValueError, match="vgg16"):
        build_model("vgg16", DIGITS_META)


@pytest.mark.parametrize(("arch", "kind"), [("vgg", "tokens"), ("transformer", "image")])
def test_incompatible_input_kind_is_rejected(arch: str, kind: str) -> None:
    with pytest.raises(ValueError, match=kind) as error:
        check_arch(arch, kind)
    message = str(error.value)
    assert arch in message
    assert all(allowed in message for allowed in ARCHITECTURES[arch].input_kinds)
    with pytest.raises(ValueError, match=kind):
        build_model(arch, META_BY_KIND[kind])


def test_unknown_option_is_named_with_the_allowed_keys() -> None:
    with pytest.raises(ValueError, match="depth") as error:
        check_arch("vgg", "image", {"depth": 3, "widths": [8]})
    assert "convs_per_stage" in str(error.value)
    with pytest.raises(ValueError, match="'dropout'"):
        build_model("transformer", TOKENS_META, dropout=0.1)


def test_check_arch_accepts_valid_requests() -> None:
    for arch, kind in compatible_cases():
        check_arch(arch, kind, SMALL_OPTIONS.get(arch, {}))
        check_arch(arch)


@pytest.mark.parametrize(
    ("arch", "options", "fragment"),
    [
        ("vgg", {"widths": [8, 16], "convs_per_stage": [2]}, "same length"),
        ("resnet", {"widths": [8], "blocks_per_stage": [1, 1]}, "same length"),
        ("resnet", {"widths": [8, 0], "blocks_per_stage": [1, 1]}, "widths"),
        ("vgg_bn", {"widths": []}, "widths"),
        ("mlp", {"hidden": 128}, "hidden"),
        ("transformer", {"d_model": 30, "n_heads": 4}, "not divisible"),
        ("transformer_ln", {"d_mlp": 0}, "d_mlp"),
        ("resnet_bn", {"residual": "no"}, "residual"),
    ],
)
def test_bad_option_values_fail_at_check_time(arch: str, options: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        check_arch(arch, None, options)
    meta = TOKENS_META if arch.startswith("transformer") else DIGITS_META
    with pytest.raises(ValueError, match=fragment):
        build_model(arch, meta, **options)


def test_builders_do_not_change_the_registered_defaults() -> None:
    before = {name: repr(spec.defaults) for name, spec in ARCHITECTURES.items()}
    model = build_model("vgg", DIGITS_META, batch_norm=True)
    assert count_modules(model, nn.BatchNorm2d) == 6
    assert count_modules(build_model("vgg", DIGITS_META), nn.BatchNorm2d) == 0
    assert {name: repr(spec.defaults) for name, spec in ARCHITECTURES.items()} == before


@pytest.mark.parametrize(
    ("arch", "has_bn"),
    [("vgg", False), ("vgg_bn", True), ("resnet", False), ("resnet_bn", True)]
    + [("resnet_plain", False)],
)
def test_batch_norm_switch_and_conv_bias(arch: str, has_bn: bool) -> None:
    model = build_model(arch, CIFAR_META)
    convs = [module for module in model.modules() if isinstance(module, nn.Conv2d)]
    assert (count_modules(model, nn.BatchNorm2d) > 0) == has_bn
    # One BatchNorm per conv (projection shortcuts included) when BN is on.
    assert count_modules(model, nn.BatchNorm2d) == (len(convs) if has_bn else 0)
    assert all((conv.bias is None) == has_bn for conv in convs)


def test_resnet_variants_differ_only_in_their_switches() -> None:
    defaults = {
        name: ARCHITECTURES[name].defaults for name in ("resnet", "resnet_bn", "resnet_plain")
    }
    assert defaults["resnet"] | {"batch_norm": True} == defaults["resnet_bn"]
    assert defaults["resnet"] | {"residual": False} == defaults["resnet_plain"]
    plain = build_model("resnet_plain", CIFAR_META)
    # Stem plus two convs per block and no projection convs: a plain 7-conv CNN.
    assert count_modules(plain, nn.Conv2d) == 7
    assert all(block.shortcut is None for block in plain.modules() if _is_block(block))


def _is_block(module: nn.Module) -> bool:
    return isinstance(module, models.BasicBlock)


def _zero_second_convs(model: nn.Module) -> list[models.BasicBlock]:
    blocks = [module for module in model.modules() if _is_block(module)]
    with torch.no_grad():
        for block in blocks:
            block.conv2.weight.zero_()
            block.conv2.bias.zero_()
    return blocks


def test_residual_blocks_pass_the_shortcut_when_the_second_conv_is_zero() -> None:
    torch.manual_seed(0)
    model = build_model("resnet", DIGITS_META, widths=[4, 4, 8], blocks_per_stage=[1, 2, 1])
    blocks = _zero_second_convs(model)
    shortcut_kinds = {type(block.shortcut) for block in blocks}
    assert shortcut_kinds == {nn.Identity, nn.Sequential}, "want identity and projection blocks"
    for block in blocks:
        inputs = torch.randn(3, block.conv1.in_channels, 8, 8)
        expected = torch.relu(block.shortcut(inputs))
        assert expected.abs().sum() > 0
        assert_close(block(inputs), expected)
        if isinstance(block.shortcut, nn.Identity):
            assert_close(block(inputs), torch.relu(inputs))


def test_plain_blocks_output_zero_when_the_second_conv_is_zero() -> None:
    torch.manual_seed(0)
    model = build_model(
        "resnet", DIGITS_META, widths=[4, 8], blocks_per_stage=[1, 1], residual=False
    )
    for block in _zero_second_convs(model):
        inputs = torch.randn(3, block.conv1.in_channels, 8, 8)
        assert torch.equal(block(inputs), torch.zeros_like(block(inputs)))


def test_residual_switch_changes_the_function_not_the_parameters() -> None:
    torch.manual_seed(0)
    # One stage of equal widths: every shortcut is the identity, which has no parameters.
    plain = build_model("resnet", DIGITS_META, widths=[4], blocks_per_stage=[2], residual=False)
    torch.manual_seed(0)
    residual = build_model("resnet", DIGITS_META, widths=[4], blocks_per_stage=[2], residual=True)
    assert count_parameters(plain) == count_parameters(residual)
    inputs = example_inputs(DIGITS_META)
    assert not torch.allclose(plain(inputs), residual(inputs))


@pytest.mark.parametrize(
    ("arch", "shape", "final_map"),
    [
        ("resnet", [1, 8, 8], (2, 2)),
        ("resnet", [3, 32, 32], (8, 8)),
        ("resnet", [1, 3, 3], (3, 3)),
        ("vgg", [1, 8, 8], (1, 1)),
        ("vgg", [3, 32, 32], (4, 4)),
        ("vgg", [1, 3, 3], (1, 1)),
        ("vgg", [1, 1, 1], (1, 1)),
    ],
)
def test_downsampling_follows_the_input_size(arch: str, shape: list, final_map: tuple) -> None:
    meta = {"input_kind": "image", "input_shape": shape, "num_classes": 3}
    model = build_model(arch, meta)
    features = model[: list(dict(model.named_children())).index("pool")]
    assert features(example_inputs(meta, batch=2)).shape[-2:] == final_map


def test_deep_plain_vgg_has_twelve_convs_without_bn() -> None:
    torch.manual_seed(0)
    model = build_model("vgg", CIFAR_META, convs_per_stage=[4, 4, 4])
    assert count_modules(model, nn.Conv2d) == 12
    assert count_modules(model, nn.BatchNorm2d) == 0
    assert torch.isfinite(model(example_inputs(CIFAR_META, batch=2))).all()


def test_transformer_projections_are_separate_square_linears() -> None:
    model = build_model("transformer", TOKENS_META)
    attention = model.attention
    projections = [attention.q, attention.k, attention.v, attention.o]
    for projection in projections:
        assert isinstance(projection, nn.Linear)
        assert (projection.in_features, projection.out_features) == (128, 128)
    assert len({projection.weight.data_ptr() for projection in projections}) == 4
    assert model.embed.weight.shape == (8, 128)
    assert model.pos_embed.weight.shape == (3, 128)
    assert (model.mlp.up.out_features, model.mlp.down.in_features) == (512, 512)
    assert model.readout.out_features == 7
    assert count_modules(model, nn.Dropout) == 0


def test_attention_heads_are_row_slices_of_the_projections() -> None:
    torch.manual_seed(0)
    model = build_model("transformer", TOKENS_META, d_model=12, n_heads=3, d_mlp=8)
    attention, d_head = model.attention, 4
    stream = torch.randn(2, 3, 12)
    by_heads = torch.zeros(2, 3, 12)
    for head in range(3):
        rows = slice(head * d_head, (head + 1) * d_head)
        queries = stream @ attention.q.weight[rows].T
        keys = stream @ attention.k.weight[rows].T
        values = stream @ attention.v.weight[rows].T
        pattern = (queries @ keys.transpose(1, 2) / math.sqrt(d_head)).softmax(dim=-1)
        by_heads += (pattern @ values) @ attention.o.weight[:, rows].T
    assert_close(attention(stream), by_heads)


def test_transformer_layer_norm_switch() -> None:
    plain = build_model("transformer", TOKENS_META, d_model=16, n_heads=2)
    normed = build_model("transformer_ln", TOKENS_META, d_model=16, n_heads=2)
    assert count_modules(plain, nn.LayerNorm) == 0
    assert count_modules(normed, nn.LayerNorm) == 3
    assert (
        count_modules(build_model("transformer", TOKENS_META, layer_norm=True), nn.LayerNorm) == 3
    )


def test_transformer_output_depends_only_on_the_tokens() -> None:
    torch.manual_seed(0)
    model = build_model("transformer", TOKENS_META, d_model=16, n_heads=2, d_mlp=32)
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6], [1, 2, 3]])
    logits = model(tokens)
    assert_close(logits[0], logits[2])
    # No mixing across the batch, and no state carried between calls.
    assert_close(model(tokens[:1]), logits[:1])
    assert_close(model(tokens), logits)
    # Bidirectional attention: the first token reaches the last position's readout.
    assert not torch.allclose(model(torch.tensor([[7, 2, 3]])), logits[:1])


def test_transformer_reads_out_the_last_position() -> None:
    torch.manual_seed(0)
    model = build_model("transformer", TOKENS_META, d_model=16, n_heads=2, d_mlp=32)
    with torch.no_grad():
        # Silence both blocks: the stream is then just token + position embedding.
        model.attention.o.weight.zero_()
        model.mlp.down.weight.zero_()
        model.mlp.down.bias.zero_()
    tokens = torch.tensor([[1, 2, 3], [6, 5, 3], [1, 2, 4]])
    logits = model(tokens)
    expected = model.readout(model.embed.weight[tokens[:, -1]] + model.pos_embed.weight[-1])
    assert_close(logits, expected)
    assert_close(logits[0], logits[1])
    assert not torch.allclose(logits[0], logits[2])


@pytest.mark.parametrize("arch", sorted(EXPECTED_ARCHS))
def test_same_seed_same_parameters_other_seed_other_parameters(arch: str) -> None:
    meta = meta_for(arch, sorted(ARCHITECTURES[arch].input_kinds)[0])

    def parameters_for(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return build_model(arch, meta, **SMALL_OPTIONS.get(arch, {})).state_dict()

    first, again, other = parameters_for(0), parameters_for(0), parameters_for(1)
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not all(torch.equal(first[name], other[name]) for name in first)


def test_registering_a_new_arch_is_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # register_architecture writes to the registry module's registry; a copy keeps this test's
    # entry out.
    monkeypatch.setattr("trainmap.models.registry.ARCHITECTURES", ARCHITECTURES.copy())

    def build_linear(meta: dict, bias: bool = True) -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(meta["input_shape"]), 2, bias=bias))

    spec = ArchSpec("linear", build_linear, {"bias": True}, frozenset({"vector"}), "a linear map")
    assert register_architecture(spec) is spec
    assert "linear" in arch_names()
    assert count_parameters(build_model("linear", VECTOR_META, bias=False)) == 80
    with pytest.raises(ValueError, match="already registered"):
        register_architecture(spec)
    with pytest.raises(ValueError, match="pixels"):
        register_architecture(ArchSpec("odd", build_linear, {}, frozenset({"pixels"}), "bad kind"))
    assert "linear" not in ARCHITECTURES
