"""The grid model: cells (task x arch x method x seed), the seed ranges that run as one job, and the
settings each cell's stages read (``cell_hash`` fingerprints them). Built from a validated config
(:mod:`trainmap.grid.validate`); nothing here reads files or checks values."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmap import methods, models
from trainmap.schema import section_defaults, without_unread_keys

#: A training map needs runs to fit on and at least one to hold out.
MIN_RUNS_PER_GROUP = 2


@dataclass(frozen=True, order=True)
class Cell:
    """One grid cell: a task trained with one architecture, method and seed."""

    task: str
    arch: str
    method: str
    seed: int

    @classmethod
    def of(cls, value: Cell | Mapping[str, Any]) -> Cell:
        """A cell from a Cell or a mapping with task, arch, method and seed (e.g. JSON)."""
        if isinstance(value, Cell):
            return value
        return cls(value["task"], value["arch"], value["method"], int(value["seed"]))

    def to_dict(self) -> dict[str, Any]:
        """``{"task", "arch", "method", "seed"}``: the JSON form :meth:`of` reads back."""
        return {"task": self.task, "arch": self.arch, "method": self.method, "seed": self.seed}

    @property
    def id(self) -> str:
        """The cell's path below a rule's results directory, e.g. ``digits/vgg_bn/kaiming/seed3``."""
        return f"{self.task}/{self.arch}/{self.method}/seed{self.seed}"


@dataclass(frozen=True, order=True)
class SeedRange:
    """Seeds of one (task, arch, method) that run as one job: those of an aligned range of
    ``train.<task>.seed_block`` seeds, [k S, (k + 1) S - 1] (e.g. ``seeds0-31``). Aligned ranges
    keep a block's seeds fixed when seeds are added to or removed from other ranges."""

    task: str
    arch: str
    method: str
    first: int
    last: int
    seeds: tuple[int, ...]

    @classmethod
    def of(cls, value: SeedRange | Mapping[str, Any]) -> SeedRange:
        """A block from a SeedRange or its JSON form (:meth:`to_dict`)."""
        if isinstance(value, SeedRange):
            return value
        return cls(value["task"], value["arch"], value["method"], int(value["first"]),
                   int(value["last"]), tuple(int(seed) for seed in value["seeds"]))  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The JSON form :meth:`of` reads back."""
        return {"task": self.task, "arch": self.arch, "method": self.method,
                "first": self.first, "last": self.last, "seeds": list(self.seeds)}  # fmt: skip

    @property
    def name(self) -> str:
        """The block's wildcard value, e.g. ``seeds0-31``."""
        return f"seeds{self.first}-{self.last}"

    @property
    def id(self) -> str:
        """The block's path below a rule's results directory, e.g. ``digits/vgg_bn/ast/seeds0-31``."""
        return f"{self.task}/{self.arch}/{self.method}/{self.name}"

    @property
    def cells(self) -> list[Cell]:
        """The block's cells, in seed order."""
        return [Cell(self.task, self.arch, self.method, seed) for seed in self.seeds]


def expand_grid(config: dict) -> list[Cell]:
    """Every (task, arch, method, seed) cell of the grid, in grid order."""
    return [
        Cell(entry["task"], arch, method, seed)
        for entry in config["grid"]
        for arch in entry["archs"]
        for method in entry["methods"]
        for seed in entry["seeds"]
    ]


def grid_tasks(config: dict) -> list[str]:
    """The tasks of the grid, each once, in grid order."""
    return list(dict.fromkeys(entry["task"] for entry in config["grid"]))


def canonical(settings: Any) -> Any:
    """``settings`` with every mapping's keys sorted (recursively; lists keep their order).

    Snakemake compares a job's params with the last run's by their text, and the order of keys
    depends on how config files were merged (``configfile:`` directives, then ``--configfile``):
    sorted keys make the same settings look the same, so nothing reruns for nothing.
    """
    if isinstance(settings, Mapping):
        return {key: canonical(settings[key]) for key in sorted(settings)}
    if isinstance(settings, list | tuple):
        return [canonical(item) for item in settings]
    return settings


def data_settings(config: dict, task: str) -> dict:
    """The data kind and options of ``task``."""
    return canonical(config["data"][task])


def model_settings(config: dict, task: str, arch: str) -> dict:
    """Builder options of ``arch`` on ``task`` (empty: the registry's defaults)."""
    return canonical(config["model"].get(task, {}).get(arch, {}))


#: Training settings whose "off" value is left out of a run's settings (its hash, the rule's
#: params, the effective settings): a study that ran before the key existed stays up to date.
OFF_VALUES = {"augment": (None, {}), "param_groups": ("single",)}


def without_off_keys(settings: Mapping[str, Any]) -> dict:
    """``settings`` (a train-style mapping) without the keys of :data:`OFF_VALUES` at their off
    value."""
    return {key: value for key, value in settings.items()
            if not (key in OFF_VALUES and value in OFF_VALUES[key])}  # fmt: skip


def train_settings(config: dict, task: str) -> dict:
    """The training hyperparameters of ``task``: everything that determines a run's arithmetic.
    ``seed_block`` (how many seeds share a job) is left out: it never changes a run's result, so
    changing it must not make a run look different (see :func:`seed_block`); so are keys at their
    off value (:data:`OFF_VALUES`)."""
    settings = without_off_keys(canonical(config["train"][task]))
    settings.pop("seed_block", None)
    return settings


def stage_job_settings(config: dict, stage: str, task: str) -> dict:
    """What a method stage's job reads: :func:`stage_settings`, with the task's batch augmentation
    (``train.<task>.augment``, when on) where the stage draws training batches: GradInit's scale
    search draws them as training does (``augment`` beside its settings, MixUp left out by the
    job), and AST's retraining takes it unless ``sparse.<task>.train.augment`` says otherwise."""
    settings = stage_settings(config, stage, task)
    augment = train_settings(config, task).get("augment")
    if not augment:
        return settings
    if stage == "gradinit":
        return {**settings, "augment": augment}
    if stage == "sparse":
        retrain = dict(settings.get("train", {}))
        retrain.setdefault("augment", augment)
        return canonical({**settings, "train": without_off_keys(retrain)})
    return settings


def seed_block(config: dict, task: str) -> int:
    """How many seeds of ``task`` train together as one job (``train.<task>.seed_block``; omitted:
    the config schema's default)."""
    default = section_defaults("train")["seed_block"]
    return int(config["train"][task].get("seed_block", default))


def seed_ranges_of(config: dict, cells: Iterable[Cell]) -> list[SeedRange]:
    """``cells`` as blocks (:class:`SeedRange`): per (task, arch, method), the seeds of each aligned
    range of ``seed_block`` seeds; in (task, arch, method, first seed) order."""
    seeds: dict[tuple[str, str, str, int], list[int]] = {}
    for cell in set(cells):
        size = seed_block(config, cell.task)
        first = cell.seed - cell.seed % size
        seeds.setdefault((cell.task, cell.arch, cell.method, first), []).append(cell.seed)
    return [
        SeedRange(
            task, arch, method, first, first + seed_block(config, task) - 1, tuple(sorted(found))
        )
        for (task, arch, method, first), found in sorted(seeds.items())
    ]


def trained_cells(config: dict) -> list[Cell]:
    """Every dense cell the grid trains: its dense cells and the teachers of its sparse cells."""
    return dense_cells_of(expand_grid(config))


def dense_cells_of(cells: Iterable[Cell]) -> list[Cell]:
    """The dense cells ``cells`` train: the dense ones and the sparse ones' teachers, sorted."""
    return sorted({teacher_cell(cell) if is_sparse(cell) else cell for cell in cells})


def evaluate_settings(config: dict, task: str) -> dict:
    """The evaluation settings of ``task``."""
    return canonical(config["evaluate"][task])


def data_options(config: dict, task: str, base_dir: str | os.PathLike) -> dict:
    """``data.<task>``'s options with a relative ``path`` resolved against the workflow directory."""
    options = data_settings(config, task)
    if options.get("path") and not Path(options["path"]).is_absolute():
        options["path"] = str(Path(base_dir) / options["path"])
    return options


def analysis_settings(config: dict) -> dict:
    """The training-map settings (``analysis``), without a key no other setting reads
    (:func:`without_unread_keys`)."""
    return canonical(without_unread_keys(config.get("analysis", {})))


def joint_settings(config: dict, name: str) -> dict:
    """The analysis settings of joint comparison ``name``: ``analysis`` with the comparison's own
    ``analysis`` entry over it (without a key no other setting reads)."""
    specs = {spec["name"]: spec for spec in config.get("analysis", {}).get("joint", [])}
    merged = config.get("analysis", {}) | specs[name].get("analysis", {})
    return canonical(without_unread_keys(merged))


def stage_settings(config: dict, stage: str, task: str) -> dict:
    """The hyperparameters of a method stage (``gradinit`` or ``sparse``) on ``task``."""
    return canonical(config.get(stage, {}).get(task, {}))


def method_of(cell: Cell) -> methods.MethodSpec:
    """The registry entry of the cell's method."""
    return methods.check_method(cell.method)


def is_sparse(cell: Cell) -> bool:
    """Whether the cell's model comes from the ``sparse`` stage (retraining a dense teacher)."""
    return method_of(cell).has_stage("sparse")


def with_train_defaults(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Train-style ``settings`` (a task's ``train``, a stage's retraining) over TrainConfig's
    defaults: what every omitted training setting takes."""
    from dataclasses import asdict

    from trainmap.training.loop import TrainConfig

    return {**asdict(TrainConfig()), **settings}


def latency_device(settings: Mapping[str, Any]) -> str:
    """Where an evaluation's latency is measured (``evaluate.<task>.latency``; omitted: the
    schema's default)."""
    return str(settings.get("latency", section_defaults("evaluate")["latency"]))


def training_device(config: Mapping[str, Any], task: str) -> str:
    """Where ``task`` trains (``train.<task>.device``; omitted: TrainConfig's default), and where
    its models are evaluated."""
    return str(with_train_defaults(train_settings(dict(config), task))["device"])


def run_checkpoints(config: Mapping[str, Any], cell: Cell) -> int:
    """How many checkpoints (HMM observations) a cell's run has: its train or sparse retraining."""
    from trainmap.training.archive import n_checkpoints

    if is_sparse(cell):
        given = stage_settings(dict(config), "sparse", cell.task).get("train", {})
    else:
        given = train_settings(dict(config), cell.task)
    settings = with_train_defaults(given)
    return n_checkpoints(int(settings["steps"]), int(settings["checkpoint_every"]))


def retrains(cell: Cell) -> bool:
    """Whether the cell trains at all, i.e. has a trajectory (one-shot pruning does not)."""
    return method_retrains(cell.method)


def method_retrains(method: str) -> bool:
    """Whether runs of ``method`` train, i.e. have a trajectory (one-shot pruning does not)."""
    spec = methods.check_method(method)
    return not spec.has_stage("sparse") or bool(spec.options.get("retrain"))


def methods_with_stage(stage: str) -> str:
    """A regex matching exactly the methods that have ``stage`` (for wildcard constraints)."""
    return "|".join(name for name, spec in methods.METHODS.items() if spec.has_stage(stage))


def methods_without_stage(stage: str) -> str:
    """A regex matching exactly the methods that do not have ``stage``."""
    return "|".join(name for name, spec in methods.METHODS.items() if not spec.has_stage(stage))


def names_regex(names: Iterable[str]) -> str:
    """A regex matching exactly ``names`` (for wildcard constraints), and nothing when there are
    none."""
    return "|".join(names) or "(?!x)x"


def teacher_cell(cell: Cell) -> Cell:
    """The dense cell whose trained model a sparse cell starts from (same task, arch and seed)."""
    return Cell(cell.task, cell.arch, methods.DENSE_BASE_METHOD, cell.seed)


def has_deploy_form(arch: str) -> bool:
    """Whether ``arch`` is re-parameterised into a deploy form after training (RepVGG)."""
    return bool(getattr(models.ARCHITECTURES[arch], "deploy_form", False))


def quantized_schemes(config: dict, cell: Cell) -> list[str]:
    """The quantisation schemes applied to the cell's final model: the configured schemes when its
    method is in ``quantize.methods`` and (if given) its arch in ``quantize.archs``; else none."""
    settings = config.get("quantize", {})
    selected = cell.method in settings.get("methods", []) and (
        "archs" not in settings or cell.arch in settings["archs"]
    )
    return list(settings.get("schemes", [])) if selected else []


def joint_labels(cells: Iterable[Cell]) -> list[str]:
    """Each pooled cell's group label in a joint comparison: its method, or ``arch/method`` when
    the comparison pools several architectures."""
    cells = list(cells)
    several_archs = len({cell.arch for cell in cells}) > 1
    return [f"{c.arch}/{c.method}" if several_archs else c.method for c in cells]


def analysis_groups(config: dict) -> dict[str, list[Cell]]:
    """Training-map groups: one per (task, arch, method) with at least two trajectories.

    Cells without a trajectory (one-shot pruning) have no training path to map. ``analysis.group_maps``
    chooses which groups get a map of their own: ``all`` (default), ``outside_joint`` (only groups no
    joint comparison contains: a joint map already maps their runs, with states shared across the
    compared methods) or ``none`` (joint maps only).
    """
    analysis = config.get("analysis", {})
    which = analysis.get("group_maps", section_defaults("analysis")["group_maps"])
    if which == "none":
        return {}
    mapped_jointly = set()
    if which == "outside_joint":
        mapped_jointly = {cell for cells in joint_comparisons(config).values() for cell in cells}
    groups: dict[str, list[Cell]] = {}
    for cell in expand_grid(config):
        if retrains(cell) and cell not in mapped_jointly:
            groups.setdefault(f"{cell.task}/{cell.arch}/{cell.method}", []).append(cell)
    return {name: cells for name, cells in groups.items() if len(cells) >= MIN_RUNS_PER_GROUP}


def paper_groups(config: dict) -> dict[str, list[Cell]]:
    """The training-maps paper's settings the grid runs (config key ``paper``): setting -> the
    trained cells of its (task, arch, method), in grid order (the paper's table, rule
    ``paper_map``)."""
    cells = [cell for cell in expand_grid(config) if retrains(cell)]
    return {
        spec["setting"]: [cell for cell in cells
                          if (cell.task, cell.arch, cell.method)
                          == (spec["task"], spec["arch"], spec["method"])]
        for spec in config.get("paper", [])
    }  # fmt: skip


def in_joint(cell: Cell, spec: Mapping[str, Any]) -> bool:
    return (
        cell.task == spec.get("task")
        and cell.arch in spec.get("archs", [cell.arch])
        and cell.method in spec.get("methods", [cell.method])
    )


def joint_comparisons(config: dict) -> dict[str, list[Cell]]:
    """Joint comparisons (``analysis.joint``): the pooled trained cells of several archs/methods of
    one task; comparisons with fewer than two runs in the grid are left out (check_config warns). A
    comparison that pools external run sets (``external``) is kept with whatever cells it has
    (none, for external sets alone)."""
    cells = [cell for cell in expand_grid(config) if retrains(cell)]
    joint = {}
    for spec in config.get("analysis", {}).get("joint", []):
        pooled = [cell for cell in cells if in_joint(cell, spec)]
        if len(pooled) >= MIN_RUNS_PER_GROUP or spec.get("external"):
            joint[spec["name"]] = pooled
    return joint


@dataclass(frozen=True)
class AdaptiveJoint:
    """An adaptive joint comparison (``analysis.joint[i].adaptive``): its grid cells are round 0;
    while the stability curve's target is not met, round r adds ``step`` more seeds to every
    (arch, method) it compares, the same seeds for each, up to ``max`` seeds per method.

    The added seeds follow the largest seed the grid trains for the task, so they are never grid
    seeds, and the same config always adds the same seeds (a rerun reproduces them)."""

    name: str
    step: int
    max: int
    base_n: int  # seeds per method in the grid (the smallest (arch, method)'s count)
    first_seed: int  # the first seed round 1 adds
    pairs: tuple[tuple[str, str], ...]  # the compared (arch, method)s
    task: str
    targets: dict[str, float]  # the stability targets (stability_ari, stability_share)

    @property
    def rounds(self) -> int:
        """The most rounds that fit under ``max`` after round 0."""
        return max(0, (self.max - self.base_n) // self.step)

    def seeds_per_method(self, round_: int) -> int:
        """Seeds per method the comparison pools at round ``round_``."""
        return self.base_n + round_ * self.step

    def round_params(self, round_: int) -> dict[str, int | str]:
        """What round ``round_`` needs to decide whether to stop (rule ``joint_round``): the round,
        the most rounds, the step, the task, the maximum, its seeds per method and the first
        added seed."""
        return {
            "round": round_,
            "rounds": self.rounds,
            "step": self.step,
            "task": self.task,
            "max": self.max,
            "seeds_per_method": self.seeds_per_method(round_),
            "first_seed": self.first_seed,
        }

    def added_cells(self, round_: int) -> list[Cell]:
        """The cells round ``round_`` (>= 1) adds, in (arch, method, seed) order."""
        first = self.first_seed + (round_ - 1) * self.step
        return [Cell(self.task, arch, method, seed) for arch, method in self.pairs
                for seed in range(first, first + self.step)]  # fmt: skip

    def cells(self, grid_cells: Iterable[Cell], round_: int) -> list[Cell]:
        """The cells round ``round_`` pools: the grid's, then each added round's."""
        added = [cell for r in range(1, round_ + 1) for cell in self.added_cells(r)]
        return [*grid_cells, *added]

    def potential_cells(self) -> list[Cell]:
        """Every cell some round may add (each trains only when its round is reached)."""
        return [cell for r in range(1, self.rounds + 1) for cell in self.added_cells(r)]


def adaptive_joints(config: dict) -> dict[str, AdaptiveJoint]:
    """The adaptive joint comparisons of the grid (:class:`AdaptiveJoint`), by name."""
    analysis = config.get("analysis", {})
    filled = joint_comparisons(config)
    grid_cells = expand_grid(config)
    found = {}
    for spec in analysis.get("joint", []):
        adaptive = spec.get("adaptive")
        if not adaptive or not filled.get(spec["name"]):
            continue
        counts = Counter((cell.arch, cell.method) for cell in filled[spec["name"]])
        task_seeds = [cell.seed for cell in grid_cells if cell.task == spec["task"]]
        settings = joint_settings(config, spec["name"])
        defaults = section_defaults("analysis")  # the schema's, where the config sets none
        targets = {key: adaptive.get(short, settings.get(key, defaults[key]))
                   for short, key in (("ari", "stability_ari"),
                                      ("share", "stability_share"))}  # fmt: skip
        found[spec["name"]] = AdaptiveJoint(
            spec["name"], int(adaptive["step"]), int(adaptive["max"]), min(counts.values()),
            max(task_seeds) + 1, tuple(sorted(counts)), spec["task"], targets,
        )  # fmt: skip
    return found


def adaptive_cells(joints: Mapping[str, AdaptiveJoint]) -> list[Cell]:
    """Every cell the adaptive joint comparisons ``joints`` (:func:`adaptive_joints`) may add, each
    once, sorted."""
    return sorted({cell for joint in joints.values() for cell in joint.potential_cells()})


def round_ranges(
    config: dict, cells: Iterable[Cell], joints: Mapping[str, AdaptiveJoint]
) -> list[SeedRange]:
    """Blocks of adaptive rounds' cells (of ``joints``, :func:`adaptive_joints`): per (task, arch,
    method) and round, its seeds in chunks of ``seed_block`` (a round's seeds train together and
    never share a block with another round's, which would retrain that round's seeds when the next
    one is added)."""
    steps = {joint.task: joint for joint in joints.values()}
    by_round: dict[tuple[str, str, str, int], list[int]] = {}
    for cell in set(cells):
        joint = steps[cell.task]
        round_ = (cell.seed - joint.first_seed) // joint.step
        by_round.setdefault((cell.task, cell.arch, cell.method, round_), []).append(cell.seed)
    ranges = []
    for (task, arch, method, _), seeds in sorted(by_round.items()):
        seeds.sort()
        size = seed_block(config, task)
        for start in range(0, len(seeds), size):
            chunk = tuple(seeds[start : start + size])
            ranges.append(SeedRange(task, arch, method, chunk[0], chunk[-1], chunk))
    return ranges


def cell_hash(config: dict, cell: Cell) -> str:
    """A short hash of everything that determines a cell's trained model (data, model, training,
    and the settings of the cell's method stages)."""
    payload = {
        "cell": cell.id,
        "data": data_settings(config, cell.task),
        "model": model_settings(config, cell.task, cell.arch),
        "train": train_settings(config, cell.task),
    }
    for stage in method_of(cell).stages:
        payload[stage] = stage_settings(config, stage, cell.task)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]
