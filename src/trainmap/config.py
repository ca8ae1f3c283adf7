"""The study configuration: one grid, validated before anything runs.

A configuration is ``params.yaml`` (hyperparameters per task, the file DVC tracks) extended by a grid
file (``config/config.yaml`` by default), exactly as Snakemake merges ``configfile:`` directives and
``--configfile``: mappings merge key by key, lists (the grid) are replaced whole.

Validation has two layers. The JSON schema in ``workflow/schemas/config.schema.yaml`` checks types and
ranges (Snakemake runs it through ``snakemake.utils.validate``). :func:`check_config` checks what a
schema cannot: names unknown to the model/method/data registries, duplicate seeds or cells, tasks
without hyperparameters, data paths that do not exist, options a builder does not take. Every error
names the key, the bad value and what is allowed, and is raised at parse time, before any job starts.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from trainmap import data as data_module
from trainmap import methods, models

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"
READER_KINDS = {"mnist", "cifar10", "cifar100"}


class ConfigError(ValueError):
    """A configuration value that cannot run; the message names key, value and the fix."""


@dataclass(frozen=True, order=True)
class Cell:
    """One grid cell: a task trained with one architecture, method and seed."""

    task: str
    arch: str
    method: str
    seed: int

    @classmethod
    def from_wildcards(cls, wildcards: Any) -> Cell:
        """The cell a Snakemake job's ``{task}/{arch}/{method}/seed{seed}`` wildcards name."""
        return cls(wildcards.task, wildcards.arch, wildcards.method, int(wildcards.seed))

    @property
    def id(self) -> str:
        """The cell's path below a rule's results directory, e.g. ``digits/vgg_bn/kaiming/seed3``."""
        return f"{self.task}/{self.arch}/{self.method}/seed{self.seed}"


def merge_config(base: dict, override: dict) -> dict:
    """Snakemake's merge: mappings merge recursively, every other value (lists too) is replaced."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_config(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_config(*paths: str | os.PathLike, check_paths_from: Path | None = None) -> dict:
    """Merge YAML files left to right (params.yaml first), validate and return the config."""
    config: dict = {}
    for path in paths:
        with open(path) as handle:
            config = merge_config(config, yaml.safe_load(handle) or {})
    validate_schema(config)
    check_config(config, base_dir=check_paths_from or Path.cwd())
    return config


def validate_schema(config: dict) -> None:
    """Check ``config`` against the JSON schema; the error names the key path and the bad value."""
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        error = errors[0]
        raise ConfigError(
            f"config key {_key(error.absolute_path) or '(top level)'}: {error.message}"
            f" (schema: {SCHEMA_PATH.relative_to(REPO_ROOT)})"
        )


def check_config(config: dict, base_dir: Path | None = None) -> None:
    """Semantic checks a schema cannot express; raises :class:`ConfigError` on the first problem."""
    base_dir = base_dir or Path.cwd()
    for index, entry in enumerate(config["grid"]):
        _check_grid_entry(config, index, entry, base_dir)
    _check_unique_cells(config)


def expand_grid(config: dict) -> list[Cell]:
    """Every (task, arch, method, seed) cell of the grid, in grid order."""
    return [
        Cell(entry["task"], arch, method, seed)
        for entry in config["grid"]
        for arch in entry["archs"]
        for method in entry["methods"]
        for seed in entry["seeds"]
    ]


def grid_tasks(config: dict) -> list[str]:
    """The tasks of the grid, each once, in grid order."""
    return list(dict.fromkeys(entry["task"] for entry in config["grid"]))


def data_settings(config: dict, task: str) -> dict:
    """The data kind and options of ``task``."""
    return dict(config["data"][task])


def model_settings(config: dict, task: str, arch: str) -> dict:
    """Builder options of ``arch`` on ``task`` (empty: the registry's defaults)."""
    return dict(config["model"].get(task, {}).get(arch, {}))


def train_settings(config: dict, task: str) -> dict:
    """The training hyperparameters of ``task``."""
    return dict(config["train"][task])


def evaluate_settings(config: dict, task: str) -> dict:
    """The evaluation settings of ``task``."""
    return dict(config["evaluate"][task])


def cell_hash(config: dict, cell: Cell) -> str:
    """A short hash of everything that determines a cell's trained model (data, model, training)."""
    payload = {
        "cell": cell.id,
        "data": data_settings(config, cell.task),
        "model": model_settings(config, cell.task, cell.arch),
        "train": train_settings(config, cell.task),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def _check_grid_entry(config: dict, index: int, entry: dict, base_dir: Path) -> None:
    where = f"grid[{index}]"
    task = entry["task"]
    for section in ("data", "train", "evaluate"):
        if task not in config[section]:
            defined = ", ".join(sorted(config[section])) or "none"
            raise ConfigError(
                f"config key {where}.task: task {task!r} has no '{section}' settings; "
                f"tasks with {section} settings: {defined}. Add {section}.{task} to params.yaml."
            )
    input_kind = _check_data(config, task, base_dir)
    _check_seeds(where, entry["seeds"])
    for position, arch in enumerate(entry["archs"]):
        options = model_settings(config, task, arch)
        try:
            models.check_arch(arch, input_kind, options)
        except ValueError as error:
            raise ConfigError(f"config key {where}.archs[{position}]: {error}") from None
    for position, method in enumerate(entry["methods"]):
        try:
            methods.check_method(method)
        except ValueError as error:
            raise ConfigError(f"config key {where}.methods[{position}]: {error}") from None
    _check_train(task, train_settings(config, task))


def _check_data(config: dict, task: str, base_dir: Path) -> str:
    settings = data_settings(config, task)
    kind = settings.pop("kind")
    if kind not in data_module.DATA_KINDS:
        allowed = ", ".join(sorted(data_module.DATA_KINDS))
        raise ConfigError(
            f"config key data.{task}.kind: unknown data kind {kind!r}; allowed: {allowed}"
        )
    allowed_options = data_module.data_kind_options(kind)
    for option in settings:
        if option not in allowed_options:
            raise ConfigError(
                f"config key data.{task}.{option}: data kind {kind!r} takes no option {option!r}; "
                f"allowed: {', '.join(sorted(allowed_options))}"
            )
    if kind in READER_KINDS:
        _check_data_path(task, kind, settings.get("path"), base_dir)
    return data_module.input_kind_of(kind)


def _check_data_path(task: str, kind: str, path: Any, base_dir: Path) -> None:
    if not path:
        raise ConfigError(
            f"config key data.{task}.path: data kind {kind!r} reads local files and needs a path "
            f"(a directory holding the standard {kind} files); nothing is downloaded"
        )
    resolved = Path(path) if Path(path).is_absolute() else base_dir / path
    if not resolved.is_dir():
        raise ConfigError(
            f"config key data.{task}.path: directory {str(path)!r} does not exist "
            f"(looked in {resolved}); put the {kind} files there or fix the path"
        )


def _check_seeds(where: str, seeds: list[int]) -> None:
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise ConfigError(
            f"config key {where}.seeds: duplicate seeds {repeated}; each seed may appear once"
        )


def _check_unique_cells(config: dict) -> None:
    seen: dict[Cell, int] = {}
    for index, entry in enumerate(config["grid"]):
        for cell in expand_grid({"grid": [entry]}):
            if cell in seen:
                raise ConfigError(
                    f"config key grid[{index}]: cell {cell.id} is already defined by "
                    f"grid[{seen[cell]}]; each (task, arch, method, seed) may appear once"
                )
            seen[cell] = index


def _check_train(task: str, settings: dict) -> None:
    if settings["checkpoint_every"] > settings["steps"]:
        raise ConfigError(
            f"config key train.{task}.checkpoint_every: {settings['checkpoint_every']} exceeds "
            f"train.{task}.steps = {settings['steps']}; a trajectory needs checkpoints"
        )
    if settings.get("warmup_steps", 0) >= settings["steps"]:
        raise ConfigError(
            f"config key train.{task}.warmup_steps: {settings['warmup_steps']} must be below "
            f"train.{task}.steps = {settings['steps']}"
        )


def _key(path: Any) -> str:
    parts = []
    for part in path:
        parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
    return "".join(parts).lstrip(".")
