"""The ``vgg`` family: ``vgg``, ``vgg_bn`` and ``vgg_deep``.

Simonyan & Zisserman (2015): stages of 3x3 convs + ReLU (+ BatchNorm), 2x2 max-pool per stage, then
global average pooling and a Linear classifier. ``vgg_deep`` is the GradInit appendix's (A.1)
no-BN VGG, sized for small images.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from torch import nn

from trainmap.models.layers import conv3x3, with_classifier_head
from trainmap.models.registry import (
    ArchSpec,
    check_flag,
    check_same_length,
    check_sizes,
    image_shape,
    register_architecture,
)


def _vgg_stage(
    in_channels: int, width: int, num_convs: int, batch_norm: bool, pool: bool
) -> nn.Sequential:
    """``num_convs`` x (conv3x3 [+ BN] + ReLU), then a 2x2 max-pool if ``pool``."""
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    channels = in_channels
    for index in range(1, num_convs + 1):
        layers[f"conv{index}"] = conv3x3(channels, width, batch_norm)
        if batch_norm:
            layers[f"bn{index}"] = nn.BatchNorm2d(width)
        layers[f"relu{index}"] = nn.ReLU()
        channels = width
    if pool:
        layers["pool"] = nn.MaxPool2d(2)
    return nn.Sequential(layers)


def build_vgg(
    meta: dict,
    widths: Sequence[int] = (16, 32, 64),
    convs_per_stage: Sequence[int] = (2, 2, 2),
    batch_norm: bool = False,
) -> nn.Sequential:
    """Stages ``stage1..stageN``, ``pool`` (global average), ``flatten``, ``classifier``."""
    _check_vgg_options(
        {"widths": widths, "convs_per_stage": convs_per_stage, "batch_norm": batch_norm}
    )
    channels, height, width = image_shape(meta)
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    for index, (stage_width, num_convs) in enumerate(zip(widths, convs_per_stage, strict=True), 1):
        # Pooling a map smaller than 2x2 would leave nothing, so small inputs stop shrinking.
        pool = min(height, width) >= 2
        layers[f"stage{index}"] = _vgg_stage(channels, stage_width, num_convs, batch_norm, pool)
        if pool:
            height, width = height // 2, width // 2
        channels = stage_width
    return with_classifier_head(layers, channels, meta["num_classes"])


def _check_vgg_options(options: dict) -> None:
    check_sizes("widths", options["widths"])
    check_sizes("convs_per_stage", options["convs_per_stage"])
    check_same_length("widths", options["widths"], "convs_per_stage", options["convs_per_stage"])
    check_flag("batch_norm", options["batch_norm"])


_IMAGE = frozenset({"image"})
_VGG_SIZES = {"widths": [16, 32, 64], "convs_per_stage": [2, 2, 2]}

register_architecture(
    ArchSpec(
        name="vgg",
        builder=build_vgg,
        defaults={**_VGG_SIZES, "batch_norm": False},
        input_kinds=_IMAGE,
        description="VGG-style 3x3 conv stages with max-pooling, no BatchNorm",
        check_options=_check_vgg_options,
    )
)
register_architecture(
    ArchSpec(
        name="vgg_bn",
        builder=build_vgg,
        defaults={**_VGG_SIZES, "batch_norm": True},
        input_kinds=_IMAGE,
        description="VGG-style 3x3 conv stages with max-pooling and BatchNorm",
        check_options=_check_vgg_options,
    )
)
# Deep enough without BN that plain Kaiming init struggles (GradInit appendix, VGG/ResNet w/o BN).
register_architecture(
    ArchSpec(
        name="vgg_deep",
        builder=build_vgg,
        defaults={"widths": [16, 32, 64], "convs_per_stage": [4, 4, 4], "batch_norm": False},
        input_kinds=_IMAGE,
        description="12-conv VGG without BatchNorm (GradInit's no-BN VGG, sized for small images)",
        check_options=_check_vgg_options,
    )
)
