"""The training loop: one function, read top to bottom (after nanoGPT's ``train.py``).

``train_model`` runs seeded mini-batch training of one grid cell and records a **checkpoint
trajectory**: the full ``state_dict`` every ``checkpoint_every`` optimiser steps (step 0 included),
stacked into one tensor per entry and saved as one file per run, so any weight metric can be
recomputed later without retraining (Hu et al., "Latent state models of training dynamics", compute
their 14 metrics from such checkpoints). At each checkpoint it evaluates the test set and records the
mean training loss/accuracy since the previous checkpoint.

Resume: every ``resume_every`` steps the whole training state (model, optimiser, schedule, batch
order, RNG, trajectory so far) is written atomically to a resume file. A rerun after a kill continues
from it and ends with weights bit-identical (CPU) to an uninterrupted run. The file is removed once
the run's outputs are written.

Divergence: a non-finite loss stops the run; its outputs are still written with
``status: diverged`` and the step, so the rest of the workflow completes and analysis can exclude the
run visibly.

Methods that change training itself (AST's distillation, SR-STE decay and mask refresh) plug in
through :class:`TrainHooks`, called from the places marked ``# hook:`` in the loop; the plain loop
is the hooks' defaults, which do nothing.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from trainmap.checkpoints import save_dense
from trainmap.data import TaskData
from trainmap.io import load_torch, save_json, save_torch, write_atomic
from trainmap.methods import check_method
from trainmap.models import build_model, count_parameters

CheckpointHook = Callable[[dict[str, float], int], None]  # (metrics, step)
EVAL_BATCH = 4096


class TrainHooks:
    """What a method adds to the training loop; every default does nothing.

    ``train_model`` calls, in this order per step: :meth:`extra_loss` after the forward pass (added
    to the task loss before ``backward``), :meth:`after_backward` after ``backward`` and gradient
    clipping, before the optimiser step (gradients may be edited here), :meth:`after_step` after
    the optimiser step. The history's ``train_loss`` is the task loss alone.
    ``step`` is the number of optimiser steps taken before the current one (0 for the first), so a
    schedule reads it as "t". :meth:`snapshot` decides what the checkpoint trajectory records.
    Everything a hook keeps across steps goes in :meth:`state_dict`, so resume stays bit-identical.
    """

    def extra_loss(
        self, logits: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor | None:
        """A term added to the task loss (e.g. distillation), or None."""
        return None

    def after_backward(self, step: int) -> None:
        """Edit gradients before the optimiser uses them (e.g. SR-STE decay)."""

    def after_step(self, step: int) -> None:
        """React to an optimiser step (e.g. refresh N:M masks every k steps)."""

    def snapshot(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The tensors a checkpoint of the trajectory records (default: the state dict, on the CPU)."""
        return {
            name: value.detach().to("cpu", copy=True) for name, value in model.state_dict().items()
        }

    def save_model(self, model: nn.Module, path: Path, model_info: dict[str, Any]) -> None:
        """Write the final model file (default: the ``dense`` checkpoint format)."""
        save_dense(model, path, **model_info)

    def state_dict(self) -> dict[str, Any]:
        """The hooks' own state, saved with the resume file."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` when a run resumes."""


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
        return cls(**values)


@dataclass(frozen=True)
class TrainPaths:
    """Where one run's outputs go."""

    trajectory: Path
    model: Path
    history: Path
    summary: Path
    resume: Path

    @classmethod
    def in_directory(cls, directory: str | Path) -> TrainPaths:
        """The standard file names inside one run directory."""
        directory = Path(directory)
        return cls(
            trajectory=directory / "trajectory.pt",
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
        size = min(self.batch_size, self.n_examples)
        if self.position + size > self.order.shape[0]:
            self.order = torch.randperm(self.n_examples, generator=self.generator)
            self.position = 0
        batch = self.order[self.position : self.position + size]
        self.position += size
        return batch

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


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """SGD (with momentum), Adam or AdamW as configured."""
    params = model.parameters()
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


class Trajectory:
    """Checkpoints of one run, kept in memory and stacked into one tensor per state entry."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.snapshots: list[dict[str, torch.Tensor]] = []

    def capture(self, step: int, snapshot: dict[str, torch.Tensor]) -> None:
        """Record ``snapshot`` (copies of the model's tensors, see TrainHooks.snapshot) at ``step``."""
        self.steps.append(step)
        self.snapshots.append(snapshot)

    def to_dict(self) -> dict[str, Any]:
        """``{"step": LongTensor[n], "state": {name: Tensor[n, *shape]}}``."""
        names = self.snapshots[0].keys() if self.snapshots else []
        return {
            "step": torch.tensor(self.steps, dtype=torch.long),
            "state": {name: torch.stack([snap[name] for snap in self.snapshots]) for name in names},
        }

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> Trajectory:
        """Inverse of :meth:`to_dict`."""
        trajectory = cls()
        trajectory.steps = saved["step"].tolist()
        state = saved["state"]
        trajectory.snapshots = [
            {name: stacked[index] for name, stacked in state.items()}
            for index in range(len(trajectory.steps))
        ]
        return trajectory


@dataclass
class RunningMeans:
    """Training loss/accuracy summed over the steps since the last checkpoint.

    Each step only appends its (detached) logits and targets; they are scored in one batch when
    the means are read or the state is saved, which costs one argmax per checkpoint instead of
    three small tensor ops per step (a measurable share of a step of a small MLP).
    """

    loss_sum: float = 0.0
    correct: int = 0
    seen: int = 0
    pending: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def add(self, loss_value: float, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """Record one step's mean loss and its predictions."""
        size = targets.shape[0]
        self.loss_sum += loss_value * size
        self.seen += size
        self.pending.append((logits.detach(), targets))

    def score_pending(self) -> None:
        """Count the correct predictions of the steps recorded since the last call."""
        if self.pending:
            logits = torch.cat([logits for logits, _ in self.pending])
            targets = torch.cat([targets for _, targets in self.pending])
            self.correct += int((logits.argmax(dim=1) == targets).sum())
            self.pending = []

    def pop(self) -> tuple[float, float]:
        """Mean loss and accuracy so far, then reset."""
        self.score_pending()
        if self.seen == 0:
            return math.nan, math.nan
        means = (self.loss_sum / self.seen, self.correct / self.seen)
        self.loss_sum, self.correct, self.seen = 0.0, 0, 0
        return means

    def state_dict(self) -> dict[str, float | int]:
        """The sums (pending predictions scored first), for a resume file."""
        self.score_pending()
        return {"loss_sum": self.loss_sum, "correct": self.correct, "seen": self.seen}


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
    """Train ``model`` on ``data``; write trajectory, final model, history and summary to ``paths``.

    ``fingerprint`` identifies the configuration: a resume file written under another fingerprint is
    ignored (and replaced), so a changed config never continues a stale run. ``model_info`` (arch,
    options, data meta) is stored beside the final weights so the model can be rebuilt from the file.
    ``hooks`` are a method's additions to the loop (see :class:`TrainHooks`).
    """
    hooks = hooks or TrainHooks()
    device = resolve_device(cfg.device)
    model.to(device)
    data = on_device(data, device)
    optimizer = make_optimizer(model, cfg)
    lr_varies = cfg.schedule != "constant" or cfg.warmup_steps > 0
    on_accelerator = device.type != "cpu"
    sampler = BatchSampler(
        len(data.x_train),
        cfg.batch_size,
        torch.Generator().manual_seed(derive_seed(seed, "batches")),
    )
    trajectory, history, running = Trajectory(), [], RunningMeans()
    start_step, elapsed_before, resumed_from = 0, 0.0, None
    saved = _load_resume(paths.resume, fingerprint)
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        sampler.load_state_dict(saved["sampler"])
        torch.set_rng_state(saved["torch_rng"])
        if device.type == "cuda" and saved.get("cuda_rng") is not None:
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        trajectory = Trajectory.from_dict(saved["trajectory"])
        history, running = saved["history"], RunningMeans(**saved["running"])
        hooks.load_state_dict(saved["hooks"])
        start_step = resumed_from = saved["step"]
        elapsed_before = saved["elapsed_s"]

    def checkpoint(step: int) -> None:
        train_loss, train_acc = running.pop()
        test_loss, test_acc = evaluate_split(model, data.x_test, data.y_test)
        row = {
            "step": step,
            "train_loss": train_loss,
            "train_acc": train_acc,
            "test_loss": test_loss,
            "test_acc": test_acc,
            "lr": cfg.lr * lr_factor(step, cfg),  # the learning rate of the next step
        }
        history.append(row)
        trajectory.capture(step, hooks.snapshot(model))
        if on_checkpoint is not None:
            # lr is logged only when it changes (a constant is a run parameter, not a metric).
            logged = {k: v for k, v in row.items() if k != "step" and (k != "lr" or lr_varies)}
            on_checkpoint(logged, step)

    started = time.perf_counter()
    if start_step == 0:
        checkpoint(0)
    status, diverged_step = "completed", None
    model.train()
    bar = tqdm(total=cfg.steps, initial=start_step, desc=description, disable=not progress)
    step = start_step
    while step < cfg.steps:
        # --- the step -------------------------------------------------------------------------
        indices = sampler.next_indices()
        if on_accelerator:
            indices = indices.to(device)
        inputs, targets = data.x_train[indices], data.y_train[indices]
        logits = model(inputs)
        loss = task_loss = F.cross_entropy(logits, targets)
        extra = hooks.extra_loss(logits, inputs, targets)  # hook: e.g. distillation
        if extra is not None:
            loss = task_loss + extra
        loss_value = task_loss.item()
        if not (math.isfinite(loss_value) and (extra is None or math.isfinite(loss.item()))):
            status, diverged_step = "diverged", step + 1
            break
        optimizer.zero_grad(set_to_none=True)
        if lr_varies:  # the schedule is a function of the step: nothing to save for resume
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * lr_factor(step, cfg)
        loss.backward()
        if cfg.grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        hooks.after_backward(step)  # hook: e.g. SR-STE decay of pruned weights
        optimizer.step()
        hooks.after_step(step)  # hook: e.g. N:M mask refresh
        step += 1
        running.add(loss_value, logits, targets)
        # --- checkpointing and resume state ---------------------------------------------------
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            checkpoint(step)
            bar.update(step - bar.n)
            bar.set_postfix(test_acc=f"{history[-1]['test_acc']:.3f}", refresh=False)
        if step % cfg.resume_every == 0 and step < cfg.steps:
            elapsed = elapsed_before + time.perf_counter() - started
            _save_resume(
                paths.resume,
                fingerprint,
                step,
                model,
                optimizer,
                sampler,
                trajectory,
                history,
                running,
                hooks,
                elapsed,
            )
    bar.close()
    wall_time = elapsed_before + time.perf_counter() - started
    summary = {
        "status": status,
        "diverged_step": diverged_step,
        "steps": cfg.steps,
        "steps_done": step,
        "n_checkpoints": len(history),
        "n_params": count_parameters(model),
        "wall_time_s": wall_time,
        "steps_per_s": step / wall_time if wall_time > 0 else math.nan,
        "resumed_from_step": resumed_from,
        "final": history[-1],
    }
    _write_outputs(paths, model, trajectory, history, summary, model_info or {}, hooks)
    paths.resume.unlink(missing_ok=True)
    return summary


def _write_outputs(
    paths: TrainPaths,
    model: nn.Module,
    trajectory: Trajectory,
    history: list[dict[str, float]],
    summary: dict[str, Any],
    model_info: dict[str, Any],
    hooks: TrainHooks,
) -> None:
    save_torch(trajectory.to_dict(), paths.trajectory)
    hooks.save_model(model, paths.model, model_info)
    frame = pd.DataFrame(history, columns=list(history[0]))
    write_atomic(paths.history, lambda tmp: frame.to_csv(tmp, index=False))
    save_json(summary, paths.summary)


def _save_resume(path: Path, fingerprint: str, step: int, model: nn.Module,
                 optimizer: torch.optim.Optimizer, sampler: BatchSampler,
                 trajectory: Trajectory, history: list, running: RunningMeans, hooks: TrainHooks,
                 elapsed: float) -> None:  # fmt: skip
    save_torch(
        {
            "fingerprint": fingerprint,
            "step": step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "sampler": sampler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
            "trajectory": trajectory.to_dict(),
            "history": history,
            "running": running.state_dict(),
            "hooks": hooks.state_dict(),
            "elapsed_s": elapsed,
        },
        path,
    )


def _load_resume(path: Path, fingerprint: str) -> dict[str, Any] | None:
    if not path.exists():
        return None
    saved = load_torch(path)
    if saved.get("fingerprint") != fingerprint:
        return None  # a different configuration: start over (the file is replaced later)
    return saved


def load_trajectory(path: str | Path) -> dict[str, Any]:
    """Read a saved trajectory: ``{"step": LongTensor[n], "state": {name: Tensor[n, ...]}}``."""
    return load_torch(path)
