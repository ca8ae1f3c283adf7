"""The ``resnet`` family: ``resnet``, ``resnet_bn``, ``resnet_plain``, ``resnet_deep``, ``fixup_resnet``.

He et al. (2016): a 3x3 stem, then stages of basic blocks, global average pooling and a Linear
classifier. ``resnet_plain`` drops both the shortcuts and BatchNorm, a plain deep CNN to compare
against. ``fixup_resnet`` and ``resnet_deep`` are the GradInit appendix's (A.1) no-BN networks:
FixUp's ResNet (Zhang et al. 2019) with its own init (:meth:`FixupResNet.standard_init`), and a
deep ResNet without normalisation, sized for small images.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
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


class BasicBlock(nn.Module):
    """Two 3x3 convs (+ BN each): ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``.

    With ``residual`` the shortcut is the identity, or a 1x1 conv (+ BN) projection when
    the channels or the stride change. Without ``residual`` ``shortcut`` is None and nothing is
    added, which turns the network into a plain deep CNN of the same depth.
    """

    def __init__(
        self, in_channels: int, out_channels: int, stride: int, batch_norm: bool, residual: bool
    ) -> None:
        super().__init__()
        self.conv1 = conv3x3(in_channels, out_channels, batch_norm, stride)
        self.bn1 = _batch_norm_or_identity(out_channels, batch_norm)
        self.conv2 = conv3x3(out_channels, out_channels, batch_norm)
        self.bn2 = _batch_norm_or_identity(out_channels, batch_norm)
        self.relu = nn.ReLU()
        self.shortcut = (
            _shortcut(in_channels, out_channels, stride, batch_norm) if residual else None
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The block output; same spatial size as the input unless the block strides."""
        out = self.relu(self.bn1(self.conv1(inputs)))
        out = self.bn2(self.conv2(out))
        if self.shortcut is not None:
            out = out + self.shortcut(inputs)
        return self.relu(out)


def _batch_norm_or_identity(channels: int, batch_norm: bool) -> nn.Module:
    return nn.BatchNorm2d(channels) if batch_norm else nn.Identity()


def _shortcut(in_channels: int, out_channels: int, stride: int, batch_norm: bool) -> nn.Module:
    """Identity when shapes match, else a 1x1 projection (+ BN) to the block's output shape."""
    if in_channels == out_channels and stride == 1:
        return nn.Identity()
    projection: OrderedDict[str, nn.Module] = OrderedDict(
        conv=nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=not batch_norm)
    )
    if batch_norm:
        projection["bn"] = nn.BatchNorm2d(out_channels)
    return nn.Sequential(projection)


def _resnet_stem(in_channels: int, width: int, batch_norm: bool) -> nn.Sequential:
    """The 3x3 conv (+ BN) + ReLU that lifts the image to the first stage's width."""
    stem: OrderedDict[str, nn.Module] = OrderedDict(conv=conv3x3(in_channels, width, batch_norm))
    if batch_norm:
        stem["bn"] = nn.BatchNorm2d(width)
    stem["relu"] = nn.ReLU()
    return nn.Sequential(stem)


def _resnet_stage(
    in_channels: int, width: int, num_blocks: int, stride: int, batch_norm: bool, residual: bool
) -> nn.Sequential:
    """``num_blocks`` basic blocks; only the first changes channels or strides."""
    blocks = [BasicBlock(in_channels, width, stride, batch_norm, residual)]
    blocks += [BasicBlock(width, width, 1, batch_norm, residual) for _ in range(num_blocks - 1)]
    return nn.Sequential(*blocks)


def build_resnet(
    meta: dict,
    widths: Sequence[int] = (16, 32, 64),
    blocks_per_stage: Sequence[int] = (1, 1, 1),
    batch_norm: bool = False,
    residual: bool = True,
) -> nn.Sequential:
    """``stem``, ``stage1..stageN`` of basic blocks, ``pool``, ``flatten``, ``classifier``."""
    _check_resnet_options(
        {
            "widths": widths,
            "blocks_per_stage": blocks_per_stage,
            "batch_norm": batch_norm,
            "residual": residual,
        }
    )
    channels, height, width = image_shape(meta)
    layers: OrderedDict[str, nn.Module] = OrderedDict(
        stem=_resnet_stem(channels, widths[0], batch_norm)
    )
    channels = widths[0]
    for index, (stage_width, num_blocks) in enumerate(
        zip(widths, blocks_per_stage, strict=True), 1
    ):
        # Downsample entering every stage but the first, unless the map is already tiny
        # (8x8 digits: 8 -> 4 -> 2 keeps a real final map instead of collapsing to 1x1).
        stride = 2 if index > 1 and min(height, width) >= 4 else 1
        layers[f"stage{index}"] = _resnet_stage(
            channels, stage_width, num_blocks, stride, batch_norm, residual
        )
        if stride == 2:
            # A padded 3x3 conv with stride 2 maps n to ceil(n / 2).
            height, width = (height + 1) // 2, (width + 1) // 2
        channels = stage_width
    return with_classifier_head(layers, channels, meta["num_classes"])


def _check_resnet_options(options: dict) -> None:
    check_sizes("widths", options["widths"])
    check_sizes("blocks_per_stage", options["blocks_per_stage"])
    check_same_length("widths", options["widths"], "blocks_per_stage", options["blocks_per_stage"])
    check_flag("batch_norm", options["batch_norm"])
    check_flag("residual", options["residual"])


# --- fixup_resnet (GradInit appendix A.1) -------------------------------------------------------


class FixupBlock(nn.Module):
    """A FixUp basic block (Zhang et al. 2019; GradInit appendix A.1): no normalisation, scalar
    biases before each conv and activation, and a scalar multiplier after the second conv:

    ``relu(scale * conv2(relu(conv1(x + b1a) + b1b) + b2a) + b2b + shortcut(x + b1a))``.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.bias1a = nn.Parameter(torch.zeros(1))
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.bias1b = nn.Parameter(torch.zeros(1))
        self.bias2a = nn.Parameter(torch.zeros(1))
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.scale = nn.Parameter(torch.ones(1))
        self.bias2b = nn.Parameter(torch.zeros(1))
        self.relu = nn.ReLU()
        self.shortcut = (
            nn.Conv2d(in_channels, out_channels, 1, stride, bias=False)
            if in_channels != out_channels or stride != 1
            else None
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The block output; a residual branch whose output is zero at FixUp's init."""
        shifted = inputs + self.bias1a
        out = self.relu(self.conv1(shifted) + self.bias1b)
        out = self.conv2(out + self.bias2a) * self.scale + self.bias2b
        identity = shifted if self.shortcut is None else self.shortcut(shifted)
        return self.relu(out + identity)


class FixupResNet(nn.Module):
    """A ResNet without normalisation, initialised by FixUp (``standard_init``)."""

    def __init__(self, in_channels: int, widths: Sequence[int], blocks_per_stage: Sequence[int],
                 num_classes: int, strides: Sequence[int]) -> None:  # fmt: skip
        super().__init__()
        self.stem = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False)
        self.stem_bias = nn.Parameter(torch.zeros(1))
        self.relu = nn.ReLU()
        blocks, channels = [], widths[0]
        for width, count, stride in zip(widths, blocks_per_stage, strides, strict=True):
            for index in range(count):
                blocks.append(FixupBlock(channels, width, stride if index == 0 else 1))
                channels = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head_bias = nn.Parameter(torch.zeros(1))
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, num_classes)``."""
        out = self.relu(self.stem(inputs) + self.stem_bias)
        out = self.pool(self.blocks(out)).flatten(1)
        return self.classifier(out + self.head_bias)

    def standard_init(self, generator: torch.Generator) -> None:
        """FixUp's rule: He init (fan-out, as in FixUp's code) everywhere, the first conv of each of
        the L residual branches scaled by L^(-1/2) (two layers per branch: L^(-1/(2m-2)), m = 2),
        the second conv of each branch and the classifier zero, scalar biases 0 and scales 1."""
        branches = len(self.blocks)
        nn.init.kaiming_normal_(self.stem.weight, mode="fan_out", nonlinearity="relu",
                                generator=generator)  # fmt: skip
        for block in self.blocks:
            nn.init.kaiming_normal_(block.conv1.weight, mode="fan_out", nonlinearity="relu",
                                    generator=generator)  # fmt: skip
            with torch.no_grad():
                block.conv1.weight.mul_(branches**-0.5)
            nn.init.zeros_(block.conv2.weight)
            if block.shortcut is not None:
                nn.init.kaiming_normal_(block.shortcut.weight, mode="fan_out",
                                        nonlinearity="relu", generator=generator)  # fmt: skip
            for name in ("bias1a", "bias1b", "bias2a", "bias2b"):
                nn.init.zeros_(getattr(block, name))
            nn.init.ones_(block.scale)
        nn.init.zeros_(self.stem_bias)
        nn.init.zeros_(self.head_bias)
        nn.init.zeros_(self.classifier.weight)
        nn.init.zeros_(self.classifier.bias)


def _check_fixup_options(options: dict) -> None:
    check_sizes("widths", options["widths"])
    check_sizes("blocks_per_stage", options["blocks_per_stage"])
    check_same_length("widths", options["widths"], "blocks_per_stage", options["blocks_per_stage"])


def build_fixup_resnet(
    meta: dict, widths: Sequence[int] = (16, 32, 64), blocks_per_stage: Sequence[int] = (3, 3, 3)
) -> FixupResNet:
    """A FixUp ResNet for ``meta``'s images: stride 2 entering each later stage while the map is
    at least 4 pixels (so 8x8 inputs keep a 2x2 final map)."""
    _check_fixup_options({"widths": widths, "blocks_per_stage": blocks_per_stage})
    channels, height, width = image_shape(meta)
    strides = []
    for index in range(len(widths)):
        stride = 2 if index > 0 and min(height, width) >= 4 else 1
        strides.append(stride)
        if stride == 2:
            height, width = (height + 1) // 2, (width + 1) // 2
    return FixupResNet(channels, widths, blocks_per_stage, meta["num_classes"], strides)


# --- registration ------------------------------------------------------------------------------

_IMAGE = frozenset({"image"})
_RESNET_SIZES = {"widths": [16, 32, 64], "blocks_per_stage": [1, 1, 1]}

register_architecture(
    ArchSpec(
        name="resnet",
        builder=build_resnet,
        defaults={**_RESNET_SIZES, "batch_norm": False, "residual": True},
        input_kinds=_IMAGE,
        description="ResNet of basic blocks with shortcuts, no BatchNorm",
        check_options=_check_resnet_options,
    )
)
register_architecture(
    ArchSpec(
        name="resnet_bn",
        builder=build_resnet,
        defaults={**_RESNET_SIZES, "batch_norm": True, "residual": True},
        input_kinds=_IMAGE,
        description="ResNet of basic blocks with shortcuts and BatchNorm",
        check_options=_check_resnet_options,
    )
)
register_architecture(
    ArchSpec(
        name="resnet_plain",
        builder=build_resnet,
        defaults={**_RESNET_SIZES, "batch_norm": False, "residual": False},
        input_kinds=_IMAGE,
        description="the ResNet's layers without shortcuts or BatchNorm: a plain deep CNN",
        check_options=_check_resnet_options,
    )
)
register_architecture(
    ArchSpec(
        name="fixup_resnet",
        builder=build_fixup_resnet,
        defaults={"widths": [16, 32, 64], "blocks_per_stage": [3, 3, 3]},
        input_kinds=_IMAGE,
        description="FixUp ResNet: no normalisation, scalar biases and scales, FixUp's init",
        check_options=_check_fixup_options,
    )
)
# Deep enough without BN that plain Kaiming init struggles (GradInit appendix, VGG/ResNet w/o BN).
register_architecture(
    ArchSpec(
        name="resnet_deep",
        builder=build_resnet,
        defaults={
            "widths": [16, 32, 64],
            "blocks_per_stage": [3, 3, 3],
            "batch_norm": False,
            "residual": True,
        },  # fmt: skip
        input_kinds=_IMAGE,
        description="19-conv ResNet without BatchNorm (GradInit's no-BN ResNet, small images)",
        check_options=_check_resnet_options,
    )
)
