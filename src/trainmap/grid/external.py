"""External run sets (config key ``external``): checkpoints trainmap did not train, on the map.

Each set names its runs either as run directories (``runs``: glob patterns relative to the
project, one directory per run: state dicts named by step plus ``evaluation.csv``;
:mod:`trainmap.dynamics.runs.external`) or as a checkpoint suite in the local Hugging Face cache
(``hub``: :mod:`trainmap.grid.external_hub`, resolved once into the set's ``revisions.json``), and
says how a run converges (``threshold`` on the ``curve`` column, reached ``rising`` or
``falling``; no threshold, no convergence criterion) and how to read the state dicts (by name and
shape, with the head count of attention layers, or through a registered architecture built for a
task's data). A set gets a training map of its own (``results/external/<name>/``) and can join a
joint comparison (``analysis.joint[i].external``) beside the grid's own runs. Every run is read and
checked here, before any job: checkpoints named by integer steps, readable, the same tensors at
every step, and, with a threshold, an evaluation curve holding the ``curve`` column at every
checkpoint step. :func:`external_set` gives what the workflow reads of one set (its runs, input
files and memory) as an :class:`ExternalSet`.
"""

from __future__ import annotations

import glob
import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainmap.errors import ConfigError
from trainmap.schema import defaults_at

if TYPE_CHECKING:
    from trainmap.dynamics.runs.hub import Manifest


class UnresolvedSuite(ConfigError):
    """A set fetched from the Hub (``hub.fetch``) whose ``revisions.json`` ``trainmap resolve``
    has not written, or wrote from other settings; the plan goes on without it."""


#: The smallest number of runs a set needs for a training map of its own.
MIN_EXTERNAL_RUNS = 2
#: The defaults of a set's settings (``curve``, ``direction``): the config schema's.
EXTERNAL_DEFAULTS: dict[str, Any] = defaults_at("external")
#: The curve a threshold on which is a fraction (at most 1).
ACCURACY_CURVE = "test_acc"
#: The curve a hub set's ``eval_tokens`` gives (trainmap.dynamics.runs.heldout.LOSS_COLUMN).
HELDOUT_CURVE = "test_loss"
#: Settings of a set of run directories that a hub set has no use for, and the reason.
RUNS_ONLY = {
    "evaluation": "a suite's curves come from curves: (<run>.csv files)",
    "accuracy_key": "a suite's curves come from curves: (<run>.csv files)",
}


def external_sets(config: Mapping[str, Any]) -> dict[str, dict]:
    """Set name -> its settings (config key ``external``), in config order."""
    return {spec["name"]: spec for spec in config.get("external") or []}


def is_hub_set(spec: Mapping[str, Any]) -> bool:
    """Whether set ``spec`` is a checkpoint suite in the Hugging Face cache (``hub``), not run
    directories (``runs``)."""
    return "hub" in spec


def heldout_settings(spec: Mapping[str, Any]) -> tuple[int, int]:
    """A hub set's ``eval_token_budget`` and ``eval_context``, the schema's defaults when left
    out."""
    return (int(spec.get("eval_token_budget", EXTERNAL_DEFAULTS["eval_token_budget"])),
            int(spec.get("eval_context", EXTERNAL_DEFAULTS["eval_context"])))  # fmt: skip


def needed_curve(spec: Mapping[str, Any]) -> str | None:
    """The curve column each run of set ``spec`` must have: its ``curve`` when it has a
    ``threshold``, else none (no convergence criterion, no curve needed)."""
    if spec.get("threshold") is None:
        return None
    return spec.get("curve", EXTERNAL_DEFAULTS["curve"])


@dataclass(frozen=True)
class ExternalSet:
    """One external set as the workflow reads it. ``runs``: run id -> its directory (``runs``
    sets) or its ``hf://`` source (hub sets). ``hub``: a hub set's resolved suite and
    ``manifest_path`` its ``revisions.json``; ``curves``: a hub set's run id -> curve file."""

    spec: Mapping[str, Any]
    runs: dict[str, str]
    hub: Manifest | None = None
    manifest_path: Path | None = None
    curves: dict[str, Path] = field(default_factory=dict)
    #: A hub set's ``eval_tokens`` file (relative paths made the project's), or None.
    eval_tokens: Path | None = None

    @property
    def fetched(self) -> bool:
        """Whether the set is a suite fetched from the Hub (``hub.fetch``): its revisions are
        measured by jobs of a block of revisions each (:attr:`blocks`)."""
        return self.hub is not None and self.hub.fetch_from is not None

    @cached_property
    def blocks(self) -> dict[str, list[list[int]]]:
        """A fetched set's run -> its steps in blocks of ``hub.revisions_per_job``, a job each
        (:func:`~trainmap.grid.external_hub.revision_blocks`); empty for any other set. Computed
        once: every revision job's input functions read it."""
        if not self.fetched:
            return {}
        from trainmap.grid.external_hub import fetch_setting, revision_blocks

        return revision_blocks(self.hub.runs, int(fetch_setting(self.spec, "revisions_per_job")))

    @cached_property
    def sizes(self) -> dict[str, dict[int, int]]:
        """A fetched set's run -> step -> bytes of the revision
        (:func:`~trainmap.grid.external_hub.revision_sizes`); empty for any other set."""
        if not self.fetched:
            return {}
        from trainmap.grid.external_hub import revision_sizes

        return revision_sizes(self.hub, self.spec)

    def inputs(self) -> dict[str, list[str] | str]:
        """The files the set's metrics read, named for the job: ``files`` (a run directory's
        checkpoints and evaluation file, a suite's snapshot files; none for a fetched suite, whose
        revision jobs' rows the workflow adds), and for a hub set ``hub`` (its ``revisions.json``,
        one path) and, with ``curves``, ``curves`` (each run's curve file). A changed file reruns
        the set's metrics."""
        if self.hub is None:
            from trainmap.dynamics.runs.external import run_files

            evaluation = self.spec.get("evaluation", EXTERNAL_DEFAULTS["evaluation"])
            files = [
                str(p) for run_dir in self.runs.values() for p in run_files(run_dir, evaluation)
            ]
            return {"files": files}
        from trainmap.grid.external_hub import hub_set_files

        named: dict[str, list[str] | str] = {
            "files": [] if self.fetched else [str(p) for p in hub_set_files(self.hub)],
            "hub": str(self.manifest_path),
        }
        if self.curves:
            named["curves"] = [str(path) for path in self.curves.values()]
        if self.eval_tokens is not None:
            named["tokens"] = str(self.eval_tokens)
        return named

    def memory_mb(self) -> int:
        """Memory to request for the set's ``external_metrics`` job (:func:`memory_mb`)."""
        if self.hub is None:
            return external_metrics_memory_mb(self.runs)
        from trainmap.grid.external_hub import largest_hub_checkpoint

        if self.fetched:
            largest = max((b for run in self.sizes.values() for b in run.values()), default=0)
            return memory_mb(largest)
        return memory_mb(largest_hub_checkpoint(self.hub))


def external_set(
    config: Mapping[str, Any], spec: Mapping[str, Any], base_dir: str | Path
) -> ExternalSet:
    """Set ``spec`` of ``config`` as the workflow reads it: a ``runs`` set's directories
    (:func:`external_runs`), or a hub set's suite from its manifest, resolved and written first
    when absent or out of date (:func:`trainmap.grid.external_hub.hub_set_manifest`; a cache that
    cannot give the suite raises :class:`~trainmap.dynamics.runs.hub.HubCacheError`)."""
    if not is_hub_set(spec):
        return ExternalSet(spec, external_runs(spec, base_dir))
    from trainmap.grid.external_hub import (
        hub_curve_files,
        hub_manifest_path,
        hub_set_manifest,
        hub_set_runs,
    )

    manifest = hub_set_manifest(config, spec, base_dir)
    runs = hub_set_runs(manifest)
    tokens = Path(base_dir) / spec["eval_tokens"] if "eval_tokens" in spec else None
    return ExternalSet(spec, runs, manifest, hub_manifest_path(config, spec["name"], base_dir),
                       hub_curve_files(spec, runs, base_dir), tokens)  # fmt: skip


def external_runs(spec: Mapping[str, Any], base_dir: str | Path) -> dict[str, str]:
    """Run id -> run directory of one ``runs`` set: its patterns expanded and sorted; a run id is
    the directory's path relative to the runs' common parent (``seed3``, ``lr0.1/seed3``). A
    directory matched by several patterns, or by several spellings, is one run."""
    return _run_ids(list(_matching_patterns(spec, base_dir)))


def _matching_patterns(spec: Mapping[str, Any], base_dir: str | Path) -> dict[Path, list[str]]:
    """Each run directory a ``runs`` set's patterns match (resolved, so two spellings of one
    directory are one run; in pattern order, each pattern's matches sorted) -> the patterns that
    match it, in config order, each once."""
    base = Path(base_dir)
    matched: dict[Path, list[str]] = {}
    for pattern in spec["runs"]:
        for match in sorted(glob.glob(str(base / pattern))):
            if Path(match).is_dir():
                patterns = matched.setdefault(Path(match).resolve(), [])
                if pattern not in patterns:
                    patterns.append(pattern)
    return matched


def _run_ids(found: list[Path]) -> dict[str, str]:
    """Run id (the path relative to the runs' common parent) -> run directory."""
    if not found:
        return {}
    root = Path(os.path.commonpath([p.parent for p in found]))
    return {p.relative_to(root).as_posix(): str(p) for p in found}


#: The external_metrics job's memory besides its checkpoints: Python, torch and the metric tables.
EXTERNAL_BASE_MB = 1500
#: ... and per byte of its largest checkpoint: a checkpoint whose counted weights in float64 pass
#: the chunk budget (trainmap.dynamics.runs.external.CHUNK_BYTES, whose float64 work the constant
#: holds) is measured entry by entry (trainmap.dynamics.runs.bounded), in about its counted weights'
#: own size (bench/suite_read.py: peak RSS above idle against the checkpoint).
CHECKPOINT_FACTOR = 1.5


def memory_mb(largest_checkpoint: int) -> int:
    """Memory (MB) to request for a set's ``external_metrics`` job whose largest checkpoint holds
    ``largest_checkpoint`` bytes: :data:`EXTERNAL_BASE_MB` plus :data:`CHECKPOINT_FACTOR` times
    that checkpoint."""
    return EXTERNAL_BASE_MB + math.ceil(CHECKPOINT_FACTOR * largest_checkpoint / 2**20)


def external_metrics_memory_mb(runs: Mapping[str, str]) -> int:
    """:func:`memory_mb` of a ``runs`` set (run id -> directory): its largest checkpoint file. A
    run whose files cannot be listed counts nothing here (the config check names it)."""
    from trainmap.dynamics.runs.external import run_files

    largest = 0
    for directory in runs.values():
        try:
            files = run_files(directory)
        except OSError:
            continue
        sizes = [f.stat().st_size for f in files if f.is_file() and f.suffix != ".csv"]
        largest = max([largest, *sizes])
    return memory_mb(largest)


def joint_external_sets(spec: Mapping[str, Any]) -> list[str]:
    """The external sets a joint comparison pools beside its own runs."""
    return list(spec.get("external", []))


def check_external(config: Mapping[str, Any], base_dir: str | Path, read_runs: bool = True) -> None:
    """Names unique and apart from the grid's method/arch labels; the convergence settings
    consistent (:func:`_check_convergence`); every pattern matching run directories, or a hub
    set's suite resolved (its ``revisions.json`` written when absent or out of date:
    :func:`external_set`); at least :data:`MIN_EXTERNAL_RUNS` runs; every run readable
    (:func:`trainmap.dynamics.runs.external.read_external_run`, or a suite run's checkpoints and its
    ``curves`` file, and the cheap shape check of each checkpoint); ``arch`` a registered
    architecture built for ``task``'s data; and each joint comparison's ``external`` naming a set.
    Raises :class:`ConfigError`. ``read_runs=False`` skips reading the runs (their directories
    are still matched, a suite's manifest still read)."""
    seen: set[str] = set()
    for index, spec in enumerate(config.get("external") or []):
        where = f"config key external[{index}]"
        if spec["name"] in seen:
            raise ConfigError(f"{where}.name: {spec['name']!r} is used twice; set names must be "
                              "unique (they name results/external/<name>)")  # fmt: skip
        seen.add(spec["name"])
        _check_name_apart(where, spec["name"])
        _check_convergence(where, spec)
        if is_hub_set(spec):
            _check_hub_set(config, where, spec, base_dir, read_runs)
        else:
            _check_runs_set(where, spec, base_dir, read_runs)
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


def _check_convergence(where: str, spec: Mapping[str, Any]) -> None:
    """What relates a set's settings to each other: a ``test_acc`` threshold is a fraction (at
    most 1); a hub set's threshold needs its runs' ``curves``; ``curves`` belongs to a hub set,
    ``evaluation`` and ``accuracy_key`` to a ``runs`` set."""
    threshold = spec.get("threshold")
    curve = spec.get("curve", EXTERNAL_DEFAULTS["curve"])
    if threshold is not None and curve == ACCURACY_CURVE and threshold > 1:
        raise ConfigError(f"{where}.threshold: {threshold} is above 1, but {ACCURACY_CURVE} is a "
                          "fraction; write e.g. 0.9 for 90 % (or set curve: test_loss for a "
                          "loss threshold)")  # fmt: skip
    if not is_hub_set(spec):
        for key in ("curves", "eval_tokens"):
            if key in spec:
                raise ConfigError(f"{where}.{key}: only a hub set takes {key}; a run directory "
                                  "holds its own curve (evaluation: names its file); remove "
                                  f"{key}")  # fmt: skip
        return
    for key, reason in RUNS_ONLY.items():
        if key in spec:
            raise ConfigError(f"{where}.{key}: a hub set has no use for {key} ({reason}); "
                              "remove it")  # fmt: skip
    if "eval_tokens" in spec and "curves" in spec:
        raise ConfigError(f"{where}.eval_tokens: eval_tokens and curves both give the runs' "
                          "curve; give one of them")  # fmt: skip
    if "eval_tokens" in spec and threshold is not None and curve != HELDOUT_CURVE:
        raise ConfigError(f"{where}.curve: {curve}, but eval_tokens gives the curve "
                          f"{HELDOUT_CURVE}; set curve: {HELDOUT_CURVE} and direction: falling")  # fmt: skip
    if threshold is not None and spec.get("curves") is None and "eval_tokens" not in spec:
        raise ConfigError(
            f"{where}.threshold: a suite ships no curve, so its runs cannot reach threshold "
            f"{threshold}; give curves (a directory of <run>.csv with step and {curve}, one per "
            "run), eval_tokens (a held-out loss per revision) or leave threshold out (a map "
            "without a convergence criterion)"
        )


def _check_runs_set(where: str, spec: Mapping[str, Any], base_dir: str | Path,
                    read_runs: bool) -> None:  # fmt: skip
    """A ``runs`` set: its patterns match enough run directories, each readable (with the
    set's curve when it has a threshold) and of one architecture."""
    from trainmap.dynamics.runs.external import (
        ExternalRunError,
        check_run_shapes,
        read_external_run,
    )

    matched = _matching_patterns(spec, base_dir)
    runs = _run_ids(list(matched))
    for (run, run_dir), patterns in zip(runs.items(), matched.values(), strict=True):
        if len(patterns) > 1:
            # Counted once either way; said, because overlapping patterns often mean one of them
            # was meant to match other runs (a typo'd sweep folder, a stale pattern).
            warnings.warn(
                f"{where}.runs: run {run} ({run_dir}) of set {spec['name']!r} is matched by "
                f"patterns {' and '.join(map(repr, patterns))} (counted once); drop or narrow a "
                "pattern if each was meant to match other runs",
                stacklevel=2,
            )
    if len(runs) < MIN_EXTERNAL_RUNS:
        raise ConfigError(
            f"{where}.runs: the patterns {spec['runs']} match {len(runs)} run director"
            f"{'y' if len(runs) == 1 else 'ies'} under {base_dir}; a training map needs at "
            f"least {MIN_EXTERNAL_RUNS} (one directory per run, patterns relative to the "
            "project, e.g. runs/seed*)"
        )
    for run_dir in runs.values() if read_runs else ():
        try:
            check_run_shapes(read_external_run(run_dir, spec.get("evaluation", EXTERNAL_DEFAULTS["evaluation"]),
                                               spec.get("accuracy_key"), needed_curve(spec)))  # fmt: skip
        except ExternalRunError as error:
            raise ConfigError(f"{where}.runs: {error}") from None


def _check_hub_set(config: Mapping[str, Any], where: str, spec: Mapping[str, Any],
                   base_dir: str | Path, read_runs: bool) -> None:  # fmt: skip
    """A hub set: its suite resolved from the cache (or its manifest up to date), enough runs,
    each run's checkpoints of one architecture and its curve file readable."""
    from trainmap.dynamics.runs.external import ExternalRunError, check_run_shapes
    from trainmap.dynamics.runs.heldout import read_tokens
    from trainmap.grid.external_hub import SuiteNotResolved, hub_external_run

    if "eval_tokens" in spec:
        try:
            read_tokens(Path(base_dir) / spec["eval_tokens"], *heldout_settings(spec),
                        setting="eval_tokens")  # fmt: skip
        except ExternalRunError as error:
            raise ConfigError(f"{where}.eval_tokens: {error}") from None
    try:
        external = external_set(config, spec, base_dir)
    except SuiteNotResolved as error:
        raise UnresolvedSuite(f"{where}.hub: {error}") from None
    except ExternalRunError as error:  # HubCacheError: the repository, revision and download
        raise ConfigError(f"{where}.hub: {error}") from None
    if len(external.runs) < MIN_EXTERNAL_RUNS:
        raise ConfigError(
            f"{where}.hub: {spec['hub']['repo']} gives {len(external.runs)} run "
            f"({', '.join(external.runs)}); a training map needs at least {MIN_EXTERNAL_RUNS}: a "
            "repository per seed ({seed} in repo, with seeds, e.g. "
            "EleutherAI/pythia-160m-seed{seed} with seeds 1-9)"
        )
    for run in external.runs if read_runs else ():
        try:
            suite_run = hub_external_run(external.hub, run, external.curves.get(run),
                                         needed_curve(spec))  # fmt: skip
        except ExternalRunError as error:
            raise ConfigError(f"{where}.curves: {error}") from None
        if external.fetched:  # not downloaded yet: trainmap resolve checked the headers
            continue
        try:
            check_run_shapes(suite_run)
        except ExternalRunError as error:
            raise ConfigError(f"{where}.hub: run {run}: {error}") from None


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
