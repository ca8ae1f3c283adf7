"""The pieces of one optimiser step, each seed as alone: its batch order (:class:`BatchSampler`),
the optimiser and learning-rate schedule, each seed's cross-entropy and its gradient clipping."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from trainmap.training.config import TrainConfig
from trainmap.training.seed_block import SeedBlock


@dataclass
class BatchSampler:
    """Seeded epoch-wise shuffling with drop-last batches; its state is saved for resume."""

    n_examples: int
    batch_size: int
    generator: torch.Generator
    order: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    position: int = 0

    @property
    def batch(self) -> int:
        """Examples per batch (the whole set when it is smaller than ``batch_size``)."""
        return min(self.batch_size, self.n_examples)

    def new_epoch(self) -> torch.Tensor:
        """Draw the next epoch's order from the generator and start at its beginning."""
        self.order = torch.randperm(self.n_examples, generator=self.generator)
        self.position = 0
        return self.order

    def next_indices(self) -> torch.Tensor:
        """Indices of the next batch; reshuffles when the epoch is used up."""
        if self.position + self.batch > len(self.order):  # the epoch is used up
            self.new_epoch()
        start = self.position
        self.position = start + self.batch
        return self.order[start : self.position]

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the same batch sequence."""
        return {
            "order": self.order,
            "position": self.position,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a saved batch sequence."""
        self.order = state["order"]
        self.position = state["position"]
        self.generator.set_state(state["generator"])


class BlockBatches:
    """A block's batch indices, each seed's from its own :class:`BatchSampler` (so each seed sees
    the batches it sees alone). The seeds' samplers move in step (same data, same batch size), so
    an epoch's orders are drawn together, stacked and copied to ``device`` once; each step's
    indices are then a slice on the device, ``(S, B)`` for a block (``(B,)`` for a block of one),
    with no host-to-device copy per step. State: the samplers' own, for the resume file."""

    def __init__(self, samplers: Sequence[BatchSampler], device: torch.device) -> None:
        self.samplers = list(samplers)
        self.device = device
        self.position = self.samplers[0].position  # every sampler's, kept here while stepping
        self.orders = self._stacked()

    def _stacked(self) -> torch.Tensor:
        orders = torch.stack([sampler.order for sampler in self.samplers])
        if self.device.type == "cuda":  # one pinned, asynchronous copy per epoch
            return orders.pin_memory().to(self.device, non_blocking=True)
        return orders.to(self.device)

    def next_indices(self) -> torch.Tensor:
        """Every seed's indices of the next batch."""
        lead = self.samplers[0]
        if self.position + lead.batch > self.orders.shape[1]:  # the epoch is used up
            for sampler in self.samplers:
                sampler.new_epoch()
            self.orders, self.position = self._stacked(), 0
        start = self.position
        self.position = start + lead.batch
        if len(self.samplers) == 1:
            return self.orders[0, start : self.position]
        return self.orders[:, start : self.position]

    def state_dict(self) -> list[dict[str, Any]]:
        """Each seed's sampler state."""
        for sampler in self.samplers:
            sampler.position = self.position
        return [sampler.state_dict() for sampler in self.samplers]

    def load_state_dict(self, states: Sequence[dict[str, Any]]) -> None:
        """Continue the saved batch sequences."""
        for sampler, state in zip(self.samplers, states, strict=True):
            sampler.load_state_dict(state)
        self.position = self.samplers[0].position
        self.orders = self._stacked()


def make_optimizer(
    params: Iterable[torch.Tensor], cfg: TrainConfig, device: torch.device | None = None
) -> torch.optim.Optimizer:
    """SGD (with momentum), Adam or AdamW as configured; on a CUDA ``device`` torch's fused kernel
    (one launch for every tensor). Their updates are elementwise, so on a block's stacked tensors
    each seed is updated exactly as alone."""
    params = list(params)
    fused = {"fused": True} if device is not None and device.type == "cuda" else {}
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, **fused
        )
    if cfg.optimizer == "adam":
        return torch.optim.Adam(
            params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, **fused
        )
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(
            params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, **fused
        )
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}; allowed: sgd, adam, adamw")


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then constant or cosine decay to zero at ``steps``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "cosine":
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def seed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each seed's mean cross-entropy: ``(S, B, C)`` logits and ``(S, B)`` targets give ``(S,)``."""
    classes = logits.shape[-1]
    losses = F.cross_entropy(logits.reshape(-1, classes), targets.reshape(-1), reduction="none")
    return losses.reshape(targets.shape).mean(dim=1)


@torch.no_grad()
def clip_seed_grad_norms(block: SeedBlock, max_norm: float) -> torch.Tensor:
    """``clip_grad_norm_`` per seed: scale each seed's gradients by min(1, max_norm / (||g_s|| +
    1e-6)), ||g_s|| the L2 norm over all of that seed's parameters (as the paper's no-BN runs clip
    each run's own norm). Returns the per-seed norms before clipping."""
    grads = [block.seed_view(p.grad) for p in block.parameters.values() if p.grad is not None]
    if not grads:
        return torch.zeros(block.size)
    squares = torch.stack([g.reshape(block.size, -1).pow(2).sum(dim=1) for g in grads])
    norms = squares.sum(dim=0).sqrt()
    coefficients = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for grad in grads:
        grad.mul_(coefficients.reshape(-1, *([1] * (grad.dim() - 1))).to(grad.dtype))
    return norms
