"""Atomic file output and safe checkpoint loading.

Every file trainmap writes goes to a temporary file in the destination directory first and is then
renamed over the target (``os.replace`` is atomic on POSIX), so a job killed mid-write never leaves a
truncated result that a later rule would read as finished work. Checkpoints are read with
``torch.load(weights_only=True)``: tensors and plain Python containers only, never arbitrary pickles.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
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


def save_torch(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to ``path`` atomically."""
    write_atomic(path, lambda tmp: torch.save(obj, tmp))


def load_torch(path: str | os.PathLike) -> Any:
    """Load a trainmap checkpoint: tensors and plain containers only (``weights_only=True``)."""
    return torch.load(path, map_location="cpu", weights_only=True)


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
