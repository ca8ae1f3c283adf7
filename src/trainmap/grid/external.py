"""External run sets (config key ``external``): checkpoints trainmap did not train, on the map.

Each set names run directories (glob patterns relative to the project, one directory per run:
state dicts named by step plus ``evaluation.csv``; :mod:`trainmap.dynamics.external`), the test
accuracy at which a run has converged, and how to read the state dicts (by name and shape, with the
head count of attention layers, or through a registered architecture built for a task's data). A
set gets a training map of its own (``results/external/<name>/``) and can join a joint comparison
(``analysis.joint[i].external``) beside the grid's own runs. Every run is read and checked here,
before any job: checkpoints named by integer steps, readable, the same tensors at every step, and
an evaluation curve with ``test_acc`` at every checkpoint step.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainmap.grid.errors import ConfigError

#: The smallest number of runs a set needs for a training map of its own.
MIN_EXTERNAL_RUNS = 2


def external_sets(config: Mapping[str, Any]) -> dict[str, dict]:
    """Set name -> its settings (config key ``external``), in config order."""
    return {spec["name"]: spec for spec in config.get("external") or []}


def external_runs(spec: Mapping[str, Any], base_dir: str | Path) -> dict[str, str]:
    """Run id -> run directory of one set: its ``runs`` patterns expanded and sorted; a run id is
    the directory's path relative to the runs' common parent (``seed3``, ``lr0.1/seed3``)."""
    base = Path(base_dir)
    found: list[Path] = []
    for pattern in spec["runs"]:
        matches = sorted(glob.glob(str(base / pattern)))
        found += [Path(match) for match in matches if Path(match).is_dir()]
    found = list(dict.fromkeys(p.resolve() for p in found))
    if not found:
        return {}
    root = Path(os.path.commonpath([p.parent for p in found]))
    return {p.relative_to(root).as_posix(): str(p) for p in found}


#: The external_metrics job's memory besides its checkpoints: Python, torch and the metric tables.
EXTERNAL_BASE_MB = 1500


def external_metrics_memory_mb(runs: Mapping[str, str]) -> int:
    """Memory to request for a set's ``external_metrics`` job: a constant plus three times its
    largest checkpoint file (the loaded state dict, its counted entries and their float64 matrices;
    :func:`trainmap.dynamics.external.chunk_size` keeps one large checkpoint in memory at a time).
    A run whose files cannot be listed counts nothing here (the config check names it)."""
    from trainmap.dynamics.external import run_files

    largest = 0
    for directory in runs.values():
        try:
            files = run_files(directory)
        except OSError:
            continue
        sizes = [f.stat().st_size for f in files if f.is_file() and f.suffix != ".csv"]
        largest = max([largest, *sizes])
    return EXTERNAL_BASE_MB + -(-3 * largest // 2**20)


def joint_external_sets(spec: Mapping[str, Any]) -> list[str]:
    """The external sets a joint comparison pools beside its own runs."""
    return list(spec.get("external", []))


def check_external(config: Mapping[str, Any], base_dir: str | Path, read_runs: bool = True) -> None:
    """Names unique and apart from the grid's method/arch labels, every pattern matching run
    directories, every run readable (:func:`trainmap.dynamics.external.read_external_run` and the
    cheap shape check of each checkpoint), ``arch`` a registered architecture built for ``task``'s
    data, and each joint comparison's ``external`` naming a set. Raises :class:`ConfigError`.
    ``read_runs=False`` skips reading the runs (their directories are still matched)."""
    from trainmap.dynamics.external import ExternalRunError, check_run_shapes, read_external_run

    seen: set[str] = set()
    for index, spec in enumerate(config.get("external") or []):
        where = f"config key external[{index}]"
        if spec["name"] in seen:
            raise ConfigError(f"{where}.name: {spec['name']!r} is used twice; set names must be "
                              "unique (they name results/external/<name>)")  # fmt: skip
        seen.add(spec["name"])
        _check_name_apart(where, spec["name"])
        runs = external_runs(spec, base_dir)
        if len(runs) < MIN_EXTERNAL_RUNS:
            raise ConfigError(
                f"{where}.runs: the patterns {spec['runs']} match {len(runs)} run director"
                f"{'y' if len(runs) == 1 else 'ies'} under {base_dir}; a training map needs at "
                f"least {MIN_EXTERNAL_RUNS} (one directory per run, patterns relative to the "
                "project, e.g. runs/seed*)"
            )
        for run_dir in runs.values() if read_runs else ():
            try:
                check_run_shapes(
                    read_external_run(
                        run_dir, spec.get("evaluation", "evaluation.csv"), spec.get("accuracy_key")
                    )  # fmt: skip
                )
            except ExternalRunError as error:
                raise ConfigError(f"{where}.runs: {error}") from None
        _check_external_arch(config, where, spec, base_dir)
    for index, joint in enumerate(config.get("analysis", {}).get("joint", [])):
        if "task" not in joint and len(joint_external_sets(joint)) < 2:
            raise ConfigError(
                f"config key analysis.joint[{index}].external: a comparison of external sets "
                "alone needs at least two sets (or a task whose runs they join)"
            )
        for position, name in enumerate(joint_external_sets(joint)):
            if name not in seen:
                raise ConfigError(
                    f"config key analysis.joint[{index}].external[{position}]: no external set "
                    f"{name!r}; sets: {', '.join(sorted(seen)) or 'none (config key external)'}"
                )


def _check_name_apart(where: str, name: str) -> None:
    """A set's name labels its runs' group in a joint comparison: not a method or architecture
    name, which label the grid's own groups there."""
    from trainmap import methods, models

    for kind, names in (("method", methods.METHODS), ("architecture", models.ARCHITECTURES)):
        if name in names:
            raise ConfigError(f"{where}.name: {name!r} is a registered {kind}, which labels the "
                              "grid's own runs in a joint comparison; name the set apart (e.g. "
                              f"{name}_external)")  # fmt: skip


def external_arch(
    config: Mapping[str, Any], spec: Mapping[str, Any], base_dir: str | Path
) -> dict | None:
    """``{"arch", "meta", "options"}`` to build the model a set's state dicts are read through, or
    None (read by name and shape). ``meta`` describes the data of the set's ``task``."""
    if spec.get("arch") is None:
        return None
    from trainmap import data
    from trainmap.grid.cells import data_options

    options = data_options(config, spec["task"], base_dir)
    meta = data.model_meta(config["data"][spec["task"]]["kind"], options)
    return {"arch": spec["arch"], "meta": meta, "options": dict(spec.get("options", {}))}


def _check_external_arch(
    config: Mapping[str, Any], where: str, spec: Mapping[str, Any], base_dir: str | Path
) -> None:
    """``arch`` (optional) is registered, takes ``options`` and is built for ``task``'s data."""
    if spec.get("arch") is None:
        return
    from trainmap import models

    if spec.get("task") not in config["data"]:
        raise ConfigError(f"{where}.task: {spec.get('task')!r} is not a task of config key data; "
                          "with arch, name the task whose data the runs were trained on (its "
                          "input shape and classes build the model)")  # fmt: skip
    try:
        built = external_arch(config, spec, base_dir)
        models.build_model(built["arch"], built["meta"], **built["options"])
    except (ValueError, KeyError) as error:
        raise ConfigError(f"{where}.arch: {error}") from None
