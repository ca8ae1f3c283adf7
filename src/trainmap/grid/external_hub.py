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

A set with ``fetch: true`` is fetched from the Hub instead (:mod:`trainmap.dynamics.runs.hub_fetch`).
No check and no job lists the Hub: ``trainmap resolve`` (:func:`resolve_fetched_sets`) writes its
manifest first, from refs and safetensors headers; the check reads it and refuses one missing or
resolved from other settings (:class:`SuiteNotResolved`, naming the command), and the workflow
gives each run's revisions to jobs of ``revisions_per_job`` (:func:`revision_blocks`), each fetching,
measuring and deleting its revisions, a row at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trainmap.dynamics.runs.external import ExternalRun
from trainmap.dynamics.runs.hub import (
    HUB_DEFAULTS,
    MANIFEST_FILE,
    HubCacheError,
    HubSpec,
    Manifest,
    hub_run_checkpoints,
    hub_run_files,
    manifest_content,
    manifest_for,
    parse_hub_source,
    read_manifest,
    suite_run_curve,
    write_manifest,
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
    (:func:`~trainmap.dynamics.runs.hub.manifest_for`), read otherwise; a fetched set's is read
    only (:func:`fetched_set_manifest`). Raises :class:`~trainmap.dynamics.runs.hub.HubCacheError`
    naming the repository, the revision and the download that fixes it."""
    if is_fetched(spec):
        return fetched_set_manifest(config, spec, base_dir)
    path = hub_manifest_path(config, spec["name"], base_dir)
    return manifest_for(hub_spec(spec["hub"], base_dir), path)


class SuiteNotResolved(HubCacheError):
    """A fetched set whose ``revisions.json`` is missing, or was resolved from other settings
    than the config's: the message names the command that resolves it."""


#: The command that resolves a config's fetched sets (:func:`resolve_fetched_sets`).
RESOLVE_COMMAND = "trainmap resolve --configfile CONFIG"


def is_fetched(spec: Mapping[str, Any]) -> bool:
    """Whether hub set ``spec`` is fetched from the Hub (``hub.fetch``), not read from the cache."""
    return bool(spec["hub"].get("fetch", HUB_DEFAULTS["fetch"]))


def fetch_setting(spec: Mapping[str, Any], key: str) -> Any:
    """Hub set ``spec``'s ``hub.<key>``, the schema's default when left out."""
    return spec["hub"].get(key, HUB_DEFAULTS.get(key))


def fetched_set_manifest(
    config: Mapping[str, Any], spec: Mapping[str, Any], base_dir: str | Path
) -> Manifest:
    """The manifest ``trainmap resolve`` wrote for fetched set ``spec``; nothing is listed on the
    Hub here. Raises :class:`SuiteNotResolved` when it is missing, was resolved from the cache, or
    from other settings than the config's (naming each that differs, and the command)."""
    path = hub_manifest_path(config, spec["name"], base_dir)
    command = f"{RESOLVE_COMMAND} --set {spec['name']}"
    if not path.is_file():
        raise SuiteNotResolved(f"{spec['hub']['repo']}: the suite is fetched from the Hub (fetch: "
                               f"true) and is not resolved yet; run `{command}` first (it reads "
                               f"refs and safetensors headers only, and writes {path})")  # fmt: skip
    try:
        manifest = read_manifest(path)
    except HubCacheError:  # unreadable, or resolved from the cache and cleaned since
        raise SuiteNotResolved(f"{path} no longer matches the config (it is not a fetched "
                               f"suite's manifest); run `{command}` again") from None  # fmt: skip
    expected = hub_spec(spec["hub"], base_dir)
    if manifest.fetch_from is None or manifest.spec != expected:
        differ = ("it was resolved from the cache, not the Hub" if manifest.fetch_from is None
                  else "; ".join(_spec_changes(manifest.spec, expected)))  # fmt: skip
        raise SuiteNotResolved(f"{path} no longer matches the config ({differ}); run `{command}` "
                               "again: rows already measured at the same commits are kept")  # fmt: skip
    return manifest


def _spec_changes(old: HubSpec | None, new: HubSpec) -> list[str]:
    """Each setting that differs between ``old`` (a manifest's) and ``new`` (the config's)."""
    if old is None:
        return ["it holds no settings"]
    return [f"{name}: {getattr(old, name)!r} there, {getattr(new, name)!r} in the config"
            for name in HubSpec.__dataclass_fields__
            if getattr(old, name) != getattr(new, name)]  # fmt: skip


def resolve_fetched_sets(
    config: Mapping[str, Any], base_dir: str | Path, names: list[str] | None = None,
    endpoint: str | None = None,
) -> dict[str, tuple[Manifest, bool]]:  # fmt: skip
    """``trainmap resolve``: each fetched set of ``config`` (those ``names``; None: all) resolved
    on the Hub (:func:`~trainmap.dynamics.runs.hub_fetch.resolve_online`) and its manifest written
    to :func:`hub_manifest_path`, only where its content changed (an unchanged suite reruns no
    job). Returns set name -> (manifest, whether it was written)."""
    from trainmap.dynamics.runs.hub_fetch import resolve_online

    sets = {spec["name"]: spec for spec in config.get("external") or []
            if "hub" in spec and is_fetched(spec)}  # fmt: skip
    unknown = sorted(set(names or ()) - set(sets))
    if unknown:
        raise HubCacheError(f"--set {', '.join(unknown)}: no fetched set of that name (fetched "
                            f"sets: {', '.join(sets) or 'none: give a hub set fetch: true'})")  # fmt: skip
    resolved = {}
    for name, spec in sets.items():
        if names and name not in names:
            continue
        manifest = resolve_online(hub_spec(spec["hub"], base_dir), endpoint=endpoint)
        path = hub_manifest_path(config, name, base_dir)
        changed = _kept_content(path) != manifest_content(manifest)
        if changed:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_manifest(manifest, path)
        resolved[name] = (manifest, changed)
    return resolved


def _kept_content(path: Path) -> dict[str, object] | None:
    """The content of the manifest at ``path``, or None where there is none to read."""
    try:
        return manifest_content(read_manifest(path)) if path.is_file() else None
    except HubCacheError:  # damaged, or an offline manifest naming files cleaned since
        return None


#: Bytes per parameter of each ``hub.dtype``.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def configured_size(spec: Mapping[str, Any]) -> int | None:
    """A revision's bytes as hub set ``spec`` states them (``parameters`` x ``dtype``), or None."""
    parameters = spec["hub"].get("parameters")
    if parameters is None:
        return None
    return int(parameters) * DTYPE_BYTES[str(fetch_setting(spec, "dtype"))]


def revision_sizes(manifest: Manifest, spec: Mapping[str, Any]) -> dict[str, dict[int, int]]:
    """Run -> step -> a fetched revision's bytes: its safetensors header's, else the config's
    (:func:`configured_size`; a ``pytorch_model.bin`` has no header to read), else 0."""
    fallback = configured_size(spec) or 0
    return {run: {step: checkpoint.size if checkpoint.size is not None else fallback
                  for step, checkpoint in steps.items()}
            for run, steps in manifest.runs.items()}  # fmt: skip


def revision_blocks(runs: Mapping[str, Iterable[int]], per_job: int) -> dict[str, list[list[int]]]:
    """Run -> its steps (``runs``: run -> steps, a manifest's runs or the plan's sizes) in blocks
    of ``per_job`` (the last may be shorter), in step order: one workflow job each, numbered by
    its place in the list."""
    ordered = {run: list(steps) for run, steps in runs.items()}
    return {run: [steps[start : start + per_job] for start in range(0, len(steps), per_job)]
            for run, steps in ordered.items()}  # fmt: skip


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
    are loaded as one state dict). A fetched suite's come from :func:`revision_sizes`."""
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
