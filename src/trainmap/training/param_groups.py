"""The optimiser's parameter groups (``train.<task>.param_groups``): which parameters train with a
fraction of the learning rate or of the weight decay.

``single``
    one group of every parameter, each at the configured learning rate and weight decay.
``gradinit``
    the GradInit authors' groups (Zhu et al. 2021, "GradInit: Learning to Initialize Neural
    Networks for Stable and Efficient Training"; zhuchen03/gradinit ``train_cifar.py``, where the
    optimiser is built). A network with BatchNorm: BatchNorm's weights and biases without weight
    decay, everything else as configured. A network without: every bias (FixUp's scalar biases
    included) and FixUp's scalar multipliers (``scale``) at a tenth of the learning rate, with the
    configured weight decay, everything else as configured.
``repvgg``
    weight decay on the kernels of convolutions and fully-connected layers only (Ding et al. 2021,
    sec. 4.1: "weight decay of 10^-4 on the kernels of conv and fully-connected layers"): every
    other parameter (BatchNorm's, biases) without it.

The GradInit authors choose by names: the no-BN rule for an architecture named ``*nobn*``, ``*fixup*`` or a
``resnet`` run with ``--no_bn``, the parameters whose full names contain ``bias`` / ``scale``; the
BN rule otherwise, the parameters whose names contain ``norm`` or ``bn``. trainmap chooses by the
network's structure instead, so that a user's architecture gets the rule its layers call for
whatever it is named: the BN rule when the model has a BatchNorm module (any
``torch.nn.modules.batchnorm._BatchNorm``), and then exactly those modules' parameters skip weight
decay; the no-BN rule otherwise, where a parameter whose own name in its module (the last part of
its dotted name) contains ``bias`` or ``scale`` is a bias or a scale. On the authors' networks and
on trainmap's (``vgg_bn``, ``resnet_bn``, ``vgg_deep``, ``resnet_deep``, ``fixup_resnet``: BatchNorm
modules are ``bn*``, biases ``*.bias`` or FixUp's ``bias1a`` .. ``head_bias``, scales ``scale``)
both give the same groups (tests/unit/training/test_param_groups.py applies the authors' rule to
the names). They part where names and structure disagree: RepVGG's identity branch is a BatchNorm
named ``identity`` (no decay here, decayed by the authors' names), and a LayerNorm of a network
with BatchNorm keeps its decay here. The authors leave GradInit's own ``autoinit`` scales out of
the optimiser; trainmap's models have none. Momentum is as configured (the authors fix 0.9).

A group's factors multiply the configured (or the seed's own) learning rate and weight decay, so a
group at a tenth keeps its tenth under the schedule and in a per-seed sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

#: A tenth of the learning rate for the biases and scales of a network without BatchNorm (the
#: authors' ``args.base_lr / 10.``).
NO_BN_LR_FACTOR = 0.1


@dataclass(frozen=True)
class ParamGroup:
    """One class of parameters: ``names`` (``model.named_parameters()`` names, in that order) train
    with ``lr_factor`` times the learning rate and ``weight_decay_factor`` times the weight decay.
    """

    label: str
    names: tuple[str, ...]
    lr_factor: float = 1.0
    weight_decay_factor: float = 1.0


def single_group(model: nn.Module) -> list[ParamGroup]:
    """Every parameter in one group, at the configured settings."""
    return [ParamGroup("all", tuple(name for name, _ in model.named_parameters()))]


def gradinit_groups(model: nn.Module) -> list[ParamGroup]:
    """The GradInit authors' groups, chosen by the model's structure (see the module docstring), in
    the authors' order; a class without parameters gives no group."""
    names = [name for name, _ in model.named_parameters()]
    batch_norm = {id(parameter) for module in model.modules() if isinstance(module, _BatchNorm)
                  for parameter in module.parameters(recurse=False)}  # fmt: skip
    if batch_norm:
        normalised = {name for name, parameter in model.named_parameters()
                      if id(parameter) in batch_norm}  # fmt: skip
        groups = [
            ParamGroup("batch_norm", _kept(names, normalised), weight_decay_factor=0.0),
            ParamGroup("others", _kept(names, set(names) - normalised)),
        ]
    else:
        own = {name: name.rsplit(".", 1)[-1] for name in names}
        biases = {name for name in names if "bias" in own[name]}
        scales = {name for name in names if "scale" in own[name]} - biases
        groups = [
            ParamGroup("bias", _kept(names, biases), lr_factor=NO_BN_LR_FACTOR),
            ParamGroup("scale", _kept(names, scales), lr_factor=NO_BN_LR_FACTOR),
            ParamGroup("others", _kept(names, set(names) - biases - scales)),
        ]
    return [group for group in groups if group.names]


def kernel_groups(model: nn.Module) -> list[ParamGroup]:
    """RepVGG's groups: the weights of every ``nn.Conv*`` and ``nn.Linear`` decayed, every other
    parameter without weight decay (see the module docstring)."""
    names = [name for name, _ in model.named_parameters()]
    kernels = {id(module.weight) for module in model.modules()
               if isinstance(module, nn.Linear | nn.modules.conv._ConvNd)
               and isinstance(getattr(module, "weight", None), nn.Parameter)}  # fmt: skip
    decayed = {name for name, parameter in model.named_parameters() if id(parameter) in kernels}
    groups = [
        ParamGroup("no_decay", _kept(names, set(names) - decayed), weight_decay_factor=0.0),
        ParamGroup("kernels", _kept(names, decayed)),
    ]
    return [group for group in groups if group.names]


def _kept(names: list[str], chosen: set[str]) -> tuple[str, ...]:
    """The ``chosen`` names in the order of ``names``."""
    return tuple(name for name in names if name in chosen)


#: The rules by their config name (the schema's ``train.<task>.param_groups`` enum lists the same).
PARAM_GROUP_RULES: dict[str, Callable[[nn.Module], list[ParamGroup]]] = {
    "single": single_group,
    "gradinit": gradinit_groups,
    "repvgg": kernel_groups,
}


def parameter_groups(model: nn.Module, rule: str) -> list[ParamGroup]:
    """``model``'s parameters in the groups of ``rule`` (:data:`PARAM_GROUP_RULES`); together
    they hold every parameter once. ``model`` may be on the meta device (a block's template)."""
    if rule not in PARAM_GROUP_RULES:
        raise ValueError(f"unknown param_groups {rule!r}; allowed: {', '.join(PARAM_GROUP_RULES)}")
    return PARAM_GROUP_RULES[rule](model)
