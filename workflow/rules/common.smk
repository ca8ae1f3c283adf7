# Shared by the families of rules: the grid, its seed blocks, the one-time tracking set-up, and the
# input, params and resources functions of more than one family. No rule lives here; a family's
# own functions are in its <family>_inputs.smk, included before its rules.
#
# Per-seed rules run one *block* per job, i.e. the seeds of one (task, arch, method) in an
# aligned range of train.<task>.seed_block seeds (trainmap.grid.SeedRange), e.g. seeds0-31. A block
# job writes each seed's files in its own directory (results/<rule>/<task>/<arch>/<method>/seed<n>/)
# and, as its declared output, the block's manifest beside them (.../seeds0-31.json). Rules depend on
# manifests; the per-seed paths they read are passed as params. trainmap.grid.BLOCK_RULES says
# which cells each block rule runs and where its files go.
import functools
import inspect
import os
import sys

from snakemake.common import overwrite_function_params

from trainmap import grid, plan
from trainmap.grid.dvc_record import record_finished_work
from trainmap.grid.roots import RootInUseError, claim_root, mark_root
from trainmap.methods import check_method
from trainmap.plugins import plugin_sources
from trainmap.tracking import cluster_tracking_problem, init_tracking, tracking_settings
from trainmap.unfinished import UnfinishedScan, find_unfinished
from trainmap.worker import WORKFLOW_PID_ENV, await_server, launch_server, stop_server

#: The directory this config's outputs all go under (config key results, default results), one
#: per config, so another study run in this checkout never writes into the default study's files.
RESULTS = grid.results_root(config)
CELLS = grid.expand_grid(config)
# The plan's model profiles (the resources of every job, the onstart's check) are measured once
# per project and code, not in every Snakemake process (each dry run, each cluster job's parse).
plan.set_profile_directory(".snakemake/trainmap/profiles")


wildcard_constraints:
    task=r"[A-Za-z][A-Za-z0-9_]*",
    arch=r"[A-Za-z][A-Za-z0-9_]*",
    method=r"[A-Za-z][A-Za-z0-9_]*",
    block=r"seeds\d+-\d+",
    name=r"[A-Za-z][A-Za-z0-9_]*",


JOB_SERVER = {}
#: The open lock file of this run's results root (trainmap.grid.roots.claim_root), held until exit.
ROOT_CLAIM = {}


onstart:
    tracking = tracking_settings(config)
    # Jobs on this machine fork from one warm process instead of importing torch and MLflow each
    # (trainmap.worker); cluster jobs run in their own processes. It starts first and imports
    # while this process checks the plan and claims the root; it also creates the tracking database
    # and experiment before it answers a job (measured: a fresh SQLite database migrated by 8 jobs
    # at once lost 7 of their runs).
    pending = None
    if workflow.local_exec:
        pending = launch_server(
            ".snakemake/trainmap",
            (tracking["uri"],),
            experiment=tracking["experiment"],
        )
    try:
        # A grid that cannot finish here is refused before any job: its planned bytes against
        # the results' disk, a job's planned RAM against this machine's (machine_problem).
        problem = plan.machine_problem(
            plan.plan_jobs(config, RESULTS), RESULTS, local=workflow.local_exec
        )
        if problem:
            print(
                f"error: the plan does not fit: {problem} (make plan: every job's estimate; "
                "nothing ran)",
                file=sys.stderr,
            )
            raise SystemExit(1)
        # One workflow per results root at a time (after the plan: a refused grid makes no
        # root): a second run on this root is refused at once, naming the first one's pid
        # (another root stays allowed). The lock is the kernel's, released when this process
        # ends; the marker lets `make clean` find the root wherever it lies.
        try:
            ROOT_CLAIM["file"] = claim_root(Path(RESULTS))
        except RootInUseError as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(1)
        mark_root(Path(RESULTS), Path(workflow.basedir))
    except BaseException:
        stop_server(pending)
        raise
    # Every job on this machine watches this process: a job whose workflow is gone (kill -9) ends
    # its process group (trainmap.worker), so no job trains on behind a dead workflow. Cluster
    # jobs run on other nodes, where this pid means nothing: the executor cancels them.
    if workflow.local_exec:
        os.environ[WORKFLOW_PID_ENV] = str(os.getpid())
    # Cluster jobs (--executor slurm, profiles/slurm) log from compute nodes: a loopback or SQLite
    # store is unreachable or unsafe there. A warning, not an error: a SLURM whose one node is
    # this machine (make slurm-up) reaches both.
    if not workflow.local_exec:
        problem = cluster_tracking_problem(tracking["uri"])
        if problem:
            print(f"warning: cluster jobs: {problem}", file=sys.stderr)
    JOB_SERVER["process"] = await_server(pending)
    if (
        JOB_SERVER["process"] is None
    ):  # no server set the store up: create it here, once
        init_tracking(tracking["uri"], tracking["experiment"])


onsuccess:
    stop_server(JOB_SERVER.pop("process", None))
    # A plain run's outputs under results/, which dvc.yaml versions: recorded in DVC when this is
    # the run dvc.yaml makes, else a warning (`dvc exp run` would delete them: grid.dvc_record).
    said = record_finished_work(
        config,
        Path(workflow.basedir),
        workflow.overwrite_configfiles,
        workflow.config_settings.config,
        workflow.dag_settings.targets,
    )
    if said:
        print(said, file=sys.stderr)


onerror:
    stop_server(JOB_SERVER.pop("process", None))


BLOCK = "{task}/{arch}/{method}/{block}"
#: Dense methods (a wildcard constraint): the train and reparam rules' models.
DENSE_METHODS = grid.methods_without_stage("sparse")
# The plugins' source files: an input of every rule that builds data or models, so editing a
# plugin reruns them (and what follows), as editing trainmap's own code does.
PLUGIN_FILES = plugin_sources(config.get("plugins"), workflow.basedir)
#: A task's dataset, a plain pattern rather than an input function: cheaper per job.
DATASET = f"{RESULTS}/data/{{task}}/dataset.pt"


# Adaptive joint comparisons (analysis.joint[i].adaptive) and the seeds their later rounds may
# add. Their blocks exist in every block rule but quantize, but only a round the checkpoint
# joint_round asks for (analysis.smk) requests them, so a seed trains only when its round is reached.
ADAPTIVE = grid.adaptive_joints(config)

#: The seed blocks of each block rule (trainmap.grid.RuleBlocks) by its name, e.g.
#: BLOCKS["train"]["<task>/<arch>/<method>/seedsF-L"] is a block, BLOCKS["train"].manifest(block)
#: its manifest.
BLOCKS = grid.study_blocks(config, RESULTS, CELLS, ADAPTIVE)


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
    find_unfinished(RESULTS, BLOCKS.by_directory(), rerun_command())
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


def block_id(wildcards):
    return f"{wildcards.task}/{wildcards.arch}/{wildcards.method}/{wildcards.block}"


# --- block params: the job's seed range and its cells' hashes ------------------------------------


@input_function
def seed_range_of_job(wildcards, output):
    """A block job's seed range (as JSON): the one whose manifest it writes (``output.manifest``)."""
    return BLOCKS.of_manifest(output.manifest).to_dict()


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
    return cell_hashes(BLOCKS.of_manifest(output.manifest).cells)


# --- scheduler requests: the plan's estimates (trainmap.plan; `make plan` prints them) ------------


@functools.cache
def planned_resources(rule_name, job):
    """``mem_mb``, ``runtime`` (minutes) and ``gpu`` of one job of ``rule_name`` (a block rule's
    block id, or an analysis job's cells as a tuple): trainmap.plan's estimate, the one
    ``python -m trainmap.plan`` prints, times plan.SAFETY_FACTOR. Models are profiled once per
    (task, arch), not per job.
    """
    if rule_name in BLOCKS:
        return plan.job_resources(config, rule_name, block=BLOCKS[rule_name][job])
    return plan.job_resources(config, rule_name, group=job)


def planned(rule_name, resource, cells_of=None):
    """A resources function: ``resource`` (mem_mb, runtime or gpu) of ``rule_name``'s jobs, planned:
    a block rule's job by its block, an analysis job by the cells ``cells_of(wildcards)``.
    """

    def of_job(wildcards):
        job = block_id(wildcards) if cells_of is None else tuple(cells_of(wildcards))
        return planned_resources(rule_name, job)[resource]

    return input_function(of_job)


# --- settings and inputs of more than one block rule --------------------------------------------


@input_function
def model_settings_of_cell(wildcards):
    return grid.model_settings(config, wildcards.task, wildcards.arch)


@input_function
def method_options_of_cell(wildcards):
    return check_method(wildcards.method).options


@input_function
def run_manifest_of_block(wildcards):
    """The block's runs (train or sparse manifest): final models, histories, trajectories."""
    return BLOCKS.run_manifest(BLOCKS["evaluate"][block_id(wildcards)])


# --- what an analysis job reads of its runs (analysis.smk's groups and joint comparisons,
# paper.smk's settings) ---------------------------------------------------------------------------


def cell_dicts(cells):
    """The cells as dicts, in the order of the path lists beside them."""
    return [cell.to_dict() for cell in cells]


#: What an analysis job reads of its cells, by kind: a function of the cells.
OF_CELLS = {
    "cells": cell_dicts,
    "cell_hashes": cell_hashes,
    # each pooled run's group label (its method, or arch/method when archs differ)
    "labels": grid.joint_labels,
    "metric_manifests": BLOCKS["collect_metrics"].manifests_of_cells,
    "metric_tables": functools.partial(
        BLOCKS["collect_metrics"].cell_files, filename="metrics.csv"
    ),
    "evaluation_manifests": BLOCKS["evaluate"].manifests_of_cells,
    "evaluation_files": functools.partial(
        BLOCKS["evaluate"].cell_files, filename="evaluation.json"
    ),
}


def of_cells(kind, cells_of):
    """An input or params function: ``kind`` (a key of OF_CELLS) of the cells that
    ``cells_of(wildcards)`` returns, e.g. ``of_cells("metric_manifests", group_cells)``.
    """
    value_of = OF_CELLS[kind]

    def of_wildcards(wildcards):
        return value_of(cells_of(wildcards))

    return input_function(of_wildcards)
