# External run sets (config key external; trainmap.grid.external): checkpoints trainmap did not
# train, read into metric tables (external_metrics) and mapped (external_map); analysis.joint
# comparisons pool them beside the grid's own runs (joint_comparison's external param).

EXTERNAL_SETS = grid.external_sets(config)


wildcard_constraints:
    external="[A-Za-z][A-Za-z0-9_]*",


EXTERNAL_RUNS = {
    name: grid.external_runs(spec, workflow.basedir)
    for name, spec in EXTERNAL_SETS.items()
}


def external_files(wildcards):
    """Every checkpoint and evaluation file of one set: a changed file reruns its metrics."""
    spec = EXTERNAL_SETS[wildcards.external]
    evaluation = spec.get("evaluation", "evaluation.csv")
    files = []
    for run_dir in EXTERNAL_RUNS[wildcards.external].values():
        files += sorted(
            str(p)
            for p in Path(run_dir).iterdir()
            if p.suffix in (".pt", ".pth", ".safetensors") or p.name == evaluation
        )
    return files


def external_run_files(name, filename):
    return [
        f"results/external/{name}/runs/{run}/{filename}" for run in EXTERNAL_RUNS[name]
    ]


@input_function
def external_runs_of_joint(wildcards):
    """The external runs a joint comparison pools: set, run id, metric table, evaluation."""
    spec = JOINT_SPECS[wildcards.name]
    return [
        {
            "set": name,
            "run": run,
            "metrics": f"results/external/{name}/runs/{run}/metrics.csv",
            "evaluation": f"results/external/{name}/runs/{run}/evaluation.json",
        }
        for name in grid.joint_external_sets(spec)
        for run in EXTERNAL_RUNS[name]
    ]


@input_function
def external_manifests_of_joint(wildcards):
    return [
        f"results/external/{name}/metrics.json"
        for name in grid.joint_external_sets(JOINT_SPECS[wildcards.name])
    ]


def external_outputs():
    """Each external set's metric manifest and training map."""
    return [
        f"results/external/{name}/{filename}"
        for name in EXTERNAL_SETS
        for filename in (
            "metrics.json",
            "map/hmm.npz",
            "map/map.json",
            "map/detours.json",
        )
    ]


rule external_metrics:
    input:
        external_files,
        definitions="src/trainmap/dynamics/metrics.py",
    output:
        manifest="results/external/{external}/metrics.json",
    log:
        "logs/external_metrics/{external}.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        runs=lambda wildcards: EXTERNAL_RUNS[wildcards.external],
        spec=lambda wildcards: EXTERNAL_SETS[wildcards.external],
        arch=lambda wildcards: grid.external_arch(
            config, EXTERNAL_SETS[wildcards.external], workflow.basedir
        ),
        convention=grid.analysis_settings(config).get("metrics", "paper"),
    script:
        "../scripts/external_metrics.py"


rule external_map:
    input:
        "results/external/{external}/metrics.json",
    output:
        model="results/external/{external}/map/hmm.npz",
        map="results/external/{external}/map/map.json",
        detours="results/external/{external}/map/detours.json",
        png=report(
            "results/external/{external}/map/map.png",
            caption="../report/training_map.rst",
            category="Training maps",
            subcategory="external/{external}",
            labels={"group": "external/{external}", "figure": "training map"},
        ),
    log:
        "logs/external_map/{external}.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 2
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        settings=grid.analysis_settings(config),
        run_ids=lambda wildcards: list(EXTERNAL_RUNS[wildcards.external]),
        metrics=lambda wildcards: external_run_files(wildcards.external, "metrics.csv"),
        evaluations=lambda wildcards: external_run_files(
            wildcards.external, "evaluation.json"
        ),
    script:
        "../scripts/external_map.py"
