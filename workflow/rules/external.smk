# External run sets (config key external; trainmap.grid.external): checkpoints trainmap did not
# train, run directories or a suite in the Hugging Face cache (its revisions.json, written by the
# config check, is an input), read into metric tables (external_metrics) and mapped
# (external_map); analysis.joint comparisons pool them beside the grid's own runs
# (joint_comparison's external param). A suite fetched from the Hub (hub.fetch; its
# revisions.json written by `trainmap resolve`) is measured first by external_revisions, one job
# per block of one run's revisions, whose tables external_metrics joins.
from trainmap.dynamics.runs.names import ROW_DEFINITIONS
from trainmap.schema import section_defaults


wildcard_constraints:
    external="[A-Za-z][A-Za-z0-9_]*",


rule external_revisions:
    input:
        unpack(revision_inputs),
        # The code that makes a row: a change measures the revisions again (their rows are kept
        # per code and settings: trainmap.dynamics.runs.hub_fetch.rows_folder).
        definitions=[f"src/trainmap/{name}" for name in ROW_DEFINITIONS],
    output:
        f"{RESULTS}/external/{{external}}/blocks/{{suite_run}}/{{revisions}}.csv",
    log:
        "logs/external_revisions/{external}/{suite_run}/{revisions}.log",
    wildcard_constraints:
        suite_run="[A-Za-z0-9][A-Za-z0-9_.-]*",
        revisions="[0-9]+",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=memory_mb_of_external,
        runtime=runtime_of_block,
    params:
        steps=steps_of_block,
        spec=spec_of_external,
        arch=arch_of_external,
        rows=rows_of_external_run,
        convention=grid.analysis_settings(config).get(
            "metrics", section_defaults("analysis")["metrics"]
        ),
    script:
        "../scripts/external_revisions.py"


rule external_metrics:
    input:
        unpack(external_files),
        # The metric definitions, the families' layouts (which matrices count) and the bounded
        # path of large checkpoints are inputs: changing any reruns the set's tables.
        definitions=[
            "src/trainmap/dynamics/metrics/weights.py",
            "src/trainmap/dynamics/runs/families.py",
            "src/trainmap/dynamics/runs/bounded.py",
        ],
    output:
        manifest=f"{RESULTS}/external/{{external}}/metrics.json",
    log:
        "logs/external_metrics/{external}.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=memory_mb_of_external,
        runtime=60,
    params:
        runs=runs_of_external,
        spec=spec_of_external,
        arch=arch_of_external,
        convention=grid.analysis_settings(config).get(
            "metrics", section_defaults("analysis")["metrics"]
        ),
    script:
        "../scripts/external_metrics.py"


rule external_map:
    input:
        f"{RESULTS}/external/{{external}}/metrics.json",
    output:
        model=f"{RESULTS}/external/{{external}}/map/hmm.npz",
        map=f"{RESULTS}/external/{{external}}/map/map.json",
        detours=f"{RESULTS}/external/{{external}}/map/detours.json",
        outliers=f"{RESULTS}/external/{{external}}/map/outliers.json",
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
        run_ids=run_ids_of_external,
        metrics=metric_tables_of_external,
        evaluations=evaluation_files_of_external,
        outlier_share=outlier_share_of_external,
    script:
        "../scripts/external_map.py"
