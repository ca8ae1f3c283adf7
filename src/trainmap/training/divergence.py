"""What the training loop keeps of each seed besides its weights (:class:`SeedRecord`: history,
divergence, frozen state), and how a diverged seed stays frozen while the rest of its block trains:
its gradients zeroed, its state restored after each optimiser step."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trainmap.training.seed_block import SeedBlock


@dataclass
class SeedRecord:
    """What the loop keeps per seed besides its weights: history, divergence, frozen state."""

    history: list[dict[str, float]] = field(default_factory=list)
    diverged_step: int | None = None
    steps_done: int = 0
    frozen_state: dict[str, torch.Tensor] | None = None

    @property
    def active(self) -> bool:
        return self.diverged_step is None


def freeze(record: SeedRecord, block: SeedBlock, index: int, step: int) -> None:
    """A seed whose loss is not finite at ``step``: diverged at step + 1 (the step it would have
    taken), its state kept as it is now."""
    record.diverged_step, record.steps_done = step + 1, step
    # on the training device: restoring it after each step copies nothing from the host
    record.frozen_state = block.state_of(index, device=None)


def zero_frozen_grads(block: SeedBlock, active: torch.Tensor) -> None:
    """Zero the gradients of the seeds of ``block`` that are not ``active`` (``(S,)`` booleans on
    the training device)."""
    for parameter in block.parameters.values():
        if parameter.grad is not None:
            grad = block.seed_view(parameter.grad)
            grad.masked_fill_(~active.reshape(-1, *([1] * (grad.dim() - 1))), 0.0)


def restore_frozen(block: SeedBlock, records: list[SeedRecord]) -> None:
    """Frozen seeds keep their state: undo what the optimiser step and the forward pass (BN running
    statistics) did to them."""
    for index, record in enumerate(records):
        if record.frozen_state is not None:
            block.set_seed_state(index, record.frozen_state)
