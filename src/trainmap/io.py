"""Atomic file output and safe, verified checkpoint loading.

Every file trainmap writes goes to a temporary file in the destination directory first and is then
renamed over the target (``os.replace`` is atomic on POSIX), so a job killed mid-write never leaves a
truncated result that a later rule would read as finished work. Checkpoints are read with
``torch.load(weights_only=True)``: tensors and plain Python containers only, never arbitrary pickles.

Checksums: every checkpoint :func:`save_torch` writes carries the SHA-256 of its content, and
:func:`load_torch` verifies it before unpickling, so a file damaged on disk or in a copy (flipped
bytes, a truncated transfer) is an error instead of silently wrong weights feeding every later rule.
The digest lives in the zip archive's comment (``torch.save`` writes a zip file; its end record may
carry a comment of up to 64 KiB that zip readers, ``torch.load`` included, skip), so a checksummed
file is still an ordinary checkpoint that plain ``torch.load`` reads. It covers every byte before
the comment. Files written before checksums existed (no comment) load unverified with a warning
naming the file: results in existing trees stay usable, and deleting such a file and rerunning
gives a verified one.

Same content, same bytes: DVC versions results by content, so a rerun that recomputes a result
must write the same file, or every rerun adds a copy to the cache and the remote and ``dvc status``
reports changes that are none. So :func:`save_torch` hands ``torch.save`` an open file, never a
path (given a path, ``torch.save`` names the archive's inner folder after it, and the path here is a
random temporary name), and :func:`save_json` writes sorted keys. Measured times
(:data:`TIMING_KEYS`: wall time, speed, latency) are never the same twice, and where a run resumed
after a kill says how it went, not what it computed, so neither goes into a result file:
``save_json`` and :func:`save_table` write them to a **timing sidecar** beside it
(``train.json`` -> ``train.timing.json``, ``evaluation.csv`` -> ``evaluation.timing.csv``;
:func:`timing_path`), a file pattern ``.dvcignore`` lists, and :func:`load_json` merges them back
in when the sidecar is there. MLflow gets the times as metrics and the sidecars as artifacts.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import re
import shutil
import struct
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainmap.faults import fault_point


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # A fresh unique name that the writer creates itself, so the file gets the permissions of any
    # new file (the umask, e.g. 0644); ``tempfile.mkstemp`` would create it owner-only (0600), and
    # ``os.replace`` would carry that mode over to every result.
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    try:
        try:
            yield tmp
        except OSError as error:
            if error.errno in _DISK_FULL:
                raise DiskFullError(target, error) from error
            raise
        fault_point("rename")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


#: A write that failed for want of room: the device is full, the user's quota or the process's
#: file-size limit (RLIMIT_FSIZE) is reached.
_DISK_FULL = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}


class DiskFullError(OSError):
    """A result file that could not be written for want of room; the file it would have replaced
    is intact (the write went to a temporary name)."""

    def __init__(self, target: Path, error: OSError) -> None:
        reason = {errno.EFBIG: "the file-size limit (ulimit -f) was reached",
                  errno.EDQUOT: "the disk quota is exhausted"}.get(error.errno,
                                                                  "no space left on the device")  # fmt: skip
        kept = "the previous version is intact" if target.exists() else "nothing was written"
        super().__init__(
            error.errno,
            f"could not write {target}: {reason} ({errno.errorcode[error.errno]}); {kept}. "
            "Free space (df -h, or set the config key results to a larger disk) and run again: "
            "the job restarts from its last resume state",
        )


def write_atomic(path: str | os.PathLike, write: Callable[[Path], Any]) -> None:
    """Call ``write(tmp_path)`` and move the result onto ``path`` atomically."""
    with atomic_path(path) as tmp:
        write(tmp)


#: ``torch.save``'s zip archive ends with this 22-byte end record; its last 2 bytes are the comment
#: length, and the comment follows.
_END_RECORD = b"PK\x05\x06"
_END_RECORD_SIZE = 22
CHECKSUM_PREFIX = b"trainmap-sha256:"
_COMMENT_SIZE = len(CHECKSUM_PREFIX) + 64
_CHUNK = 1 << 20


class DamagedFileError(OSError):
    """A result file that cannot be trusted (a checkpoint, a JSON record): its first line names the
    file and says how to remake it."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        super().__init__(f"damaged file {path}: {problem}; {remedy(path)}")
        self.path = Path(path)
        self.problem = problem


#: A seed range's manifest name, e.g. ``seeds0-31.json`` (trainmap.grid.SeedRange.name + ".json").
SEED_RANGE_MANIFEST = re.compile(r"seeds(\d+)-(\d+)\.json")


#: Where a config's published outputs live: a folder beside the config files (config/published/).
PUBLISHED_DIRECTORY = "published"


def published_digest_of(configfile: str | Path) -> Path:
    """The digest a config's results are checked against (``make run``'s last step):
    ``config/config.yaml`` -> ``config/published/config.results.sha256``, its findings page and
    machine record beside it (:func:`companion_path`)."""
    path = Path(configfile)
    return path.parent / PUBLISHED_DIRECTORY / f"{path.stem}.results.sha256"


def companion_path(published_digest: str | Path, suffix: str) -> Path:
    """A file published beside a digest: ``config/published/config.results.sha256`` with
    ``suffix`` ``.findings.md`` -> ``config/published/config.findings.md``."""
    path = Path(published_digest)
    name = path.name.removesuffix(".sha256").removesuffix(".results")
    return path.with_name(f"{name}{suffix}")


def block_manifest_of(path: str | os.PathLike) -> Path | None:
    """The manifest of the seed block that wrote ``path`` (``.../seed3/model.pt`` ->
    ``.../seeds0-31.json``, the manifest whose seed range holds 3; also for a file one folder
    down, ``.../seed3/checkpoints/step_00000100.safetensors``), or None outside a block."""
    seed_dir = Path(path).parent
    match = re.fullmatch(r"seed(\d+)", seed_dir.name)
    if match is None:
        seed_dir = seed_dir.parent
        match = re.fullmatch(r"seed(\d+)", seed_dir.name)
    if match is None:
        return None
    seed = int(match.group(1))
    for manifest in sorted(seed_dir.parent.glob("seeds*-*.json")):
        bounds = SEED_RANGE_MANIFEST.fullmatch(manifest.name)
        if bounds and int(bounds.group(1)) <= seed <= int(bounds.group(2)):
            return manifest
    return None


def remedy(path: str | os.PathLike) -> str:
    """How to remake a damaged file: Snakemake tracks a seed block by its manifest, so a file a
    block wrote is remade by deleting the manifest too."""
    manifest = block_manifest_of(path)
    if manifest is None:
        return "delete it and rerun (Snakemake remakes it)"
    return (
        f"delete it and its block's manifest {manifest}, then rerun (Snakemake remakes the block)"
    )


def save_torch(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to ``path`` atomically, with the SHA-256 of the content in the archive; the
    same ``obj`` gives the same bytes whatever the path."""

    import torch  # here, not at the top: the analysis reads and writes JSON without torch

    def write(tmp: Path) -> None:
        fault_point("torch-write")
        with open(tmp, "w+b") as stream:
            # An open file, not the (random, temporary) path: torch.save names the archive's inner
            # folder after a path it is given, and "archive" for a stream.
            torch.save(obj, stream)
            size = stream.seek(0, os.SEEK_END)
            stream.seek(size - _END_RECORD_SIZE)
            if stream.read(4) != _END_RECORD:  # never for torch's zip writer; fail loudly if so
                raise RuntimeError(f"torch.save wrote no zip end record to {tmp}")
            digest = _sha256(stream, size - 2)
            stream.seek(size - 2)
            stream.write(struct.pack("<H", _COMMENT_SIZE) + CHECKSUM_PREFIX + digest.encode())

    write_atomic(path, write)


def load_torch(path: str | os.PathLike) -> Any:
    """Load a trainmap checkpoint after verifying its checksum: tensors and plain containers only
    (``weights_only=True``). A damaged file raises :class:`DamagedFileError`."""
    import torch

    verified = verify_checksum(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except pickle.UnpicklingError:
        # torch's own message suggests weights_only=False, which would run the file's code.
        raise DamagedFileError(
            path,
            "it holds objects other than tensors and plain containers, which trainmap "
            "never writes; refusing to load it",
        ) from None
    except Exception as error:  # noqa: BLE001 - every failure to read is one clear error
        state = "its checksum matched, but " if verified else ""
        raise DamagedFileError(
            path, f"{state}it cannot be read as a checkpoint ({type(error).__name__})"
        ) from None


def verify_checksum(path: str | os.PathLike) -> bool:
    """Check the SHA-256 :func:`save_torch` stored in ``path``: True when it matches, False for a
    file written before checksums existed (a warning names it); a mismatch, an empty, truncated or
    non-checkpoint file raises :class:`DamagedFileError`."""
    with open(path, "rb") as stream:
        size = stream.seek(0, os.SEEK_END)
        if size == 0:
            raise DamagedFileError(path, "it is empty")
        tail_size = min(size, _END_RECORD_SIZE + _COMMENT_SIZE)
        stream.seek(size - tail_size)
        tail = stream.read(tail_size)
        comment = tail[-_COMMENT_SIZE:]
        if comment.startswith(CHECKSUM_PREFIX) and tail.startswith(_END_RECORD):
            stored = comment[len(CHECKSUM_PREFIX) :].decode("ascii", errors="replace")
            if _sha256(stream, size - _COMMENT_SIZE - 2) != stored:
                raise DamagedFileError(
                    path, "its content does not match the checksum written with it"
                )
            return True
    if tail[-_END_RECORD_SIZE : -_END_RECORD_SIZE + 4] == _END_RECORD and tail[-2:] == b"\0\0":
        warnings.warn(
            f"{path} has no checksum (written before trainmap checksummed checkpoints): loading "
            f"it unverified; for a verified file, {remedy(path)}",
            stacklevel=3,
        )
        return False
    raise DamagedFileError(path, "it is truncated or is not a checkpoint trainmap wrote")


def load_resume_or_none(path: str | os.PathLike) -> Any | None:
    """A run's resume state, or None when there is none or it is damaged: Snakemake does not track
    resume files, so a damaged one would fail its cell on every rerun. A damaged file is deleted
    with a warning and training starts from the beginning."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        return load_torch(path)
    except DamagedFileError as error:
        warnings.warn(
            f"damaged resume file {path}: {error.problem}; deleted it, training starts from step 0",
            stacklevel=2,
        )
        path.unlink(missing_ok=True)
        return None


def _sha256(stream: Any, length: int) -> str:
    """The SHA-256 of the first ``length`` bytes of ``stream`` (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    stream.seek(0)
    remaining = length
    while remaining > 0:
        chunk = stream.read(min(_CHUNK, remaining))
        if not chunk:
            break
        digest.update(chunk)
        remaining -= len(chunk)
    return digest.hexdigest()


#: Keys (at any depth of a JSON record, or columns of a table) whose values differ between runs of
#: the same computation: measured times, and the step a killed run resumed from (a resumed run's
#: results are the uninterrupted run's, byte for byte). save_json and save_table write them to the
#: timing sidecar instead.
TIMING_KEYS = frozenset({"wall_time_s", "steps_per_s", "train_wall_time_s", "latency_ms",
                         "seconds", "elapsed_s", "metrics_s", "archive_s",
                         "resumed_from_step"})  # fmt: skip
TIMING_INFIX = ".timing"


def timing_path(path: str | os.PathLike) -> Path:
    """Where the measured times of ``path`` go: ``train.json`` -> ``train.timing.json``,
    ``evaluation.csv`` -> ``evaluation.timing.csv``, ``seeds0-1.resume.pt`` ->
    ``seeds0-1.resume.timing.json``."""
    path = Path(path)
    suffix = ".csv" if path.suffix == ".csv" else ".json"
    return path.with_name(f"{path.stem}{TIMING_INFIX}{suffix}")


def save_json(obj: Any, path: str | os.PathLike) -> None:
    """Write pretty, key-sorted JSON atomically (NaN is written as null: JSON has no NaN). Entries
    named in :data:`TIMING_KEYS` go to :func:`timing_path` instead (same nesting; list items keep
    their positions), so the file itself holds only what a rerun reproduces byte for byte."""
    content, timing = split_timing(_json_safe(obj))
    if timing is None:
        timing_path(path).unlink(missing_ok=True)  # a sidecar of an earlier version of the file
    else:
        save_timing(timing, path)
    _write_json(content, path)


def load_json(path: str | os.PathLike, timing: bool = True) -> Any:
    """Read a JSON file, with the entries of its timing sidecar merged back in when it has one
    (``timing=False``: the file alone)."""
    try:
        content = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DamagedFileError(path, f"not valid JSON ({error})") from None
    if not timing:
        return content
    try:
        return merge_timing(content, load_timing(path))
    except ValueError:  # a sidecar left from another version of the file
        warnings.warn(f"{timing_path(path)} does not fit {path}: its times are left out",
                      stacklevel=2)  # fmt: skip
        return content


def save_timing(timing: dict[str, Any], path: str | os.PathLike) -> None:
    """Write the measured times of ``path`` to its :func:`timing_path`, as they are."""
    _write_json(timing, timing_path(path))


def load_timing(path: str | os.PathLike) -> dict[str, Any]:
    """The measured times of ``path`` (its timing sidecar; empty when it has none)."""
    sidecar = timing_path(path)
    return json.loads(sidecar.read_text()) if sidecar.exists() else {}


def split_timing(obj: Any) -> tuple[Any, Any]:
    """``(content, timing)``: ``obj`` without its :data:`TIMING_KEYS` entries, and those entries
    alone in the same nesting (None when there are none; a list's items keep their positions)."""
    if isinstance(obj, dict):
        content, timing = {}, {}
        for key, value in obj.items():
            if key in TIMING_KEYS:
                timing[key] = value
                continue
            content[key], inner = split_timing(value)
            if inner is not None:
                timing[key] = inner
        return content, timing or None
    if isinstance(obj, list):
        pairs = [split_timing(item) for item in obj]
        if all(inner is None for _, inner in pairs):
            return [item for item, _ in pairs], None
        return [item for item, _ in pairs], [inner or {} for _, inner in pairs]
    return obj, None


def merge_timing(content: Any, timing: Any) -> Any:
    """The inverse of :func:`split_timing`; ValueError when ``timing`` does not fit ``content``."""
    if not timing:
        return content
    if isinstance(content, dict) and isinstance(timing, dict):
        merged = dict(content)
        for key, value in timing.items():
            merged[key] = merge_timing(content[key], value) if key in content else value
        return merged
    if isinstance(content, list) and isinstance(timing, list) and len(content) == len(timing):
        return [merge_timing(item, inner) for item, inner in zip(content, timing, strict=True)]
    raise ValueError("the times do not fit the record")


def save_table(frame: Any, path: str | os.PathLike, keys: tuple[str, ...] = ()) -> None:
    """Write a pandas table as CSV atomically; its :data:`TIMING_KEYS` columns go, with the
    ``keys`` columns that name each row, to its timing sidecar instead (``evaluation.csv`` ->
    ``evaluation.timing.csv``)."""
    timed = [column for column in frame.columns if column in TIMING_KEYS]
    sidecar = timing_path(path)
    if timed:
        times = frame[[*keys, *timed]]
        write_atomic(sidecar, lambda tmp: times.to_csv(tmp, index=False))
    else:
        sidecar.unlink(missing_ok=True)
    content = frame.drop(columns=timed)
    write_atomic(path, lambda tmp: content.to_csv(tmp, index=False))


def _write_json(obj: Any, path: str | os.PathLike) -> None:
    text = json.dumps(_json_safe(obj), indent=2, sort_keys=True) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text))


def append_rows(path: str | os.PathLike, rows: list[dict[str, Any]], fields: list[str]) -> None:
    """Append ``rows`` to the CSV file ``path`` (its header ``fields`` written first when the file
    is new): a benchmark's resumable raw rows, one finished piece of work at a time."""
    import csv

    path = Path(path)
    new = not path.is_file()
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def save_text(text: str, path: str | os.PathLike) -> None:
    """Write text atomically."""
    write_atomic(path, lambda tmp: tmp.write_text(text))


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and obj != obj:  # NaN
        return None
    if isinstance(obj, float) and obj in (float("inf"), float("-inf")):
        return None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy arrays and scalars, tensors
        return _json_safe(obj.tolist())
    return obj


# Everything a run of the workflow (Snakemake or DVC) reads; results and tracking stores stay out.
WORKFLOW_PATHS = ("Snakefile", "params.yaml", "dvc.yaml", ".dvcignore", "config", "workflow",
                  "profiles", "src")  # fmt: skip


def copy_workflow(repo: Path, destination: Path) -> Path:
    """Copy the workflow's sources (:data:`WORKFLOW_PATHS`) of ``repo`` into ``destination``, for a
    run in a scratch directory (tests, benchmarks); no results, no tracking store, no bytecode."""
    destination.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_PATHS:
        source = repo / name
        if source.is_dir():
            shutil.copytree(
                source, destination / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        elif source.exists():
            shutil.copy2(source, destination / name)
    return destination
