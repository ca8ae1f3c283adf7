"""Building blocks that more than one convolutional family uses (VGG, ResNet): no registration here.

Kept apart from the families so that no family imports another's private helpers.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn


def conv3x3(in_channels: int, out_channels: int, batch_norm: bool, stride: int = 1) -> nn.Conv2d:
    """A padded 3x3 convolution, with a bias only when no BatchNorm follows it."""
    # BatchNorm's shift makes a conv bias redundant, so convs carry one only without BN.
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=not batch_norm)


def with_classifier_head(
    layers: OrderedDict[str, nn.Module], channels: int, num_classes: int
) -> nn.Sequential:
    """``layers`` then ``pool`` (global average), ``flatten`` and a Linear ``classifier``."""
    layers["pool"] = nn.AdaptiveAvgPool2d(1)
    layers["flatten"] = nn.Flatten(start_dim=1)
    layers["classifier"] = nn.Linear(channels, num_classes)
    return nn.Sequential(layers)
