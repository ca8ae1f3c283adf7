"""What one training run is told: its hyperparameters (:class:`TrainConfig`, ``params.yaml:
train.<task>``) and where its outputs go (:class:`TrainPaths`).

Every field's default is the config schema's (``$defs/train_settings``), read once here: the
schema is the one place a training setting's default is written. Five settings are a task's recipe
that the schema requires in ``train.<task>`` (optimizer, lr, batch_size, steps, checkpoint_every);
they keep a default all the same, as the other thirteen do, because a stage's retraining
(``sparse.<task>.train``, a train-style mapping that may leave any key out) takes the schema's
default for one it leaves out, and ``TrainConfig()`` is what the grid completes such a mapping
with (:func:`trainmap.grid.with_train_defaults`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from trainmap.schema import section_defaults
from trainmap.training.archive import ArchivePolicy, checkpoint_steps

#: Settings that may differ between the seeds of one block: given as a list, seed ``s`` trains with
#: the value at position ``s`` mod the list's length (a sweep inside one block).
PER_SEED = ("lr", "momentum", "weight_decay")

#: The defaults of ``train.<task>``'s settings: the schema's (``$defs/train_settings``).
TRAIN_DEFAULTS: dict[str, Any] = section_defaults("train")


@dataclass(frozen=True)
class TrainConfig:
    """Training hyperparameters of one task (``params.yaml: train.<task>``); a setting of
    :data:`PER_SEED` is a number or a tuple of per-seed values (:meth:`for_seed`). An omitted
    setting takes the schema's default (:data:`TRAIN_DEFAULTS`)."""

    optimizer: str = TRAIN_DEFAULTS["optimizer"]
    lr: float | tuple[float, ...] = TRAIN_DEFAULTS["lr"]
    momentum: float | tuple[float, ...] = TRAIN_DEFAULTS["momentum"]
    betas: tuple[float, float] = tuple(TRAIN_DEFAULTS["betas"])
    weight_decay: float | tuple[float, ...] = TRAIN_DEFAULTS["weight_decay"]
    batch_size: int = TRAIN_DEFAULTS["batch_size"]
    steps: int = TRAIN_DEFAULTS["steps"]
    schedule: str = TRAIN_DEFAULTS["schedule"]
    warmup_steps: int = TRAIN_DEFAULTS["warmup_steps"]
    grad_clip: float | None = TRAIN_DEFAULTS["grad_clip"]
    checkpoint_every: int = TRAIN_DEFAULTS["checkpoint_every"]
    resume_every: int = TRAIN_DEFAULTS["resume_every"]
    device: str = TRAIN_DEFAULTS["device"]
    archive: ArchivePolicy = field(default_factory=ArchivePolicy)
    precision: str = TRAIN_DEFAULTS["precision"]
    deterministic: bool = TRAIN_DEFAULTS["deterministic"]
    #: the batch augmentation (``train.<task>.augment``; :mod:`trainmap.training.augment`), None
    #: when off
    augment: dict[str, Any] | None = TRAIN_DEFAULTS["augment"]
    #: the optimiser's parameter groups (``train.<task>.param_groups``;
    #: :mod:`trainmap.training.param_groups`)
    param_groups: str = TRAIN_DEFAULTS["param_groups"]

    @classmethod
    def from_dict(cls, settings: dict[str, Any]) -> TrainConfig:
        """Build from a config mapping; unknown keys are an error naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ValueError(f"unknown training settings {unknown}; allowed: {sorted(known)}")
        values = dict(settings)
        for key in ("betas", *PER_SEED):
            if isinstance(values.get(key), list):
                values[key] = tuple(values[key])
        values["archive"] = ArchivePolicy.from_value(values.get("archive"))
        return cls(**values)

    def for_seed(self, seed: int) -> TrainConfig:
        """This config with every per-seed setting (:data:`PER_SEED`) at ``seed``'s value: position
        ``seed`` mod the list's length."""
        chosen = {key: values[seed % len(values)] for key in PER_SEED
                  if isinstance(values := getattr(self, key), tuple)}  # fmt: skip
        return replace(self, **chosen) if chosen else self

    def seed_settings(self, seed: int) -> dict[str, float]:
        """The per-seed settings given as lists, at ``seed``'s values (empty when there are
        none)."""
        own = self.for_seed(seed)
        return {key: getattr(own, key) for key in PER_SEED if isinstance(getattr(self, key), tuple)}

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
