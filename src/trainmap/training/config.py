"""What one training run is told: its hyperparameters (:class:`TrainConfig`, ``params.yaml:
train.<task>``) and where its outputs go (:class:`TrainPaths`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from trainmap.training.archive import ArchivePolicy, checkpoint_steps

#: Settings that may differ between the seeds of one block: given as a list, seed ``s`` trains with
#: the value at position ``s`` mod the list's length (a sweep inside one block).
PER_SEED = ("lr", "momentum", "weight_decay")


@dataclass(frozen=True)
class TrainConfig:
    """Training hyperparameters of one task (``params.yaml: train.<task>``); a setting of
    :data:`PER_SEED` is a number or a tuple of per-seed values (:meth:`for_seed`)."""

    optimizer: str = "sgd"
    lr: float | tuple[float, ...] = 0.1
    momentum: float | tuple[float, ...] = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float | tuple[float, ...] = 0.0
    batch_size: int = 32
    steps: int = 1000
    schedule: str = "constant"
    warmup_steps: int = 0
    grad_clip: float | None = None
    checkpoint_every: int = 25
    resume_every: int = 1000
    device: str = "cpu"
    archive: ArchivePolicy = field(default_factory=ArchivePolicy)
    precision: str = field(default_factory=lambda: _schema_default("precision"))
    deterministic: bool = field(default_factory=lambda: _schema_default("deterministic"))
    #: the batch augmentation (``train.<task>.augment``; :mod:`trainmap.training.augment`), None
    #: when off
    augment: dict[str, Any] | None = None
    #: the optimiser's parameter groups (``train.<task>.param_groups``;
    #: :mod:`trainmap.training.param_groups`)
    param_groups: str = field(default_factory=lambda: _schema_default("param_groups"))

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


def _schema_default(key: str) -> Any:
    """The config schema's default of training setting ``key`` (declared there only)."""
    from trainmap.schema import section_defaults

    return section_defaults("train")[key]


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
