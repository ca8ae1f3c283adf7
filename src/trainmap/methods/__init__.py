"""The method registry: what a grid cell's ``method`` does to its model.

A method names how a network is initialised and which extra workflow stages a grid cell passes
through besides ``train`` and ``evaluate``:

``kaiming`` (the baseline, no extra stage)
    He et al. (2015), "Delving deep into rectifiers", eq. (10): every Conv and Linear weight is drawn
    from N(0, 2 / fan_in) (``kaiming_normal_``, fan-in mode, ReLU gain), biases are zero, normalisation
    layers start at gamma = 1, beta = 0, embeddings keep their N(0, 1) default. Zero biases matter
    later: GradInit skips tensors of zero norm (the authors' code). An architecture with an
    initialisation of its own (FixUp) defines ``standard_init(generator)``, which ``kaiming`` calls.
``gradinit`` / ``metainit`` (stage ``gradinit``, ``trainmap.methods.gradinit``)
    Kaiming init of every layer (non-zero, as GradInit's appendix does for FixUp networks too),
    then one learned scale per parameter tensor: GradInit's objective (Algorithm 1) or MetaInit's
    gradient quotient (appendix D). ``train`` starts from the rescaled model.
``ast``, ``ast_slorb``, ``ast_static``, ``oneshot``, ``oneshot_ft``, ``wanda`` (stage ``sparse``)
    N:M sparsity from the dense model that the ``kaiming`` cell of the same task, architecture and
    seed trained (``trainmap.methods.sparse``): AST's annealed SR-STE retraining with distillation (+ SLoRB),
    the static-lambda SR-STE comparison, and the one-shot baselines (magnitude, magnitude with
    frozen-mask fine-tuning, Wanda). The cell's trajectory is its sparse retraining.

``options`` are the fixed settings that tell methods sharing a stage apart; the stage's
hyperparameters per task live in ``params.yaml`` (``gradinit.<task>``, ``sparse.<task>``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainmap.registry import Registry, caller_module

STAGES = ("gradinit", "sparse")
#: The method whose trained dense model a sparse method retrains (its teacher).
DENSE_BASE_METHOD = "kaiming"


@dataclass(frozen=True)
class MethodSpec:
    """A grid method: its initialiser, the stages it adds and the fixed options of those stages."""

    name: str
    description: str
    initialise: Callable[[nn.Module, torch.Generator], None]
    stages: tuple[str, ...] = field(default=())
    options: dict[str, Any] = field(default_factory=dict)

    def has_stage(self, stage: str) -> bool:
        """Whether cells of this method pass through ``stage`` (``gradinit`` or ``sparse``)."""
        return stage in self.stages


#: The registered methods by name, each with the module that registered it.
METHODS: Registry[MethodSpec] = Registry("method")


def register_method(spec: MethodSpec) -> MethodSpec:
    """Add a method to the registry (a name may be registered once: a second registration, e.g. a
    plugin reusing a built-in name, is an error naming both modules)."""
    unknown = sorted(set(spec.stages) - set(STAGES))
    if unknown:
        raise ValueError(f"method {spec.name!r} names unknown stages {unknown}; known: {STAGES}")
    return METHODS.register(spec.name, spec, caller_module())


def method_names() -> list[str]:
    """The registered method names, sorted."""
    return METHODS.names()


def check_method(name: str) -> MethodSpec:
    """Return the method called ``name`` or raise a ValueError naming the allowed ones."""
    return METHODS.lookup(name)


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


def standard_init(model: nn.Module, generator: torch.Generator) -> None:
    """The architecture's own initialisation where it has one (FixUp), else :func:`kaiming_init`."""
    own = getattr(model, "standard_init", None)
    if callable(own):
        own(generator)
    else:
        kaiming_init(model, generator)


register_method(
    MethodSpec(
        name="kaiming",
        description="He-normal init of every Conv/Linear weight, zero biases (the baseline)",
        initialise=standard_init,
    )
)
for _objective, _description in (
    ("gradinit", "GradInit: learned per-tensor scales of the Kaiming init (Algorithm 1)"),
    ("metainit", "MetaInit: per-tensor scales minimising the gradient quotient (appendix D)"),
):
    register_method(
        MethodSpec(
            name=_objective,
            description=_description,
            initialise=kaiming_init,
            stages=("gradinit",),
            options={"objective": _objective},
        )
    )
_AST = {"mask": "magnitude", "retrain": True, "frozen_mask": False, "decay": "annealed",
        "distill": True, "slorb": False}  # fmt: skip
for _name, _options, _description in (
    ("ast", {}, "AST: N:M retraining with annealed SR-STE and distillation (AST-Naive)"),
    ("ast_slorb", {"slorb": True}, "AST with SLoRB low-rank boosting (AST-Boosted)"),
    ("ast_static", {"decay": "static"}, "N:M retraining with static-lambda SR-STE + distillation"),
    ("oneshot", {"retrain": False}, "one-shot N:M magnitude pruning, no retraining"),
    ("oneshot_ft", {"frozen_mask": True, "decay": "none", "distill": False},
     "one-shot N:M magnitude pruning, then fine-tuning with the mask frozen"),
    ("wanda", {"mask": "wanda", "retrain": False},
     "one-shot N:M pruning by Wanda scores |W| * ||x||, no retraining"),
):  # fmt: skip
    register_method(
        MethodSpec(
            name=_name,
            description=_description,
            initialise=kaiming_init,
            stages=("sparse",),
            options={**_AST, **_options},
        )
    )
