"""The method registry: what a grid cell's ``method`` does to its model.

A method names how a network is initialised and which extra stages (GradInit, re-parameterisation,
sparse retraining, quantisation) a grid cell passes through. The foundation registers the baseline:

``kaiming``
    He et al. (2015), "Delving deep into rectifiers", eq. (10): every Conv and Linear weight is drawn
    from N(0, 2 / fan_in) (``kaiming_normal_``, fan-in mode, ReLU gain), biases are zero, normalisation
    layers start at gamma = 1, beta = 0, embeddings keep their N(0, 1) default. Zero biases matter
    later: GradInit skips tensors of zero norm (NOTES.md, GradInit).

Methods are looked up by name, so later work registers more with :func:`register_method`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class MethodSpec:
    """A grid method: its initialiser and the workflow stages it adds after ``train``."""

    name: str
    description: str
    initialise: Callable[[nn.Module, torch.Generator], None]
    stages: tuple[str, ...] = field(default=())


METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    """Add a method to the registry (a name may be registered once)."""
    if spec.name in METHODS:
        raise ValueError(f"method {spec.name!r} is already registered")
    METHODS[spec.name] = spec
    return spec


def method_names() -> list[str]:
    """The registered method names, sorted."""
    return sorted(METHODS)


def check_method(name: str) -> MethodSpec:
    """Return the method called ``name`` or raise a ValueError naming the allowed ones."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; allowed: {', '.join(method_names())}")
    return METHODS[name]


def kaiming_init(model: nn.Module, generator: torch.Generator) -> None:
    """He-normal (fan-in, ReLU gain) weights and zero biases for every Conv/Linear layer."""
    for module in model.modules():
        if isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d | nn.Linear):
            nn.init.kaiming_normal_(
                module.weight, mode="fan_in", nonlinearity="relu", generator=generator
            )
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d | nn.LayerNorm | nn.GroupNorm):
            if module.weight is not None:
                nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


register_method(
    MethodSpec(
        name="kaiming",
        description="He-normal init of every Conv/Linear weight, zero biases (the baseline)",
        initialise=kaiming_init,
    )
)
