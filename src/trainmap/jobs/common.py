"""What the job modules share: a seed range's job (:class:`SeedRangeJob`: its cells, their MLflow
runs, their directories and its manifest), the files an upstream job wrote, settings hashes and
job logs.

Per-seed rules run a **seed range** of one (task, arch, method) per job
(``trainmap.grid.SeedRange``): ``train`` and ``sparse_retrain`` train its cells as one vectorised
model, the others loop over them. Every seed still gets its own files in its own directory
(``results/<rule>/<task>/<arch>/<method>/seed<n>/``) and its own MLflow run under its cell's parent
run; the job's declared output is the range's **manifest** beside them
(``.../seeds<first>-<last>.json``), which lists the cells and what each wrote. Snakemake tracks
manifests, so a 40,000-seed grid is a DAG of a few thousand jobs.
"""

from __future__ import annotations

import hashlib
import json
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import (
    AbstractContextManager,
    ExitStack,
    contextmanager,
    redirect_stderr,
    redirect_stdout,
)
from pathlib import Path
from typing import Any, TypeVar

from tqdm.auto import tqdm

from trainmap.grid import Cell, SeedRange
from trainmap.io import save_json
from trainmap.lineage import (
    FILES,
    MADE_FROM,
    check_current,
    check_file,
    directory_hashes,
    made_from,
)
from trainmap.tracking import RuleRun, rule_run

Result = TypeVar("Result")


def settings_hash(settings: Any) -> str:
    """A short, stable hash of a settings mapping."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


class SeedRangeJob:
    """The job of a per-seed rule for one seed range: each cell's MLflow run (nested under the
    cell's parent run at its config hash, ``cell_hashes[cell.id]``), each cell's directory beside
    the ``manifest``, and the manifest itself, written last.

    A looping job calls :meth:`for_each_cell`; a vectorised one opens every cell's run at once
    (:meth:`runs`) around the one call that trains them all. Both end with :meth:`write_manifest`.

    What the job reads goes through :meth:`input_file` (a file an upstream block wrote, checked
    against that block's manifest) and :meth:`uses` (any other input, e.g. the dataset): the
    manifest records them as what the block was made from (trainmap.lineage).
    """

    def __init__(
        self,
        rule: str,
        seed_range: SeedRange | Mapping[str, Any],
        manifest: str | Path,
        tracking: Mapping[str, str],
        cell_hashes: Mapping[str, str],
    ) -> None:
        self.rule = rule
        self.seed_range = SeedRange.of(seed_range)
        self.manifest = Path(manifest)
        self.tracking = tracking
        self.cell_hashes = cell_hashes
        self.inputs: set[str] = set()

    def input_file(self, manifest: str | Path, cell: Cell, name: str) -> Path:
        """``cell``'s file ``name`` that the upstream block of ``manifest`` wrote, checked to be
        the file that manifest records and the manifest to be current (trainmap.lineage); the
        manifest becomes one of what this block is made from."""
        path = check_file(cell_file(manifest, cell, name), manifest)
        # outside the workflow a block's files may come without its manifest: then the file itself
        self.inputs.add(str(manifest) if Path(manifest).exists() else str(path))
        return path

    def uses(self, *paths: str | Path | None) -> None:
        """Record ``paths`` (inputs read whole, e.g. the dataset or an upstream manifest) as what
        this block is made from; a manifest among them must be current."""
        for path in paths:
            if path is None:
                continue
            if str(path).endswith(".json"):
                check_current(path)
            self.inputs.add(str(path))

    @property
    def cells(self) -> list[Cell]:
        """The range's cells, in seed order."""
        return self.seed_range.cells

    def seed_dir(self, cell: Cell) -> Path:
        """Where ``cell``'s files go: beside the manifest (``.../seeds0-31.json`` -> ``.../seed3``)."""
        return seed_dir(self.manifest, cell)

    def run(self, cell: Cell, params: Mapping | None = None) -> AbstractContextManager[RuleRun]:
        """``cell``'s MLflow run of this rule."""
        return rule_run(self.tracking, self.rule, cell=cell, params=params,
                        config_hash=self.cell_hashes[cell.id])  # fmt: skip

    def for_each_cell(
        self,
        work: Callable[[Cell, RuleRun], Result],
        *,
        params: Mapping | None = None,
        description: str | None = None,
    ) -> list[Result]:
        """``work(cell, run)`` for each cell in seed order, inside the cell's own run, with a
        progress bar in the job's log; the results in seed order."""
        cells = tqdm(self.cells, desc=description or f"{self.rule} {self.seed_range.id}",
                     mininterval=5)  # fmt: skip
        results = []
        for cell in cells:
            with self.run(cell, params) as run:
                results.append(work(cell, run))
        return results

    @contextmanager
    def runs(self, params: Mapping | None = None) -> Iterator[list[RuleRun]]:
        """Every cell's run, open together (in seed order) while the range trains as one model."""
        with ExitStack() as stack:
            yield [stack.enter_context(self.run(cell, params)) for cell in self.cells]

    def write_manifest(self, entries: Iterable[Mapping[str, Any]], **extra: Any) -> None:
        """The job's declared output: its cells, each with its ``entries`` item (its status) and
        the SHA-256 of every file it wrote, in seed order; and what the block was made from."""
        entries = [{**entry, FILES: directory_hashes(self.seed_dir(cell))}
                   for cell, entry in zip(self.cells, entries, strict=True)]  # fmt: skip
        write_manifest(self.manifest, self.rule, self.seed_range, entries,
                       **{MADE_FROM: made_from(self.manifest, self.inputs)}, **extra)  # fmt: skip


# --- seed ranges' files and manifests -------------------------------------------------------------


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


def write_manifest(path: str | Path, rule: str, block: SeedRange, files: list[Mapping[str, Any]],
                   **extra: Any) -> None:  # fmt: skip
    """The block's declared output: its cells and, per cell, the files it wrote (and a status)."""
    cells = [{"cell": cell.id, **entry} for cell, entry in zip(block.cells, files, strict=True)]
    save_json({"rule": rule, "block": block.to_dict(), "cells": cells, **extra}, path)


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
