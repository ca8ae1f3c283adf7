# Grid expansion, input functions and the one-time tracking set-up. No rule lives here.
#
# Per-seed rules run one *block* per job, i.e. the seeds of one (task, arch, method) in an
# aligned range of train.<task>.seed_block seeds (trainmap.grid.SeedRange), e.g. seeds0-31. A block
# job writes each seed's files in its own directory (results/<rule>/<task>/<arch>/<method>/seed<n>/)
# and, as its declared output, the block's manifest beside them (.../seeds0-31.json). Rules depend on
# manifests; the per-seed paths they read are passed as params.
import dataclasses
import functools
import inspect
import os
import sys

from snakemake.common import overwrite_function_params

from trainmap import grid, plan
from trainmap.io import load_json
from trainmap.methods import check_method
from trainmap.plugins import plugin_sources
from trainmap.tracking import cluster_tracking_problem, init_tracking, tracking_settings
from trainmap.unfinished import UnfinishedScan, find_unfinished
from trainmap.worker import start_server, stop_server

#: The directory this config's outputs all go under (config key results, default results), one
#: per config, so another study run in this checkout never writes into the default study's files.
RESULTS = grid.results_root(config)
CELLS = grid.expand_grid(config)
TASKS = grid.grid_tasks(config)


wildcard_constraints:
    task=r"[A-Za-z][A-Za-z0-9_]*",
    arch=r"[A-Za-z][A-Za-z0-9_]*",
    method=r"[A-Za-z][A-Za-z0-9_]*",
    block=r"seeds\d+-\d+",
    name=r"[A-Za-z][A-Za-z0-9_]*",


JOB_SERVER = {}


onstart:
    # Create the tracking database and experiment once, before parallel jobs (measured: a fresh
    # SQLite database migrated by 8 jobs at once lost 7 of their runs).
    tracking = tracking_settings(config)
    # Cluster jobs (--executor slurm, profiles/slurm) log from compute nodes: a loopback or SQLite
    # store is unreachable or unsafe there. A warning, not an error: a SLURM whose one node is
    # this machine (make slurm-up) reaches both.
    if not workflow.local_exec:
        problem = cluster_tracking_problem(tracking["uri"])
        if problem:
            print(f"warning: cluster jobs: {problem}", file=sys.stderr)
    init_tracking(tracking["uri"], tracking["experiment"])
    # Jobs on this machine fork from one warm process instead of importing torch and MLflow each
    # (trainmap.worker); cluster jobs run in their own processes.
    if workflow.local_exec:
        JOB_SERVER["process"] = start_server(
            ".snakemake/trainmap", (tracking["uri"],)
        )


onsuccess:
    stop_server(JOB_SERVER.pop("process", None))


onerror:
    stop_server(JOB_SERVER.pop("process", None))


BLOCK = "{task}/{arch}/{method}/{block}"
# The stage that makes a cell's model depends on its method: method-name regexes per stage.
GRADINIT_METHODS = grid.methods_with_stage("gradinit")
SPARSE_METHODS = grid.methods_with_stage("sparse")
DENSE_METHODS = grid.methods_without_stage("sparse")
QUANT_SCHEMES = list(config.get("quantize", {}).get("schemes", []))
HMM_GROUPS = grid.analysis_groups(config)
JOINT_GROUPS = grid.joint_groups(config)
# The plugins' source files: an input of every rule that builds data or models, so editing a
# plugin reruns them (and what follows), as editing trainmap's own code does.
PLUGIN_FILES = plugin_sources(config.get("plugins"), workflow.basedir)
JOINT_SPECS = {
    spec["name"]: spec for spec in grid.analysis_settings(config).get("joint", [])
}


# Adaptive joint comparisons (analysis.joint[i].adaptive): the seeds their later rounds may add.
# Their blocks exist in every rule family below, but only a round the checkpoint joint_round asks
# for (analysis.smk) requests them, so a seed trains only when its round is reached.
ADAPTIVE = grid.adaptive_joints(config)
ROUND_CELLS = grid.adaptive_cells(ADAPTIVE)


ROUND_BLOCK_IDS = set()


def blocks_by_id(cells, rounds=()):
    """The blocks of the grid's ``cells`` (aligned seed ranges) and of adaptive rounds' cells
    ``rounds`` (one range per round), by id."""
    added = grid.round_ranges(config, rounds, ADAPTIVE)
    ROUND_BLOCK_IDS.update(block.id for block in added)
    return {block.id: block for block in grid.seed_ranges_of(config, cells) + added}


def of_grid(blocks):
    """``blocks`` without adaptive rounds' blocks: what the grid itself runs (the targets)."""
    return {id: block for id, block in blocks.items() if id not in ROUND_BLOCK_IDS}


def with_deploy_form(cell):
    return grid.has_deploy_form(cell.arch) and not grid.is_sparse(cell)


# The blocks of each rule family, by id ("task/arch/method/seedsF-L").
GRADINIT_BLOCKS = blocks_by_id(
    (c for c in CELLS if grid.method_of(c).has_stage("gradinit")),
    [c for c in ROUND_CELLS if grid.method_of(c).has_stage("gradinit")],
)
TRAIN_BLOCKS = blocks_by_id(
    grid.trained_cells(config), grid.dense_cells_of(ROUND_CELLS)
)
SPARSE_BLOCKS = blocks_by_id(
    (c for c in CELLS if grid.is_sparse(c)),
    [c for c in ROUND_CELLS if grid.is_sparse(c)],
)
GRID_BLOCKS = blocks_by_id(CELLS, ROUND_CELLS)
REPARAM_BLOCKS = blocks_by_id(
    (c for c in CELLS if with_deploy_form(c)),
    [c for c in ROUND_CELLS if with_deploy_form(c)],
)
QUANTIZE_BLOCKS = blocks_by_id(c for c in CELLS if grid.quantized_schemes(config, c))
METRIC_BLOCKS = blocks_by_id(
    (c for c in CELLS if grid.retrains(c)), [c for c in ROUND_CELLS if grid.retrains(c)]
)


# --- blocks a killed job left unfinished (trainmap.unfinished) ---------------------------


def rerun_command():
    """A plain run's command line as the user gave it: its cores and config files."""
    cores = workflow.resource_settings.cores
    command = ["snakemake", "--cores", str(cores) if cores else "all"]
    for path in workflow.overwrite_configfiles:
        command += ["--configfile", os.path.relpath(path)]
    return command


# A block whose manifest is missing while its resume file or seed directories remain: one directory
# listing per (rule, task, arch, method), in the main process only (not in a cluster job).
UNFINISHED = (
    find_unfinished(
        RESULTS,
        {
            "gradinit": GRADINIT_BLOCKS.values(),
            "train": TRAIN_BLOCKS.values(),
            "sparse": SPARSE_BLOCKS.values(),
            "reparam": REPARAM_BLOCKS.values(),
            "quantize": QUANTIZE_BLOCKS.values(),
            "evaluate": GRID_BLOCKS.values(),
            "metrics": METRIC_BLOCKS.values(),
        },
        rerun_command(),
    )
    if workflow.is_main_process
    else UnfinishedScan()
)
for line in UNFINISHED.messages():
    print(line, file=sys.stderr)


def unfinished_manifests():
    """The manifests of unfinished blocks, inputs of the default target. Snakemake reruns a job
    whose output is missing only when a job that needs it runs; as targets, the next plain run
    finishes them (and, by their new mtimes, what depends on them)."""
    return UNFINISHED.manifests


def input_function(func):
    """Mark ``func`` (an input, params or resources function) so Snakemake reads its signature once.

    Snakemake otherwise calls ``inspect.signature`` on every such function for every job
    (bench/dag_scale.py).
    """
    overwrite_function_params(func, inspect.signature(func).parameters)
    return func


#: A task's dataset, a plain pattern rather than an input function: cheaper per job.
DATASET = f"{RESULTS}/data/{{task}}/dataset.pt"


def block_id(wildcards):
    return f"{wildcards.task}/{wildcards.arch}/{wildcards.method}/{wildcards.block}"


def manifest(rule_dir, block):
    """The manifest a block job of ``rule_dir`` writes (``results/train/.../seeds0-31.json``)."""
    return f"{RESULTS}/{rule_dir}/{block.id}.json"


def block_with_method(block, method):
    """The block of the same task, arch and seed range under another method (its teacher)."""
    return dataclasses.replace(block, method=method)


def run_dir_of(block):
    """Where a block's final models, histories and trajectories are: its sparse or train run."""
    return run_dir_of_cell(block.cells[0])


# --- block params: the job's seed range and its cells' hashes ------------------------------------

#: Each block rule's seed ranges, by the results directory its manifests go to. One (task, arch,
#: method, range) can hold other seeds in another rule: train's also hold the dense teachers that
#: sparse cells of the grid retrain from.
BLOCKS_OF_RULE_DIR = {
    "gradinit": GRADINIT_BLOCKS,
    "train": TRAIN_BLOCKS,
    "sparse": SPARSE_BLOCKS,
    "reparam": REPARAM_BLOCKS,
    "quantize": QUANTIZE_BLOCKS,
    "evaluate": GRID_BLOCKS,
    "metrics": METRIC_BLOCKS,
}


def seed_range_of_manifest(path):
    """The seed range whose manifest is ``path``, ``.../<rule dir>/<task>/<arch>/<method>/seedsF-L.json``."""
    rule_dir, *block = Path(path).with_suffix("").parts[-5:]
    return BLOCKS_OF_RULE_DIR[rule_dir]["/".join(block)]


@input_function
def seed_range_of_job(wildcards, output):
    """A block job's seed range (as JSON): the one whose manifest it writes (``output.manifest``)."""
    return seed_range_of_manifest(output.manifest).to_dict()


@functools.cache
def cell_hash_of(cell):
    """trainmap.grid.cell_hash of ``cell``: the config hash its MLflow runs nest under (one parent
    run per cell and hash). Computed once per cell, whichever rules need it."""
    return grid.cell_hash(config, cell)


def cell_hashes(cells):
    """``{cell id: cell hash}``: a job's cells' hashes, a params entry (a job reruns when one of its
    cells' settings changes, as it would for the settings themselves)."""
    return {cell.id: cell_hash_of(cell) for cell in cells}


@input_function
def cell_hashes_of_block(wildcards, output):
    """The cell hashes of a block job's seed range (that of ``output.manifest``)."""
    return cell_hashes(seed_range_of_manifest(output.manifest).cells)


# --- scheduler requests: the plan's estimates (trainmap.plan; `make plan` prints them) ------------

#: Each block rule's blocks, by rule name.
BLOCKS_OF_RULE = {
    "gradinit": GRADINIT_BLOCKS,
    "train": TRAIN_BLOCKS,
    "sparse_retrain": SPARSE_BLOCKS,
    "quantize": QUANTIZE_BLOCKS,
    "evaluate": GRID_BLOCKS,
    "collect_metrics": METRIC_BLOCKS,
}


@functools.cache
def planned_resources(rule_name, job):
    """``mem_mb``, ``runtime`` (minutes) and ``gpu`` of one job of ``rule_name`` (a block id, a group
    or a joint comparison's name): trainmap.plan's estimate, the one ``python -m trainmap.plan``
    prints, times plan.SAFETY_FACTOR. Models are profiled once per (task, arch), not per job.
    """
    if rule_name in BLOCKS_OF_RULE:
        return plan.job_resources(
            config, rule_name, block=BLOCKS_OF_RULE[rule_name][job]
        )
    cells = HMM_GROUPS[job] if rule_name == "fit_hmm" else JOINT_GROUPS.get(job, [])
    return plan.job_resources(config, rule_name, group=cells)


def job_of(rule_name, wildcards):
    """The job ``planned_resources`` knows: a block id, a group or a joint comparison's name."""
    if rule_name in BLOCKS_OF_RULE:
        return block_id(wildcards)
    if rule_name == "fit_hmm":
        return f"{wildcards.task}/{wildcards.arch}/{wildcards.method}"
    return wildcards.name


def planned(rule_name, resource):
    """An input function: ``resource`` (mem_mb, runtime or gpu) of ``rule_name``'s jobs, planned."""

    def of_job(wildcards):
        return planned_resources(rule_name, job_of(rule_name, wildcards))[resource]

    return input_function(of_job)


# --- settings ------------------------------------------------------------------------------------


@input_function
def data_settings_of_task(wildcards):
    return grid.data_settings(config, wildcards.task)


def data_files_of_task(wildcards):
    """The user's file of an ``arrays`` task: an input, so editing it remakes the data and all
    that follows."""
    settings = grid.data_settings(config, wildcards.task)
    return [settings["path"]] if settings["kind"] == "arrays" else []


@input_function
def model_settings_of_cell(wildcards):
    return grid.model_settings(config, wildcards.task, wildcards.arch)


@input_function
def train_settings_of_task(wildcards):
    return grid.train_settings(config, wildcards.task)


@input_function
def evaluate_settings_of_task(wildcards):
    return grid.evaluate_settings(config, wildcards.task)


@input_function
def gradinit_settings_of_task(wildcards):
    return grid.stage_settings(config, "gradinit", wildcards.task)


@input_function
def sparse_settings_of_task(wildcards):
    return grid.stage_settings(config, "sparse", wildcards.task)


@input_function
def method_options_of_cell(wildcards):
    return check_method(wildcards.method).options


# --- inputs: the manifests a block job reads ------------------------------------------------------


@input_function
def train_inputs(wildcards):
    """The dataset, and GradInit's manifest for blocks of a gradinit-stage method."""
    block = TRAIN_BLOCKS[block_id(wildcards)]
    files = {"dataset": f"{RESULTS}/data/{block.task}/dataset.pt"}
    if grid.method_of(block.cells[0]).has_stage("gradinit"):
        files["init"] = manifest("gradinit", block)
    return files


@input_function
def teacher_manifest_of_block(wildcards):
    """The dense models a sparse block retrains: the kaiming block of the same seed range."""
    block = SPARSE_BLOCKS[block_id(wildcards)]
    teacher = grid.teacher_cell(block.cells[0]).method
    return manifest("train", TRAIN_BLOCKS[block_with_method(block, teacher).id])


@input_function
def run_manifest_of_block(wildcards):
    """The block's runs (train or sparse manifest): final models, histories, trajectories."""
    block = GRID_BLOCKS[block_id(wildcards)]
    rule_dir = run_dir_of(block)
    blocks = SPARSE_BLOCKS if rule_dir == "sparse" else TRAIN_BLOCKS
    return manifest(rule_dir, blocks[block.id])


@input_function
def evaluation_inputs_of_block(wildcards):
    """The block's runs and every other form of its models that evaluate measures (deploy,
    quantised), as manifests."""
    block = GRID_BLOCKS[block_id(wildcards)]
    files = {
        "run": run_manifest_of_block(wildcards),
        "dataset": DATASET.format(task=block.task),
    }
    if block.id in REPARAM_BLOCKS:
        files["deploy"] = manifest("reparam", REPARAM_BLOCKS[block.id])
    if block.id in QUANTIZE_BLOCKS:
        files["quantized"] = manifest("quantize", QUANTIZE_BLOCKS[block.id])
    return files


# --- whole-grid targets ---------------------------------------------------------------------------


def manifests(rule_dir, blocks):
    return [manifest(rule_dir, block) for block in blocks.values()]


def cell_paths(rule_dir, cells, filename):
    """One path per cell, e.g. every ``results/evaluate/<cell>/evaluation.json``."""
    return [f"{RESULTS}/{rule_dir}/{cell.id}/{filename}" for cell in cells]


def run_dir_of_cell(cell):
    return "sparse" if grid.is_sparse(cell) else "train"


def run_paths_of_cells(cells, filename):
    """A file of every cell's run (train or sparse), e.g. every ``history.csv``."""
    return [f"{RESULTS}/{run_dir_of_cell(cell)}/{cell.id}/{filename}" for cell in cells]


def datasets_of_grid():
    return [f"{RESULTS}/data/{task}/dataset.pt" for task in TASKS]


def transformed_models_of_grid():
    """Deploy, sparse and quantised models of the grid, as block manifests."""
    return (
        manifests("reparam", of_grid(REPARAM_BLOCKS))
        + manifests("sparse", of_grid(SPARSE_BLOCKS))
        + manifests("quantize", QUANTIZE_BLOCKS)
    )


def retrained_sparse_cells():
    """The sparse cells that retrain (their masks flip), as dicts."""
    return [c.to_dict() for c in CELLS if grid.is_sparse(c) and grid.retrains(c)]


def by_cell(blocks):
    """Each cell's block of ``blocks``, built once so that group jobs need not scan every block."""
    return {cell: block for block in blocks.values() for cell in block.cells}


SPARSE_BLOCK_OF_CELL = by_cell(SPARSE_BLOCKS)
METRIC_BLOCK_OF_CELL = by_cell(METRIC_BLOCKS)
GRID_BLOCK_OF_CELL = by_cell(GRID_BLOCKS)


def manifests_of_cells(rule_dir, block_of_cell, cells):
    """The manifests of the blocks holding ``cells``, once each, in block order (that of
    ``seed_ranges_of``: task, arch, method, first seed); cells in no block are left out.
    """
    found = {block_of_cell[c] for c in cells if c in block_of_cell}
    return [manifest(rule_dir, block) for block in sorted(found)]


def retrained_sparse_manifests():
    retraining = [grid.Cell.of(c) for c in retrained_sparse_cells()]
    return manifests_of_cells("sparse", SPARSE_BLOCK_OF_CELL, retraining)


def flips_of_grid():
    return [
        f"{RESULTS}/sparse/{grid.Cell.of(c).id}/flips.csv"
        for c in retrained_sparse_cells()
    ]


def summary_figures():
    """The grid-wide figures beyond the evaluation: flip rates when the grid retrains sparse models."""
    return [f"{RESULTS}/summary/flip_rates.png"] if retrained_sparse_cells() else []


# The report's category of the joint comparisons, first in its menu; within a comparison the
# report sorts its results by label, so each label starts with its place on the page: the
# answers (stability line and verdict table) first, then the map, occupancy, stability and the rest.
ANSWERS = "Answers"


def answer_labels(place, item):
    """A joint comparison's report labels: the comparison, and the item with its place."""
    return {"comparison": "{name}", "item": f"{place}. {item}"}


def grid_summary():
    """The evaluation summary of the grid's cells and its figures; none for a study of external
    run sets alone (an empty grid)."""
    if not CELLS:
        return []
    return [
        f"{RESULTS}/summary/evaluation.csv",
        f"{RESULTS}/summary/metrics.json",
        f"{RESULTS}/summary/learning_curves.png",
        *summary_figures(),
    ]


# --- training-map groups -------------------------------------------------------------------------


def metric_manifests_of_cells(cells):
    return manifests_of_cells("metrics", METRIC_BLOCK_OF_CELL, cells)


def evaluation_manifests_of_cells(cells):
    return manifests_of_cells("evaluate", GRID_BLOCK_OF_CELL, cells)


def group_cells(wildcards):
    return HMM_GROUPS[f"{wildcards.task}/{wildcards.arch}/{wildcards.method}"]


@input_function
def cells_of_group(wildcards):
    """The cells (as dicts) of one training-map group, in the order of its path lists."""
    return [cell.to_dict() for cell in group_cells(wildcards)]


def joint_cells(wildcards):
    """A joint comparison's cells: the grid's, or an adaptive round's (rule joint_round), whose
    seeds grow by round; none for the final rule of an adaptive comparison (its rounds did the
    analysis)."""
    name = wildcards.name
    if "round" in wildcards.keys():
        return ADAPTIVE[name].cells(JOINT_GROUPS[name], int(wildcards.round))
    return [] if name in ADAPTIVE else JOINT_GROUPS[name]


@input_function
def cells_of_joint(wildcards):
    return [cell.to_dict() for cell in joint_cells(wildcards)]


def names_regex(names):
    """A wildcard constraint matching exactly ``names`` (and nothing when there are none)."""
    return "|".join(names) or "(?!x)x"


ADAPTIVE_NAMES = names_regex(ADAPTIVE)


@input_function
def adaptive_round_of_joint(wildcards):
    """What a round of an adaptive comparison needs to decide whether to stop (rule joint_round)."""
    joint = ADAPTIVE[wildcards.name]
    return {
        "round": int(wildcards.round),
        "rounds": joint.rounds,
        "step": joint.step,
        "task": joint.task,
        "max": joint.max,
        "seeds_per_method": joint.seeds_per_method(int(wildcards.round)),
        "first_seed": joint.first_seed,
    }


@input_function
def is_adaptive_joint(wildcards):
    return wildcards.name in ADAPTIVE


@input_function
def settings_of_joint(wildcards):
    """A joint comparison's analysis settings (its own ``analysis`` entry over ``analysis``)."""
    return grid.joint_settings(config, wildcards.name)


@input_function
def settings_of_round(wildcards):
    """The analysis settings of an adaptive round: the comparison's, with its stability targets."""
    return (
        grid.joint_settings(config, wildcards.name) | ADAPTIVE[wildcards.name].targets
    )


@input_function
def adaptive_trace_of_joint(wildcards):
    """An adaptive comparison's trace of rounds (rule adaptive_rounds), none for a fixed one."""
    if wildcards.name not in ADAPTIVE:
        return []
    return [f"{RESULTS}/joint/{wildcards.name}/adaptive.json"]


@input_function
def rounds_of_joint(wildcards):
    """An adaptive comparison's round decisions, round 0 on, up to the one that stopped: each
    round is a checkpoint, so Snakemake runs the next only when the last one asked for it.
    """
    if wildcards.name not in ADAPTIVE:
        return []
    decisions = []
    for round_ in range(ADAPTIVE[wildcards.name].rounds + 1):
        job = checkpoints.joint_round.get(name=wildcards.name, round=round_)
        decisions.append(job.output.decision)
        if load_json(job.output.decision)["stop"]:
            break
    return decisions


@input_function
def cell_hashes_of_group(wildcards):
    """The cell hashes of one training-map group's cells (their parent runs get its metrics)."""
    return cell_hashes(group_cells(wildcards))


@input_function
def cell_hashes_of_joint(wildcards):
    """The cell hashes of one joint comparison's cells."""
    return cell_hashes(joint_cells(wildcards))


@input_function
def metrics_of_group(wildcards):
    """The metric manifests of one training-map group's blocks (task/arch/method)."""
    return metric_manifests_of_cells(group_cells(wildcards))


@input_function
def metric_tables_of_group(wildcards):
    """The per-run metric tables of one training-map group, in cell order."""
    return cell_paths("metrics", group_cells(wildcards), "metrics.csv")


@input_function
def evaluations_of_group(wildcards):
    return evaluation_manifests_of_cells(group_cells(wildcards))


@input_function
def evaluation_files_of_group(wildcards):
    return cell_paths("evaluate", group_cells(wildcards), "evaluation.json")


@input_function
def metrics_of_joint(wildcards):
    return metric_manifests_of_cells(joint_cells(wildcards))


@input_function
def metric_tables_of_joint(wildcards):
    return cell_paths("metrics", joint_cells(wildcards), "metrics.csv")


@input_function
def groups_of_joint(wildcards):
    """Each pooled run's group label (its method, or arch/method when archs differ)."""
    return grid.joint_labels(joint_cells(wildcards))


@input_function
def evaluations_of_joint(wildcards):
    return evaluation_manifests_of_cells(joint_cells(wildcards))


@input_function
def evaluation_files_of_joint(wildcards):
    return cell_paths("evaluate", joint_cells(wildcards), "evaluation.json")


# --- the training-maps paper's settings (config key paper; rules in paper.smk) -----------------

PAPER_GROUPS = grid.paper_groups(config)
PAPER_ANALYSES = ["authors", "trainmap"]


def setting_cells(wildcards):
    return PAPER_GROUPS[wildcards.setting]


@input_function
def cells_of_setting(wildcards):
    """The cells (as dicts) of one paper setting's group, in the order of its path lists."""
    return [cell.to_dict() for cell in setting_cells(wildcards)]


@input_function
def metrics_of_setting(wildcards):
    return metric_manifests_of_cells(setting_cells(wildcards))


@input_function
def metric_tables_of_setting(wildcards):
    return cell_paths("metrics", setting_cells(wildcards), "metrics.csv")


@input_function
def evaluations_of_setting(wildcards):
    return evaluation_manifests_of_cells(setting_cells(wildcards))


@input_function
def evaluation_files_of_setting(wildcards):
    return cell_paths("evaluate", setting_cells(wildcards), "evaluation.json")


def paper_maps(filename):
    """One file of every (setting, analysis) map, settings in config order."""
    return [
        f"{RESULTS}/paper/{setting}/{analysis}/{filename}"
        for setting in PAPER_GROUPS
        for analysis in PAPER_ANALYSES
    ]


def analysis_outputs():
    """Every trained run's metric tables (as block manifests), and the grid's training maps,
    regressions and joint comparisons; the external sets' tables and maps (external.smk).
    """
    files = manifests("metrics", of_grid(METRIC_BLOCKS))
    for group in HMM_GROUPS:
        # hmm.npz too: a killed (forced) fit's missing model is refitted by a plain run, and the
        # map and regression after it (else Snakemake keeps the old ones).
        files += [
            f"{RESULTS}/hmm/{group}/{name}"
            for name in ("hmm.npz", "map.json", "detours.json")
        ]
    files += [f"{RESULTS}/joint/{name}/joint.json" for name in JOINT_GROUPS]
    return files + external_outputs()


# --- external run sets (config key external; rules in external.smk) ---------------------------

EXTERNAL_SETS = grid.external_sets(config)


EXTERNAL_RUNS = {
    name: grid.external_runs(spec, workflow.basedir)
    for name, spec in EXTERNAL_SETS.items()
}


def external_files(wildcards):
    """Every checkpoint and evaluation file of one set: a changed file reruns its metrics."""
    from trainmap.dynamics.external import run_files

    evaluation = EXTERNAL_SETS[wildcards.external].get("evaluation", "evaluation.csv")
    return [
        str(path)
        for run_dir in EXTERNAL_RUNS[wildcards.external].values()
        for path in run_files(run_dir, evaluation)
    ]


def external_run_files(name, filename):
    return [
        f"{RESULTS}/external/{name}/runs/{run}/{filename}"
        for run in EXTERNAL_RUNS[name]
    ]


@input_function
def external_runs_of_joint(wildcards):
    """The external runs a joint comparison pools: set, run id, metric table, evaluation."""
    spec = JOINT_SPECS[wildcards.name]
    return [
        {
            "set": name,
            "run": run,
            "metrics": f"{RESULTS}/external/{name}/runs/{run}/metrics.csv",
            "evaluation": f"{RESULTS}/external/{name}/runs/{run}/evaluation.json",
        }
        for name in grid.joint_external_sets(spec)
        for run in EXTERNAL_RUNS[name]
    ]


@input_function
def external_manifests_of_joint(wildcards):
    return [
        f"{RESULTS}/external/{name}/metrics.json"
        for name in grid.joint_external_sets(JOINT_SPECS[wildcards.name])
    ]


def external_outputs():
    """Each external set's metric manifest and training map."""
    return [
        f"{RESULTS}/external/{name}/{filename}"
        for name in EXTERNAL_SETS
        for filename in (
            "metrics.json",
            "map/hmm.npz",
            "map/map.json",
            "map/detours.json",
        )
    ]
