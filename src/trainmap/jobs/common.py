"""One function per workflow rule: read inputs, call the library, write outputs, log to MLflow.

The Snakemake scripts in ``workflow/scripts/`` only unpack ``snakemake.input/params/output`` and call
one of these, so every rule can also run from Python without Snakemake.

Per-seed rules run a **block** of seeds per job (``trainmap.grid.Block``): ``train`` and
``sparse_retrain`` train the block as one vectorised model, the others loop over its cells. Every
seed still gets its own files in its own directory (``results/<rule>/<task>/<arch>/<method>/seed<n>/``)
and its own MLflow run under its cell's parent run; the job's declared output is the block's
**manifest** beside them (``.../seeds<first>-<last>.json``), which lists the cells and their files.
Snakemake tracks manifests, so a 40,000-seed grid is a DAG of a few thousand jobs.
"""

from __future__ import annotations

import hashlib
import json
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from trainmap.data import TaskData, load_task_data
from trainmap.grid import Cell, SeedRange
from trainmap.io import (
    save_json,
)


def settings_hash(settings: Any) -> str:
    """A short, stable hash of a settings mapping."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


# --- blocks and their manifests -------------------------------------------------------------------


def seed_dir(manifest: str | Path, cell: Cell) -> Path:
    """A cell's directory beside its block's manifest (``.../seeds0-31.json`` -> ``.../seed3``)."""
    return Path(manifest).parent / f"seed{cell.seed}"


def cell_file(manifest: str | Path, cell: Cell, name: str) -> Path:
    """A file of ``cell`` that the block of ``manifest`` wrote; a clear error when it is gone."""
    path = seed_dir(manifest, cell) / name
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing, though its block's manifest {manifest} says it was written; "
            f"delete {manifest} (or rerun with --forcerun) so that Snakemake remakes the block"
        )
    return path


def write_manifest(path: str | Path, rule: str, block: SeedRange, files: list[dict[str, Any]],
                   **extra: Any) -> None:  # fmt: skip
    """The block's declared output: its cells and, per cell, the files it wrote (and a status)."""
    cells = [{"cell": cell.id, **entry} for cell, entry in zip(block.cells, files, strict=True)]
    save_json({"rule": rule, "block": block.to_dict(), "cells": cells, **extra}, path)


def _over_cells(block: SeedRange, description: str, work: Callable[[Cell], dict]) -> list[dict]:
    """``work(cell)`` for every cell of the block, with a progress bar in the job's log."""
    from tqdm.auto import tqdm

    return [work(cell) for cell in tqdm(block.cells, desc=description, mininterval=5)]


def _task_data(data: str | Path | TaskData) -> TaskData:
    """The dataset: as given when a block job loaded it once for all its cells, else read (and
    verified) from its path."""
    return data if isinstance(data, TaskData) else load_task_data(data)


@contextmanager
def logged_to(path: str | Path) -> Iterator[None]:
    """Send the job's stdout, stderr (progress bars, warnings, tracebacks) to its Snakemake log."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", buffering=1) as log, redirect_stdout(log), redirect_stderr(log):
        try:
            yield
        except BaseException:
            traceback.print_exc(file=log)
            raise
