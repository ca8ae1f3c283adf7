"""The loss and accuracy the training loop records: every seed's on the test set at a checkpoint
(:func:`evaluate_block`, in batches of :data:`EVAL_BATCH`), and its training batches' means since
the previous checkpoint (:class:`RunningMeans`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainmap.training.seed_block import SeedBlock

EVAL_BATCH = 4096


@torch.no_grad()
def evaluate_split(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    prepare: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on ``(x, y)`` in eval mode; ``prepare``: what
    each batch of ``x`` goes through first (normalisation: ``trainmap.training.augment``)."""
    was_training = model.training
    model.eval()
    loss_sum, correct = 0.0, 0
    for start in range(0, len(x), EVAL_BATCH):
        inputs = x[start : start + EVAL_BATCH]
        logits = model(inputs if prepare is None else prepare(inputs))
        target = y[start : start + EVAL_BATCH]
        loss_sum += F.cross_entropy(logits, target, reduction="sum").item()
        correct += (logits.argmax(dim=1) == target).sum().item()
    model.train(was_training)
    return loss_sum / len(x), correct / len(x)


@torch.no_grad()
def evaluate_block(
    block: SeedBlock,
    x: torch.Tensor,
    y: torch.Tensor,
    prepare: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[list[float], list[float]]:
    """Every seed's mean cross-entropy and accuracy on ``(x, y)``, in eval mode; ``prepare``: what
    each batch of ``x`` goes through first."""
    was_training = block.training
    block.eval()
    loss_sum = torch.zeros(block.size, dtype=torch.float64, device=x.device)
    correct = torch.zeros(block.size, dtype=torch.long, device=x.device)
    for start in range(0, len(x), EVAL_BATCH):
        inputs = x[start : start + EVAL_BATCH]
        logits = block.forward_shared(inputs if prepare is None else prepare(inputs))
        target = y[start : start + EVAL_BATCH]
        flat = logits.reshape(-1, logits.shape[-1])
        losses = F.cross_entropy(flat, target.repeat(block.size), reduction="none")
        loss_sum += losses.reshape(block.size, -1).sum(dim=1).double()
        correct += (logits.argmax(dim=-1) == target).sum(dim=1)
    block.train(was_training)
    return (loss_sum / len(x)).tolist(), (correct.double() / len(x)).tolist()


@dataclass
class RunningMeans:
    """Each seed's training loss/accuracy summed over the steps since the last checkpoint.

    Each step only appends its (detached) per-seed losses, logits and targets, on the training
    device; they are scored when the means are read or the state is saved, one step after another
    (so a resume that splits a checkpoint interval adds the same numbers in the same order), with
    one argmax per step batch and one copy to the host for all the steps since the last scoring,
    instead of several small tensor ops and a device round-trip per step.
    """

    size: int
    loss_sum: list[float] = field(default_factory=list)
    correct: list[int] = field(default_factory=list)
    seen: list[int] = field(default_factory=list)
    pending: list[tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=list
    )

    def __post_init__(self) -> None:
        self.loss_sum = self.loss_sum or [0.0] * self.size
        self.correct = self.correct or [0] * self.size
        self.seen = self.seen or [0] * self.size

    def add(self, active: list[int], losses: torch.Tensor, logits: torch.Tensor,
            targets: torch.Tensor) -> None:  # fmt: skip
        """Record one step of the ``active`` seeds: their mean losses (``(S,)``, or a block of
        one's scalar) and predictions."""
        self.pending.append((active, losses.detach().reshape(-1), logits.detach(), targets))

    def score_pending(self) -> None:
        """Add the losses and correct predictions of the steps since the last call, in step order."""
        if not self.pending:
            return
        steps = len(self.pending)
        # (steps, S, B, ...) for any block; a block of one records (B, ...) tensors. Predictions
        # are stacked, not logits (a transformer's would be vocabulary-times larger).
        predicted = torch.stack([logits.argmax(dim=-1) for _, _, logits, _ in self.pending])
        targets = torch.stack([targets for _, _, _, targets in self.pending])
        correct = predicted.reshape(steps, self.size, -1) == targets.reshape(steps, self.size, -1)
        hits = correct.sum(dim=2).tolist()
        losses = torch.stack([losses for _, losses, _, _ in self.pending]).tolist()
        size = self.pending[0][3].numel() // self.size  # examples per seed and step
        for row, (active, _, _, _) in enumerate(self.pending):  # sequential, as steps came
            for index in active:
                self.loss_sum[index] += losses[row][index] * size  # float64, as Python floats are
                self.correct[index] += hits[row][index]
                self.seen[index] += size
        self.pending = []

    def pop(self, index: int) -> tuple[float, float]:
        """Seed ``index``'s mean loss and accuracy so far, then reset its sums."""
        self.score_pending()
        if self.seen[index] == 0:
            return math.nan, math.nan
        means = (self.loss_sum[index] / self.seen[index], self.correct[index] / self.seen[index])
        self.loss_sum[index], self.correct[index], self.seen[index] = 0.0, 0, 0
        return means

    def state_dict(self) -> dict[str, Any]:
        """The sums (pending predictions scored first), for a resume file."""
        self.score_pending()
        return {"size": self.size, "loss_sum": list(self.loss_sum),
                "correct": list(self.correct), "seen": list(self.seen)}  # fmt: skip
