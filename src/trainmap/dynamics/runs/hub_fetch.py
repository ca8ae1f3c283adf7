"""Public checkpoint suites fetched from the Hugging Face Hub with bounded disk.

Part 1 (:mod:`trainmap.dynamics.runs.hub`) reads suites already in the local cache. This module
reaches the Hub itself, in three steps that never hold more than the revisions in flight:

1. :func:`resolve_online` lists each repository's branches (``list_repo_refs``) and reads each
   kept revision's safetensors headers (``get_safetensors_metadata``: a ranged read of the
   header, never the weights), checking that every run holds one architecture. It gives the same
   :class:`~trainmap.dynamics.runs.hub.Manifest` the offline reader gives (``revisions.json``,
   :func:`~trainmap.dynamics.runs.hub.write_manifest`), with ``fetch_from`` set to the endpoint:
   its files are fetched when they are read, so nothing after this step lists the Hub.
2. :func:`fetch_checkpoint` downloads one revision's weight files (and ``config.json``) into the
   cache (``snapshot_download`` with ``allow_patterns``); a revision whose files are all there
   already (the user downloaded it) is read where it is and marked as not fetched.
3. :func:`release_checkpoint` deletes a revision that :func:`fetch_checkpoint` fetched from the
   cache (``scan_cache_dir(...).delete_revisions``), once what was measured of it is written.

:func:`suite_run_metrics` does the three for one run, a revision at a time: each revision's metrics
row is written (atomically) as soon as it is measured, a rerun reads no revision that has its row,
and the rows are joined into the run's table at the end. A crash, ``kill -9`` or a full disk keeps
every row already written; the disk in use is the revisions in flight (one, or ``fetch_jobs``)
plus the rows.

The endpoint is ``huggingface_hub``'s (``HF_ENDPOINT``, read when it is imported) unless one is
given. Errors name the repository and the revision: :class:`~trainmap.dynamics.runs.hub.
HubCacheError`.
"""

from __future__ import annotations

import errno
import hashlib
import json
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from trainmap.dynamics.metrics.weights import with_history
from trainmap.dynamics.runs.external import ExternalRun, external_run_metrics, no_curve
from trainmap.dynamics.runs.heldout import LOSS_COLUMN, TOKENIZER_FILES, with_heldout_loss
from trainmap.dynamics.runs.hub import (
    SEED,
    STEP,
    HubCacheError,
    HubCheckpoint,
    HubSpec,
    Manifest,
    _hub,
    _intervals_text,
    _select_steps,
    _step_repo,
    _steps_text,
    check_one_architecture,
    match_branches,
    run_name,
)
from trainmap.dynamics.runs.layouts import MODEL_WEIGHTS, ExternalRunError, checkpoint_shapes
from trainmap.dynamics.runs.names import HUB_DEFAULTS, HUB_SCHEME, ROW_DEFINITIONS
from trainmap.io import write_atomic

#: What :func:`fetch_checkpoint` downloads besides a revision's weight files.
FETCHED_BESIDES_WEIGHTS = ("config.json",)
#: The safetensors dtypes of floating-point tensors (the entries a map measures).
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})


@dataclass(frozen=True)
class Fetched:
    """One checkpoint's files in the cache: its ``snapshot`` folder and whether
    :func:`fetch_checkpoint` downloaded them (``fetched``) or found them there already."""

    snapshot: Path
    fetched: bool


def resolve_online(
    spec: HubSpec, endpoint: str | None = None, token: str | bool | None = None
) -> Manifest:
    """Resolve ``spec`` against the Hub: a run per seed, its checkpoints by step (a branch per
    checkpoint: the branches ``spec.revision_pattern`` matches, within ``spec.steps``; a
    repository per checkpoint: ``spec.steps``, each a single step, at ``spec.revision``), each
    checkpoint's commit and weight files from its safetensors headers, every run's first
    checkpoint holding the first run's tensors. Nothing but refs and headers is read. The
    manifest's snapshots are where :func:`fetch_checkpoint` puts the files in ``spec``'s cache
    (created if missing)."""
    hub = _hub()
    cache = spec.cache_dir if spec.cache_dir is not None else Path(hub.constants.HF_HUB_CACHE)
    cache.mkdir(parents=True, exist_ok=True)
    api = hub.HfApi(endpoint=endpoint, token=token)
    runs: dict[str, dict[int, HubCheckpoint]] = {}
    shapes: dict[str, tuple[str, HubCheckpoint, dict[str, tuple[int, ...]]]] = {}
    for seed in spec.seeds or (None,):
        repo = spec.repo.replace(SEED, str(seed)) if seed is not None else spec.repo
        listed: dict[str, str] | None = None  # the branches of a repository per seed, listed once
        if STEP in repo:
            found = {step: (_step_repo(repo, step), spec.revision) for step in _listed_steps(spec)}
        else:
            branches = _refs(api, hub, repo)
            matched = match_branches(sorted(branches), repo, spec)
            if not matched:
                raise HubCacheError(f"{repo}: no branch's name matches {spec.revision_pattern!r} "
                                    f"(branches: {', '.join(sorted(branches)) or 'none'}); give "
                                    "the revision pattern of its checkpoints' branches")  # fmt: skip
            found = {step: (repo, name) for step, name in matched.items()}
            _check_steps_listed(found, repo, spec)
            listed = branches
        kept = _select_steps(found, repo, spec)
        run = run_name(spec.repo, seed)
        runs[run] = {}
        for step, (name, revision) in tqdm(kept.items(), desc=f"{run}: headers", unit="revision",
                                           leave=False):  # fmt: skip
            commit = _commit(api, hub, name, revision, listed)
            files, tensors, size = _weight_files(api, hub, name, revision, commit)
            checkpoint = HubCheckpoint(name, revision, commit, _snapshot(hub, cache, name, commit),
                                       files, size)  # fmt: skip
            runs[run][step] = checkpoint
            if tensors is not None and run not in shapes:
                shapes[run] = (run, checkpoint, tensors)
    check_one_architecture(list(shapes.values()))
    return Manifest(source=HUB_SCHEME + spec.repo, cache_dir=cache, runs=runs, spec=spec,
                    fetch_from=endpoint or str(hub.constants.ENDPOINT))  # fmt: skip


def fetch_checkpoint(
    checkpoint: HubCheckpoint, cache_dir: Path, endpoint: str | None = None,
    token: str | bool | None = None,
) -> Fetched:  # fmt: skip
    """Put ``checkpoint``'s weight files (and ``config.json`` where the revision has one) into
    ``cache_dir`` at its commit, unless all are there already; only those files are downloaded.
    A failed download (after huggingface_hub's own retries) raises :class:`HubCacheError` naming
    the repository and the revision; a half-written blob stays ``.incomplete`` and is never read."""
    hub = _hub()
    snapshot = _snapshot(hub, cache_dir, checkpoint.repo, checkpoint.commit)
    if all((snapshot / name).is_file() for name in checkpoint.files):
        return Fetched(snapshot, fetched=False)
    try:
        with repository_lock(cache_dir, checkpoint.repo):
            folder = hub.snapshot_download(
                checkpoint.repo, revision=checkpoint.commit, cache_dir=cache_dir,
                endpoint=endpoint, token=token,
                allow_patterns=[*checkpoint.files, *FETCHED_BESIDES_WEIGHTS],
            )  # fmt: skip
    except Exception as error:  # noqa: BLE001 - each failure named with its repository
        raise HubCacheError(_failure(checkpoint, "could not be fetched", error)) from error
    missing = [name for name in checkpoint.files if not (Path(folder) / name).is_file()]
    if missing:
        raise HubCacheError(f"{checkpoint.repo} revision {checkpoint.revision}: the Hub gave no "
                            f"{', '.join(missing)} at commit {checkpoint.commit}; resolve the "
                            "suite again (its revisions.json is out of date)")  # fmt: skip
    return Fetched(Path(folder), fetched=True)


def tokenizer_folder(
    checkpoint: HubCheckpoint, cache_dir: Path, endpoint: str | None = None,
    token: str | bool | None = None,
) -> tuple[Path, bool]:  # fmt: skip
    """The folder holding ``checkpoint``'s tokenizer files: its snapshot, where they are fetched
    (only they: ``snapshot_download`` with the tokenizer's file names) unless one is there
    already. Returns the folder and whether this call fetched into a revision whose weights are
    not in the cache (the caller then deletes it: :func:`release_checkpoint`)."""
    hub = _hub()
    snapshot = _snapshot(hub, cache_dir, checkpoint.repo, checkpoint.commit)
    if any((snapshot / name).is_file() for name in TOKENIZER_FILES):
        return snapshot, False
    had = snapshot.is_dir()
    try:
        with repository_lock(cache_dir, checkpoint.repo):
            folder = hub.snapshot_download(
                checkpoint.repo, revision=checkpoint.commit, cache_dir=cache_dir,
                endpoint=endpoint, token=token, allow_patterns=list(TOKENIZER_FILES),
            )  # fmt: skip
    except Exception as error:  # noqa: BLE001 - each failure named with its repository
        raise HubCacheError(
            _failure(checkpoint, "its tokenizer could not be fetched", error)
        ) from error
    return Path(folder), not had


@contextmanager
def repository_lock(cache_dir: Path, repo: str) -> Iterator[None]:
    """Held while a revision of ``repo`` is downloaded into ``cache_dir`` or deleted from it, by
    threads and processes alike (a file lock, ``<cache>/.locks/trainmap/``): revisions share blobs
    (a ``config.json`` the same at every step), and a deletion computed while another revision's
    files are being linked would delete a blob that revision has just linked to. Downloads of one
    repository therefore take turns; measuring still overlaps them."""
    from filelock import FileLock

    folder = _hub().file_download.repo_folder_name(repo_id=repo, repo_type="model")
    path = cache_dir / ".locks" / "trainmap" / f"{folder}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path):
        yield


def release_checkpoint(checkpoint: HubCheckpoint, cache_dir: Path) -> int:
    """Delete ``checkpoint``'s revision from ``cache_dir`` (its snapshot, its ref if it points
    there, and the blobs no other revision uses); returns the bytes freed. A deletion that fails
    raises :class:`HubCacheError` naming the repository, the revision and the folder."""
    hub = _hub()
    try:
        with repository_lock(cache_dir, checkpoint.repo):
            info = hub.scan_cache_dir(cache_dir)
            strategy = info.delete_revisions(checkpoint.commit)
            strategy.execute()
    except Exception as error:  # noqa: BLE001 - each failure named with its repository
        raise HubCacheError(_failure(checkpoint, f"could not be deleted from {cache_dir}", error)
                            + "; what was measured of it is kept: free the disk by hand "
                            "(hf cache delete) or fix the folder's permissions") from error  # fmt: skip
    snapshot = _snapshot(hub, cache_dir, checkpoint.repo, checkpoint.commit)
    if snapshot.exists():
        raise HubCacheError(f"{checkpoint.repo} revision {checkpoint.revision}: {snapshot} is "
                            "still there after its deletion; free the disk by hand (hf cache "
                            "delete); what was measured of it is kept")  # fmt: skip
    return int(strategy.expected_freed_size)


def suite_run_metrics(
    manifest: Manifest,
    run: str,
    rows: Path,
    measure: Callable[[Path, int], pd.DataFrame],
    keep_weights: bool = bool(HUB_DEFAULTS["keep_weights"]),
    token: str | bool | None = None,
    fetch_jobs: int = int(HUB_DEFAULTS["fetch_jobs"]),
    steps: Collection[int] | None = None,
) -> pd.DataFrame:
    """``run``'s metric table (only ``steps`` of it, when given: a workflow job's block of
    revisions), one revision at a time, in step order. A revision whose row
    ``rows/step<step>.<commit>.csv`` exists is not read again (a row of the step at another
    commit is an error: :func:`_row_kept`); any other is fetched
    (:func:`fetch_checkpoint`, from ``manifest.fetch_from``), checked to hold the tensors of the
    run's first revision (their shapes kept in ``rows/shapes.json``), measured by
    ``measure(weights path, step)`` (one row of the metric table), its row written atomically,
    and then, if it was fetched here (by this call or by one a crash ended: a marker
    ``rows/.fetched-<commit>`` says so) and not ``keep_weights``, deleted from the cache
    (:func:`release_checkpoint`); a revision the user had stays. A revision a crash left in the
    cache after its row was written is deleted at the start of the next call. ``fetch_jobs``:
    revisions fetched ahead, the next ones downloading while one is measured (the disk then holds
    at most that many; downloads of one repository take turns: :func:`repository_lock`). Returns
    the rows joined (pandas reads the numbers back as written: the same floats)."""
    if run not in manifest.runs:
        raise HubCacheError(f"{manifest.source}: no run {run!r} (runs: {', '.join(manifest.runs)})")
    if fetch_jobs < 1:
        raise HubCacheError(f"fetch jobs {fetch_jobs}: give at least 1")
    kept = manifest.runs[run]
    if steps is not None:
        unknown = sorted(set(steps) - set(kept))
        if unknown:
            raise HubCacheError(f"{manifest.source}: run {run} has no steps {unknown[:5]} (its "
                                f"steps: {_steps_text(kept)}); resolve the suite again")  # fmt: skip
        kept = {step: checkpoint for step, checkpoint in kept.items() if step in set(steps)}
    rows.mkdir(parents=True, exist_ok=True)
    todo = [(step, checkpoint) for step, checkpoint in kept.items()
            if not _row_kept(rows, step, checkpoint)]  # fmt: skip
    pending = {step for step, _ in todo}
    for step, checkpoint in kept.items():
        # A crash between writing a revision's row and deleting it leaves the revision in the
        # cache with its marker: it is measured, so it is deleted now, not skipped and kept.
        marker = rows / f".fetched-{checkpoint.commit}"
        if marker.exists() and step not in pending:
            snapshot = _snapshot(_hub(), manifest.cache_dir, checkpoint.repo, checkpoint.commit)
            if snapshot.exists() and not keep_weights:
                release_checkpoint(checkpoint, manifest.cache_dir)
            marker.unlink(missing_ok=True)

    def start(pool: ThreadPoolExecutor, checkpoint: HubCheckpoint) -> Future[Fetched]:
        # Marked before the download: a revision a crash left in the cache is still known as
        # fetched here, and deleted once measured, not taken for one the user had.
        snapshot = _snapshot(_hub(), manifest.cache_dir, checkpoint.repo, checkpoint.commit)
        if not all((snapshot / name).is_file() for name in checkpoint.files):
            (rows / f".fetched-{checkpoint.commit}").touch()
        return pool.submit(fetch_checkpoint, checkpoint, manifest.cache_dir, manifest.fetch_from,
                           token)  # fmt: skip

    with ThreadPoolExecutor(max_workers=fetch_jobs) as pool:
        try:
            started = [start(pool, checkpoint) for _, checkpoint in todo[:fetch_jobs]]
            for index, (step, checkpoint) in enumerate(todo):
                fetched = started[index].result()
                _measure_revision(checkpoint, fetched, step, rows, measure)
                marker = rows / f".fetched-{checkpoint.commit}"
                if (fetched.fetched or marker.exists()) and not keep_weights:
                    release_checkpoint(checkpoint, manifest.cache_dir)
                marker.unlink(missing_ok=True)
                if index + fetch_jobs < len(todo):
                    started.append(start(pool, todo[index + fetch_jobs][1]))
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    tables = [pd.read_csv(row_path(rows, step, checkpoint)) for step, checkpoint in kept.items()]
    return pd.concat(tables, ignore_index=True)


def measured_revisions(
    manifest: Manifest, run: str, rows_base: Path, *, convention: str, heads: int | None = None,
    model: Any = None, arch: Mapping | None = None, tokens: np.ndarray | None = None,
    context: int = 0, keep_weights: bool = bool(HUB_DEFAULTS["keep_weights"]),
    fetch_jobs: int = int(HUB_DEFAULTS["fetch_jobs"]), steps: Collection[int] | None = None,
) -> pd.DataFrame:  # fmt: skip
    """``run``'s metric rows (``steps`` of them, when given), without its curve: each revision
    fetched and measured alone (:func:`~trainmap.dynamics.runs.external.external_run_metrics`
    with ``convention``, ``heads`` and ``model``, the model built from ``arch``), with ``tokens``
    its held-out loss on them in ``context``-token sequences
    (:func:`~trainmap.dynamics.runs.heldout.with_heldout_loss`), its row kept under
    ``rows_base``/<key of these settings> (:func:`rows_folder`) by :func:`suite_run_metrics`.
    What ``trainmap map --fetch`` and the workflow's revision jobs measure."""

    def measure(path: Path, step: int) -> pd.DataFrame:
        one = ExternalRun(path.parent, {step: path}, no_curve([step]))
        return with_heldout_loss(external_run_metrics(one, convention, heads, model),
                                 {step: path}, tokens, context)  # fmt: skip

    rows = rows_folder(rows_base, row_settings(convention, heads, arch, tokens, context))
    return suite_run_metrics(manifest, run, rows, measure, keep_weights=keep_weights,
                             fetch_jobs=fetch_jobs, steps=steps)  # fmt: skip


def rows_folder(base: Path, settings: Mapping[str, Any]) -> Path:
    """Where the rows measured under ``settings`` (what changes a row: the convention, heads,
    architecture, held-out tokens; JSON-able) and the present code of :data:`ROW_DEFINITIONS` are
    kept: ``base/<key>``, the key a hash of both, with ``settings.json`` there saying what they
    were. Rows measured otherwise stay in their own folder and are never read as these."""
    import trainmap

    package = Path(trainmap.__file__).parent
    digest = hashlib.sha256(json.dumps(dict(settings), sort_keys=True, default=str).encode())
    for name in ROW_DEFINITIONS:
        digest.update((package / name).read_bytes())
    folder = base / digest.hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    record = folder / "settings.json"
    if not record.is_file():
        write_atomic(record, lambda tmp: tmp.write_text(json.dumps(dict(settings), indent=1,
                                                                   sort_keys=True, default=str)))  # fmt: skip
    return folder


def row_settings(convention: str, heads: int | None, arch: Mapping | None,
                 tokens: np.ndarray | None, context: int) -> dict:  # fmt: skip
    """What a fetched revision's metrics row depends on besides its weights and the code
    (:func:`rows_folder`): the convention, heads, the model the state dicts are read through
    (``{"arch", "meta", "options"}`` or None), and the held-out tokens (their digest) and
    context. A row holds no curve: :func:`with_curve` joins it to the rows."""

    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()[:16]

    return {"convention": convention, "heads": heads, "arch": arch,
            "tokens": None if tokens is None else digest(np.ascontiguousarray(tokens).tobytes()),
            "context": None if tokens is None else context}  # fmt: skip


def with_curve(table: pd.DataFrame, curve: pd.DataFrame, heldout: bool) -> pd.DataFrame:
    """The joined rows ``table`` (measured without a curve) with the run's ``curve`` at their
    steps (:func:`~trainmap.dynamics.metrics.weights.with_history`); with ``heldout``, the
    held-out loss measured per revision stays the ``test_loss`` column. The curve is joined
    here, not kept in the rows, so a changed curve file remeasures nothing."""
    loss = table[LOSS_COLUMN].to_numpy() if heldout else None
    table = with_history(table, curve)
    if loss is not None:
        table[LOSS_COLUMN] = loss
    return table


def row_path(rows: Path, step: int, checkpoint: HubCheckpoint) -> Path:
    """Where the row of ``step`` measured at ``checkpoint``'s commit is kept."""
    return rows / f"step{step}.{checkpoint.commit}.csv"


def _row_kept(rows: Path, step: int, checkpoint: HubCheckpoint) -> bool:
    """Whether ``step``'s row was measured already, at this commit. A row measured at another
    commit (the branch was moved since) is an error naming both: nothing is measured over it."""
    if row_path(rows, step, checkpoint).is_file():
        return True
    other = sorted(rows.glob(f"step{step}.*.csv"))
    if other:
        measured = other[0].name.split(".")[1]
        raise HubCacheError(
            f"{checkpoint.repo} revision {checkpoint.revision}: its row in {rows} was measured at "
            f"commit {measured}, but the revision now points to {checkpoint.commit}; keep the "
            f"old numbers with the revisions.json they came from, or delete {other[0]} to measure "
            "the revision again"
        )
    return False


def _measure_revision(
    checkpoint: HubCheckpoint, fetched: Fetched, step: int, rows: Path,
    measure: Callable[[Path, int], pd.DataFrame],
) -> None:  # fmt: skip
    """Check one fetched revision's tensors against the run's first (``rows/shapes.json``),
    measure it and write its row (:func:`row_path`) atomically."""
    path = fetched.snapshot / checkpoint.files[0]
    shapes = {name: list(shape) for name, shape in checkpoint_shapes(path).items()}
    shapes_file = rows / "shapes.json"
    if not shapes_file.is_file():
        write_atomic(shapes_file, lambda tmp: tmp.write_text(json.dumps(shapes)))
    reference = json.loads(shapes_file.read_text())
    if shapes != reference:
        differ = sorted(set(shapes) ^ set(reference)) or sorted(
            name for name in shapes if shapes[name] != reference[name])  # fmt: skip
        raise ExternalRunError(f"{checkpoint.repo} revision {checkpoint.revision}: its tensors "
                               f"differ from the run's first revision's ({', '.join(differ[:5])}"
                               f"); every checkpoint of a run holds one architecture")  # fmt: skip
    table = measure(path, step)
    write_atomic(row_path(rows, step, checkpoint), lambda tmp: table.to_csv(tmp, index=False))


def _failure(checkpoint: HubCheckpoint, what: str, error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return (f"{checkpoint.repo} revision {checkpoint.revision} (commit {checkpoint.commit}) "
                f"{what}: no room for it ({error}); free space in the cache (df -h) or point "
                "--hf-cache at a larger disk, and run again: the rows already written are kept")  # fmt: skip
    return (f"{checkpoint.repo} revision {checkpoint.revision} (commit {checkpoint.commit}) {what}"
            f": {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")  # fmt: skip


def _snapshot(hub: Any, cache: Path, repo: str, commit: str) -> Path:
    return cache / hub.file_download.repo_folder_name(repo_id=repo, repo_type="model") / \
        "snapshots" / commit  # fmt: skip


def _listed_steps(spec: HubSpec) -> list[int]:
    """A repository-per-checkpoint suite's steps: online they cannot be listed, so ``steps`` must
    name each (intervals of one step)."""
    wide = [(lo, hi) for lo, hi in spec.steps if lo != hi]
    if not spec.steps or wide:
        raise HubCacheError(f"{spec.repo}: a repository per checkpoint is fetched only at the "
                            "steps given one by one (steps: 0,20000,40000), not "
                            f"{_intervals_text(wide) or 'every step'}; list them")  # fmt: skip
    return [lo for lo, _ in spec.steps]


def _check_steps_listed(found: Mapping[int, tuple[str, str]], repo: str, spec: HubSpec) -> None:
    """Each interval of ``spec.steps`` holds a branch on the Hub (else the error names them)."""
    absent = [(lo, hi) for lo, hi in spec.steps if not any(lo <= s <= hi for s in found)]
    if absent:
        raise HubCacheError(f"{repo}: steps {_intervals_text(absent)} have no branch on the Hub "
                            f"(its steps: {_steps_text(found)}); leave them out of steps")  # fmt: skip


def _refs(api: Any, hub: Any, repo: str) -> dict[str, str]:
    """Branch -> commit of ``repo`` on the Hub."""
    try:
        refs = api.list_repo_refs(repo)
    except Exception as error:  # noqa: BLE001 - each failure named with its repository
        raise HubCacheError(_hub_failure(hub, repo, None, error)) from error
    return {branch.name: branch.target_commit for branch in refs.branches}


def _commit(
    api: Any, hub: Any, repo: str, revision: str, branches: Mapping[str, str] | None = None
) -> str:
    """The commit ``revision`` of ``repo`` points to: from ``repo``'s ``branches`` when they were
    listed already, else from its refs (a repository per checkpoint)."""
    if branches is None:
        branches = _refs(api, hub, repo)
    if revision in branches:
        return branches[revision]
    try:
        return str(api.model_info(repo, revision=revision).sha)
    except Exception as error:  # noqa: BLE001 - each failure named with its repository
        raise HubCacheError(_hub_failure(hub, repo, revision, error)) from error


def _weight_files(
    api: Any, hub: Any, repo: str, revision: str, commit: str
) -> tuple[tuple[str, ...], dict[str, tuple[int, ...]] | None, int | None]:
    """The weight files of ``repo`` at ``commit`` (a sharded checkpoint: its index, then its
    shards), the shapes of their floating-point tensors and their tensors' bytes, from the
    safetensors headers (None and None for a ``pytorch_model.bin`` checkpoint, whose shapes are
    read once it is fetched)."""
    errors = hub.errors
    try:
        metadata = api.get_safetensors_metadata(repo, revision=commit)
    except errors.NotASafetensorsRepoError:
        try:
            listed = set(api.list_repo_files(repo, revision=commit))
        except Exception as error:  # noqa: BLE001
            raise HubCacheError(_hub_failure(hub, repo, revision, error)) from error
        for name in MODEL_WEIGHTS:
            if name in listed and not name.endswith(".index.json"):
                return (name,), None, None
        raise HubCacheError(f"{repo} revision {revision}: holds none of "
                            f"{', '.join(MODEL_WEIGHTS)} (it holds {', '.join(sorted(listed)[:8])})"
                            "; a suite's checkpoints are Hugging Face model folders") from None  # fmt: skip
    except Exception as error:  # noqa: BLE001 - each failure named with its repository
        raise HubCacheError(_hub_failure(hub, repo, revision, error)) from error
    tensors = {name: tuple(info.shape)
               for meta in metadata.files_metadata.values()
               for name, info in meta.tensors.items() if info.dtype in FLOAT_DTYPES}  # fmt: skip
    size = sum(info.data_offsets[1] - info.data_offsets[0]  # the tensor's bytes in its file
               for meta in metadata.files_metadata.values() for info in meta.tensors.values())  # fmt: skip
    if metadata.sharded:
        shards = tuple(sorted(set(metadata.weight_map.values())))
        return ("model.safetensors.index.json", *shards), tensors, size
    return ("model.safetensors",), tensors, size


def _hub_failure(hub: Any, repo: str, revision: str | None, error: BaseException) -> str:
    """What a Hub error means for ``repo`` (and ``revision``), and the fix."""
    errors = hub.errors
    where = repo if revision is None else f"{repo} revision {revision}"
    if isinstance(error, errors.GatedRepoError):
        return (f"{where}: the repository is gated; accept its terms on the Hub and log in "
                "(hf auth login, or HF_TOKEN)")  # fmt: skip
    if isinstance(error, errors.RevisionNotFoundError):
        return f"{where}: the revision does not exist on the Hub; fix the steps or the revision"
    if isinstance(error, errors.RepositoryNotFoundError):
        return (f"{where}: no such repository on the Hub, or it is private (log in: hf auth "
                "login, or HF_TOKEN); fix the repository pattern")  # fmt: skip
    if isinstance(error, errors.EntryNotFoundError):
        return f"{where}: a file the suite needs is not on the Hub ({error})"
    return f"{where}: the Hub could not be read ({type(error).__name__}: {error})"
