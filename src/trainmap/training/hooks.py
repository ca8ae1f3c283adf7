"""What a method adds to the training loop: :class:`TrainHooks`, called from the places marked
``# hook:`` in :func:`trainmap.training.loop.train_block` (the plain loop is its defaults, which do
nothing), and the types of the loop's per-checkpoint callbacks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainmap.training.checkpoints import save_dense
from trainmap.training.seed_block import SeedBlock

CheckpointHook = Callable[[dict[str, float], int], None]  # (metrics, step) of one run
BlockCheckpointHook = Callable[[int, dict[str, float], int], None]  # (seed index, metrics, step)


class TrainHooks:
    """What a method adds to the training loop; every default does nothing.

    ``train_block`` calls :meth:`attach` with the block before the first step; then, per step:
    :meth:`extra_loss` after the forward pass (its per-seed values are added to the task loss before
    ``backward``), :meth:`after_backward` after ``backward`` and gradient clipping, before the
    optimiser step (gradients may be edited here), :meth:`after_step` after the optimiser step.
    Tensors are the block's, seed dimension first (``block.tensor(name)``, ``.grad``). The history's
    ``train_loss`` is the task loss alone. ``step`` is the number of optimiser steps taken before the
    current one (0 for the first), so a schedule reads it as "t". :meth:`snapshot` decides what a
    checkpoint records (its metrics and archive). Everything a hook keeps across steps goes in
    :meth:`state_dict`, so resume stays bit-identical. :meth:`for_seed` gives one seed's hooks when a block's model
    cannot be vectorised and its seeds train one at a time.
    """

    block: SeedBlock

    def attach(self, block: SeedBlock) -> None:
        """Remember the block the loop trains (called once, before the first step)."""
        self.block = block

    @property
    def adds_loss(self) -> bool:
        """Whether :meth:`extra_loss` is overridden (the loop then calls it every step)."""
        return type(self).extra_loss is not TrainHooks.extra_loss

    def extra_loss(
        self, logits: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor | None:
        """Per-seed terms ``(S,)`` added to the task loss (e.g. distillation), or None."""
        return None

    def after_backward(self, step: int) -> None:
        """Edit gradients before the optimiser uses them (e.g. SR-STE decay)."""

    def after_step(self, step: int) -> None:
        """React to an optimiser step (e.g. refresh N:M masks every k steps)."""

    def snapshot(self, block: SeedBlock) -> dict[str, torch.Tensor]:
        """What a checkpoint records, seed dimension first, on the training device (default: the
        state dict; read at once, so the block's own tensors, not copies)."""
        return {name: value.detach() for name, value in block.state().items()}

    def save_model(self, model: nn.Module, path: Path, model_info: dict[str, Any]) -> None:
        """Write one seed's final model file (default: the ``dense`` checkpoint format)."""
        save_dense(model, path, **model_info)

    def state_dict(self) -> dict[str, Any]:
        """The hooks' own state, saved with the resume file."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` when a run resumes."""

    def for_seed(self, index: int) -> TrainHooks | None:
        """The hooks of seed ``index`` trained on its own, when the block's model cannot be
        vectorised and its seeds train one at a time; None: these hooks hold per-seed state of
        the whole block (a subclass, unless it overrides this), so such a block is refused. The
        plain hooks hold nothing."""
        return TrainHooks() if type(self) is TrainHooks else None
