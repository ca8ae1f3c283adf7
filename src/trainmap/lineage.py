"""What every result was made from: content hashes in the block manifests, checked before a job reads.

A block job's manifest (trainmap.jobs.common) records

* per cell, ``files``: the SHA-256 of every file the job wrote in the cell's directory (timing
  sidecars aside: they differ on every run, trainmap.io.timing_path), and
* ``made_from``: the SHA-256 of every input file the job read (upstream manifests, the dataset),
  by path relative to the manifest's own directory, so the record is the same on any machine.

So a manifest's bytes change whenever what its block made changes (a retrained model gives another
manifest), and Snakemake, which compares an updated input's checksum with the one it recorded,
reruns exactly what depends on it, also when each DVC stage is its own ``snakemake`` call.

And a job refuses a mixed generation (:class:`StaleInputError`): before it reads a file of a block,
the file must be the one the block's manifest records, and the manifest must still be made from
what sits upstream now (the ``made_from`` hashes, followed up the chain of manifests). A manual
copy, an interrupted stage or another runner cannot make a verdict from files older than their
upstream; the error names the files and the command that remakes them.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trainmap.io import SEED_RANGE_MANIFEST, TIMING_INFIX, block_manifest_of

#: Manifest keys: per cell ``{name: sha256}``, and the job's inputs ``{relative path: sha256}``.
FILES = "files"
MADE_FROM = "made_from"


class StaleInputError(RuntimeError):
    """An input was not made from what sits upstream now, or is not the file its manifest records."""


def remake_command(manifest: str | os.PathLike) -> str:
    """The command that remakes a block and everything after it."""
    return (f"snakemake --cores all --forcerun {manifest} (with your --configfile; "
            "or delete the manifest and run the workflow again)")  # fmt: skip


def _stat_key(path: str | os.PathLike) -> tuple[str, int, int]:
    """A file's identity while unchanged: absolute path, size, modification time."""
    stat = os.stat(path)
    return (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes (remembered per path, size and modification time, so a job
    that meets one input through several manifests reads it once)."""
    key = _stat_key(path)
    if key not in _DIGESTS:
        with open(path, "rb") as stream:
            _DIGESTS[key] = hashlib.file_digest(stream, "sha256").hexdigest()
    return _DIGESTS[key]


def is_result_file(path: Path) -> bool:
    """A file a rerun reproduces: not a timing sidecar, not a temporary file being written."""
    return not path.name.startswith(".") and TIMING_INFIX not in path.name


def directory_hashes(directory: str | os.PathLike) -> dict[str, str]:
    """``{relative name: sha256}`` of every result file under ``directory``, sorted by name."""
    root = Path(directory)
    if not root.is_dir():
        return {}
    files = sorted(p for p in root.rglob("*") if p.is_file() and is_result_file(p))
    return {p.relative_to(root).as_posix(): file_sha256(p) for p in files}


def made_from(manifest: str | os.PathLike, inputs: Iterable[str | os.PathLike]) -> dict[str, str]:
    """The ``made_from`` record of ``manifest``: each input's SHA-256, by path relative to the
    manifest's directory."""
    base = Path(manifest).parent
    return {
        Path(os.path.relpath(Path(path).absolute(), base.absolute())).as_posix(): file_sha256(path)
        for path in sorted({os.fspath(p) for p in inputs})
    }


_MANIFESTS: dict[tuple[str, int, int], Mapping[str, Any]] = {}


def _load(manifest: Path) -> Mapping[str, Any]:
    key = _stat_key(manifest)
    if key not in _MANIFESTS:
        _MANIFESTS[key] = json.loads(manifest.read_text())
    return _MANIFESTS[key]


def _cell_files(manifest: Path, seed_dir: str) -> Mapping[str, str] | None:
    """The recorded hashes of one cell's files (its directory ``seed<n>``), None when the manifest
    predates content hashes."""
    record = _load(manifest)
    for cell in record.get("cells", []):
        if cell.get("cell", "").rsplit("/", 1)[-1] == seed_dir:
            return cell.get(FILES)
    return None


def check_current(manifest: str | os.PathLike) -> None:
    """Stop unless ``manifest`` was made from what sits upstream now: each ``made_from`` input has
    the recorded SHA-256, and each upstream manifest is current too (up the chain). Hashes are
    remembered per file and modification time, so a repeated check costs a ``stat`` per file. A
    manifest written before content hashes is accepted with a warning (nothing to check it
    against)."""
    manifest = Path(manifest)
    record = _load(manifest)
    if MADE_FROM not in record:
        warnings.warn(
            f"{manifest} predates content hashes: what it was made from cannot be checked; "
            f"{remake_command(manifest)} records them",
            stacklevel=2,
        )
        return
    for relative, recorded in record[MADE_FROM].items():
        upstream = manifest.parent / relative
        shown = Path(os.path.normpath(upstream))
        if not upstream.exists():
            raise StaleInputError(
                f"{manifest} was made from {shown}, which is gone: its results are stale. "
                f"Remake it and what follows: {remake_command(manifest)}"
            )
        if file_sha256(upstream) != recorded:
            raise StaleInputError(
                f"{manifest} was made from {shown} as it was then (sha256 {recorded[:12]}), which "
                f"has changed since (now {file_sha256(upstream)[:12]}): its results are stale, and "
                "anything made from them would mix generations. Remake it and what follows: "
                f"{remake_command(manifest)}"
            )
        if upstream.suffix == ".json" and MADE_FROM in _load(upstream):
            check_current(upstream)


def check_file(path: str | os.PathLike, manifest: str | os.PathLike | None = None) -> Path:
    """Stop unless ``path`` (a file a block wrote) is the file its block's ``manifest`` records and
    that manifest is current (:func:`check_current`); the path back. Files outside a block
    (external runs, the dataset) pass unchecked."""
    path = Path(path)
    manifest = Path(manifest) if manifest is not None else block_manifest_of(path)
    if manifest is None or not manifest.exists():
        return path
    check_current(manifest)
    # the cell's directory and the file's name within it (``model.pt``, ``checkpoints/step_...``)
    try:
        seed_dir, *inside = path.absolute().relative_to(manifest.parent.absolute()).parts
    except ValueError:
        seed_dir, inside = path.parent.name, [path.name]
    recorded = _cell_files(manifest, seed_dir)
    if recorded is None:
        return path  # a manifest from before content hashes (check_current warned)
    name = "/".join(inside)
    if name not in recorded:
        raise StaleInputError(
            f"{path} is not among the files its block's manifest {manifest} records: it was "
            f"not made by that block. Remake the block: {remake_command(manifest)}"
        )
    if file_sha256(path) != recorded[name]:
        raise StaleInputError(
            f"{path} (sha256 {file_sha256(path)[:12]}) is not the file its block's manifest "
            f"{manifest} records ({recorded[name][:12]}): it was replaced after the block was "
            f"made, and results from it would mix generations. Remake the block: "
            f"{remake_command(manifest)}"
        )
    return path


def check_files(paths: Iterable[str | os.PathLike]) -> None:
    """:func:`check_file` for each of ``paths`` (an analysis job's metric tables and evaluations)."""
    for path in paths:
        check_file(path)


def block_manifests(root: str | os.PathLike) -> list[Path]:
    """Every block manifest under ``root`` (``results/<rule>/<task>/<arch>/<method>/seedsF-L.json``)."""
    return sorted(
        p for p in Path(root).rglob("seeds*-*.json") if SEED_RANGE_MANIFEST.fullmatch(p.name)
    )


def check_tree(root: str | os.PathLike) -> int:
    """Check every block under ``root``: each manifest current, each file it records unchanged.
    Returns how many files were checked; the first stale one stops it (:class:`StaleInputError`)."""
    checked = 0
    for manifest in block_manifests(root):
        check_current(manifest)
        for cell in _load(manifest).get("cells", []):
            seed_dir = manifest.parent / cell["cell"].rsplit("/", 1)[-1]
            for name in cell.get(FILES, {}):
                check_file(seed_dir / name, manifest)
                checked += 1
    return checked


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m trainmap.lineage",
        description="Check that every result under a directory was made from what sits upstream "
        "now (each block manifest's recorded input and file hashes).",
    )
    parser.add_argument("root", nargs="?", default="results")
    args = parser.parse_args(argv)
    try:
        checked = check_tree(args.root)
    except StaleInputError as error:
        print(f"stale: {error}")
        return 1
    print(f"{len(block_manifests(args.root))} blocks, {checked} files: every one made from what "
          "sits upstream now")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
