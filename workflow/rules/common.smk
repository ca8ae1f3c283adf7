# Grid expansion, input functions and the one-time tracking set-up. No rule lives here.
import inspect

from snakemake.common import overwrite_function_params

from trainmap import config as grid
from trainmap.tracking import experiment_name, init_tracking, tracking_uri
from trainmap.worker import start_server, stop_server

grid.check_config(config, base_dir=Path(workflow.basedir))
CELLS = grid.expand_grid(config)
TASKS = grid.grid_tasks(config)


wildcard_constraints:
    task=r"[A-Za-z][A-Za-z0-9_]*",
    arch=r"[A-Za-z][A-Za-z0-9_]*",
    method=r"[A-Za-z][A-Za-z0-9_]*",
    seed=r"\d+",
    name=r"[A-Za-z][A-Za-z0-9_]*",
    scheme=r"[A-Za-z][A-Za-z0-9_]*",


JOB_SERVER = {}


onstart:
    # Create the tracking database and experiment once, before parallel jobs (FACTS.md: a fresh
    # SQLite database migrated by 8 jobs at once lost 7 of their runs).
    init_tracking(tracking_uri(config), experiment_name(config))
    # Jobs on this machine fork from one warm process instead of importing torch and MLflow each
    # (trainmap.worker); cluster jobs run in their own processes.
    if workflow.local_exec:
        JOB_SERVER["process"] = start_server(
            ".snakemake/trainmap", (tracking_uri(config),)
        )


onsuccess:
    stop_server(JOB_SERVER.pop("process", None))


onerror:
    stop_server(JOB_SERVER.pop("process", None))


CELL = "{task}/{arch}/{method}/seed{seed}"
# The stage that makes a cell's model depends on its method: method-name regexes per stage.
GRADINIT_METHODS = grid.methods_with_stage("gradinit")
SPARSE_METHODS = grid.methods_with_stage("sparse")
DENSE_METHODS = grid.methods_without_stage("sparse")
QUANT_SCHEMES = list(config.get("quantize", {}).get("schemes", []))
HMM_GROUPS = grid.analysis_groups(config)
JOINT_GROUPS = grid.joint_groups(config)


def input_function(func):
    """Mark ``func`` (an input, params or resources function) so Snakemake reads its signature once.

    Snakemake otherwise calls ``inspect.signature`` on every such function for every job: at 40k
    jobs with several functions each, ~6 % of a dry run (bench/dag_scale.py).
    """
    overwrite_function_params(func, inspect.signature(func).parameters)
    return func


#: A task's dataset, a plain pattern rather than an input function: cheaper per job.
DATASET = "results/data/{task}/dataset.pt"


def cell_of(wildcards):
    return grid.Cell.from_wildcards(wildcards)


@input_function
def data_settings_of_task(wildcards):
    return grid.data_settings(config, wildcards.task)


@input_function
def model_settings_of_cell(wildcards):
    return grid.model_settings(config, wildcards.task, wildcards.arch)


@input_function
def train_settings_of_task(wildcards):
    return grid.train_settings(config, wildcards.task)


@input_function
def gpus_of_task(wildcards):
    """1 when the task trains on a GPU (train.<task>.device: cuda), for the cluster's request."""
    device = grid.train_settings(config, wildcards.task).get("device", "cpu")
    return 1 if device.startswith("cuda") else 0


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
    return grid.method_of(cell_of(wildcards)).options


@input_function
def initial_model_of_cell(wildcards):
    """GradInit's rescaled model for cells of a gradinit-stage method; none for the others."""
    cell = cell_of(wildcards)
    if grid.method_of(cell).has_stage("gradinit"):
        return f"results/gradinit/{cell.id}/init.pt"
    return []


@input_function
def teacher_model_of_cell(wildcards):
    """The dense model a sparse cell retrains: the kaiming cell of the same task, arch and seed."""
    return f"results/train/{grid.teacher_cell(cell_of(wildcards)).id}/model.pt"


def run_dir_of_cell(cell):
    """Where a cell's final model, history and trajectory are: its sparse or its train run."""
    return f"results/{'sparse' if grid.is_sparse(cell) else 'train'}/{cell.id}"


@input_function
def run_files_of_cell(wildcards):
    """The final model, history and run summary of a cell (train or sparse rule)."""
    run_dir = run_dir_of_cell(cell_of(wildcards))
    return {
        "model": f"{run_dir}/model.pt",
        "history": f"{run_dir}/history.csv",
        "summary": f"{run_dir}/train.json",
    }


@input_function
def run_files_with_trajectory_of_cell(wildcards):
    """What collect_metrics reads: the run's files and its checkpoint trajectory."""
    files = run_files_of_cell(wildcards)
    files["trajectory"] = f"{run_dir_of_cell(cell_of(wildcards))}/trajectory.pt"
    return files


@input_function
def evaluation_inputs_of_cell(wildcards):
    """The run's files and every other form of its model that evaluate measures (deploy,
    quantised), in one input function: Snakemake's cost per input function and job adds up.
    """
    cell = cell_of(wildcards)
    files = run_files_of_cell(wildcards)
    if grid.has_deploy_form(cell.arch) and not grid.is_sparse(cell):
        files["deploy"] = f"results/reparam/{cell.id}/deploy.pt"
    if grid.quantized_schemes(config, cell):
        files["quantized"] = f"results/quantize/{cell.id}/quantize.json"
    return files


def files_of_grid(rule_dir, filename):
    """One path per grid cell, e.g. every ``results/evaluate/<cell>/evaluation.json``."""
    return [f"results/{rule_dir}/{cell.id}/{filename}" for cell in CELLS]


def run_files_of_grid(filename):
    """A file of every cell's run (train or sparse), e.g. every ``history.csv``."""
    return [f"{run_dir_of_cell(cell)}/{filename}" for cell in CELLS]


def datasets_of_grid():
    return [f"results/data/{task}/dataset.pt" for task in TASKS]


def gradinit_outputs_of_grid():
    return [
        f"results/gradinit/{cell.id}/init.pt"
        for cell in CELLS
        if grid.method_of(cell).has_stage("gradinit")
    ]


def trained_models_of_grid():
    """Every dense model the grid trains, the teachers of its sparse cells included."""
    dense = {grid.teacher_cell(c) if grid.is_sparse(c) else c for c in CELLS}
    return [f"results/train/{cell.id}/model.pt" for cell in sorted(dense)]


def transformed_models_of_grid():
    """Deploy, sparse and quantised models of the grid."""
    files = []
    for cell in CELLS:
        if grid.is_sparse(cell):
            files.append(f"results/sparse/{cell.id}/model.pt")
        elif grid.has_deploy_form(cell.arch):
            files.append(f"results/reparam/{cell.id}/deploy.pt")
        if grid.quantized_schemes(config, cell):
            files.append(f"results/quantize/{cell.id}/quantize.json")
    return files


def retrained_sparse_cells():
    """The sparse cells that retrain (their masks flip), as dicts."""
    return [c.to_dict() for c in CELLS if grid.is_sparse(c) and grid.retrains(c)]


def flips_of_grid():
    return [
        f"results/sparse/{grid.Cell.of(c).id}/flips.csv"
        for c in retrained_sparse_cells()
    ]


def summary_figures():
    """The grid-wide figures beyond the evaluation: flip rates when the grid retrains sparse models."""
    return ["results/summary/flip_rates.png"] if retrained_sparse_cells() else []


def metrics_of_cells(cells):
    return [f"results/metrics/{cell.id}/metrics.csv" for cell in cells]


@input_function
def cells_of_group(wildcards):
    """The cells (as dicts) of one training-map group, in the order of its input lists."""
    cells = HMM_GROUPS[f"{wildcards.task}/{wildcards.arch}/{wildcards.method}"]
    return [cell.to_dict() for cell in cells]


@input_function
def cells_of_joint(wildcards):
    return [cell.to_dict() for cell in JOINT_GROUPS[wildcards.name]]


@input_function
def metrics_of_group(wildcards):
    """The per-run metric tables of one training-map group (task/arch/method)."""
    return metrics_of_cells(
        HMM_GROUPS[f"{wildcards.task}/{wildcards.arch}/{wildcards.method}"]
    )


@input_function
def evaluations_of_group(wildcards):
    cells = HMM_GROUPS[f"{wildcards.task}/{wildcards.arch}/{wildcards.method}"]
    return [f"results/evaluate/{cell.id}/evaluation.json" for cell in cells]


@input_function
def metrics_of_joint(wildcards):
    return metrics_of_cells(JOINT_GROUPS[wildcards.name])


@input_function
def groups_of_joint(wildcards):
    """Each pooled run's group label (its method, or arch/method when archs differ)."""
    cells = JOINT_GROUPS[wildcards.name]
    several_archs = len({cell.arch for cell in cells}) > 1
    return [f"{c.arch}/{c.method}" if several_archs else c.method for c in cells]


@input_function
def evaluations_of_joint(wildcards):
    return [
        f"results/evaluate/{cell.id}/evaluation.json"
        for cell in JOINT_GROUPS[wildcards.name]
    ]


def analysis_outputs():
    """Every trained run's metric table, and the grid's training maps, regressions and joint
    comparisons. Metric tables of runs in a map or a joint comparison are reached through it, so
    only the others are listed here (fewer targets: a faster DAG for large grids)."""
    grouped = {
        cell
        for group in (*HMM_GROUPS.values(), *JOINT_GROUPS.values())
        for cell in group
    }
    files = metrics_of_cells(
        [c for c in CELLS if grid.retrains(c) and c not in grouped]
    )
    for group in HMM_GROUPS:
        files += [f"results/hmm/{group}/map.json", f"results/hmm/{group}/detours.json"]
    files += [f"results/joint/{name}/joint.json" for name in JOINT_GROUPS]
    return files
