# The external run sets and their rules' input and params functions (rules in external.smk);
# the joint comparisons read the sets' runs too (analysis_inputs.smk). A hub set's suite was
# resolved into its revisions.json by the config check; its runs and files come from there.
from trainmap.grid.external import external_set

EXTERNAL_SETS = grid.external_sets(config)
#: Each set as the workflow reads it (trainmap.grid.external.ExternalSet).
EXTERNAL = {
    name: external_set(config, spec, workflow.basedir)
    for name, spec in EXTERNAL_SETS.items()
}
#: Each set's runs: run id -> run directory (or a suite run's hf:// source).
EXTERNAL_RUNS = {name: external.runs for name, external in EXTERNAL.items()}


def external_files(wildcards):
    """Every file one set's metrics read, named (files; a hub set's hub and curves): a changed
    file reruns its metrics."""
    return EXTERNAL[wildcards.external].inputs()


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
        )
    ]
