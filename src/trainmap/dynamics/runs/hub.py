"""Public checkpoint suites from the local Hugging Face Hub cache, as run sets (offline).

A researcher downloads a suite with ``huggingface_hub`` (``snapshot_download(repo,
revision="step1000")``, or ``hf download REPO --revision step1000``); its files land in the Hub
cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``) as
``models--ORG--NAME/refs/<revision>`` (a file holding the revision's commit hash),
``snapshots/<commit>/<file>`` (a symlink into ``blobs/``) and ``blobs/<hash>``. Three suite shapes
are read from there, found through huggingface_hub's own cache API (``HF_HUB_CACHE``,
``try_to_load_from_cache``):

1. one repository, a branch per checkpoint (Pythia, OLMo): ``EleutherAI/pythia-160m``; the
   revisions whose name matches ``revision_pattern`` at its start (its first group is the step;
   default ``step(\\d+)``) are the checkpoints of one run;
2. one repository per seed, a branch per checkpoint (PolyPythias):
   ``EleutherAI/pythia-14m-seed{seed}`` with ``seeds``; a run per seed;
3. one repository per seed and checkpoint (MultiBERTs):
   ``google/multiberts-seed_{seed}-step_{step}k``; the ``{step}`` value is an integer, ``k`` read
   as thousands (``step_20k`` is step 20000); each repository's ``revision`` (default ``main``);
   a run per seed.

A run is named by its repository's name, the ``-``-separated part holding ``{step}`` left out
(:func:`run_name`: ``pythia-14m-seed1``, ``multiberts-seed_0``).

:func:`resolve_hub_runs` resolves a :class:`HubSpec` once into a :class:`Manifest` (run -> step ->
repository, revision, commit, snapshot folder, weight files, and the spec it was resolved from),
checking every file it names; :func:`write_manifest` writes it (``revisions.json``, atomically),
:func:`read_manifest` reads it back, :func:`manifest_for` reads it when it is the resolution of a
given spec and resolves and writes it otherwise (the workflow's ``external: hub:`` sets),
:func:`hub_run_files` lists the files a run is read from and :func:`hub_run_checkpoints`
gives a run's checkpoint per step, a path
:func:`trainmap.dynamics.runs.layouts.load_state_dict_file` reads (a snapshot's
``model.safetensors``, a sharded checkpoint's index JSON, or ``pytorch_model.bin``). Nothing after
the resolution reads the cache layout. What the cache cannot give raises :class:`HubCacheError`
naming the repository, the revision and the fix (the download command), before any metric.

Nothing is downloaded here. ``huggingface_hub`` is an optional dependency (``pip install
'trainmap[hub]'``), imported on first use.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pandas as pd

from trainmap.dynamics.runs.layouts import (
    MODEL_WEIGHTS,
    SHARD_INDEX_SUFFIX,
    ExternalRunError,
    index_shards,
)
from trainmap.dynamics.runs.names import HUB_DEFAULTS, HUB_SCHEME
from trainmap.io import save_json

SEED = "{seed}"
STEP = "{step}"
#: A branch's name, matched at its start; the first group is the step (Pythia's ``step1000``,
#: OLMo's ``step1000-tokens4B``).
DEFAULT_REVISION_PATTERN = str(HUB_DEFAULTS["revision_pattern"])
#: The revision read of each repository of a repository-per-checkpoint suite (``{step}``).
DEFAULT_REVISION = str(HUB_DEFAULTS["revision"])
#: The manifest's file name beside a map's outputs.
MANIFEST_FILE = "revisions.json"
MANIFEST_FORMAT = 1
#: How huggingface_hub names a file whose download has not finished (``blobs/<hash>.incomplete``).
INCOMPLETE_SUFFIX = ".incomplete"
INSTALL_HINT = "pip install 'trainmap[hub]'"


class HubCacheError(ExternalRunError):
    """A checkpoint suite the local Hugging Face cache cannot give; the message names the
    repository, the revision and the fix."""


class HubRevisionWarning(UserWarning):
    """Two revisions (or repositories) of a suite give one step; the message names both and the
    one read."""


@dataclass(frozen=True)
class HubSpec:
    """A checkpoint suite to read from the cache.

    ``repo``: ``ORG/NAME``; its name holds ``{seed}`` when ``seeds`` are given (a run per seed)
    and ``{step}`` for a repository per checkpoint. ``steps``: the checkpoints kept, as closed
    intervals ``(first, last)`` (a single step is ``(s, s)``); each must hold a cached step;
    empty: every cached step. ``revision_pattern``: matched at the start of each branch name, its
    first group the step (suites without ``{step}``). ``revision``: the revision read of each
    repository of a ``{step}`` suite. ``cache_dir``: the Hub cache (None: huggingface_hub's
    ``HF_HUB_CACHE``, which honours ``HF_HUB_CACHE`` and ``HF_HOME``). :func:`parse_hub_source`
    builds one from the strings a user types (``seeds="1-9"``, ``steps="0-1000,2000"``)."""

    repo: str
    seeds: tuple[int, ...] = ()
    steps: tuple[tuple[int, int], ...] = ()
    revision_pattern: str = DEFAULT_REVISION_PATTERN
    revision: str = DEFAULT_REVISION
    cache_dir: Path | None = None

    def __post_init__(self) -> None:
        org, _, name = self.repo.partition("/")
        if not org or not name or "/" in name or re.search(r"\s", self.repo):
            raise HubCacheError(f"hub repository {self.repo!r}: give ORG/NAME, e.g. "
                                "EleutherAI/pythia-14m-seed{seed}")  # fmt: skip
        unknown = set(re.findall(r"\{[^{}]*\}", self.repo)) - {SEED, STEP}
        if unknown or "{" in org:
            raise HubCacheError(f"hub repository {self.repo!r}: placeholders {sorted(unknown) or [org]} "
                                "not understood; the repository's name may hold {seed} and "
                                "{step} (e.g. google/multiberts-seed_{seed}-step_{step}k)")  # fmt: skip
        if self.repo.count(STEP) > 1:
            raise HubCacheError(f"hub repository {self.repo!r}: {{step}} appears twice; give it "
                                "once")  # fmt: skip
        if (SEED in self.repo) != bool(self.seeds):
            raise HubCacheError(
                f"hub repository {self.repo!r} with seeds {list(self.seeds)}: give seeds exactly "
                "when the name holds {seed} (e.g. EleutherAI/pythia-14m-seed{seed} with seeds 1-9)"
            )
        if any(lo > hi for lo, hi in self.steps):
            raise HubCacheError(f"hub steps {_intervals_text(self.steps)}: an interval ends "
                                "before it starts; write first-last, e.g. 0-1000")  # fmt: skip
        try:
            groups = re.compile(self.revision_pattern).groups
        except re.error as error:
            raise HubCacheError(f"hub revision pattern {self.revision_pattern!r}: not a regular "
                                f"expression ({error})") from None  # fmt: skip
        if groups < 1:
            raise HubCacheError(f"hub revision pattern {self.revision_pattern!r}: has no group; "
                                r"its first group is the step, e.g. step(\d+)")  # fmt: skip


@dataclass(frozen=True)
class HubCheckpoint:
    """One checkpoint of a suite, resolved: its ``repo``, ``revision`` (the branch or tag asked
    for), ``commit``, ``snapshot`` folder and the ``files`` read there (relative paths: the weights
    first, a sharded checkpoint's index followed by its shards). ``size``: the bytes of its
    tensors where the safetensors headers gave them (a suite resolved online), else None."""

    repo: str
    revision: str
    commit: str
    snapshot: Path
    files: tuple[str, ...]
    size: int | None = None

    @property
    def weights(self) -> Path:
        """The path :func:`~trainmap.dynamics.runs.layouts.load_state_dict_file` reads."""
        return self.snapshot / self.files[0]


@dataclass(frozen=True)
class Manifest:
    """A suite resolved once: its ``source`` (``hf://`` and the repository pattern), the
    ``cache_dir`` it was found in, ``runs``: run name -> step -> :class:`HubCheckpoint`, in step
    order, and the ``spec`` it was resolved from (None in a manifest written without one).
    ``fetch_from``: the Hub endpoint a manifest resolved online names
    (:func:`trainmap.dynamics.runs.hub_fetch.resolve_online`), whose checkpoints are fetched into
    ``cache_dir`` when they are read; None: every file is in the cache already."""

    source: str
    cache_dir: Path
    runs: dict[str, dict[int, HubCheckpoint]]
    spec: HubSpec | None = None
    fetch_from: str | None = None


def parse_ranges(value: str | int | Iterable[int], what: str) -> tuple[tuple[int, int], ...]:
    """Closed intervals of non-negative integers from ``"0-1000,2000"``, an integer or a list of
    integers (each its own interval); ``what`` names the setting in errors."""
    if isinstance(value, bool):
        raise HubCacheError(f"hub {what} {value!r}: give integers, e.g. 1-9 or [0, 2, 5]")
    if isinstance(value, int):
        value = [value]
    if not isinstance(value, str):
        items = list(value)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in items):
            raise HubCacheError(f"hub {what} {items!r}: give non-negative integers, e.g. [0, 2, 5] "
                                "or a string of ranges such as '1-9'")  # fmt: skip
        return tuple((v, v) for v in items)
    intervals = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise HubCacheError(f"hub {what} {value!r}: {part.strip()!r} is neither an integer nor "
                                "a range first-last; write e.g. '1-9' or '0-1000,2000'")  # fmt: skip
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise HubCacheError(f"hub {what} {value!r}: {part.strip()!r} ends before it starts; "
                                "write first-last")  # fmt: skip
        intervals.append((first, last))
    return tuple(intervals)


def parse_hub_source(
    source: str,
    seeds: str | int | Iterable[int] | None = None,
    steps: str | int | Iterable[int] | None = None,
    revision_pattern: str = DEFAULT_REVISION_PATTERN,
    revision: str = DEFAULT_REVISION,
    cache_dir: str | os.PathLike | None = None,
) -> HubSpec:
    """The :class:`HubSpec` of ``hf://ORG/NAME`` (the scheme may be left out) with the options as
    a user writes them: ``seeds`` ``"1-9"`` (every integer of a range is a seed) or a list,
    ``steps`` ``"0-1000,2000"`` (a range keeps the cached steps inside it, a single step must be
    cached) or a list; None: no seeds / every cached step."""
    repo = source.removeprefix(HUB_SCHEME)
    seed_list = sorted({s for lo, hi in parse_ranges(seeds, "seeds") for s in range(lo, hi + 1)}
                       if seeds is not None else set())  # fmt: skip
    return HubSpec(
        repo=repo,
        seeds=tuple(seed_list),
        steps=parse_ranges(steps, "steps") if steps is not None else (),
        revision_pattern=revision_pattern,
        revision=revision,
        cache_dir=Path(cache_dir).expanduser() if cache_dir is not None else None,
    )


def is_hub_source(source: str) -> bool:
    """Whether ``source`` (a command-line argument) names a suite in the Hub cache: ``hf://...``."""
    return source.startswith(HUB_SCHEME)


def run_name(repo: str, seed: int | None) -> str:
    """A run's name: the repository's name with ``seed`` filled in and the ``-``-separated part
    holding ``{step}`` (without ``{seed}``) left out: ``EleutherAI/pythia-14m-seed{seed}`` ->
    ``pythia-14m-seed1``, ``google/multiberts-seed_{seed}-step_{step}k`` -> ``multiberts-seed_0``."""
    name = repo.split("/", 1)[1]
    parts = [part for part in name.split("-") if STEP not in part or SEED in part]
    name = "-".join(part.replace(STEP, "") for part in parts) or "run"
    return name.replace(SEED, str(seed)) if seed is not None else name


def resolve_hub_runs(spec: HubSpec) -> Manifest:
    """Resolve ``spec`` in the local cache, offline: a run per seed (one run without seeds), its
    checkpoints by step, each checked (its ref, snapshot folder, weight files and their blobs,
    a sharded checkpoint's shards). Where two revisions give one step, the shorter name (then the
    first in name order) is read, with a :class:`HubRevisionWarning` naming both. Anything the
    cache lacks raises :class:`HubCacheError` naming the repository, the revision and the
    download command that fetches it."""
    hub = _hub()
    cache = _cache_dir(hub, spec)
    runs: dict[str, dict[int, HubCheckpoint]] = {}
    for seed in spec.seeds or (None,):
        repo = spec.repo.replace(SEED, str(seed)) if seed is not None else spec.repo
        if STEP in repo:
            found = _step_repositories(hub, cache, repo, spec)
        else:
            found = {step: (repo, rev) for step, rev in _branches(hub, cache, repo, spec).items()}
        kept = _select_steps(found, repo, spec)
        runs[run_name(spec.repo, seed)] = {
            step: _checkpoint(hub, cache, name, revision) for step, (name, revision) in kept.items()
        }
    _check_one_architecture(runs)
    return Manifest(source=HUB_SCHEME + spec.repo, cache_dir=cache, runs=runs, spec=spec)


def _check_one_architecture(runs: Mapping[str, Mapping[int, HubCheckpoint]]) -> None:
    """Every run's first checkpoint holds the first run's tensors, by name and shape (their
    headers; a run's own checkpoints are compared with each other when it is read): a map
    compares runs of one architecture. Raises :class:`HubCacheError` naming both revisions."""
    from trainmap.dynamics.runs.layouts import checkpoint_shapes

    firsts = {run: next(iter(checkpoints.values())) for run, checkpoints in runs.items()
              if checkpoints}  # fmt: skip
    check_one_architecture([(run, first, checkpoint_shapes(first.weights))
                            for run, first in firsts.items()])  # fmt: skip


def check_one_architecture(
    firsts: Iterable[tuple[str, HubCheckpoint, Mapping[str, tuple[int, ...]]]],
) -> None:
    """Each ``(run, its first checkpoint, that checkpoint's tensor shapes)`` holds the first
    one's tensors, by name and shape; else :class:`HubCacheError` naming both revisions."""
    from trainmap.dynamics.runs.external import _differing_entries

    reference: tuple[str, HubCheckpoint, Mapping[str, tuple[int, ...]]] | None = None
    for run, checkpoint, shapes in firsts:
        if reference is None:
            reference = (run, checkpoint, shapes)
            continue
        first_run, first, expected = reference
        differ = _differing_entries(shapes, expected)
        if differ:
            raise HubCacheError(
                f"{checkpoint.repo} at revision {checkpoint.revision}: run {run} holds other "
                f"tensors than run {first_run} ({first.repo} at revision {first.revision}): "
                f"{', '.join(differ[:5])}{' ...' if len(differ) > 5 else ''} differ in name or "
                "shape; the runs of one suite share one architecture (map each model size as a "
                "suite of its own)"
            )


def write_manifest(manifest: Manifest, path: str | os.PathLike) -> None:
    """Write ``manifest`` to ``path`` (conventionally :data:`MANIFEST_FILE`) atomically, as JSON
    (:func:`manifest_content`)."""
    save_json(manifest_content(manifest), path)


def manifest_content(manifest: Manifest) -> dict[str, object]:
    """``manifest`` as its JSON holds it: ``{"format", "source", "cache_dir", "runs": {run: {step:
    {repo, revision, commit, snapshot, files, size}}}, "spec": {repo, seeds, steps,
    revision_pattern, revision, cache_dir}, "fetch_from"}`` (``spec``, ``fetch_from`` and
    ``size`` only where the manifest has them). Two manifests with equal content name the same
    checkpoints."""
    runs = {
        run: {str(step): _entry(checkpoint) for step, checkpoint in checkpoints.items()}
        for run, checkpoints in manifest.runs.items()
    }
    content: dict[str, object] = {"format": MANIFEST_FORMAT, "source": manifest.source,
                                  "cache_dir": str(manifest.cache_dir), "runs": runs}  # fmt: skip
    if manifest.spec is not None:
        content["spec"] = _spec_entry(manifest.spec)
    if manifest.fetch_from is not None:
        content["fetch_from"] = manifest.fetch_from
    return content


def read_manifest(path: str | os.PathLike) -> Manifest:
    """The :class:`Manifest` written to ``path`` by :func:`write_manifest`, each file it names
    checked to be there still (a cache cleaned since is an error naming the run, step and file:
    resolve the suite again); a manifest resolved online names files that are fetched when they
    are read, and those are not checked."""
    path = Path(path)
    try:
        content = json.loads(path.read_text())
        if content.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"format {content.get('format')!r}, not {MANIFEST_FORMAT}")
        runs = {
            run: dict(sorted((int(step), _from_entry(entry)) for step, entry in steps.items()))
            for run, steps in content["runs"].items()
        }
        spec = _from_spec_entry(content["spec"]) if content.get("spec") is not None else None
        fetch_from = content.get("fetch_from")
        manifest = Manifest(str(content["source"]), Path(content["cache_dir"]), runs, spec,
                            None if fetch_from is None else str(fetch_from))  # fmt: skip
    except Exception as error:  # noqa: BLE001 - every failure to read is one clear error
        raise HubCacheError(f"{path}: not a suite manifest ({type(error).__name__}: {error}); "
                            "resolve the suite again (resolve_hub_runs, write_manifest)") from None  # fmt: skip
    for run, checkpoints in manifest.runs.items():
        for step, checkpoint in checkpoints.items():
            if not checkpoint.files:
                raise HubCacheError(f"{path}: run {run} step {step} names no files; resolve the "
                                    "suite again")  # fmt: skip
            if manifest.fetch_from is not None:
                continue  # fetched when it is read
            for name in checkpoint.files:
                if not (checkpoint.snapshot / name).is_file():
                    raise HubCacheError(
                        f"{path}: run {run} step {step}: {checkpoint.snapshot / name} "
                        f"({checkpoint.repo} revision {checkpoint.revision}) is no longer there "
                        "(the cache was cleaned or moved); download it again and resolve the "
                        f"suite again: {_download_command(checkpoint.repo, checkpoint.revision)}"
                    )
    return manifest


def manifest_for(spec: HubSpec, path: str | os.PathLike) -> Manifest:
    """The resolution of ``spec``, kept at ``path``: the manifest there when it was resolved from
    ``spec`` and every file it names is still there (the file is then left untouched, its
    modification time too); else ``spec`` resolved again (:func:`resolve_hub_runs`) and written
    there (:func:`write_manifest`). Raises :class:`HubCacheError` when the cache cannot give
    ``spec``."""
    path = Path(path)
    if path.is_file():
        try:
            kept = read_manifest(path)
        except HubCacheError:  # unreadable, or naming files cleaned since: resolved again below
            kept = None
        if kept is not None and kept.spec == spec:
            return kept
    manifest = resolve_hub_runs(spec)
    write_manifest(manifest, path)
    return manifest


def _spec_entry(spec: HubSpec) -> dict[str, object]:
    """A spec as the manifest's JSON holds it."""
    return {"repo": spec.repo, "seeds": list(spec.seeds),
            "steps": [[lo, hi] for lo, hi in spec.steps],
            "revision_pattern": spec.revision_pattern, "revision": spec.revision,
            "cache_dir": str(spec.cache_dir) if spec.cache_dir is not None else None}  # fmt: skip


def _from_spec_entry(entry: Mapping) -> HubSpec:
    """The spec of a manifest's JSON entry (:func:`_spec_entry`)."""
    cache_dir = entry["cache_dir"]
    return HubSpec(repo=str(entry["repo"]), seeds=tuple(int(s) for s in entry["seeds"]),
                   steps=tuple((int(lo), int(hi)) for lo, hi in entry["steps"]),
                   revision_pattern=str(entry["revision_pattern"]),
                   revision=str(entry["revision"]),
                   cache_dir=Path(cache_dir) if cache_dir is not None else None)  # fmt: skip


def _entry(checkpoint: HubCheckpoint) -> dict[str, object]:
    """A checkpoint as the manifest's JSON holds it."""
    entry = {"repo": checkpoint.repo, "revision": checkpoint.revision,
             "commit": checkpoint.commit, "snapshot": str(checkpoint.snapshot),
             "files": list(checkpoint.files)}  # fmt: skip
    if checkpoint.size is not None:  # written only where known: an offline manifest is unchanged
        entry["size"] = checkpoint.size
    return entry


def _from_entry(entry: Mapping) -> HubCheckpoint:
    """The checkpoint of a manifest's JSON entry (:func:`_entry`)."""
    files = tuple(str(name) for name in entry["files"])
    size = entry.get("size")
    return HubCheckpoint(str(entry["repo"]), str(entry["revision"]), str(entry["commit"]),
                         Path(entry["snapshot"]), files, None if size is None else int(size))  # fmt: skip


def hub_run_checkpoints(manifest: Manifest, run: str) -> dict[int, Path]:
    """Step -> checkpoint path of ``run`` (an :class:`~trainmap.dynamics.runs.external.ExternalRun`'s
    ``checkpoints``), in step order."""
    if run not in manifest.runs:
        raise HubCacheError(f"{manifest.source}: no run {run!r} (runs: "
                            f"{', '.join(manifest.runs)}); name one of them")  # fmt: skip
    return {step: checkpoint.weights for step, checkpoint in manifest.runs[run].items()}


def suite_run_curve(curve_file: Path | None, steps: list[int], curve: str | None) -> pd.DataFrame:
    """A suite run's evaluation curve at its checkpoint ``steps`` (a suite ships none): its
    ``<run>.csv`` file read (:func:`~trainmap.dynamics.runs.layouts.read_evaluation`, holding
    the column ``curve``; None: no column required), or none without a file
    (:func:`~trainmap.dynamics.runs.external.no_curve`)."""
    from trainmap.dynamics.runs.external import no_curve
    from trainmap.dynamics.runs.layouts import read_evaluation

    if curve_file is None:
        return no_curve(steps)
    return read_evaluation(Path(curve_file), steps, curve)


def hub_run_files(manifest: Manifest, run: str) -> list[Path]:
    """Every file ``run`` is read from (the weights, a sharded checkpoint's index and shards), in
    step order: a workflow's inputs, as :func:`~trainmap.dynamics.runs.external.run_files` gives them
    for a run directory."""
    hub_run_checkpoints(manifest, run)  # an unknown run is an error naming the runs
    return [c.snapshot / name for c in manifest.runs[run].values() for name in c.files]


def _hub() -> ModuleType:
    """huggingface_hub, imported on first use (it is an optional dependency)."""
    try:
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.errors
        import huggingface_hub.file_download
        import huggingface_hub.utils
    except ImportError:
        raise HubCacheError("reading checkpoint suites from the Hugging Face cache needs "
                            f"huggingface_hub: {INSTALL_HINT}") from None  # fmt: skip
    return huggingface_hub


def _cache_dir(hub: ModuleType, spec: HubSpec) -> Path:
    """The cache to read: ``spec.cache_dir``, else huggingface_hub's ``HF_HUB_CACHE`` (read at
    each call, so a patched constant counts); a missing one is an error (offline or not)."""
    constants = hub.constants
    cache = spec.cache_dir if spec.cache_dir is not None else Path(constants.HF_HUB_CACHE)
    if cache.is_dir():
        return cache
    offline = constants.HF_HUB_OFFLINE or (
        os.environ.get("HF_HUB_OFFLINE", "").upper() in constants.ENV_VARS_TRUE_VALUES
    )
    command = _download_command(spec.repo, _hint_revision(spec))
    if offline:
        raise HubCacheError(
            f"{spec.repo}: HF_HUB_OFFLINE=1 and there is no Hugging Face cache at {cache}; point "
            "HF_HUB_CACHE (or HF_HOME, or the cache directory setting) at the cache that holds "
            f"the suite, or download it first without HF_HUB_OFFLINE: {command}"
        )
    raise HubCacheError(f"{spec.repo}: there is no Hugging Face cache at {cache}; download the "
                        f"suite first ({command}) or point HF_HUB_CACHE at its cache")  # fmt: skip


def _download_command(repo: str, revision: str | None) -> str:
    """The two ways to fetch ``repo`` at ``revision`` into the cache, for error messages."""
    if revision is None:
        return f"hf download {repo}  (or snapshot_download({repo!r}))"
    return (f"hf download {repo} --revision {revision}  (or snapshot_download({repo!r}, "
            f"revision={revision!r}))")  # fmt: skip


def _hint_revision(spec: HubSpec, step: int | None = None) -> str:
    """The revision to name in a download command: a ``{step}`` suite's ``revision``, else the
    branch of ``step`` (the first step asked for, else 0) where the default pattern names it."""
    if STEP in spec.repo:
        return spec.revision
    if spec.revision_pattern != DEFAULT_REVISION_PATTERN:
        return "<branch>"
    if step is None:
        step = spec.steps[0][0] if spec.steps else 0
    return f"step{step}"


def _repo_dir(hub: ModuleType, cache: Path, repo: str, revision: str) -> Path:
    """``models--ORG--NAME`` of ``repo`` in ``cache``; not there is an error naming the command."""
    try:
        hub.utils.validate_repo_id(repo)
    except hub.utils.HFValidationError as error:
        raise HubCacheError(f"{repo}: not a repository id ({error}); fix the repository "
                            "pattern") from None  # fmt: skip
    folder = cache / hub.file_download.repo_folder_name(repo_id=repo, repo_type="model")
    if not folder.is_dir():
        raise HubCacheError(f"{repo}: not in the Hugging Face cache {cache}; download it: "
                            f"{_download_command(repo, revision)}")  # fmt: skip
    return folder


def _branches(hub: ModuleType, cache: Path, repo: str, spec: HubSpec) -> dict[int, str]:
    """Step -> revision of ``repo``'s cached refs that ``spec.revision_pattern`` matches."""
    folder = _repo_dir(hub, cache, repo, _hint_revision(spec))
    refs = folder / "refs"
    names = sorted(p.relative_to(refs).as_posix() for p in refs.rglob("*") if p.is_file()) \
        if refs.is_dir() else []  # fmt: skip
    found = match_branches(names, repo, spec)
    if not found:
        raise HubCacheError(
            f"{repo}: no cached revision's name matches {spec.revision_pattern!r} (revisions "
            f"cached: {', '.join(names) or 'none'}); download the checkpoints' branches "
            f"({_download_command(repo, _hint_revision(spec))}) or give the revision pattern "
            "of its branches"
        )
    return found


def match_branches(names: Iterable[str], repo: str, spec: HubSpec) -> dict[int, str]:
    """Step -> branch of the ``names`` that ``spec.revision_pattern`` matches at their start (its
    first group the step); two names of one step: :func:`_prefer`. Empty when none matches."""
    pattern = re.compile(spec.revision_pattern)
    found: dict[int, str] = {}
    for name in names:
        match = pattern.match(name)
        if match is None:
            continue
        try:
            step = int(match.group(1))
        except (TypeError, ValueError):
            raise HubCacheError(
                f"{repo} revision {name}: the revision pattern {spec.revision_pattern!r} gives "
                f"step {match.group(1)!r}, not an integer; make its first group the step's digits"
            ) from None
        found[step] = _prefer(repo, step, found[step], name) if step in found else name
    return found


def _prefer(where: str, step: int, first: str, second: str) -> str:
    """Of two names giving one step, the shorter (then the first in name order), with a warning
    naming both."""
    chosen, other = sorted((first, second), key=lambda name: (len(name), name))
    warnings.warn(f"{where}: {chosen!r} and {other!r} both give step {step}; reading {chosen!r} "
                  "(the shorter name); narrow the revision or repository pattern to read the "
                  "other", HubRevisionWarning, stacklevel=4)  # fmt: skip
    return chosen


def _step_repositories(
    hub: ModuleType, cache: Path, repo: str, spec: HubSpec
) -> dict[int, tuple[str, str]]:
    """Step -> (repository, revision) of the cached repositories ``repo`` (holding ``{step}``)
    matches: the ``{step}`` value an integer, ``k`` (after it, in the value or the pattern)
    read as thousands."""
    # huggingface_hub's repo_folder_name (models--ORG--NAME), spelled out: it refuses {step}
    folder = hub.constants.REPO_ID_SEPARATOR.join(["models", *repo.split("/")])
    before, after = folder.split(STEP)
    pattern = re.compile(re.escape(before) + r"(?P<step>[^/]+?)" + re.escape(after))
    found: dict[int, tuple[str, str]] = {}
    for child in sorted(cache.iterdir()):
        match = pattern.fullmatch(child.name)
        if match is None or not child.is_dir():
            continue
        name = repo.replace(STEP, match["step"])
        value = re.fullmatch(r"(\d+)(k?)", match["step"])
        if value is None:
            raise HubCacheError(
                f"{name} (revision {spec.revision}): its step {match['step']!r} (the {{step}} of "
                f"{repo}) is not an integer (with an optional k for thousands); remove it from the "
                f"cache ({child}) or give a repository pattern it does not match"
            )
        thousands = value.group(2) == "k" or after.startswith("k")
        step = int(value.group(1)) * (1000 if thousands else 1)
        if step in found:
            name = _prefer(repo, step, found[step][0], name)
        found[step] = (name, spec.revision)
    if not found:
        example = _step_repo(repo, spec.steps[0][0] if spec.steps else 0)
        raise HubCacheError(f"{repo}: no repository of the suite is in the Hugging Face cache "
                            f"{cache}; download them, e.g. "
                            f"{_download_command(example, spec.revision)}")  # fmt: skip
    return dict(sorted(found.items()))


def _step_repo(repo: str, step: int) -> str:
    """The repository of ``step`` in a ``{step}`` suite (``{step}k``: thousands)."""
    if f"{STEP}k" in repo:
        return repo.replace(STEP, str(step // 1000)) if step % 1000 == 0 else repo
    return repo.replace(STEP, str(step))


def _select_steps(
    found: Mapping[int, tuple[str, str]], repo: str, spec: HubSpec
) -> dict[int, tuple[str, str]]:
    """The found checkpoints inside ``spec.steps`` (all without), in step order; an interval
    holding no cached step is an error listing those intervals and the cached steps."""
    ordered = dict(sorted(found.items()))
    if not spec.steps:
        return ordered
    absent = [(lo, hi) for lo, hi in spec.steps if not any(lo <= s <= hi for s in ordered)]
    if absent:
        first = absent[0][0]
        where = _step_repo(repo, first) if STEP in repo else repo
        raise HubCacheError(
            f"{repo}: steps {_intervals_text(absent)} not in the cache (cached steps: "
            f"{_steps_text(ordered)}); download them, e.g. "
            f"{_download_command(where, _hint_revision(spec, first))}, or leave them out of steps"
        )
    return {step: value for step, value in ordered.items()
            if any(lo <= step <= hi for lo, hi in spec.steps)}  # fmt: skip


def _checkpoint(hub: ModuleType, cache: Path, repo: str, revision: str) -> HubCheckpoint:
    """One revision of ``repo`` resolved to its commit, snapshot and weight files, each checked."""
    folder = _repo_dir(hub, cache, repo, revision)
    command = _download_command(repo, revision)
    ref = folder / "refs" / revision
    if ref.is_file():
        commit = ref.read_text().strip()
    elif (folder / "snapshots" / revision).is_dir():  # a commit hash asked for by itself
        commit = revision
    else:
        refs = folder / "refs"
        cached = sorted(p.relative_to(refs).as_posix() for p in refs.rglob("*") if p.is_file()) \
            if refs.is_dir() else []  # fmt: skip
        raise HubCacheError(f"{repo}: revision {revision} is not in the cache (revisions cached: "
                            f"{', '.join(cached) or 'none'}); download it: {command}")  # fmt: skip
    snapshot = folder / "snapshots" / commit
    if not snapshot.is_dir():
        raise HubCacheError(
            f"{repo} revision {revision}: refs/{revision} points to commit {commit}, which has no "
            f"snapshot folder ({snapshot}; deleted, or its download never finished); download it "
            f"again: {command}"
        )
    for name in MODEL_WEIGHTS:
        cached = hub.try_to_load_from_cache(repo, name, cache_dir=cache, revision=commit)
        if isinstance(cached, str) or (snapshot / name).is_symlink():
            _check_blob(snapshot, name, repo, revision, command)
            files = [name]
            if name.endswith(SHARD_INDEX_SUFFIX):
                files += _shards(snapshot, name, repo, revision, command)
            return HubCheckpoint(repo, revision, commit, snapshot, tuple(files))
    held = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if not p.is_dir())
    unfinished = sorted(p.name for p in (folder / "blobs").glob(f"*{INCOMPLETE_SUFFIX}"))
    interrupted = (f"; its blobs/ holds unfinished downloads ({', '.join(unfinished[:3])})"
                   if unfinished else "")  # fmt: skip
    raise HubCacheError(
        f"{repo} revision {revision}: the snapshot {snapshot} holds no weights (none of "
        f"{', '.join(MODEL_WEIGHTS)}; it holds {', '.join(held[:8]) or 'nothing'}){interrupted}; "
        f"download them: {command}"
    )


def _check_blob(snapshot: Path, name: str, repo: str, revision: str, command: str) -> None:
    """The snapshot's file ``name`` is there: a regular file, or a symlink into a finished blob
    (not a deleted one, not ``<hash>.incomplete``)."""
    link = snapshot / name
    if not link.is_symlink():
        if not link.is_file():
            raise HubCacheError(f"{repo} revision {revision}: {name} is missing from the "
                                f"snapshot {snapshot}; download it again: {command}")  # fmt: skip
        return
    blob = Path(os.path.abspath(link.parent / os.readlink(link)))  # the first hop, into blobs/
    resolved = link.resolve()
    partial = blob.with_name(blob.name + INCOMPLETE_SUFFIX)
    if resolved.name.endswith(INCOMPLETE_SUFFIX) or (not resolved.exists() and partial.exists()):
        unfinished = resolved if resolved.name.endswith(INCOMPLETE_SUFFIX) else partial
        raise HubCacheError(f"{repo} revision {revision}: {name} was not fully downloaded (its "
                            f"blob {unfinished} is unfinished); download it again: {command}")  # fmt: skip
    if not resolved.is_file():
        raise HubCacheError(f"{repo} revision {revision}: {name} links to a deleted blob "
                            f"({blob}); download it again: {command}")  # fmt: skip


def _shards(snapshot: Path, index: str, repo: str, revision: str, command: str) -> list[str]:
    """The shard files a sharded checkpoint's index names, each checked (:func:`_check_blob`)."""
    try:
        shards = index_shards(snapshot / index)
    except ExternalRunError as error:
        raise HubCacheError(f"{repo} revision {revision}: {error}; download it again: "
                            f"{command}") from None  # fmt: skip
    names = [shard.relative_to(snapshot).as_posix() for shard in shards]
    for name in names:
        if not (snapshot / name).is_symlink() and not (snapshot / name).is_file():
            raise HubCacheError(f"{repo} revision {revision}: shard {name} of {index} is missing "
                                f"({len(names)} shards named); download it: {command}")  # fmt: skip
        _check_blob(snapshot, name, repo, revision, command)
    return names


def _steps_text(steps: Iterable[int]) -> str:
    values = [str(step) for step in sorted(steps)]
    if len(values) <= 12:
        return ", ".join(values) or "none"
    return f"{', '.join(values[:5])}, ..., {', '.join(values[-5:])} ({len(values)} steps)"


def _intervals_text(intervals: Iterable[tuple[int, int]]) -> str:
    return ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in intervals)
