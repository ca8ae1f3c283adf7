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
"""

from __future__ import annotations

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

import torch


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
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


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
    """A checkpoint that cannot be trusted: its first line names the file and says to remake it."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        super().__init__(f"damaged file {path}: {problem}; {remedy(path)}")
        self.path = Path(path)
        self.problem = problem


def block_manifest_of(path: str | os.PathLike) -> Path | None:
    """The manifest of the seed block that wrote ``path`` (``.../seed3/model.pt`` ->
    ``.../seeds0-31.json``, the manifest whose seed range holds 3), or None outside a block."""
    seed_dir = Path(path).parent
    match = re.fullmatch(r"seed(\d+)", seed_dir.name)
    if match is None:
        return None
    seed = int(match.group(1))
    for manifest in sorted(seed_dir.parent.glob("seeds*-*.json")):
        bounds = re.fullmatch(r"seeds(\d+)-(\d+)\.json", manifest.name)
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
    """``torch.save`` to ``path`` atomically, with the SHA-256 of the content in the archive."""

    def write(tmp: Path) -> None:
        torch.save(obj, tmp)
        with open(tmp, "r+b") as stream:
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


def save_json(obj: Any, path: str | os.PathLike) -> None:
    """Write pretty, key-sorted JSON atomically (NaN is written as null: JSON has no NaN)."""
    text = json.dumps(_json_safe(obj), indent=2, sort_keys=True) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text))


def load_json(path: str | os.PathLike) -> Any:
    """Read a JSON file."""
    return json.loads(Path(path).read_text())


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
    if isinstance(obj, torch.Tensor):
        return _json_safe(obj.tolist())
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy arrays and scalars
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
