"""The pieces of one optimiser step, each seed as alone: its batch order (:class:`BatchSampler`),
the optimiser and learning-rate schedule, each seed's cross-entropy and its gradient clipping."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainmap.training.augment import Augmentation
from trainmap.training.config import TrainConfig
from trainmap.training.param_groups import ParamGroup, parameter_groups
from trainmap.training.seed_block import SeedBlock


@dataclass
class BatchSampler:
    """Seeded epoch-wise shuffling with drop-last batches; its state is saved for resume.

    With an ``augment`` recipe each epoch also draws every position's augmentation
    (:meth:`~trainmap.training.augment.Augmentation.draw_epoch`, images of ``shape``) from
    ``augment_generator``, after the order (which is then the order drawn without augmentation)."""

    n_examples: int
    batch_size: int
    generator: torch.Generator
    order: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    position: int = 0
    augment: Augmentation | None = None
    augment_generator: torch.Generator | None = None
    shape: tuple[int, ...] = ()
    draws: torch.Tensor | None = None

    @property
    def batch(self) -> int:
        """Examples per batch (the whole set when it is smaller than ``batch_size``)."""
        return min(self.batch_size, self.n_examples)

    def new_epoch(self) -> torch.Tensor:
        """Draw the next epoch's order (and augmentation) and start at its beginning."""
        self.order = torch.randperm(self.n_examples, generator=self.generator)
        if self.augment is not None and self.augment_generator is not None:
            self.draws = self.augment.draw_epoch(self.n_examples, self.batch, self.shape,
                                                 self.augment_generator)  # fmt: skip
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
        state = {
            "order": self.order,
            "position": self.position,
            "generator": self.generator.get_state(),
        }
        if self.augment_generator is not None:
            state["draws"] = self.draws
            state["augment_generator"] = self.augment_generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a saved batch sequence."""
        self.order = state["order"]
        self.position = state["position"]
        self.generator.set_state(state["generator"])
        if self.augment_generator is not None:
            self.draws = state["draws"]
            self.augment_generator.set_state(state["augment_generator"])


class BlockBatches:
    """A block's batch indices, each seed's from its own :class:`BatchSampler` (so each seed sees
    the batches it sees alone). The seeds' samplers move in step (same data, same batch size), so
    an epoch's orders (and augmentation draws) are drawn together, stacked and copied to ``device``
    once; each step's indices are then a slice on the device, ``(S, B)`` for a block (``(B,)`` for
    a block of one), with no host-to-device copy per step, and :attr:`draws` the batch's draws
    (``(S, B, K)`` or ``(B, K)``; None without augmentation). State: the samplers' own, for the
    resume file."""

    def __init__(self, samplers: Sequence[BatchSampler], device: torch.device) -> None:
        self.samplers = list(samplers)
        self.device = device
        self.position = self.samplers[0].position  # every sampler's, kept here while stepping
        self.orders, self.epoch_draws = self._stacked()
        self.draws: torch.Tensor | None = None

    def _stacked(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        orders = torch.stack([sampler.order for sampler in self.samplers])
        draws = None
        if self.samplers[0].draws is not None:
            draws = torch.stack([sampler.draws for sampler in self.samplers])
        if self.device.type == "cuda":  # one pinned, asynchronous copy per epoch
            return (orders.pin_memory().to(self.device, non_blocking=True),
                    None if draws is None else draws.pin_memory().to(self.device,
                                                                      non_blocking=True))  # fmt: skip
        return orders.to(self.device), None if draws is None else draws.to(self.device)

    def next_indices(self) -> torch.Tensor:
        """Every seed's indices of the next batch (their draws in :attr:`draws`)."""
        lead = self.samplers[0]
        if self.position + lead.batch > self.orders.shape[1]:  # the epoch is used up
            for sampler in self.samplers:
                sampler.new_epoch()
            (self.orders, self.epoch_draws), self.position = self._stacked(), 0
        start = self.position
        self.position = start + lead.batch
        if self.epoch_draws is not None:
            draws = self.epoch_draws[:, start : self.position]
            self.draws = draws[0] if len(self.samplers) == 1 else draws
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
        self.orders, self.epoch_draws = self._stacked()


def make_optimizer(
    model: nn.Module,
    cfg: TrainConfig,
    device: torch.device | None = None,
    params: Mapping[str, torch.Tensor] | None = None,
) -> torch.optim.Optimizer:
    """SGD (with momentum), Adam or AdamW as configured, over ``model``'s parameters, or over
    ``params`` when given (tensors by ``model``'s parameter names: a block's stacked tensors); on a
    CUDA ``device`` torch's fused kernel (one launch for every tensor). Its param groups are the
    classes of ``cfg.param_groups`` by ``model``'s structure
    (:func:`~trainmap.training.param_groups.parameter_groups`), each at its factors times ``cfg``'s
    learning rate and weight decay; ``single`` is one plain group of every parameter. The updates
    are elementwise, so on a block's stacked tensors each seed is updated exactly as alone."""
    params = dict(model.named_parameters()) if params is None else params
    groups = []
    for group in parameter_groups(model, cfg.param_groups):
        torch_group: dict[str, Any] = {"params": [params[name] for name in group.names]}
        if group.lr_factor != 1.0:  # set only where it differs: the optimiser's defaults otherwise
            torch_group["lr"] = cfg.lr * group.lr_factor
        if group.weight_decay_factor != 1.0:
            torch_group["weight_decay"] = cfg.weight_decay * group.weight_decay_factor
        groups.append(torch_group)
    return _torch_optimizer(groups, cfg, device)


def _torch_optimizer(
    groups: list[dict[str, Any]], cfg: TrainConfig, device: torch.device | None
) -> torch.optim.Optimizer:
    """The configured optimiser over param ``groups`` (a group's own ``lr``, ``momentum``,
    ``weight_decay`` override ``cfg``'s)."""
    fused = {"fused": True} if device is not None and device.type == "cuda" else {}
    settings = {"lr": cfg.lr, "weight_decay": cfg.weight_decay, **fused}
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, momentum=cfg.momentum, **settings)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(groups, betas=cfg.betas, **settings)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, betas=cfg.betas, **settings)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}; allowed: sgd, adam, adamw")


def make_block_optimizer(
    block: SeedBlock,
    configs: Sequence[TrainConfig],
    device: torch.device | None = None,
) -> torch.optim.Optimizer | SeedRunsOptimizer:
    """The optimiser of ``block``'s parameters (stacked, ``[S, ...]``, one row per seed), grouped
    by its template module's structure (``param_groups``, the same for every seed), ``configs``
    each seed's settings (:meth:`TrainConfig.for_seed`): :func:`make_optimizer` when every seed has
    the same settings, else a :class:`SeedRunsOptimizer` (per-seed settings,
    :data:`trainmap.training.config.PER_SEED`)."""
    runs: list[tuple[int, int, TrainConfig]] = []
    for index, own in enumerate(configs):
        if runs and runs[-1][2] == own:
            runs[-1] = (runs[-1][0], index + 1, own)
        else:
            runs.append((index, index + 1, own))
    if len(runs) == 1:
        return make_optimizer(block.module, configs[0], device, params=block.parameters)
    classes = parameter_groups(block.module, configs[0].param_groups)
    return SeedRunsOptimizer(block.parameters, classes, runs, device)


class SeedRunsOptimizer:
    """One torch optimiser for a block whose seeds differ in learning rate, momentum or weight
    decay: each run of neighbouring seeds with the same settings and each of its ``classes`` of
    parameters (:func:`~trainmap.training.param_groups.parameter_groups` of the block's template
    module; ``single``: one) is a param group of views of the stacked tensors (``[start:stop]``
    rows), with the run's settings times the class's factors (run by run, the classes in their
    order). The update is torch's own and elementwise, so a seed gets the bits it gets in a block
    that shares its values, and trains as it would alone with them to a block's round-off
    (tests/unit/training/test_seed_blocks.py: bit for bit against the shared block on the CPU,
    1e-10 against the seed alone in float64; test_param_groups.py: with parameter groups).

    The loop's interface: :meth:`zero_grad`, :meth:`step`, ``param_groups``, :meth:`state_dict`,
    :meth:`load_state_dict`.
    """

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        classes: Sequence[ParamGroup],
        runs: Sequence[tuple[int, int, TrainConfig]],
        device: torch.device | None = None,
    ) -> None:
        self.params = list(params.values())
        self.rows: list[tuple[int, int]] = []  # per param group: its seeds' rows,
        self.stacked: list[list[torch.Tensor]] = []  # the stacked tensors it holds rows of,
        self.views: list[list[torch.Tensor]] = []  # and its views of them
        groups = []
        for start, stop, own in runs:
            for group in classes:
                stacked = [params[name] for name in group.names]
                views = [param.detach()[start:stop] for param in stacked]
                self.rows.append((start, stop))
                self.stacked.append(stacked)
                self.views.append(views)
                groups.append({"params": views, "lr": _scaled(own.lr, group.lr_factor),
                               "momentum": own.momentum,
                               "weight_decay": _scaled(own.weight_decay,
                                                       group.weight_decay_factor)})  # fmt: skip
        if runs[0][2].optimizer != "sgd":  # momentum is SGD's alone
            for group in groups:
                del group["momentum"]
        self.optimizer = _torch_optimizer(groups, runs[0][2], device)
        self.param_groups = self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            param.grad = None
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        """Each group's views take their rows of the stacked gradients, then torch's step."""
        for views, stacked, (start, stop) in zip(self.views, self.stacked, self.rows, strict=True):
            for view, param in zip(views, stacked, strict=True):
                view.grad = None if param.grad is None else param.grad[start:stop]
        self.optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)


def _scaled(value: float, factor: float) -> float:
    """``value`` times a param group's ``factor``; ``value`` itself at factor 1 (the group of
    ``single`` holds exactly the configured number)."""
    return value if factor == 1.0 else value * factor


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
