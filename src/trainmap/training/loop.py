"""The training loop: one function, read top to bottom (after nanoGPT's ``train.py``).

``train_block`` trains a **block of seeds** of one grid cell family (task, arch, method) at once: S
networks whose state is stacked along a leading seed dimension and run as one vectorised model
(:class:`trainmap.training.seed_block.SeedBlock`: ``torch.func.vmap`` over ``functional_call``). A tiny network is
bound by per-operation overhead, so S seeds cost little more than one. Each seed keeps everything a
run alone has: its own initialisation, its own batch order (its own seeded sampler), its own
BatchNorm statistics, its own gradient clipping (each run's own norm), its own outputs. A single
seed is a block of one (``train_model``), which runs the module itself, without vmap: there is one
loop, and a seed trained in a block equals the same seed trained alone up to floating-point
summation order (tests: float64 to 1e-10, float32 loss curves to 1e-4).

Every ``checkpoint_every`` optimiser steps (step 0 and the last included) the loop takes a
**checkpoint**: it evaluates the test set, records the mean training loss/accuracy since the previous
checkpoint, and hands the block's weights to a :class:`~trainmap.training.record.CheckpointRecorder`,
which computes the 14 weight metrics of every convention from them at once (as Hu et al., "Latent
state models of training dynamics", do inside their training loop), appends them to each run's
``checkpoint_metrics.csv``, and writes the checkpoint to the run's archive when
``train.<task>.archive`` keeps it (:mod:`trainmap.training.archive`). No checkpoint stays in memory.

Resume: every ``resume_every`` steps the whole training state of the block (stacked model and
optimiser state, every seed's batch order, RNG, histories and metric rows so far: no checkpoint
weights, so its size does not grow with the checkpoints) is written atomically to one
resume file (the wall time so far beside it, in its timing sidecar: ``trainmap.io.timing_path``). A
rerun after a kill continues from it and ends with weights bit-identical (CPU) to an uninterrupted
run. The file is removed once the block's outputs are written.

Every output is the same bytes when its content is: the summary's wall time and steps/s go to
``train.timing.json`` beside ``train.json`` (``trainmap.io.save_json``), so rerunning a cell rewrites
metric table, archive, model, history and summary byte for byte.

Divergence, per seed: a seed whose loss turns NaN/inf is recorded as ``diverged`` at that step and
frozen (its weights and statistics stay those of the step it diverged at; it no longer contributes
gradients), while the other seeds of the block go on. Its outputs are still written, so the rest of
the workflow completes and analysis can exclude the run visibly.

Methods that change training itself (AST's distillation, SR-STE decay and mask refresh) plug in
through :class:`TrainHooks`, called from the places marked ``# hook:`` in the loop; the plain loop
is the hooks' defaults, which do nothing. Hooks see the block's stacked tensors.

Models vmap cannot vectorise (a user's architecture with data-dependent control flow, ``.item()``,
dropout, or state vmap does not see): when the block is built, one trial step compares it with each
seed's own module (:func:`trainmap.training.seed_block.vectorisation_problem`); on a problem the
block's seeds train one after another, each as a block of one (this same loop), with an
:class:`~trainmap.training.seed_block.UnvectorisableWarning` naming the architecture and the
reason. Each seed's files are then those it gives trained alone. A block of one seeds torch's
global RNG from its seed before its first step, so a model that draws random numbers gives the
same run alone and in such a block.
"""

from __future__ import annotations

import hashlib
import math
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from trainmap.data import TaskData
from trainmap.io import (
    load_resume_or_none,
    load_timing,
    save_json,
    save_timing,
    save_torch,
    timing_path,
    write_atomic,
)
from trainmap.methods import check_method
from trainmap.models import build_model, count_parameters
from trainmap.training.archive import ArchivePolicy, checkpoint_steps
from trainmap.training.checkpoints import save_dense
from trainmap.training.record import CheckpointRecorder
from trainmap.training.seed_block import SeedBlock, UnvectorisableWarning, vectorisation_problem

CheckpointHook = Callable[[dict[str, float], int], None]  # (metrics, step) of one run
BlockCheckpointHook = Callable[[int, dict[str, float], int], None]  # (seed index, metrics, step)
EVAL_BATCH = 4096
HISTORY_COLUMNS = ["step", "train_loss", "train_acc", "test_loss", "test_acc", "lr"]


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


@dataclass(frozen=True)
class TrainConfig:
    """Training hyperparameters of one task (``params.yaml: train.<task>``)."""

    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    batch_size: int = 32
    steps: int = 1000
    schedule: str = "constant"
    warmup_steps: int = 0
    grad_clip: float | None = None
    checkpoint_every: int = 25
    resume_every: int = 1000
    device: str = "cpu"
    archive: ArchivePolicy = field(default_factory=ArchivePolicy)

    @classmethod
    def from_dict(cls, settings: dict[str, Any]) -> TrainConfig:
        """Build from a config mapping; unknown keys are an error naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ValueError(f"unknown training settings {unknown}; allowed: {sorted(known)}")
        values = dict(settings)
        if "betas" in values:
            values["betas"] = tuple(values["betas"])
        values["archive"] = ArchivePolicy.from_value(values.get("archive"))
        return cls(**values)

    @property
    def checkpoint_steps(self) -> list[int]:
        """Every step the loop takes a checkpoint at (0, every ``checkpoint_every``, the last)."""
        return checkpoint_steps(self.steps, self.checkpoint_every)


@dataclass(frozen=True)
class TrainPaths:
    """Where one run's outputs go: the metric table streamed at each checkpoint, the archive of
    kept checkpoints (a directory), the final model, history and summary, the resume file."""

    metrics: Path
    archive: Path
    model: Path
    history: Path
    summary: Path
    resume: Path

    @classmethod
    def in_directory(cls, directory: str | Path) -> TrainPaths:
        """The standard file names inside one run directory."""
        directory = Path(directory)
        return cls(
            metrics=directory / "checkpoint_metrics.csv",
            archive=directory / "checkpoints",
            model=directory / "model.pt",
            history=directory / "history.csv",
            summary=directory / "train.json",
            resume=directory / "resume.pt",
        )


@dataclass
class BatchSampler:
    """Seeded epoch-wise shuffling with drop-last batches; its state is saved for resume."""

    n_examples: int
    batch_size: int
    generator: torch.Generator
    order: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    position: int = 0

    def next_indices(self) -> torch.Tensor:
        """Indices of the next batch; reshuffles when the epoch is used up."""
        start, size = self.position, min(self.batch_size, self.n_examples)
        if start + size > len(self.order):
            self.order = torch.randperm(self.n_examples, generator=self.generator)
            start = 0
        self.position = start + size
        return self.order[start : start + size]

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


def resolve_device(name: str) -> torch.device:
    """``cpu`` or ``cuda[:i]``; asking for CUDA on a machine without it is an error, not a fallback."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"training device {name!r} requested (train.<task>.device) but this "
                         "machine has no CUDA device; use device: cpu here")  # fmt: skip
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"training device {name!r} is not supported; use cpu or cuda")
    return device


def on_device(data: TaskData, device: torch.device) -> TaskData:
    """The task's tensors on ``device`` (the data sets here are small enough to live there)."""
    if device.type == "cpu":
        return data
    return TaskData(data.x_train.to(device), data.y_train.to(device), data.x_test.to(device),
                    data.y_test.to(device), data.meta)  # fmt: skip


def derive_seed(seed: int, purpose: str) -> int:
    """A seed for one purpose (init, batch order, ...) derived from the grid cell's seed."""
    digest = hashlib.sha256(f"{seed}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def build_cell_model(
    arch: str, method: str, seed: int, meta: dict, model_options: dict | None = None
) -> nn.Module:
    """The seeded initial model of a grid cell: build the architecture, then apply the method's init."""
    torch.manual_seed(derive_seed(seed, "build"))
    model = build_model(arch, meta, **(model_options or {}))
    generator = torch.Generator().manual_seed(derive_seed(seed, "init"))
    check_method(method).initialise(model, generator)
    return model


def make_optimizer(params: Iterable[torch.Tensor], cfg: TrainConfig) -> torch.optim.Optimizer:
    """SGD (with momentum), Adam or AdamW as configured. Their updates are elementwise, so on a
    block's stacked tensors each seed is updated exactly as alone."""
    params = list(params)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
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


@torch.no_grad()
def evaluate_split(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on ``(x, y)`` in eval mode."""
    was_training = model.training
    model.eval()
    loss_sum, correct = 0.0, 0
    for start in range(0, len(x), EVAL_BATCH):
        logits = model(x[start : start + EVAL_BATCH])
        target = y[start : start + EVAL_BATCH]
        loss_sum += F.cross_entropy(logits, target, reduction="sum").item()
        correct += (logits.argmax(dim=1) == target).sum().item()
    model.train(was_training)
    return loss_sum / len(x), correct / len(x)


@torch.no_grad()
def evaluate_block(
    block: SeedBlock, x: torch.Tensor, y: torch.Tensor
) -> tuple[list[float], list[float]]:
    """Every seed's mean cross-entropy and accuracy on ``(x, y)``, in eval mode."""
    was_training = block.training
    block.eval()
    loss_sum = torch.zeros(block.size, dtype=torch.float64, device=x.device)
    correct = torch.zeros(block.size, dtype=torch.long, device=x.device)
    for start in range(0, len(x), EVAL_BATCH):
        logits = block.forward_shared(x[start : start + EVAL_BATCH])
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

    Each step only appends its (detached) per-seed losses, logits and targets; they are scored when
    the means are read or the state is saved, one step after another (so a resume that splits a
    checkpoint interval adds the same numbers in the same order), with one argmax per step batch
    instead of several small tensor ops per step (a measurable share of a small MLP's step).
    """

    size: int
    loss_sum: list[float] = field(default_factory=list)
    correct: list[int] = field(default_factory=list)
    seen: list[int] = field(default_factory=list)
    pending: list[tuple[list[int], list[float], torch.Tensor, torch.Tensor]] = field(
        default_factory=list
    )

    def __post_init__(self) -> None:
        self.loss_sum = self.loss_sum or [0.0] * self.size
        self.correct = self.correct or [0] * self.size
        self.seen = self.seen or [0] * self.size

    def add(self, active: list[int], losses: list[float], logits: torch.Tensor,
            targets: torch.Tensor) -> None:  # fmt: skip
        """Record one step of the ``active`` seeds: their mean losses and predictions."""
        self.pending.append((active, losses, logits.detach(), targets))

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
        size = self.pending[0][3].numel() // self.size  # examples per seed and step
        for row, (active, losses, _, _) in enumerate(self.pending):  # sequential, as steps came
            for index in active:
                self.loss_sum[index] += losses[index] * size  # float64, as Python floats are
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


def train_model(
    model: nn.Module,
    data: TaskData,
    cfg: TrainConfig,
    seed: int,
    paths: TrainPaths,
    *,
    on_checkpoint: CheckpointHook | None = None,
    progress: bool = True,
    fingerprint: str = "",
    description: str = "train",
    model_info: dict[str, Any] | None = None,
    hooks: TrainHooks | None = None,
) -> dict[str, Any]:
    """Train one seed: :func:`train_block` with a block of one (the module itself, no vmap)."""
    hook = (
        None if on_checkpoint is None else (lambda _, metrics, step: on_checkpoint(metrics, step))
    )
    return train_block(
        [model], data, cfg, [seed], [paths], resume_path=paths.resume, on_checkpoint=hook,
        progress=progress, fingerprint=fingerprint, description=description,
        model_info=[model_info or {}], hooks=hooks,
    )[0]  # fmt: skip


def train_block(
    models: Sequence[nn.Module],
    data: TaskData,
    cfg: TrainConfig,
    seeds: Sequence[int],
    paths: Sequence[TrainPaths],
    *,
    resume_path: Path,
    on_checkpoint: BlockCheckpointHook | None = None,
    progress: bool = True,
    fingerprint: str = "",
    description: str = "train",
    model_info: Sequence[dict[str, Any]] | None = None,
    hooks: TrainHooks | None = None,
) -> list[dict[str, Any]]:
    """Train ``models`` (one per seed of ``seeds``, same architecture) together as one block; write
    each seed's metric table, archive, final model, history and summary to its ``paths``; the
    models end up holding their trained weights. Returns the per-seed summaries.

    ``fingerprint`` identifies the configuration: a resume file written under another fingerprint is
    ignored (and replaced), so a changed config never continues a stale run. ``model_info`` (arch,
    options, data meta; one per seed) is stored beside the final weights so each model can be rebuilt
    from its file; its ``arch``/``meta``/``model_options`` also give the architecture whose layout
    the streamed metrics count (a sparse run's checkpoints hold the dense architecture's entries);
    without them, the first model's. ``hooks`` are a method's additions to the loop (see
    :class:`TrainHooks`).

    A block whose model vmap cannot vectorise (a trial step when the block is built) trains its
    seeds one after another instead, each as a block of one, with an ``UnvectorisableWarning``.
    """
    size = len(models)
    if not (len(seeds) == len(paths) == size):
        raise ValueError(f"a block of {size} models needs as many seeds and paths")
    hooks = hooks or TrainHooks()
    device = resolve_device(cfg.device)
    cfg.archive.check_device(device)
    block = SeedBlock(models).to(device)
    data = on_device(data, device)
    problem = None if size == 1 else vectorisation_problem(block, _first_batches(data, cfg, seeds))
    if problem is not None:
        del block  # its stacked copy of the seeds' state: each seed trains from its own model
        return _train_seeds_apart(
            problem, models, data, cfg, seeds, paths, resume_path=resume_path,
            on_checkpoint=on_checkpoint, progress=progress, fingerprint=fingerprint,
            description=description, model_info=model_info, hooks=hooks,
        )  # fmt: skip
    hooks.attach(block)
    optimizer = make_optimizer(block.parameters.values(), cfg)
    lr_varies = cfg.schedule != "constant" or cfg.warmup_steps > 0
    on_accelerator = device.type != "cpu"
    samplers = [_sampler(len(data.x_train), cfg, seed) for seed in seeds]
    structure = metric_structure(models[0], model_info[0] if model_info else None)
    recorder = CheckpointRecorder(structure, [p.metrics for p in paths],
                                  [p.archive.parent for p in paths], cfg.checkpoint_steps,
                                  cfg.archive)  # fmt: skip
    running = RunningMeans(size)
    records = [SeedRecord() for _ in range(size)]
    start_step, elapsed_before, resumed_from = 0, 0.0, None
    saved = _load_resume(resume_path, fingerprint)
    if saved is not None:
        block.load_state(saved["block"])
        optimizer.load_state_dict(saved["optimizer"])
        for sampler, state in zip(samplers, saved["samplers"], strict=True):
            sampler.load_state_dict(state)
        torch.set_rng_state(saved["torch_rng"])
        if device.type == "cuda" and saved.get("cuda_rng") is not None:
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        recorder.load_state_dict(saved["recorder"])
        running = RunningMeans(**saved["running"])
        records = [SeedRecord(**record) for record in saved["records"]]
        hooks.load_state_dict(saved["hooks"])
        start_step = resumed_from = saved["step"]
        elapsed_before = saved["elapsed_s"]  # from the resume file's timing sidecar
    else:
        recorder.start_fresh()
        if size == 1:  # random numbers a model draws (dropout) come from its own seed
            torch.manual_seed(derive_seed(seeds[0], "train"))

    def active_seeds() -> list[int]:
        return [index for index, record in enumerate(records) if record.active]

    def checkpoint(step: int) -> None:
        test_losses, test_accs = evaluate_block(block, data.x_test, data.y_test)
        active = active_seeds()
        for index in active:
            train_loss, train_acc = running.pop(index)
            row = {
                "step": step,
                "train_loss": train_loss,
                "train_acc": train_acc,
                "test_loss": test_losses[index],
                "test_acc": test_accs[index],
                "lr": cfg.lr * lr_factor(step, cfg),  # the learning rate of the next step
            }
            records[index].history.append(row)
            if on_checkpoint is not None:
                # lr is logged only when it changes (a constant is a run parameter, not a metric).
                logged = {k: v for k, v in row.items() if k != "step" and (k != "lr" or lr_varies)}
                on_checkpoint(index, logged, step)
        recorder.capture(step, hooks.snapshot(block), active)

    started = time.perf_counter()
    if start_step == 0:
        checkpoint(0)
    block.train()
    bar = tqdm(total=cfg.steps, initial=start_step, desc=description, disable=not progress)
    step = start_step
    active = active_seeds()
    while step < cfg.steps and active:
        # --- the step (every seed of the block at once) ------------------------------------------
        logits, inputs, targets, task_losses = _forward_step(
            block, samplers, data, device if on_accelerator else None
        )
        extra = None
        if hooks.adds_loss:  # hook: e.g. distillation, on (S, B, ...) tensors
            if size == 1:  # a block of one steps on (B, ...) tensors and a scalar loss
                logits, inputs, targets = logits[None], inputs[None], targets[None]
                task_losses = task_losses.reshape(1)
            extra = hooks.extra_loss(logits, inputs, targets)
        losses = task_losses if extra is None else task_losses + extra
        if extra is None:
            task_values = loss_values = task_losses.reshape(-1).tolist()
        else:
            task_values, loss_values = torch.stack([task_losses, losses]).tolist()
        if not math.isfinite(sum(loss_values[i] + task_values[i] for i in active)):
            for index in active:
                if not (math.isfinite(task_values[index]) and math.isfinite(loss_values[index])):
                    _freeze(records[index], block, index, step)  # diverged at this step, frozen
            active = active_seeds()
            if not active:
                break
        optimizer.zero_grad(set_to_none=True)
        if lr_varies:  # the schedule is a function of the step: nothing to save for resume
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * lr_factor(step, cfg)
        if len(active) == size:  # a block of one's scalar loss is the plain loop's graph
            (losses if losses.dim() == 0 else losses.sum()).backward()
        else:  # frozen seeds add nothing (their NaN must not reach the sum)
            mask = torch.zeros(size, dtype=torch.bool, device=losses.device)
            mask[active] = True
            torch.where(mask, losses, torch.zeros_like(losses)).sum().backward()
            _zero_frozen_grads(block, records)
        if cfg.grad_clip is not None:
            clip_seed_grad_norms(block, cfg.grad_clip)
        hooks.after_backward(step)  # hook: e.g. SR-STE decay of pruned weights
        optimizer.step()
        if len(active) < size:
            _restore_frozen(block, records)
        hooks.after_step(step)  # hook: e.g. N:M mask refresh
        step += 1
        running.add(active, task_values, logits, targets)
        # --- checkpointing and resume state ---------------------------------------------------
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            checkpoint(step)
            bar.update(step - bar.n)
            accs = [records[i].history[-1]["test_acc"] for i in active]
            if accs:
                bar.set_postfix(test_acc=f"{sum(accs) / len(accs):.3f}", refresh=False)
        if step % cfg.resume_every == 0 and step < cfg.steps:
            elapsed = elapsed_before + time.perf_counter() - started
            _save_resume(resume_path, fingerprint, step, block, optimizer, samplers, recorder,
                         running, records, hooks, elapsed)  # fmt: skip
    bar.close()
    wall_time = elapsed_before + time.perf_counter() - started
    summaries = []
    for index in range(size):
        record = records[index]
        if record.active:
            record.steps_done = step
        if record.frozen_state is not None:
            block.set_seed_state(index, record.frozen_state)
        summaries.append({
            "status": "completed" if record.active else "diverged",
            "diverged_step": record.diverged_step,
            "steps": cfg.steps,
            "steps_done": record.steps_done,
            "n_checkpoints": len(record.history),
            "n_params": count_parameters(models[index]),
            "wall_time_s": wall_time,
            "steps_per_s": step / wall_time if wall_time > 0 else math.nan,
            # the block's seconds on streamed metrics and archive writes (this process's share
            # after a resume; timing sidecar only)
            "metrics_s": recorder.metrics_s,
            "archive_s": recorder.archive_s,
            "seed_block": size,
            "resumed_from_step": resumed_from,
            "final": record.history[-1],
        })  # fmt: skip
    block.write_back()
    infos = list(model_info) if model_info is not None else [{} for _ in range(size)]
    for index in range(size):
        recorder.finish(index)
        _write_outputs(paths[index], block.model_of(index), records[index].history,
                       summaries[index], infos[index], hooks)  # fmt: skip
    resume_path.unlink(missing_ok=True)
    timing_path(resume_path).unlink(missing_ok=True)
    return summaries


def _sampler(n_examples: int, cfg: TrainConfig, seed: int) -> BatchSampler:
    """Seed ``seed``'s batch order: its own generator, seeded from the seed."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "batches"))
    return BatchSampler(n_examples, cfg.batch_size, generator)


def _first_batches(data: TaskData, cfg: TrainConfig, seeds: Sequence[int]) -> torch.Tensor:
    """Each seed's first training batch, ``(S, B, ...)`` (from fresh samplers: the loop's own
    samplers are not touched)."""
    indices = [_sampler(len(data.x_train), cfg, seed).next_indices() for seed in seeds]
    return data.x_train[torch.stack(indices).to(data.x_train.device)]


def _train_seeds_apart(
    problem: str,
    models: Sequence[nn.Module],
    data: TaskData,
    cfg: TrainConfig,
    seeds: Sequence[int],
    paths: Sequence[TrainPaths],
    *,
    resume_path: Path,
    on_checkpoint: BlockCheckpointHook | None,
    description: str,
    model_info: Sequence[dict[str, Any]] | None,
    hooks: TrainHooks,
    **common: Any,
) -> list[dict[str, Any]]:
    """A block vmap cannot vectorise (``problem`` says why): its seeds trained one after another,
    each as a block of one with its resume file in its own directory; the block's summaries."""
    infos = list(model_info) if model_info is not None else [{} for _ in models]
    arch = infos[0].get("arch")
    what = f"architecture {arch!r}" if arch else f"model {type(models[0]).__name__}"
    seed_hooks = [hooks.for_seed(index) for index in range(len(models))]
    if None in seed_hooks:
        raise ValueError(
            f"{what} cannot be vectorised over the seeds of block {description!r} ({problem}), "
            f"and the method's training hooks ({type(hooks).__name__}) train a block only as a "
            "whole; train its seeds one per job (train.<task>.seed_block: 1)"
        )
    warnings.warn(
        f"{what} cannot be vectorised over the seeds of block {description!r} ({problem}); its "
        f"{len(models)} seeds train one at a time, each as a block of one (the same results, "
        "without the block's speed-up)",
        UnvectorisableWarning,
        stacklevel=3,
    )
    summaries = []
    for index, seed in enumerate(seeds):
        hook = None if on_checkpoint is None else _for_index(on_checkpoint, index)
        summaries += train_block(
            [models[index]], data, cfg, [seed], [paths[index]], resume_path=paths[index].resume,
            on_checkpoint=hook, description=f"{description} seed {seed}",
            model_info=[infos[index]], hooks=seed_hooks[index], **common,
        )  # fmt: skip
    resume_path.unlink(missing_ok=True)  # one a vectorised run of this block may have left
    timing_path(resume_path).unlink(missing_ok=True)
    return summaries


def _for_index(hook: BlockCheckpointHook, index: int) -> BlockCheckpointHook:
    """``hook`` of a block, called by a block of one that trains the block's seed ``index``."""
    return lambda _, metrics, step: hook(index, metrics, step)


def _forward_step(
    block: SeedBlock, samplers: Sequence[BatchSampler], data: TaskData, device: torch.device | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One training batch per seed and the block's forward pass: logits, inputs, targets and the
    loss. A block of S > 1 gives ``(S, B, ...)`` tensors and each seed's mean cross-entropy
    ``(S,)``; a block of one gives the plain loop's ``(B, ...)`` tensors and its scalar loss, so its
    graph is the plain loop's (model, cross-entropy; ``flatten`` is a no-op on 2-D logits)."""
    if block.size == 1:
        indices = samplers[0].next_indices()
    else:
        indices = torch.stack([sampler.next_indices() for sampler in samplers])
    if device is not None:
        indices = indices.to(device)
    inputs, targets = data.x_train[indices], data.y_train[indices]
    if block.size > 1:
        logits = block(inputs)
        return logits, inputs, targets, seed_cross_entropy(logits, targets)
    output = block.module(inputs)
    return output, inputs, targets, F.cross_entropy(output.flatten(0, -2), targets.flatten())


def _freeze(record: SeedRecord, block: SeedBlock, index: int, step: int) -> None:
    """A seed whose loss is not finite at ``step``: diverged at step + 1 (the step it would have
    taken), its state kept as it is now."""
    record.diverged_step, record.steps_done = step + 1, step
    record.frozen_state = block.state_of(index)


def _zero_frozen_grads(block: SeedBlock, records: list[SeedRecord]) -> None:
    frozen = [index for index, record in enumerate(records) if not record.active]
    for parameter in block.parameters.values():
        if parameter.grad is not None:
            block.seed_view(parameter.grad)[frozen] = 0.0


def _restore_frozen(block: SeedBlock, records: list[SeedRecord]) -> None:
    """Frozen seeds keep their state: undo what the optimiser step and the forward pass (BN running
    statistics) did to them."""
    for index, record in enumerate(records):
        if record.frozen_state is not None:
            block.set_seed_state(index, record.frozen_state)


def _write_outputs(
    paths: TrainPaths,
    model: nn.Module,
    history: list[dict[str, float]],
    summary: dict[str, Any],
    model_info: dict[str, Any],
    hooks: TrainHooks,
) -> None:
    hooks.save_model(model, paths.model, model_info)
    frame = pd.DataFrame(history, columns=HISTORY_COLUMNS)
    write_atomic(paths.history, lambda tmp: frame.to_csv(tmp, index=False))
    save_json(summary, paths.summary)


def _save_resume(path: Path, fingerprint: str, step: int, block: SeedBlock,
                 optimizer: torch.optim.Optimizer, samplers: list[BatchSampler],
                 recorder: CheckpointRecorder, running: RunningMeans, records: list[SeedRecord],
                 hooks: TrainHooks, elapsed: float) -> None:  # fmt: skip
    # The time so far goes beside the file (seeds0-31.resume.timing.json), so the resume file of
    # a step is the same bytes in every run, like every other file trainmap writes.
    save_timing({"elapsed_s": elapsed}, path)
    save_torch(
        {
            "fingerprint": fingerprint,
            "step": step,
            "block": {key: value.detach().clone() for key, value in block.state().items()},
            "optimizer": optimizer.state_dict(),
            "samplers": [sampler.state_dict() for sampler in samplers],
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
            "recorder": recorder.state_dict(),
            "running": running.state_dict(),
            "records": [vars(record) for record in records],
            "hooks": hooks.state_dict(),
        },
        path,
    )


def _load_resume(path: Path, fingerprint: str) -> dict[str, Any] | None:
    saved = load_resume_or_none(path)  # none, or a damaged file (deleted): start from step 0
    if saved is None or saved.get("fingerprint") != fingerprint or "recorder" not in saved:
        # A different configuration, or a resume file of an older trainmap (one seed, no block
        # state, or every checkpoint's weights): start over; the file is replaced later.
        return None
    # Resume files of an older trainmap held the time themselves; a missing sidecar costs only
    # the reported wall time of the part before the resume.
    saved.setdefault("elapsed_s", load_timing(path).get("elapsed_s", 0.0))
    return saved


def metric_structure(model: nn.Module, info: Mapping[str, Any] | None) -> nn.Module:
    """The architecture whose layout the streamed metrics count: rebuilt from ``model_info``
    ``info`` (``arch``, ``meta``, ``model_options``) when given, so a sparse run counts its dense
    layers; else ``model`` itself."""
    info = info or {}
    if {"arch", "meta"} <= set(info):
        with torch.random.fork_rng(devices=[]):  # building it draws no number the run would draw
            return build_model(info["arch"], info["meta"], **info.get("model_options", {}))
    return model
