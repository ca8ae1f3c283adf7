# The external run sets and their rules' input and params functions (rules in external.smk);
# the joint comparisons read the sets' runs too (analysis_inputs.smk).

EXTERNAL_SETS = grid.external_sets(config)
#: Each set's runs: run id -> run directory.
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


def external_run_file(name, run, filename):
    """A file of one run of set ``name`` under the results, e.g. its ``metrics.csv``."""
    return f"{RESULTS}/external/{name}/runs/{run}/{filename}"


@input_function
def memory_mb_of_external(wildcards):
    """external_metrics' memory: a constant plus three times the set's largest checkpoint."""
    return grid.external_metrics_memory_mb(EXTERNAL_RUNS[wildcards.external])


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
