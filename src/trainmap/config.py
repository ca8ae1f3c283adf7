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
import importlib
import json
import os
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
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
#: A training map needs runs to fit on and at least one to hold out.
MIN_RUNS_PER_GROUP = 2


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

    @classmethod
    def of(cls, value: Cell | Mapping[str, Any]) -> Cell:
        """A cell from a Cell or a mapping with task, arch, method and seed (e.g. JSON)."""
        if isinstance(value, Cell):
            return value
        return cls(value["task"], value["arch"], value["method"], int(value["seed"]))

    def to_dict(self) -> dict[str, Any]:
        """``{"task", "arch", "method", "seed"}``: the JSON form :meth:`of` reads back."""
        return {"task": self.task, "arch": self.arch, "method": self.method, "seed": self.seed}

    @property
    def id(self) -> str:
        """The cell's path below a rule's results directory, e.g. ``digits/vgg_bn/kaiming/seed3``."""
        return f"{self.task}/{self.arch}/{self.method}/seed{self.seed}"


@dataclass(frozen=True, order=True)
class Block:
    """Seeds of one (task, arch, method) that run as one job: those of an aligned range of
    ``train.<task>.seed_block`` seeds, [k S, (k + 1) S - 1] (e.g. ``seeds0-31``). Aligned ranges
    keep a block's seeds fixed when seeds are added to or removed from other ranges."""

    task: str
    arch: str
    method: str
    first: int
    last: int
    seeds: tuple[int, ...]

    @classmethod
    def of(cls, value: Block | Mapping[str, Any]) -> Block:
        """A block from a Block or its JSON form (:meth:`to_dict`)."""
        if isinstance(value, Block):
            return value
        return cls(value["task"], value["arch"], value["method"], int(value["first"]),
                   int(value["last"]), tuple(int(seed) for seed in value["seeds"]))  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The JSON form :meth:`of` reads back."""
        return {"task": self.task, "arch": self.arch, "method": self.method,
                "first": self.first, "last": self.last, "seeds": list(self.seeds)}  # fmt: skip

    @property
    def name(self) -> str:
        """The block's wildcard value, e.g. ``seeds0-31``."""
        return f"seeds{self.first}-{self.last}"

    @property
    def id(self) -> str:
        """The block's path below a rule's results directory, e.g. ``digits/vgg_bn/ast/seeds0-31``."""
        return f"{self.task}/{self.arch}/{self.method}/{self.name}"

    @property
    def cells(self) -> list[Cell]:
        """The block's cells, in seed order."""
        return [Cell(self.task, self.arch, self.method, seed) for seed in self.seeds]


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
    for stage in STAGE_VALIDATORS:  # every task's stage settings, used by the grid or not
        for task in config.get(stage, {}):
            _validate_stage_settings(config, stage, task)
    _check_quantize(config)
    _check_joint_groups(config)


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


def canonical(settings: Any) -> Any:
    """``settings`` with every mapping's keys sorted (recursively; lists keep their order).

    Snakemake compares a job's params with the last run's by their text, and the order of keys
    depends on how config files were merged (``configfile:`` directives, then ``--configfile``):
    sorted keys make the same settings look the same, so nothing reruns for nothing.
    """
    if isinstance(settings, Mapping):
        return {key: canonical(settings[key]) for key in sorted(settings)}
    if isinstance(settings, list | tuple):
        return [canonical(item) for item in settings]
    return settings


def data_settings(config: dict, task: str) -> dict:
    """The data kind and options of ``task``."""
    return canonical(config["data"][task])


def model_settings(config: dict, task: str, arch: str) -> dict:
    """Builder options of ``arch`` on ``task`` (empty: the registry's defaults)."""
    return canonical(config["model"].get(task, {}).get(arch, {}))


def train_settings(config: dict, task: str) -> dict:
    """The training hyperparameters of ``task``: everything that determines a run's arithmetic.
    ``seed_block`` (how many seeds share a job) is left out: it never changes a run's result, so
    changing it must not make a run look different (see :func:`seed_block`)."""
    settings = canonical(config["train"][task])
    settings.pop("seed_block", None)
    return settings


def seed_block(config: dict, task: str) -> int:
    """How many seeds of ``task`` train together as one job (``train.<task>.seed_block``)."""
    return int(config["train"][task].get("seed_block", 1))


def blocks_of(config: dict, cells: Iterable[Cell]) -> list[Block]:
    """``cells`` grouped into :class:`Block` s: per (task, arch, method), the seeds of each aligned
    range of ``seed_block`` seeds; in (task, arch, method, first seed) order."""
    seeds: dict[tuple[str, str, str, int], list[int]] = {}
    for cell in set(cells):
        size = seed_block(config, cell.task)
        first = cell.seed - cell.seed % size
        seeds.setdefault((cell.task, cell.arch, cell.method, first), []).append(cell.seed)
    return [
        Block(task, arch, method, first, first + seed_block(config, task) - 1, tuple(sorted(found)))
        for (task, arch, method, first), found in sorted(seeds.items())
    ]


def trained_cells(config: dict) -> list[Cell]:
    """Every dense cell the grid trains: its dense cells and the teachers of its sparse cells."""
    cells = expand_grid(config)
    dense = {teacher_cell(cell) if is_sparse(cell) else cell for cell in cells}
    return sorted(dense)


def evaluate_settings(config: dict, task: str) -> dict:
    """The evaluation settings of ``task``."""
    return canonical(config["evaluate"][task])


def analysis_settings(config: dict) -> dict:
    """The training-map settings (``analysis``)."""
    return canonical(config.get("analysis", {}))


def stage_settings(config: dict, stage: str, task: str) -> dict:
    """The hyperparameters of a method stage (``gradinit`` or ``sparse``) on ``task``."""
    return canonical(config.get(stage, {}).get(task, {}))


def method_of(cell: Cell) -> methods.MethodSpec:
    """The registry entry of the cell's method."""
    return methods.check_method(cell.method)


def is_sparse(cell: Cell) -> bool:
    """Whether the cell's model comes from the ``sparse`` stage (retraining a dense teacher)."""
    return method_of(cell).has_stage("sparse")


def retrains(cell: Cell) -> bool:
    """Whether the cell trains at all, i.e. has a trajectory (one-shot pruning does not)."""
    spec = method_of(cell)
    return not spec.has_stage("sparse") or bool(spec.options.get("retrain"))


def methods_with_stage(stage: str) -> str:
    """A regex matching exactly the methods that have ``stage`` (for wildcard constraints)."""
    return "|".join(name for name, spec in methods.METHODS.items() if spec.has_stage(stage))


def methods_without_stage(stage: str) -> str:
    """A regex matching exactly the methods that do not have ``stage``."""
    return "|".join(name for name, spec in methods.METHODS.items() if not spec.has_stage(stage))


def teacher_cell(cell: Cell) -> Cell:
    """The dense cell whose trained model a sparse cell starts from (same task, arch and seed)."""
    return Cell(cell.task, cell.arch, methods.DENSE_BASE_METHOD, cell.seed)


def has_deploy_form(arch: str) -> bool:
    """Whether ``arch`` is re-parameterised into a deploy form after training (RepVGG)."""
    return bool(getattr(models.ARCHITECTURES[arch], "deploy_form", False))


def quantized_schemes(config: dict, cell: Cell) -> list[str]:
    """The quantisation schemes applied to the cell's final model: the configured schemes when its
    method is in ``quantize.methods`` and (if given) its arch in ``quantize.archs``; else none."""
    settings = config.get("quantize", {})
    selected = cell.method in settings.get("methods", []) and (
        "archs" not in settings or cell.arch in settings["archs"]
    )
    return list(settings.get("schemes", [])) if selected else []


def analysis_groups(config: dict) -> dict[str, list[Cell]]:
    """Training-map groups: one per (task, arch, method) with at least two trajectories.

    Cells without a trajectory (one-shot pruning) have no training path to map.
    """
    groups: dict[str, list[Cell]] = {}
    for cell in expand_grid(config):
        if retrains(cell):
            groups.setdefault(f"{cell.task}/{cell.arch}/{cell.method}", []).append(cell)
    return {name: cells for name, cells in groups.items() if len(cells) >= MIN_RUNS_PER_GROUP}


def _in_joint(cell: Cell, spec: Mapping[str, Any]) -> bool:
    return (
        cell.task == spec["task"]
        and cell.arch in spec.get("archs", [cell.arch])
        and cell.method in spec.get("methods", [cell.method])
    )


def joint_groups(config: dict) -> dict[str, list[Cell]]:
    """Joint comparisons (``analysis.joint``): the pooled trained cells of several archs/methods of
    one task; groups with fewer than two runs in the grid are left out (check_config warns)."""
    cells = [cell for cell in expand_grid(config) if retrains(cell)]
    joint = {}
    for spec in config.get("analysis", {}).get("joint", []):
        pooled = [cell for cell in cells if _in_joint(cell, spec)]
        if len(pooled) >= MIN_RUNS_PER_GROUP:
            joint[spec["name"]] = pooled
    return joint


def cell_hash(config: dict, cell: Cell) -> str:
    """A short hash of everything that determines a cell's trained model (data, model, training,
    and the settings of the cell's method stages)."""
    payload = {
        "cell": cell.id,
        "data": data_settings(config, cell.task),
        "model": model_settings(config, cell.task, cell.arch),
        "train": train_settings(config, cell.task),
    }
    for stage in method_of(cell).stages:
        payload[stage] = stage_settings(config, stage, cell.task)
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
        try:
            models.check_arch(arch, input_kind)
        except ValueError as error:
            raise ConfigError(f"config key {where}.archs[{position}]: {error}") from None
        # Fix: bad builder options used to be reported against grid[i].archs[j]; the key to fix is
        # model.<task>.<arch>, so check the options separately and name that key.
        options = model_settings(config, task, arch)
        try:
            models.check_arch(arch, input_kind, options)
        except ValueError as error:
            raise ConfigError(f"config key model.{task}.{arch}: {error}") from None
    for position, method in enumerate(entry["methods"]):
        try:
            spec = methods.check_method(method)
        except ValueError as error:
            raise ConfigError(f"config key {where}.methods[{position}]: {error}") from None
        for stage in spec.stages:
            _check_stage_settings(config, stage, task, method)
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
    # Fix: JSON schema's "integer" accepts 2.0, which became a cell "seed2.0" that no rule's
    # seed=\d+ wildcard matches (Snakemake then failed with a puzzling MissingInputException).
    for position, seed in enumerate(seeds):
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(
                f"config key {where}.seeds[{position}]: {seed!r} is not an integer seed; "
                "write seeds as whole numbers (0, 1, 2), without a decimal point"
            )
    repeated = sorted(seed for seed, count in Counter(seeds).items() if count > 1)
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


#: The function that validates (and completes with defaults) each method stage's settings.
STAGE_VALIDATORS = {
    "gradinit": "trainmap.gradinit:check_settings",
    "sparse": "trainmap.sparse:check_settings",
}


def _check_stage_settings(config: dict, stage: str, task: str, method: str) -> None:
    if task not in config.get(stage, {}):
        raise ConfigError(
            f"config key {stage}.{task}: method {method!r} needs {stage} settings for task "
            f"{task!r}; add {stage}.{task} to params.yaml (an empty mapping takes the defaults)"
        )


def _validate_stage_settings(config: dict, stage: str, task: str) -> None:
    module_name, function_name = STAGE_VALIDATORS[stage].split(":")
    validate = getattr(importlib.import_module(module_name), function_name)
    try:
        validate(config[stage][task])
    except ValueError as error:
        raise ConfigError(f"config key {stage}.{task}: {error}") from None


def _check_quantize(config: dict) -> None:
    from trainmap.quantize import SCHEMES

    settings = config.get("quantize", {})
    for position, method in enumerate(settings.get("methods", [])):
        try:
            methods.check_method(method)
        except ValueError as error:
            raise ConfigError(f"config key quantize.methods[{position}]: {error}") from None
    for position, arch in enumerate(settings.get("archs", [])):
        try:
            models.check_arch(arch)
        except ValueError as error:
            raise ConfigError(f"config key quantize.archs[{position}]: {error}") from None
    for position, scheme in enumerate(settings.get("schemes", [])):
        if scheme not in SCHEMES:
            raise ConfigError(f"config key quantize.schemes[{position}]: unknown scheme "
                              f"{scheme!r}; allowed: {', '.join(sorted(SCHEMES))}")  # fmt: skip


def _check_joint_groups(config: dict) -> None:
    """Names unique and known to the registries (errors); groups the grid cannot fill are skipped
    with a warning, so a grid file that replaces the default grid keeps working."""
    cells = [cell for cell in expand_grid(config) if retrains(cell)]
    filled = joint_groups(config)
    seen: set[str] = set()
    for index, spec in enumerate(config.get("analysis", {}).get("joint", [])):
        where = f"analysis.joint[{index}]"
        if spec["name"] in seen:
            raise ConfigError(f"config key {where}.name: {spec['name']!r} is used twice; names "
                              "must be unique (they name the results/joint/<name> directory)")  # fmt: skip
        seen.add(spec["name"])
        for key, check in (("archs", models.check_arch), ("methods", methods.check_method)):
            for position, name in enumerate(spec.get(key, [])):
                try:
                    check(name)
                except ValueError as error:
                    raise ConfigError(f"config key {where}.{key}[{position}]: {error}") from None
        if spec["name"] not in filled:
            found = sum(1 for cell in cells if _in_joint(cell, spec))
            warnings.warn(
                f"config key {where} ({spec['name']!r}): the grid has {found} trained run(s) of "
                f"task {spec['task']!r} with these archs/methods; a joint training map needs at "
                f"least {MIN_RUNS_PER_GROUP}, so it is skipped",
                stacklevel=2,
            )


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
