# External run sets (config key external; trainmap.grid.external): checkpoints trainmap did not
# train, read into metric tables (external_metrics) and mapped (external_map); analysis.joint
# comparisons pool them beside the grid's own runs (joint_comparison's external param).


wildcard_constraints:
    external="[A-Za-z][A-Za-z0-9_]*",


rule external_metrics:
    input:
        external_files,
        definitions="src/trainmap/dynamics/metrics.py",
    output:
        manifest=f"{RESULTS}/external/{{external}}/metrics.json",
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
        f"{RESULTS}/external/{{external}}/metrics.json",
    output:
        model=f"{RESULTS}/external/{{external}}/map/hmm.npz",
        map=f"{RESULTS}/external/{{external}}/map/map.json",
        detours=f"{RESULTS}/external/{{external}}/map/detours.json",
        png=report(
            f"{RESULTS}/external/{{external}}/map/map.png",
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
