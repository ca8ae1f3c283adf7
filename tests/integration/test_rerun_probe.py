"""Integration: the rerun probe. Every setting of params.yaml, changed one at a time over the
finished smoke grid, reruns exactly what it feeds: the rules that read it (their params or inputs
changed) and what depends on those (their inputs are remade), nothing else, and no rule for a
setting of a task the grid does not run. Each rule a setting reaches lives in a DVC stage that
declares the setting's section, so `dvc exp run -S key=value` runs that stage, and the content
hashes of the block manifests (trainmap.lineage) carry the change through the stages after it
(tests/integration/test_dvc.py shows that with real runs).

The probe plans each change with Snakemake's own DAG (a dry run through its API, in this process:
~1 s a key instead of ~5 s for a `snakemake -n` process), from the reasons Snakemake gives per job.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import SMOKE

from trainmap.errors import ConfigError
from trainmap.grid import Cell, expand_grid, load_config, method_of

pytestmark = pytest.mark.integration

#: The sections of params.yaml whose settings reach rules (``dvc`` holds DVC's own).
SECTIONS = ("data", "model", "train", "evaluate", "gradinit", "sparse", "quantize", "analysis")

#: The DVC stages (dvc.yaml) in their order, and the stage whose target runs each rule (the rest
#: run in ``analysis``). A stage's `snakemake` call also runs what its target needs upstream.
STAGES = ("settings", "data", "gradinit", "train", "transform", "evaluate", "analysis")
STAGE_OF_RULE = {
    "effective_settings": "settings", "data": "data", "gradinit": "gradinit", "train": "train",
    "reparam": "transform", "sparse_retrain": "transform", "quantize": "transform",
    "flip_rates": "transform", "evaluate": "evaluate", "summary": "evaluate",
}  # fmt: skip


def leaves(tree: dict, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], object]]:
    if isinstance(tree, list):  # the grid's entries
        for entry in tree:
            yield from leaves(entry, prefix)
        return
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from leaves(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def get(tree: dict, path: tuple[str, ...]) -> object:
    for key in path:
        tree = tree[key]
    return tree


def nested(path: tuple[str, ...], value: object) -> dict:
    for key in reversed(path):
        value = {key: value}
    return value


def alternatives(value: object, same_name: set) -> list:
    """Other values a setting could take, most likely valid first."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value * 2, max(value - 1, 0)]
    if isinstance(value, float):
        return [value / 2, value * 2, value + 0.01] if value else [0.1, 1.0]
    if isinstance(value, list):
        if value and isinstance(value[0], dict):
            return []  # joint comparisons: each entry's settings are probed through analysis.*
        if value and isinstance(value[0], int | float) and not isinstance(value[0], bool):
            return [[value[0] + 1, *value[1:]], [v / 2 for v in value]]
        others = sorted(str(v) for v in same_name if v not in value)
        return ([value[:-1]] if len(value) > 1 else []) + [[*value, other] for other in others]
    if isinstance(value, str) or value is None:
        return sorted((v for v in same_name if v != value), key=str)
    return []


def values_by_name(tree: dict) -> dict[str, set]:
    """Every scalar value each leaf name takes anywhere in params.yaml: candidate enum values."""
    found: dict[str, set] = {}
    for path, value in leaves(tree):
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str | int | float | bool) or item is None:
                found.setdefault(path[-1], set()).add(item)
    return found


class Planner:
    """Snakemake's plan for the smoke grid with one extra config file, in this process."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def plan(self, overlay: Path | None) -> dict[str, set[str]]:
        """``{rule: reasons}`` of the jobs a run would run (``direct``: the job's own params or
        inputs changed; ``upstream``: an input is remade by another job; anything else by name)."""
        from snakemake.api import SnakemakeApi
        from snakemake.settings.types import (
            ConfigSettings,
            DAGSettings,
            OutputSettings,
            Quietness,
            ResourceSettings,
            StorageSettings,
        )

        files = [self.workdir / SMOKE] + ([overlay] if overlay else [])
        cwd = os.getcwd()
        try:
            with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
                workflow_api = api.workflow(
                    ResourceSettings(cores=2), ConfigSettings(configfiles=files),
                    StorageSettings(), snakefile=self.workdir / "Snakefile", workdir=self.workdir,
                )  # fmt: skip
                workflow_api.dag(DAGSettings()).execute_workflow(executor="dryrun")
                dag = workflow_api._workflow_store.dag
                planned: dict[str, set[str]] = {}
                for job in dag.needrun_jobs(exclude_finished=False):
                    if job.rule.name.startswith("all"):
                        continue
                    planned.setdefault(job.rule.name, set()).add(reason_kind(dag.reason(job)))
                return planned
        finally:
            os.chdir(cwd)


def reason_kind(reason) -> str:
    if reason.params_changed or reason.input_changed or reason.missing_output:
        return "direct"
    if reason.updated_input_run:
        return "upstream"
    return str(reason)


def schema_enums(workdir: Path) -> dict[str, set]:
    """The allowed values the config schema lists for each property name (enum candidates)."""
    found: dict[str, set] = {}

    def walk(node: object, name: str | None) -> None:
        if isinstance(node, dict):
            if name and isinstance(node.get("enum"), list):
                found.setdefault(name, set()).update(
                    v for v in node["enum"] if isinstance(v, str | int | float | bool)
                )
            for key, value in node.get("properties", {}).items():
                walk(value, key)
            for key, value in node.items():
                if key != "properties":
                    walk(value, name)
        elif isinstance(node, list):
            for item in node:
                walk(item, name)

    walk(yaml.safe_load((workdir / "workflow/schemas/config.schema.yaml").read_text()), None)
    return found


@pytest.fixture(scope="module")
def probe(smoke_run: Path, tmp_path_factory) -> dict[tuple[str, ...], dict | str]:
    return run_probe(smoke_run, tmp_path_factory.mktemp("probe"))


def run_probe(smoke_run: Path, scratch: Path) -> dict[tuple[str, ...], dict | str]:
    """Every leaf of params.yaml's rule sections, changed one at a time (to a value the config
    check accepts), and Snakemake's plan for it; the config error when no other value passes.

    The settings of a task no cell of the grid runs are planned together, one plan per task with
    all of them changed at once (the first value each passes with): no rule may rerun for the
    whole change, so none reruns for any part of it. Where the joint change fails the config
    check, each of its settings is planned alone."""
    params = yaml.safe_load((smoke_run / "params.yaml").read_text())
    base = (smoke_run / "params.yaml", smoke_run / "config/config.yaml", smoke_run / SMOKE)
    effective = load_config(*base, check_paths_from=smoke_run)
    cells = expand_grid(effective)
    candidates = values_by_name(params)
    for name, values in values_by_name(effective["grid"]).items():
        candidates.setdefault(name, set()).update(values)
    for name, values in schema_enums(smoke_run).items():
        candidates.setdefault(name, set()).update(values)
    planner = Planner(smoke_run)
    assert planner.plan(None) == {}, "the finished smoke grid has work left before any change"

    def passes(change: dict, name: str) -> str | None:
        """The config error for ``change`` as an overlay, or None when it passes."""
        overlay = scratch / name
        overlay.write_text(yaml.safe_dump(change))
        try:
            load_config(*base, overlay, check_paths_from=smoke_run)
        except (ConfigError, ValueError) as refused:
            return str(refused).splitlines()[0]
        return None

    results: dict[tuple[str, ...], dict | str] = {}
    outside: dict[str, dict[tuple[str, ...], object]] = {}  # task -> {key: accepted value}
    for section in SECTIONS:
        for path, _ in leaves(params[section], (section,)):
            error = "no other value"
            for value in alternatives(get(effective, path), candidates.get(path[-1], set())):
                refused = passes(nested(path, copy.deepcopy(value)), "overlay.yaml")
                if refused is None:
                    if reaches_grid(path, cells):
                        results[path] = planner.plan(scratch / "overlay.yaml")
                    else:
                        outside.setdefault(path[1], {})[path] = value
                    break
                error = refused
            else:
                results[path] = error
    for changes in outside.values():
        joint: dict = {}
        for path, value in changes.items():
            node = joint
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = copy.deepcopy(value)
        if passes(joint, "joint.yaml") is None:
            plan = planner.plan(scratch / "joint.yaml")
            results.update((path, plan) for path in changes)
            continue
        for path, value in changes.items():
            passes(nested(path, copy.deepcopy(value)), "overlay.yaml")
            results[path] = planner.plan(scratch / "overlay.yaml")
    (smoke_run / "rerun_probe.yaml").write_text(yaml.safe_dump(
        {".".join(k): ({rule: sorted(why) for rule, why in v.items()} if isinstance(v, dict)
                       else v) for k, v in results.items()}))  # fmt: skip
    return results


def reaches_grid(key: tuple[str, ...], cells: list[Cell]) -> bool:
    """Whether a cell of the grid reads setting ``key``: every analysis setting does; a task's
    setting does when a cell runs the task (and, for a method stage's, a method with that stage)."""
    if key[0] in ("analysis", "quantize"):
        return True
    task_cells = [cell for cell in cells if cell.task == key[1]]
    if key[0] in ("gradinit", "sparse"):
        return any(method_of(cell).has_stage(key[0]) for cell in task_cells)
    return bool(task_cells)


def test_every_setting_reruns_what_it_feeds_and_nothing_else(probe, smoke_run: Path) -> None:
    config = load_config(smoke_run / "params.yaml", smoke_run / "config/config.yaml",
                         smoke_run / SMOKE, check_paths_from=smoke_run)  # fmt: skip
    cells = expand_grid(config)
    unplanned = [k for k, v in probe.items() if isinstance(v, str)]
    assert len(unplanned) < len(probe) / 10, f"settings with no valid other value: {unplanned}"
    for key, plan in probe.items():
        if isinstance(plan, str):
            continue
        label = ".".join(key)
        for rule, reasons in plan.items():
            # a job reruns because it reads the setting or because what it reads is remade:
            # never for another cause (code, missing files, forced)
            assert reasons <= {"direct", "upstream"}, f"{label}: {rule} reruns for {reasons}"
        direct = {rule for rule, reasons in plan.items() if "direct" in reasons}
        if reaches_grid(key, cells):
            assert direct, f"{label}: the grid reads this setting, yet no rule reruns: {plan}"
        else:
            assert plan == {}, f"{label}: no cell of the grid reads this setting, yet {plan}"


def test_the_probe_reaches_every_rule_family(probe) -> None:
    """Over all settings the probe reruns each rule family of the smoke grid, and a setting of each
    section reaches the rule that reads it (not only what follows)."""
    first = {}
    for key, plan in probe.items():
        if isinstance(plan, dict):
            direct = {rule for rule, reasons in plan.items() if "direct" in reasons}
            first.setdefault(key[0], set()).update(direct)
    assert "data" in first["data"] and "train" in first["train"]
    assert "evaluate" in first["evaluate"] and "gradinit" in first["gradinit"]
    assert "sparse_retrain" in first["sparse"] and "quantize" in first["quantize"]
    assert {"fit_hmm", "joint_comparison"} <= first["analysis"]
    assert {"train", "gradinit"} <= first["model"]


def test_dvc_runs_the_stage_of_every_rule_a_setting_reaches(probe, repo_root: Path) -> None:
    """`dvc exp run -S section.key=value` runs a stage only when the stage declares the section:
    every rule a setting reaches first must live in such a stage."""
    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    assert [name for name in stages if name in STAGES] == list(STAGES)
    declared = {name: set(stage.get("params", [])) for name, stage in stages.items()}
    outs = {name: {next(iter(out)) if isinstance(out, dict) else out for out in stage.get("outs", [])}
            for name, stage in stages.items()}  # fmt: skip
    after = {name: {other for other in STAGES if outs[name] & set(stages[other]["deps"])}
             for name in STAGES}  # fmt: skip

    def downstream(names: set[str]) -> set[str]:
        found = set(names)
        while grown := {o for name in found for o in after[name]} - found:
            found |= grown
        return found

    for key, plan in probe.items():
        if not isinstance(plan, dict):
            continue
        declaring = {name for name in STAGES if key[0] in declared[name]}
        reached = downstream(declaring)
        for rule, reasons in plan.items():
            if "direct" in reasons:
                stage = STAGE_OF_RULE.get(rule, "analysis")
                # a stage that declares the section runs the rule (its target needs it), or the
                # rule's stage follows one through the outputs DVC sees change
                assert declaring and (stage in reached
                                      or STAGES.index(stage) <= max(map(STAGES.index, declaring))), (
                    f"{'.'.join(key)} reaches rule {rule} (DVC stage {stage}), but no stage that "
                    f"declares params section {key[0]} runs it or precedes it"
                )  # fmt: skip


def test_new_training_keys_at_their_off_value_rerun_nothing(smoke_run: Path, tmp_path) -> None:
    """``train.<task>.augment`` (null or {}) and ``param_groups: single`` leave a finished study up
    to date: they are out of the cell hash, the rules' params and the effective settings. Turning
    augmentation on for digits reruns digits' training (the check can fail)."""
    planner = Planner(smoke_run)
    overlay = tmp_path / "off.yaml"
    for off in (None, {}):
        settings = {"augment": off, "param_groups": "single"}
        overlay.write_text(
            yaml.safe_dump({"train": {"sparse_parity": settings, "digits": settings}})
        )
        assert planner.plan(overlay) == {}, off
    overlay.write_text(yaml.safe_dump({"train": {"digits": {"augment": {"flip": True}}}}))
    planned = planner.plan(overlay)
    assert planned.get("train") == {"direct"} and "effective_settings" in planned
