"""The checks of the analysis sections against the grid: joint comparisons (names, registered
archs and methods, what the grid runs, adaptive seeds), ``paper`` entries, the checkpoint cuts and
``reproducible`` halves each map's runs allow, and ``analysis.features``."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from trainmap import methods, models
from trainmap.errors import ConfigError, did_you_mean
from trainmap.grid.cells import (
    MIN_RUNS_PER_GROUP,
    AdaptiveJoint,
    Cell,
    adaptive_joints,
    analysis_groups,
    analysis_settings,
    expand_grid,
    in_joint,
    joint_comparisons,
    joint_labels,
    joint_settings,
    method_retrains,
    paper_groups,
    retrains,
    run_checkpoints,
)
from trainmap.schema import section_defaults


def check_paper(config: dict) -> None:
    """``paper``: each entry names one of the paper's settings, once, and a group of the grid
    with enough runs for a map."""
    from trainmap.dynamics.paper import check_setting

    filled = paper_groups(config)
    seen: set[str] = set()
    for index, spec in enumerate(config.get("paper", [])):
        where, setting = f"config key paper[{index}]", spec["setting"]
        try:
            check_setting(setting)
        except ValueError as error:
            raise ConfigError(f"{where}.setting: {error}") from None
        if setting in seen:
            raise ConfigError(f"{where}.setting: {setting!r} is named twice; each of the paper's "
                              "settings is one row of results/paper/table.md")  # fmt: skip
        seen.add(setting)
        group = f"{spec['task']}/{spec['arch']}/{spec['method']}"
        if len(filled[setting]) < MIN_RUNS_PER_GROUP:
            raise ConfigError(
                f"{where}: the grid trains {len(filled[setting])} run(s) of {group}; the map of "
                f"setting {setting!r} needs at least {MIN_RUNS_PER_GROUP} (the paper: 40): add "
                f"{{task: {spec['task']}, archs: [{spec['arch']}], methods: [{spec['method']}], "
                "seeds: [...]}} to grid, or fix the entry's task, arch or method"
            )


def check_joint_comparisons(config: dict) -> None:
    """Names unique and known to the registries (errors); comparisons the grid cannot fill are
    skipped with a warning, so a grid file that replaces the default grid keeps working."""
    cells = [cell for cell in expand_grid(config) if retrains(cell)]
    filled = joint_comparisons(config)
    adaptive = adaptive_joints(config)
    seen: set[str] = set()
    for index, spec in enumerate(config.get("analysis", {}).get("joint", [])):
        where = f"analysis.joint[{index}]"
        if spec["name"] in seen:
            raise ConfigError(f"config key {where}.name: {spec['name']!r} is used twice; names "
                              "must be unique (they name the results/joint/<name> directory)")  # fmt: skip
        seen.add(spec["name"])
        if "task" not in spec and spec.get("external"):
            continue  # external run sets alone (trainmap.grid.external checks them)
        if "task" not in spec:
            raise ConfigError(f"config key {where}: no task; a joint comparison pools the runs "
                              "of one task (task: ...) and/or external run sets (external: "
                              "[...])")  # fmt: skip
        if spec["task"] not in config["data"]:  # a typo, not merely a task absent from the grid
            raise ConfigError(
                f"config key {where}.task: unknown task {spec['task']!r} (no data.{spec['task']} "
                f"defines it); tasks: {', '.join(sorted(config['data']))}"
                f"{did_you_mean(spec['task'], config['data'])}"
            )
        for key, registry in (("archs", models.ARCHITECTURES), ("methods", methods.METHODS)):
            check = models.check_arch if key == "archs" else methods.check_method
            for position, name in enumerate(spec.get(key, [])):
                try:
                    check(name)
                except ValueError as error:
                    raise ConfigError(f"config key {where}.{key}[{position}]: {error}"
                                      f"{did_you_mean(name, registry)}") from None  # fmt: skip
        _check_joint_against_grid(config, where, spec)
        if spec.get("adaptive"):
            _check_adaptive(config, where, spec, adaptive)
        if spec["name"] not in filled:
            found = sum(1 for cell in cells if in_joint(cell, spec))
            warnings.warn(
                f"config key {where} ({spec['name']!r}): the grid has {found} trained run(s) of "
                f"task {spec['task']!r} with these archs/methods; a joint training map needs at "
                f"least {MIN_RUNS_PER_GROUP}, so it is skipped",
                stacklevel=2,
            )


def _check_adaptive(
    config: dict, where: str, spec: Mapping[str, Any], joints: Mapping[str, AdaptiveJoint]
) -> None:  # fmt: skip
    """An adaptive joint comparison can grow: the stability curve is on, its maximum is not below
    the grid's seeds per method, and every adaptive comparison of its task adds seeds in the same
    step (their added seeds are shared). The schema checks the values' types and ranges."""
    default = section_defaults("analysis")["stability"]  # the schema's, where the config sets none
    if not config.get("analysis", {}).get("stability", default):
        raise ConfigError(f"config key {where}.adaptive: adaptive seeds stop when the stability "
                          "curve meets its target, but analysis.stability is 0 (no curve); set "
                          "analysis.stability to the subsamples per seed count, e.g. 20")  # fmt: skip
    joint = joints.get(spec["name"])
    if joint is None:
        return  # no cells of the grid: skipped with a warning (nothing to grow)
    if joint.max < joint.base_n:
        raise ConfigError(f"config key {where}.adaptive.max: {joint.max} is below the "
                          f"{joint.base_n} seeds per method the grid already has; raise it (or "
                          "drop adaptive)")  # fmt: skip
    for other in joints.values():
        if other.task == joint.task and other.step != joint.step:
            raise ConfigError(f"config key {where}.adaptive.step: {joint.step} differs from "
                              f"adaptive joint comparison {other.name!r} of the same task (step "
                              f"{other.step}); both add the same seeds, so they need the same "
                              "step")  # fmt: skip


def _check_joint_against_grid(config: dict, where: str, spec: Mapping[str, Any]) -> None:
    """A joint comparison compares what the grid runs: each named method must have a training
    trajectory, and once the grid runs any of the comparison's groups it must run every named
    method and arch of its task (else the "comparison" would silently shrink, e.g. to one
    method). A comparison none of whose groups the grid runs (a grid file that replaces the
    default grid) is skipped with a warning instead (:func:`check_joint_comparisons`)."""
    for position, method in enumerate(spec.get("methods", [])):
        if not method_retrains(method):
            raise ConfigError(
                f"config key {where}.methods[{position}]: method {method!r} has no training "
                "trajectory (it prunes without retraining), so it has no path on a training map; "
                f"remove it from {where}.methods (its retraining twin, e.g. 'oneshot_ft', has one)"
            )
    in_task = [cell for cell in expand_grid(config) if cell.task == spec["task"]]
    if not any(in_joint(cell, spec) for cell in in_task):
        return
    for key, ran in (
        ("archs", {c.arch for c in in_task}),
        ("methods", {c.method for c in in_task}),
    ):
        for position, name in enumerate(spec.get(key, [])):
            if name not in ran:
                raise ConfigError(
                    f"config key {where}.{key}[{position}]: the grid runs no {key[:-1]} {name!r} "
                    f"on task {spec['task']!r} ({key} it runs there: {', '.join(sorted(ran))}), "
                    f"so joint comparison {spec['name']!r} would silently compare fewer groups; "
                    f"add {name!r} to the grid's {key} for {spec['task']!r} or remove it here "
                    "(a config file can replace the whole list: analysis: {joint: [...]})"
                )


def check_analysis_runs(config: dict) -> None:
    """Each map's runs allow its analysis settings: a checkpoint cut (``checkpoints_per_run``,
    ``first_n``) within the runs' checkpoints, and the ``reproducible`` rule's ``halves`` within
    the distinct splits of its runs into halves (per method in a joint comparison)."""
    from trainmap.dynamics.maps.hmm.splits import DEFAULT_HALVES, distinct_halvings

    maps = [
        (f"group {name}", analysis_settings(config), "analysis", {name: cells})
        for name, cells in analysis_groups(config).items()
    ]
    joints = joint_comparisons(config)
    for index, spec in enumerate(config.get("analysis", {}).get("joint", [])):
        cells = joints.get(spec["name"])
        if cells:
            by_group: dict[str, list[Cell]] = {}
            for cell, label in zip(cells, joint_labels(cells), strict=True):
                by_group.setdefault(label, []).append(cell)
            maps.append((f"joint comparison {spec['name']!r}", joint_settings(config, spec["name"]),
                         f"analysis.joint[{index}].analysis", by_group))  # fmt: skip
    for what, settings, where, groups in maps:
        cells = [cell for group in groups.values() for cell in group]
        shortest = min(run_checkpoints(config, cell) for cell in cells)
        per_run, first_n = settings.get("checkpoints_per_run"), settings.get("first_n")
        if per_run is not None and per_run > shortest:
            raise ConfigError(f"config key analysis.checkpoints_per_run: {per_run} is more than the "
                              f"{shortest} checkpoints of the shortest run of {what}; lower it to "
                              f"at most {shortest} or leave it null")  # fmt: skip
        if first_n is not None and first_n > (per_run or shortest):
            raise ConfigError(f"config key analysis.first_n: {first_n} is beyond the "
                              f"{per_run or shortest} checkpoints the runs of {what} have; lower "
                              "it or leave it null")  # fmt: skip
        if settings.get("selection") == "reproducible":
            sizes = [len({cell.seed for cell in group}) for group in groups.values()]
            halves = settings.get("halves")
            distinct = distinct_halvings(sizes, settings.get("half_size"))
            if min(sizes) < 2 or (halves is not None and halves > distinct):
                raise ConfigError(f"config key {where}.halves: {halves or DEFAULT_HALVES} splits into halves, but "
                                  f"the runs of {what} ({', '.join(map(str, sizes))} per group) "
                                  f"allow {distinct if min(sizes) >= 2 else 0} distinct ones; "
                                  "lower halves, add seeds or use selection holdout")  # fmt: skip


def check_features(config: dict) -> None:
    """``analysis.features`` names metrics that collect_metrics computes."""
    from trainmap.dynamics.metrics.weights import METRIC_NAMES

    for position, name in enumerate(config.get("analysis", {}).get("features", [])):
        if name not in METRIC_NAMES:
            raise ConfigError(
                f"config key analysis.features[{position}]: unknown metric {name!r}; allowed: "
                f"{', '.join(METRIC_NAMES)}{did_you_mean(name, METRIC_NAMES)}"
            )
