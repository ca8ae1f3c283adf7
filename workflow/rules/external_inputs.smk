# The external run sets and their rules' input and params functions (rules in external.smk);
# the joint comparisons read the sets' runs too (analysis_inputs.smk). A hub set's suite was
# resolved into its revisions.json by the config check; its runs and files come from there.
from trainmap.grid.external import EXTERNAL_DEFAULTS, external_set

EXTERNAL_SETS = grid.external_sets(config)
#: Each set as the workflow reads it (trainmap.grid.external.ExternalSet).
EXTERNAL = {
    name: external_set(config, spec, workflow.basedir)
    for name, spec in EXTERNAL_SETS.items()
}
#: Each set's runs: run id -> run directory (or a suite run's hf:// source).
EXTERNAL_RUNS = {name: external.runs for name, external in EXTERNAL.items()}


def external_files(wildcards):
    """Every file one set's metrics read, named (files; a hub set's hub and curves; a fetched
    suite's blocks, its revision jobs' tables): a changed file reruns its metrics."""
    external = EXTERNAL[wildcards.external]
    files = external.inputs()
    if external.fetched:
        files["blocks"] = revision_block_files(wildcards.external)
    return files


def revision_block_file(name, run, block):
    """The table of block ``block`` of run ``run``'s revisions of fetched set ``name``."""
    return f"{RESULTS}/external/{name}/blocks/{run}/{block}.csv"


def revision_block_files(name):
    """Every revision job's table of fetched set ``name``, run by run, in block order."""
    return [
        revision_block_file(name, run, block)
        for run, blocks in EXTERNAL[name].blocks.items()
        for block in range(len(blocks))
    ]


def revision_inputs(wildcards):
    """What one external_revisions job reads, named: hub (the set's revisions.json, written by
    `trainmap resolve`) and, with eval_tokens, tokens (the held-out token ids)."""
    external = EXTERNAL[wildcards.external]
    files = {"hub": str(external.manifest_path)}
    if external.eval_tokens is not None:
        files["tokens"] = str(external.eval_tokens)
    return files


@input_function
def rows_of_external_run(wildcards):
    """Where one fetched run's revision rows are kept, across its jobs and their reruns
    (trainmap.dynamics.runs.hub_fetch.rows_folder adds the settings' key)."""
    return f"{RESULTS}/external/{wildcards.external}/rows/{wildcards.suite_run}"


@input_function
def steps_of_block(wildcards):
    """The steps one external_revisions job measures."""
    blocks = EXTERNAL[wildcards.external].blocks[wildcards.suite_run]
    return blocks[int(wildcards.revisions)]


@input_function
def runtime_of_block(wildcards):
    """external_revisions' minutes: its revisions' plan (trainmap.plan.suites), times the
    plan's safety factor."""
    from trainmap.grid.external_hub import fetch_setting
    from trainmap.plan.suites import block_runtime_minutes

    external = EXTERNAL[wildcards.external]
    sizes = external.sizes[wildcards.suite_run]
    return block_runtime_minutes(
        [sizes[step] for step in steps_of_block(wildcards)],
        fetch_setting(external.spec, "dtype"),
    )


def external_run_file(name, run, filename):
    """A file of one run of set ``name`` under the results, e.g. its ``metrics.csv``."""
    return f"{RESULTS}/external/{name}/runs/{run}/{filename}"


@input_function
def memory_mb_of_external(wildcards):
    """external_metrics' memory: a constant plus 1.5 times the set's largest checkpoint."""
    return EXTERNAL[wildcards.external].memory_mb()


@input_function
def runs_of_external(wildcards):
    return EXTERNAL_RUNS[wildcards.external]


@input_function
def outlier_share_of_external(wildcards):
    """The set's outlier_share, the schema's default when left out."""
    return EXTERNAL_SETS[wildcards.external].get(
        "outlier_share", EXTERNAL_DEFAULTS["outlier_share"]
    )


@input_function
def run_ids_of_external(wildcards):
    return list(EXTERNAL_RUNS[wildcards.external])


@input_function
def spec_of_external(wildcards):
    return EXTERNAL_SETS[wildcards.external]


@input_function
def arch_of_external(wildcards):
    """The model a set's state dicts are read through (trainmap.grid.external_arch), or None."""
    return grid.external_arch(
        config, EXTERNAL_SETS[wildcards.external], workflow.basedir
    )


@input_function
def metric_tables_of_external(wildcards):
    name = wildcards.external
    return [external_run_file(name, run, "metrics.csv") for run in EXTERNAL_RUNS[name]]


@input_function
def evaluation_files_of_external(wildcards):
    name = wildcards.external
    return [
        external_run_file(name, run, "evaluation.json") for run in EXTERNAL_RUNS[name]
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
            "map/outliers.json",
        )
    ]
