"""Seed blocks that a killed job left unfinished, found when the workflow is parsed.

Snakemake deletes a job's outputs just before it runs the job. A block job killed mid-run
(``kill -9``, a lost node, an interrupted ``--forcerun``) therefore leaves no manifest, while its
resume file and the per-seed files of an earlier run stay, and so does everything downstream.
Snakemake reruns a job whose output is missing only when a job that needs the output has to run,
so a plain rerun said "Nothing to be done" and kept the earlier run's results without a word.

:func:`find_unfinished` finds such blocks from one directory listing per
``results/<rule>/<task>/<arch>/<method>`` directory (no file-system call per cell): a block of the
grid whose manifest is missing while its resume file or any of its seed directories is there. The
Snakefile makes their manifests inputs of ``rule all``, so the next plain run finishes them
(training resumes from the resume file) and, as their manifests are then newer, reruns what depends
on them. Every resume file found is reported, also one beside a finished manifest or one that
belongs to no block of the grid.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainmap.grid import SeedRange
from trainmap.io import SEED_RANGE_MANIFEST

#: The suffix of a block's resume file beside its manifest (trainmap.jobs: ``.with_suffix``).
RESUME_SUFFIX = ".resume.pt"


@dataclass(frozen=True)
class UnfinishedBlock:
    """A block of the grid whose manifest is missing while files of its job remain."""

    rule_dir: str
    block_id: str
    manifest: str
    #: The block's resume file, when one remains (training blocks: the rerun resumes from it).
    resume: str | None
    #: The block's seed directories that remain (from the killed job or an earlier run).
    seed_dirs: tuple[str, ...]
    n_seeds: int
    #: A manifest beside it, of no block of the grid, that holds some of its seeds: the grid's
    #: seed_block changed since (then the seed directories are that block's, not a killed job's).
    old_manifest: str | None = None

    def message(self, command: Sequence[str]) -> str:
        """One line: the block, what is missing, what remains and the commands that finish it."""
        cause = (
            f"seed_block changed: {self.old_manifest} beside it holds its seeds in another block"
            if self.old_manifest
            else "its job was killed or failed, or it was deleted"
        )
        if self.resume:
            remains = f"its resume file {self.resume} remains"
            does = "finishes it from the resume file"
        else:
            shown = self.seed_dirs[0] + (", ..." if len(self.seed_dirs) > 1 else "")
            remains = (
                f"{len(self.seed_dirs)} of its {self.n_seeds} seed directories ({shown}) hold "
                "files of an earlier run"
            )
            does = "remakes it"
        return (
            f"trainmap: unfinished block {self.rule_dir}/{self.block_id}: its manifest "
            f"{self.manifest} is missing ({cause}) while {remains}. `{shlex.join(command)}` "
            f"(rule all) {does} and reruns what depends on it; this block alone: "
            f"`{shlex.join([*command, self.manifest])}`"
        )


@dataclass(frozen=True)
class LeftoverResume:
    """A resume file that no unfinished block of the grid resumes from."""

    path: str
    rule_dir: str
    block_id: str
    #: The block's finished manifest beside it, or None when the block is not one of the grid.
    manifest: str | None

    def message(self) -> str:
        """One line: the resume file, its block, and why nothing uses it."""
        head = f"trainmap: resume file {self.path} of block {self.rule_dir}/{self.block_id}"
        if self.manifest:
            return (
                f"{head} is left over beside the block's finished manifest {self.manifest}: "
                "nothing reads it unless the block reruns, which would resume from it; delete it "
                "if that manifest holds the results you want"
            )
        return (
            f"{head} belongs to no block of this grid (a killed job of another configuration or "
            "seed_block): nothing uses it; finish it with that configuration, or delete it"
        )


@dataclass(frozen=True)
class UnfinishedScan:
    """What :func:`find_unfinished` found: the blocks to finish and the other resume files."""

    blocks: tuple[UnfinishedBlock, ...] = ()
    leftover_resumes: tuple[LeftoverResume, ...] = ()
    #: The command a plain run is started with, for the messages (e.g. with its --configfile).
    command: tuple[str, ...] = ("snakemake", "--cores", "all")

    @property
    def manifests(self) -> list[str]:
        """The missing manifests, to make them targets of ``rule all``."""
        return [block.manifest for block in self.blocks]

    def messages(self) -> list[str]:
        """One line per unfinished block and per left-over resume file (for stderr)."""
        return [block.message(self.command) for block in self.blocks] + [
            resume.message() for resume in self.leftover_resumes
        ]


def find_unfinished(
    results: str | os.PathLike,
    blocks_of_rule: Mapping[str, Iterable[SeedRange]],
    command: Sequence[str] = ("snakemake", "--cores", "all"),
) -> UnfinishedScan:
    """The blocks of ``blocks_of_rule`` (rule directory -> the grid's blocks of that rule) whose
    manifest ``<results>/<rule>/<block id>.json`` is missing while their resume file or one of
    their seed directories exists, and every resume file none of them resumes from.

    One directory listing per ``<results>/<rule>/<task>/<arch>/<method>`` directory on disk; with
    no results yet, one failed listing per rule.
    """
    results = Path(results)
    unfinished: list[UnfinishedBlock] = []
    leftover: list[LeftoverResume] = []
    for rule_dir, blocks in blocks_of_rule.items():
        listings = _listings(results / rule_dir)
        if not listings:  # a fresh run: nothing of this rule on disk
            continue
        by_dir: dict[str, list[SeedRange]] = {}
        for block in blocks:
            by_dir.setdefault(f"{block.task}/{block.arch}/{block.method}", []).append(block)
        for group, names in listings.items():
            base = f"{results.as_posix()}/{rule_dir}/{group}"
            found, left = _scan_directory(base, rule_dir, group, names, by_dir.get(group, []))
            unfinished += found
            leftover += left
    return UnfinishedScan(tuple(unfinished), tuple(leftover), tuple(command))


def _scan_directory(
    base: str, rule_dir: str, group: str, names: frozenset[str], grid_blocks: list[SeedRange]
) -> tuple[list[UnfinishedBlock], list[LeftoverResume]]:
    """The unfinished blocks and left-over resume files of one directory ``base`` (``group`` is
    its ``<task>/<arch>/<method>``), given its entries ``names`` and the grid's blocks there."""
    grid_names = {block.name for block in grid_blocks}
    other_manifests = [
        (f"{base}/{name}", range(int(match[1]), int(match[2]) + 1))
        for name in sorted(names)
        if (match := SEED_RANGE_MANIFEST.fullmatch(name))
        and name.removesuffix(".json") not in grid_names
    ]
    unfinished, leftover = [], []
    for block in grid_blocks:
        manifest = f"{base}/{block.name}.json"
        resume = f"{block.name}{RESUME_SUFFIX}"
        if f"{block.name}.json" in names:
            if resume in names:
                leftover.append(LeftoverResume(f"{base}/{resume}", rule_dir, block.id, manifest))
            continue
        seed_dirs = tuple(f"{base}/seed{seed}" for seed in block.seeds if f"seed{seed}" in names)
        if resume not in names and not seed_dirs:
            continue
        resume_path = f"{base}/{resume}" if resume in names else None
        old_manifest = (
            None  # a resume file: this block's own job ran and was stopped
            if resume_path
            else next((path for path, seeds in other_manifests
                       if any(seed in seeds for seed in block.seeds)), None)
        )  # fmt: skip
        unfinished.append(UnfinishedBlock(rule_dir, block.id, manifest, resume_path, seed_dirs,
                                          len(block.seeds), old_manifest))  # fmt: skip
    leftover += [
        LeftoverResume(
            f"{base}/{name}", rule_dir, f"{group}/{name.removesuffix(RESUME_SUFFIX)}", None
        )
        for name in sorted(names)
        if name.endswith(RESUME_SUFFIX) and name.removesuffix(RESUME_SUFFIX) not in grid_names
    ]
    return unfinished, leftover


def _listings(rule_root: Path) -> dict[str, frozenset[str]]:
    """The entry names of every ``<task>/<arch>/<method>`` directory below ``rule_root``."""
    listings = {}
    for task in _subdirs(rule_root):
        for arch in _subdirs(task):
            for method in _subdirs(arch):
                with os.scandir(method) as entries:
                    names = frozenset(entry.name for entry in entries)
                listings[f"{task.name}/{arch.name}/{method.name}"] = names
    return listings


def _subdirs(path: Path) -> list[Path]:
    """The directories in ``path``, sorted (so the messages come in a stable order)."""
    try:
        with os.scandir(path) as entries:
            return sorted(Path(e.path) for e in entries if e.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []
