"""Tests for torchvision's ResNets as registered architectures (trainmap.models.torchvision_resnet)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from torch import nn

from trainmap.dynamics.metrics.weights import layout_of_model
from trainmap.models import ARCHITECTURES, arch_names, build_model, check_arch, count_parameters
from trainmap.models import torchvision_resnet as family
from trainmap.training.seed_block import SeedBlock, vectorisation_problem

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_RGB_META = {"input_kind": "image", "input_shape": [3, 16, 16], "num_classes": 10}
ARCHS = ("resnet18", "resnet50")


def features_before_pool(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """The map torchvision's ResNet feeds ``layer1`` (stem and max-pool applied)."""
    return model.maxpool(model.relu(model.bn1(model.conv1(inputs))))


def test_both_are_registered_for_images_by_this_family() -> None:
    for arch in ARCHS:
        assert arch in arch_names()
        assert ARCHITECTURES[arch].input_kinds == frozenset({"image"})
        assert ARCHITECTURES.source_of(arch) == "trainmap.models.torchvision_resnet"


@pytest.mark.parametrize(("arch", "expected"), [("resnet18", 11_689_512), ("resnet50", 25_557_032)])
def test_imagenet_sizes_have_torchvisions_parameter_counts(arch: str, expected: int) -> None:
    meta = {**TINY_RGB_META, "num_classes": 1000}
    assert count_parameters(build_model(arch, meta)) == expected


def test_num_classes_sizes_the_readout_and_the_logits() -> None:
    torch.manual_seed(0)
    inputs = torch.randn(2, 3, 16, 16)
    for arch, features in (("resnet18", 512), ("resnet50", 2048)):
        model = build_model(arch, {**TINY_RGB_META, "num_classes": 7}).eval()
        assert (model.fc.in_features, model.fc.out_features) == (features, 7)
        with torch.no_grad():
            logits = model(inputs)
        assert logits.shape == (2, 7)
        assert torch.isfinite(logits).all()


def test_cifar_stem_is_a_3x3_stride_1_conv_without_bias_and_no_max_pool() -> None:
    torch.manual_seed(0)
    imagenet = build_model("resnet18", TINY_RGB_META)
    cifar = build_model("resnet18", TINY_RGB_META, cifar_stem=True)
    conv = cifar.conv1
    assert isinstance(conv, nn.Conv2d)
    assert (conv.in_channels, conv.out_channels) == (3, 64)
    assert (conv.kernel_size, conv.stride, conv.padding) == ((3, 3), (1, 1), (1, 1))
    assert conv.bias is None
    assert isinstance(cifar.maxpool, nn.Identity)
    assert (imagenet.conv1.kernel_size, imagenet.conv1.stride) == ((7, 7), (2, 2))
    assert isinstance(imagenet.maxpool, nn.MaxPool2d)
    # The stem alone: the CIFAR stem keeps the 16x16 resolution, ImageNet's quarters it.
    inputs = torch.randn(2, 3, 16, 16)
    assert features_before_pool(cifar, inputs).shape == (2, 64, 16, 16)
    assert features_before_pool(imagenet, inputs).shape == (2, 64, 4, 4)
    # Only the stem changes: 7x7x3x64 weights give way to 3x3x3x64.
    assert count_parameters(imagenet) - count_parameters(cifar) == (49 - 9) * 3 * 64


def test_cifar_stem_applies_to_resnet50_too() -> None:
    model = build_model("resnet50", TINY_RGB_META, cifar_stem=True)
    assert model.conv1.kernel_size == (3, 3) and isinstance(model.maxpool, nn.Identity)


def test_zero_init_residual_zeroes_each_blocks_last_batch_norm() -> None:
    model = build_model("resnet18", TINY_RGB_META, zero_init_residual=True)
    last_norms = [block.bn2.weight for stage in (model.layer1, model.layer2, model.layer3,
                                                 model.layer4) for block in stage]  # fmt: skip
    assert len(last_norms) == 8
    assert all(torch.count_nonzero(weight) == 0 for weight in last_norms)
    assert torch.count_nonzero(build_model("resnet18", TINY_RGB_META).layer1[0].bn2.weight) > 0


def test_the_paper_metric_layout_is_the_authors_resnet18_walker() -> None:
    """``paper`` counts the stem conv, each block's conv1 and conv2 and fc, never a block's
    ``downsample`` conv (the authors' ``get_metrics_resnet18``); ``paper_shortcuts`` adds the
    three downsample convs."""
    model = build_model("resnet18", TINY_RGB_META, cifar_stem=True)
    blocks = [f"layer{stage}.{block}.conv{conv}.weight"
              for stage in range(1, 5) for block in range(2) for conv in (1, 2)]  # fmt: skip
    paper = layout_of_model(model, "paper")
    assert [matrix.name for matrix in paper.matrices] == ["conv1.weight", *blocks, "fc.weight"]
    assert paper.biases == ("fc.bias",)
    counted = {matrix.name for matrix in layout_of_model(model, "paper_shortcuts").matrices}
    downsample = {f"layer{stage}.0.downsample.0.weight" for stage in (2, 3, 4)}
    assert counted - {matrix.name for matrix in paper.matrices} == downsample


def test_two_seeds_train_as_one_vectorised_block() -> None:
    """BatchNorm under vmap: each seed's logits and running statistics in the block equal its own
    module's (vectorisation_problem's trial step)."""
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(build_model("resnet18", TINY_RGB_META, cifar_stem=True))
    block = SeedBlock(models)
    inputs = torch.randn(2, 4, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    assert vectorisation_problem(block, inputs) is None
    # The trial compared two different seeds.
    assert not torch.equal(block.tensor("conv1.weight")[0], block.tensor("conv1.weight")[1])


def test_grey_images_are_refused_naming_the_fix() -> None:
    meta = {"input_kind": "image", "input_shape": [1, 8, 8], "num_classes": 10}
    for arch in ARCHS:
        with pytest.raises(ValueError, match=r"3-channel \(RGB\)") as error:
            build_model(arch, meta)
        message = str(error.value)
        assert repr(arch) in message and "[1, 8, 8]" in message
        assert "cifar10" in message and "resnet_bn" in message


def test_unknown_and_mistyped_options_are_refused() -> None:
    with pytest.raises(ValueError, match="'widths'") as error:
        check_arch("resnet18", "image", {"widths": [64]})
    assert "cifar_stem" in str(error.value) and "zero_init_residual" in str(error.value)
    with pytest.raises(ValueError, match="cifar_stem"):
        check_arch("resnet50", "image", {"cifar_stem": "yes"})
    with pytest.raises(ValueError, match="'tokens'"):
        check_arch("resnet18", "tokens")
    with pytest.raises(ValueError, match="zero_init_residual"):
        family.build_resnet18(TINY_RGB_META, zero_init_residual=1)


def test_without_torchvision_registration_works_and_building_names_the_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # None in sys.modules makes every import of torchvision fail, as in a core-only install.
    for name in [name for name in sys.modules if name.split(".")[0] == "torchvision"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.models", None)
    # A fresh registry without this family's entries, and the family's module run again into it.
    registry = ARCHITECTURES.copy()
    for arch in ARCHS:
        registry.unregister(arch)
    monkeypatch.setattr("trainmap.models.registry.ARCHITECTURES", registry)
    spec = importlib.util.spec_from_file_location("fresh_torchvision_resnet", family.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(ARCHS) <= set(registry)
    for arch in ARCHS:
        with pytest.raises(ImportError) as error:
            registry[arch].builder(TINY_RGB_META)
        assert str(error.value) == (
            f"architecture {arch!r} needs torchvision: pip install 'trainmap[workflow]'"
        )
