"""The checks of the grid itself: each entry's task has the sections it needs and data it can
read, its archs and methods are registered (with their stages' settings present) and its seeds are
whole and distinct; no cell is defined twice."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from trainmap import data as data_module
from trainmap import methods, models
from trainmap.errors import ConfigError, did_you_mean
from trainmap.grid.blocks import BLOCK_RULES
from trainmap.grid.cells import Cell, expand_grid, seed_block, seed_ranges_of
from trainmap.grid.data_checks import check_data_package, check_data_path, task_input_kind
from trainmap.grid.section_checks import check_stage_settings


def check_grid_entry(config: dict, index: int, entry: dict, base_dir: Path) -> None:
    """``grid[index]`` (``entry``): its task has data, train and evaluate settings, its data kind's
    package imports and its local files (relative to ``base_dir``) are there, its seeds are whole
    and distinct, its archs fit the task's input and its methods are registered, each with its
    stages' settings for the task. Raises :class:`ConfigError` on the first problem."""
    where = f"grid[{index}]"
    task = entry["task"]
    for section in ("data", "train", "evaluate"):
        if task not in config[section]:
            defined = ", ".join(sorted(config[section])) or "none"
            raise ConfigError(
                f"config key {where}.task: task {task!r} has no '{section}' settings; "
                f"tasks with {section} settings: {defined}"
                f"{did_you_mean(task, config[section])}. Add {section}.{task} to params.yaml."
            )
    kind = config["data"][task]["kind"]
    spec = data_module.data_kind(kind)
    if spec.reads is not None:
        check_data_path(task, spec, config["data"][task].get("path"), base_dir)
    check_data_package(task, kind)
    input_kind = task_input_kind(config, task, base_dir)
    _check_seeds(where, entry["seeds"])
    for position, arch in enumerate(entry["archs"]):
        try:
            models.check_arch(arch, input_kind)
        except ValueError as error:
            raise ConfigError(
                f"config key {where}.archs[{position}]: {error}"
                f"{did_you_mean(arch, models.ARCHITECTURES)}"
            ) from None
    for position, method in enumerate(entry["methods"]):
        try:
            spec = methods.check_method(method)
        except ValueError as error:
            raise ConfigError(
                f"config key {where}.methods[{position}]: {error}"
                f"{did_you_mean(method, methods.METHODS)}"
            ) from None
        for stage in spec.stages:
            check_stage_settings(config, stage, task, method)


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


def check_unique_cells(config: dict) -> None:
    """No cell (task, arch, method, seed) is defined by two grid entries; raises
    :class:`ConfigError` naming the first repeat and the entry that defined it."""
    seen: dict[Cell, int] = {}
    for index, entry in enumerate(config["grid"]):
        for cell in expand_grid({"grid": [entry]}):
            if cell in seen:
                raise ConfigError(
                    f"config key grid[{index}]: cell {cell.id} is already defined by "
                    f"grid[{seen[cell]}]; each (task, arch, method, seed) may appear once"
                )
            seen[cell] = index


#: The most block jobs a study may plan: Snakemake's dry run of a 4-rule grid took 32 s and 700 MB
#: at 40,000 jobs and grows about linearly (FACTS: dry-run scaling), so 100,000 jobs is a DAG of
#: minutes and a few GB; a grid past it is a typo or a study to split.
MAX_JOBS = 100_000


def check_job_count(config: dict) -> None:
    """Refuse a grid whose block rules (:data:`~trainmap.grid.blocks.BLOCK_RULES`) would plan more
    than :data:`MAX_JOBS` jobs, before Snakemake builds their DAG: raises :class:`ConfigError`
    naming the count, the task with the most jobs and its ``train.<task>.seed_block``. Counting
    costs one pass over the grid's cells."""
    cells = expand_grid(config)
    per_task: dict[str, int] = {}
    for rule in BLOCK_RULES:
        for block in seed_ranges_of(config, rule.cells(config, cells)):
            per_task[block.task] = per_task.get(block.task, 0) + 1
    total = sum(per_task.values())
    if total <= MAX_JOBS:
        return
    task = max(per_task, key=per_task.get)
    raise ConfigError(
        f"config key grid: {total:,} jobs planned ({len(cells):,} cells; {per_task[task]:,} of "
        f"the jobs are task {task}'s, {seed_block(config, task)} seed(s) a job); allowed: at most "
        f"{MAX_JOBS:,} a study: raise train.{task}.seed_block (seeds per job), or split the grid "
        "into studies of their own (one config file each)"
    )
