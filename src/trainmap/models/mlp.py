"""The ``mlp`` family: flatten, then Linear + ReLU layers of widths ``hidden``, then a Linear readout."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from trainmap.models.registry import ArchSpec, check_sizes, register_architecture


class MLP(nn.Module):
    """Flatten, ``Linear + ReLU`` per hidden width, a Linear readout; in order in ``layers``."""

    def __init__(self, in_features: int, hidden: Sequence[int], num_classes: int) -> None:
        super().__init__()
        modules: list[nn.Module] = [nn.Flatten(start_dim=1)]
        width = in_features
        for hidden_width in hidden:
            modules += [nn.Linear(width, hidden_width), nn.ReLU()]
            width = hidden_width
        modules.append(nn.Linear(width, num_classes))
        self.layers = nn.Sequential(*modules)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, num_classes)`` for inputs ``(batch, *input_shape)``."""
        return self.layers(inputs)


def build_mlp(meta: dict, hidden: Sequence[int] = (128,)) -> MLP:
    """An MLP over the flattened example (vectors, or images read pixel by pixel)."""
    check_sizes("hidden", hidden, allow_empty=True)
    return MLP(math.prod(meta["input_shape"]), hidden, meta["num_classes"])


def _check_mlp_options(options: dict) -> None:
    check_sizes("hidden", options["hidden"], allow_empty=True)


register_architecture(
    ArchSpec(
        name="mlp",
        builder=build_mlp,
        defaults={"hidden": [128]},
        input_kinds=frozenset({"vector", "image"}),
        description="flatten, Linear + ReLU per hidden width, Linear readout",
        check_options=_check_mlp_options,
    )
)
