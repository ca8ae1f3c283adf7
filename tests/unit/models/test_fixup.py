"""FixUp ResNet (GradInit appendix A.1) and the deep no-BN architectures."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainmap.models import FixupBlock, build_model
from trainmap.training.loop import build_cell_model

DIGITS = {"input_kind": "image", "input_shape": [1, 8, 8], "num_classes": 10}
CIFAR = {"input_kind": "image", "input_shape": [3, 32, 32], "num_classes": 10}


pytestmark = pytest.mark.usefixtures("one_thread")


def fixup(seed: int = 0, **options) -> nn.Module:
    return build_cell_model("fixup_resnet", "kaiming", seed, DIGITS, options or None)


def test_fixup_zero_inits_the_second_conv_and_the_classifier():
    model = fixup()
    for block in model.blocks:
        assert torch.count_nonzero(block.conv2.weight) == 0
        assert block.scale.item() == 1.0
        for name in ("bias1a", "bias1b", "bias2a", "bias2b"):
            assert getattr(block, name).item() == 0.0
    assert torch.count_nonzero(model.classifier.weight) == 0
    assert torch.count_nonzero(model.classifier.bias) == 0


def test_fixup_scales_the_first_conv_by_one_over_sqrt_of_the_branch_count():
    model = fixup(widths=[64, 64], blocks_per_stage=[8, 8])
    branches = 16
    for block in model.blocks[1:]:  # 64 -> 64 convs: fan-out 64 * 9
        expected = math.sqrt(2 / (64 * 9)) * branches**-0.5
        assert block.conv1.weight.std().item() == pytest.approx(expected, rel=0.05)


def test_fixup_residual_branches_output_zero_at_init():
    """Every block is its shortcut at init, so the network equals its branch-free skeleton."""
    model = fixup(seed=3).eval()
    inputs = torch.randn(4, 1, 8, 8)
    x = model.relu(model.stem(inputs) + model.stem_bias)
    for block in model.blocks:
        shortcut = x if block.shortcut is None else block.shortcut(x)
        assert torch.allclose(block(x), torch.relu(shortcut))
        x = block(x)


def test_first_sgd_step_only_moves_the_classifier():
    """FixUp: with the classifier at zero, the gradient is zero for all layers but the final FC."""
    model = fixup(seed=1)
    inputs, targets = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    loss = nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    for name, parameter in model.named_parameters():
        if name.startswith("classifier"):
            assert torch.count_nonzero(parameter.grad) > 0, name
        else:
            assert parameter.grad is None or torch.count_nonzero(parameter.grad) == 0, name


def test_gradinit_methods_use_nonzero_kaiming_on_fixup():
    model = build_cell_model("fixup_resnet", "gradinit", 0, DIGITS)
    assert torch.count_nonzero(model.classifier.weight) > 0
    assert all(torch.count_nonzero(b.conv2.weight) > 0 for b in model.blocks)


def test_fixup_block_downsamples_with_a_projection():
    block = FixupBlock(4, 8, stride=2)
    assert block.shortcut is not None
    assert block(torch.randn(2, 4, 8, 8)).shape == (2, 8, 4, 4)


@pytest.mark.parametrize("arch", ["vgg_deep", "resnet_deep", "fixup_resnet"])
@pytest.mark.parametrize("meta", [DIGITS, CIFAR], ids=["8x8", "32x32"])
def test_deep_no_bn_architectures(arch, meta):
    model = build_model(arch, meta)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) >= 10
    assert not any(isinstance(m, nn.BatchNorm2d | nn.LayerNorm) for m in model.modules())
    assert model(torch.randn(2, *meta["input_shape"])).shape == (2, 10)
