"""Models: the architecture registry (:mod:`trainmap.models.registry`) and the built-in families.

An architecture is looked up by name and sized from a data set's metadata:
``build_model(arch, meta, **options)`` (see :mod:`trainmap.models.registry` for the builder
contract). One module per family, each registering its architectures with
:func:`register_architecture` calls at module level (variants of a family differ only in their
default switches):

:mod:`~trainmap.models.mlp`
    ``mlp``: flatten, Linear + ReLU layers of widths ``hidden``, a Linear readout.
:mod:`~trainmap.models.transformer`
    ``transformer`` / ``transformer_ln``: the one-layer transformer of Nanda et al. (2023), with
    :class:`MultiHeadAttention`; ``transformer_ln`` adds pre-LayerNorms.
:mod:`~trainmap.models.vgg`
    ``vgg`` / ``vgg_bn`` (Simonyan & Zisserman 2015) and ``vgg_deep`` (GradInit's no-BN VGG).
:mod:`~trainmap.models.resnet`
    ``resnet`` / ``resnet_bn`` / ``resnet_plain`` (He et al. 2016), ``resnet_deep`` and
    ``fixup_resnet`` (GradInit's no-BN networks; FixUp's ResNet with its own init).
:mod:`~trainmap.models.repvgg`
    ``repvgg`` and its ablations ``repvgg_idonly``, ``repvgg_1x1only``, ``repvgg_plain``, and
    ``repvgg_a0`` .. ``repvgg_b3g4`` (Ding et al. 2021); the RepVGG block owns its fusion.
:mod:`~trainmap.models.torchvision_resnet`
    ``resnet18`` / ``resnet50``: torchvision's ResNets (RGB images, no pretrained weights; needs
    the ``workflow`` extra), with the training-maps authors' CIFAR stem as ``cifar_stem``.

The imports of the family modules below are the one place where the built-in families register,
exactly as a user's family registers: a module that calls :func:`register_architecture` for each
architecture, imported once. A new family is a new module here plus one line in that list.
"""

from __future__ import annotations

# The built-in families: importing each runs its register_architecture calls.
from trainmap.models import mlp, repvgg, resnet, torchvision_resnet, transformer, vgg  # noqa: F401
from trainmap.models.registry import (
    ARCHITECTURES,
    INPUT_KINDS,
    ArchSpec,
    arch_names,
    build_model,
    check_arch,
    check_flag,
    check_positive,
    check_same_length,
    check_sizes,
    count_parameters,
    eval_forward_with_hooks,
    image_shape,
    register_architecture,
)
from trainmap.models.resnet import BasicBlock, FixupBlock, FixupResNet
from trainmap.models.transformer import MultiHeadAttention, Transformer

__all__ = [
    "ARCHITECTURES",
    "INPUT_KINDS",
    "ArchSpec",
    "BasicBlock",
    "FixupBlock",
    "FixupResNet",
    "MultiHeadAttention",
    "Transformer",
    "arch_names",
    "build_model",
    "check_arch",
    "check_flag",
    "check_positive",
    "check_same_length",
    "check_sizes",
    "count_parameters",
    "eval_forward_with_hooks",
    "image_shape",
    "register_architecture",
]
