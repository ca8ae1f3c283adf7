"""External sets given as ``hub:``: a checkpoint suite in the local Hugging Face cache as a run set.

A set ``{name, hub: {repo, seeds, steps, revision_pattern, revision, cache}}`` (config key
``external``) names a suite the way ``trainmap map hf://ORG/NAME --seeds ... --steps ...`` does
(:mod:`trainmap.dynamics.runs.hub`). At the config check it is resolved once, offline, into the set's
manifest ``<results>/external/<name>/revisions.json`` (run -> step -> revision -> commit -> files,
and the settings it was resolved from); a later check finds it up to date and leaves it untouched,
so its modification time reruns nothing, and resolves again only when the settings changed or a
file it names is gone (:func:`trainmap.dynamics.runs.hub.manifest_for`). After that the run ids, the
jobs' input files, their memory and the checkpoints read all come from the manifest, never from the
cache's layout. ``curves:`` (optional) is a directory of ``<run>.csv`` files, each run's evaluation
curve; a suite ships none.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainmap.dynamics.runs.external import ExternalRun
from trainmap.dynamics.runs.hub import (
    HUB_DEFAULTS,
    MANIFEST_FILE,
    HubSpec,
    Manifest,
    hub_run_checkpoints,
    hub_run_files,
    manifest_for,
    parse_hub_source,
    suite_run_curve,
)
from trainmap.grid.study import results_root

#: A curve file's name in a set's ``curves`` directory: the run's name and this suffix.
CURVE_SUFFIX = ".csv"


def hub_spec(settings: Mapping[str, Any], base_dir: str | Path) -> HubSpec:
    """The :class:`~trainmap.dynamics.runs.hub.HubSpec` of a set's ``hub`` settings, each left out
    taking the schema's default (:data:`~trainmap.dynamics.runs.hub.HUB_DEFAULTS`); ``cache`` relative
    to ``base_dir`` (the project). A bad value raises
    :class:`~trainmap.dynamics.runs.hub.HubCacheError` naming it."""
    values = HUB_DEFAULTS | dict(settings)
    cache = values["cache"]
    return parse_hub_source(
        values["repo"],
        seeds=values.get("seeds"),
        steps=values.get("steps"),
        revision_pattern=values["revision_pattern"],
        revision=values["revision"],
        cache_dir=Path(base_dir) / Path(cache).expanduser() if cache is not None else None,
    )


def hub_manifest_path(config: Mapping[str, Any], name: str, base_dir: str | Path) -> Path:
    """Where set ``name``'s manifest lives: ``<results>/external/<name>/revisions.json``, the
    results root (config key ``results``) relative to ``base_dir``."""
    return Path(base_dir) / results_root(dict(config)) / "external" / name / MANIFEST_FILE


def hub_set_manifest(
    config: Mapping[str, Any], spec: Mapping[str, Any], base_dir: str | Path
) -> Manifest:
    """The resolved suite of hub set ``spec``: its manifest, written when absent or out of date
    (:func:`~trainmap.dynamics.runs.hub.manifest_for`), read otherwise. Raises
    :class:`~trainmap.dynamics.runs.hub.HubCacheError` naming the repository, the revision and the
    download that fixes it."""
    path = hub_manifest_path(config, spec["name"], base_dir)
    return manifest_for(hub_spec(spec["hub"], base_dir), path)


def hub_set_runs(manifest: Manifest) -> dict[str, str]:
    """Run id -> the run's source, ``hf://<repository pattern>/<run>`` (what an evaluation record
    names as the run's directory), in the manifest's order."""
    return {run: f"{manifest.source}/{run}" for run in manifest.runs}


def hub_set_files(manifest: Manifest) -> list[Path]:
    """Every file the set's metrics read: each run's weights (a sharded checkpoint's index and
    shards), in run and step order."""
    return [path for run in manifest.runs for path in hub_run_files(manifest, run)]


def largest_hub_checkpoint(manifest: Manifest) -> int:
    """Bytes of the set's largest checkpoint, its files together (a sharded checkpoint's shards
    are loaded as one state dict)."""
    return max(
        (sum((checkpoint.snapshot / name).stat().st_size for name in checkpoint.files)
         for steps in manifest.runs.values() for checkpoint in steps.values()),
        default=0,
    )  # fmt: skip


def hub_curve_files(
    spec: Mapping[str, Any], runs: Mapping[str, str], base_dir: str | Path
) -> dict[str, Path]:
    """Run id -> its curve file ``<curves>/<run>.csv`` (``curves`` relative to ``base_dir``);
    empty without ``curves``."""
    if spec.get("curves") is None:
        return {}
    folder = Path(base_dir) / spec["curves"]
    return {run: folder / f"{run}{CURVE_SUFFIX}" for run in runs}


def hub_external_run(
    manifest: Manifest, run: str, curve_file: Path | None, curve: str | None
) -> ExternalRun:
    """Run ``run`` of a resolved suite as an :class:`~trainmap.dynamics.runs.external.ExternalRun`:
    its checkpoints from ``manifest`` (:func:`~trainmap.dynamics.runs.hub.hub_run_checkpoints`), its
    curve :func:`~trainmap.dynamics.runs.hub.suite_run_curve`, its directory its ``hf://`` source (:func:`hub_set_runs`)."""
    checkpoints = hub_run_checkpoints(manifest, run)
    evaluation = suite_run_curve(curve_file, list(checkpoints), curve)
    return ExternalRun(Path(hub_set_runs(manifest)[run]), checkpoints, evaluation)
