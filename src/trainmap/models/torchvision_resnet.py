"""The ``torchvision_resnet`` family: torchvision's ``resnet18`` and ``resnet50``.

He et al. (2016), as torchvision builds them (``torchvision.models.resnet18`` / ``resnet50``,
``weights=None``: randomly initialised, nothing downloaded): a 7x7 stride-2 conv stem and a 3x3
stride-2 max-pool, four stages of basic (``resnet18``) or bottleneck (``resnet50``) blocks, global
average pooling and a Linear ``fc`` readout of ``meta["num_classes"]`` logits. The module names are
torchvision's (``conv1``, ``layer2.0.downsample.0``, ``fc``), as the training-maps authors' metric
walker reads them.

``cifar_stem`` swaps the ImageNet stem for the one the training-maps authors train CIFAR-100 with
(michahu/modeling-training, ``scripts/00_training/computer_vision.py``, the ``resnet18`` branch,
applied there to ``MyResNet``: torchvision's ``ResNet`` with switches that drop BatchNorm or the
shortcuts, both on for the usual ResNet-18): ``conv1`` becomes a 3x3 stride-1 padding-1 conv
without bias (64 channels) and ``maxpool`` an ``nn.Identity``, so a 32x32 image keeps its
resolution into ``layer1``. As there, ``conv1`` is replaced after torchvision built (and
initialised) the model, so it carries PyTorch's default Conv2d init, not torchvision's Kaiming
fan-out init.

torchvision is an optional dependency (the ``workflow`` extra): registering these architectures
needs only torch, and the builder imports torchvision when a model is built.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

from torch import nn

from trainmap.models.registry import ArchSpec, check_flag, image_shape, register_architecture

#: The channels torchvision's ResNets take: RGB images.
IMAGE_CHANNELS = 3
#: The width of torchvision's stem (the channels ``layer1`` takes).
STEM_WIDTH = 64
INSTALL = "pip install 'trainmap[workflow]'"


def _import_torchvision_models(arch: str) -> ModuleType:
    """``torchvision.models``, or an ImportError naming ``arch`` and the install that adds it."""
    try:
        return importlib.import_module("torchvision.models")
    except ImportError as error:
        raise ImportError(f"architecture {arch!r} needs torchvision: {INSTALL}") from error


def _check_rgb(arch: str, meta: dict) -> None:
    """Raise unless ``meta`` describes 3-channel images (torchvision's stem takes RGB)."""
    channels, _, _ = image_shape(meta)
    if channels != IMAGE_CHANNELS:
        raise ValueError(
            f"architecture {arch!r} takes {IMAGE_CHANNELS}-channel (RGB) images, but the data's "
            f"input_shape is {list(meta['input_shape'])} ({channels} channel(s)); train it on RGB "
            "data (e.g. cifar10), or pick an architecture that takes any channel count "
            "(resnet_bn, vgg_bn)"
        )


def _check_torchvision_resnet_options(options: dict) -> None:
    check_flag("cifar_stem", options["cifar_stem"])
    check_flag("zero_init_residual", options["zero_init_residual"])


def _torchvision_resnet_builder(arch: str) -> Callable[..., nn.Module]:
    """The registered builder of torchvision's ``arch`` (``resnet18`` or ``resnet50``)."""

    def build(meta: dict, cifar_stem: bool = False, zero_init_residual: bool = False) -> nn.Module:
        """torchvision's ``arch`` for ``meta``'s RGB images, ``meta["num_classes"]`` logits, no
        pretrained weights; ``cifar_stem``: the authors' 3x3 stride-1 stem without max-pool;
        ``zero_init_residual``: torchvision's switch zeroing each block's last BatchNorm weight.
        Draws from torch's global RNG (the caller seeds)."""
        _check_torchvision_resnet_options(
            {"cifar_stem": cifar_stem, "zero_init_residual": zero_init_residual}
        )
        _check_rgb(arch, meta)
        models = _import_torchvision_models(arch)
        model = getattr(models, arch)(
            weights=None, num_classes=meta["num_classes"], zero_init_residual=zero_init_residual
        )
        if cifar_stem:
            # michahu/modeling-training, scripts/00_training/computer_vision.py (CIFAR ResNets).
            model.conv1 = nn.Conv2d(IMAGE_CHANNELS, STEM_WIDTH, kernel_size=(3, 3), stride=(1, 1),
                                    padding=(1, 1), bias=False)  # fmt: skip
            model.maxpool = nn.Identity()
        return model

    build.__name__ = build.__qualname__ = f"build_{arch}"
    return build


build_resnet18 = _torchvision_resnet_builder("resnet18")
build_resnet50 = _torchvision_resnet_builder("resnet50")


# --- registration ------------------------------------------------------------------------------

_DEFAULTS = {"cifar_stem": False, "zero_init_residual": False}

register_architecture(
    ArchSpec(
        name="resnet18",
        builder=build_resnet18,
        defaults=dict(_DEFAULTS),
        input_kinds=frozenset({"image"}),
        description="torchvision's ResNet-18 (RGB images; cifar_stem: 3x3 stem, no max-pool)",
        check_options=_check_torchvision_resnet_options,
    )
)
register_architecture(
    ArchSpec(
        name="resnet50",
        builder=build_resnet50,
        defaults=dict(_DEFAULTS),
        input_kinds=frozenset({"image"}),
        description="torchvision's ResNet-50 (RGB images; cifar_stem: 3x3 stem, no max-pool)",
        check_options=_check_torchvision_resnet_options,
    )
)
