"""The workflow's block rules: the rules whose jobs are seed ranges, which cells each runs and where
its files go.

A block rule runs one job per :class:`~trainmap.grid.cells.SeedRange` of one (task, arch, method).
The job writes each seed's files in the seed's own directory,
``<results>/<directory>/<task>/<arch>/<method>/seed<n>/``, and, as its declared output, the range's
manifest beside them, ``.../seedsF-L.json``; rules depend on manifests. :data:`BLOCK_RULES` is the
one table of block rules. :func:`study_blocks` expands a config into every rule's seed ranges: the
grid's (aligned ranges, :func:`~trainmap.grid.cells.seed_ranges_of`), then those of adaptive joint
comparisons' rounds (one range per round, :func:`~trainmap.grid.cells.round_ranges`), which a job
needs only once a round asks for its seeds.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from trainmap.grid.cells import (
    AdaptiveJoint,
    Cell,
    SeedRange,
    adaptive_cells,
    dense_cells_of,
    has_deploy_form,
    is_sparse,
    method_of,
    quantized_schemes,
    retrains,
    round_ranges,
    seed_ranges_of,
    teacher_cell,
)

#: ``cells(config, cells)``: the cells among ``cells`` that a block rule runs.
CellSelection = Callable[[dict, Iterable[Cell]], list[Cell]]


@dataclass(frozen=True)
class BlockRule:
    """A rule whose jobs are seed ranges: its ``name``, the results ``directory`` its files go
    under, the cells it runs (:data:`CellSelection`) and whether it runs the seeds adaptive rounds
    add (``rounds``)."""

    name: str
    directory: str
    cells: CellSelection
    rounds: bool = True


def _with_gradinit_stage(config: dict, cells: Iterable[Cell]) -> list[Cell]:
    return [cell for cell in cells if method_of(cell).has_stage("gradinit")]


def _dense_and_teachers(config: dict, cells: Iterable[Cell]) -> list[Cell]:
    return dense_cells_of(cells)


def _sparse(config: dict, cells: Iterable[Cell]) -> list[Cell]:
    return [cell for cell in cells if is_sparse(cell)]


def _with_deploy_form(config: dict, cells: Iterable[Cell]) -> list[Cell]:
    return [cell for cell in cells if has_deploy_form(cell.arch) and not is_sparse(cell)]


def _quantized(config: dict, cells: Iterable[Cell]) -> list[Cell]:
    return [cell for cell in cells if quantized_schemes(config, cell)]


def _every(config: dict, cells: Iterable[Cell]) -> list[Cell]:
    return list(cells)


def _retrained(config: dict, cells: Iterable[Cell]) -> list[Cell]:
    return [cell for cell in cells if retrains(cell)]


#: Every block rule, in workflow order: GradInit's scales (gradinit-stage methods), training (dense
#: cells and the teachers sparse cells retrain from), sparse retraining, RepVGG's deploy form
#: (dense cells of an architecture that has one), quantisation (``quantize.methods`` and
#: ``.archs``; the grid's cells only), evaluation (every cell) and the metric tables (every cell
#: that trains: one-shot pruning has no trajectory).
BLOCK_RULES: tuple[BlockRule, ...] = (
    BlockRule("gradinit", "gradinit", _with_gradinit_stage),
    BlockRule("train", "train", _dense_and_teachers),
    BlockRule("sparse_retrain", "sparse", _sparse),
    BlockRule("reparam", "reparam", _with_deploy_form),
    BlockRule("quantize", "quantize", _quantized, rounds=False),
    BlockRule("evaluate", "evaluate", _every),
    BlockRule("collect_metrics", "metrics", _retrained),
)


def run_rule_of(cell: Cell) -> str:
    """The block rule whose run holds a cell's final model, history and trajectory:
    ``sparse_retrain`` for a sparse cell, else ``train``."""
    return "sparse_retrain" if is_sparse(cell) else "train"


class RuleBlocks(Mapping[str, SeedRange]):
    """One block rule's seed ranges in a study, by id (``task/arch/method/seedsF-L``): the grid's,
    then adaptive rounds'; its files under the study's ``results`` directory."""

    def __init__(
        self,
        rule: BlockRule,
        results: str,
        grid: Sequence[SeedRange],
        rounds: Sequence[SeedRange] = (),
    ) -> None:
        self.rule = rule
        self.results = results
        #: The grid's ranges, in :func:`~trainmap.grid.cells.seed_ranges_of` order.
        self.grid = tuple(grid)
        self._by_id = {block.id: block for block in [*grid, *rounds]}

    def __getitem__(self, block_id: str) -> SeedRange:
        return self._by_id[block_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def manifest(self, block: SeedRange) -> str:
        """The manifest ``block``'s job writes, e.g.
        ``results/train/digits/mlp/kaiming/seeds0-31.json``."""
        return f"{self.results}/{self.rule.directory}/{block.id}.json"

    def grid_manifests(self) -> list[str]:
        """The manifests of the grid's ranges (adaptive rounds' left out), in range order."""
        return [self.manifest(block) for block in self.grid]

    @cached_property
    def _block_of_cell(self) -> dict[Cell, SeedRange]:
        return {cell: block for block in self._by_id.values() for cell in block.cells}

    def manifests_of_cells(self, cells: Iterable[Cell]) -> list[str]:
        """The manifests of the ranges holding ``cells``, each once, in range order (task, arch,
        method, first seed); cells in no range of the rule are left out."""
        found = {self._block_of_cell[cell] for cell in cells if cell in self._block_of_cell}
        return [self.manifest(block) for block in sorted(found)]

    def cell_file(self, cell: Cell, filename: str) -> str:
        """A file in a cell's own directory, e.g. ``results/evaluate/<cell id>/evaluation.json``."""
        return f"{self.results}/{self.rule.directory}/{cell.id}/{filename}"

    def cell_files(self, cells: Iterable[Cell], filename: str) -> list[str]:
        """:meth:`cell_file` of each of ``cells``, in their order."""
        return [self.cell_file(cell, filename) for cell in cells]


class StudyBlocks(Mapping[str, RuleBlocks]):
    """Every block rule's seed ranges in a study (:class:`RuleBlocks`), by rule name, in the order
    of :data:`BLOCK_RULES`."""

    def __init__(self, rules: Iterable[RuleBlocks]) -> None:
        self._by_name = {blocks.rule.name: blocks for blocks in rules}
        self._by_directory = {blocks.rule.directory: blocks for blocks in self._by_name.values()}

    def __getitem__(self, name: str) -> RuleBlocks:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def by_directory(self) -> dict[str, list[SeedRange]]:
        """Each rule's ranges (the grid's, then adaptive rounds'), by its results directory."""
        return {name: list(blocks.values()) for name, blocks in self._by_directory.items()}

    def of_manifest(self, path: str | os.PathLike) -> SeedRange:
        """The seed range whose manifest is ``path``, that is
        ``<results>/<directory>/<task>/<arch>/<method>/seedsF-L.json``
        (:meth:`RuleBlocks.manifest`)."""
        directory, *block = Path(path).with_suffix("").parts[-5:]
        return self._by_directory[directory]["/".join(block)]

    def run_manifest(self, block: SeedRange) -> str:
        """The manifest of the run (:func:`run_rule_of`) of ``block``'s seeds: their final models,
        histories and trajectories."""
        runs = self[run_rule_of(block.cells[0])]
        return runs.manifest(runs[block.id])

    def run_files(self, cells: Iterable[Cell], filename: str) -> list[str]:
        """A file of each cell's run (:func:`run_rule_of`), e.g. every ``history.csv``."""
        return [self[run_rule_of(cell)].cell_file(cell, filename) for cell in cells]

    def teacher_manifest(self, block: SeedRange) -> str:
        """The manifest of the dense models a sparse ``block`` retrains: the train range of the
        teacher method (:func:`~trainmap.grid.cells.teacher_cell`) with the same id otherwise."""
        teacher = dataclasses.replace(block, method=teacher_cell(block.cells[0]).method)
        train = self["train"]
        return train.manifest(train[teacher.id])


def study_blocks(
    config: dict,
    results: str,
    cells: Sequence[Cell],
    joints: Mapping[str, AdaptiveJoint],
) -> StudyBlocks:
    """Every block rule's seed ranges for the grid's ``cells`` and the seeds that the adaptive
    joint comparisons ``joints`` (:func:`~trainmap.grid.cells.adaptive_joints`) may add, with their
    files under ``results``."""
    added = adaptive_cells(joints)
    return StudyBlocks(
        RuleBlocks(
            rule,
            results,
            seed_ranges_of(config, rule.cells(config, cells)),
            round_ranges(config, rule.cells(config, added), joints) if rule.rounds else (),
        )
        for rule in BLOCK_RULES
    )
