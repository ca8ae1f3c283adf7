rule gradinit:
    input:
        dataset=DATASET,
    output:
        model=f"results/gradinit/{CELL}/init.pt",
        scales=f"results/gradinit/{CELL}/scales.json",
        history=f"results/gradinit/{CELL}/history.csv",
        diagnostics=f"results/gradinit/{CELL}/diagnostics.csv",
        diagnostics_plot=report(
            f"results/gradinit/{CELL}/diagnostics.png",
            caption="../report/gradinit_diagnostics.rst",
            category="GradInit",
            subcategory="{task}/{arch}/{method}",
            labels={"cell": CELL, "figure": "per-layer diagnostics"},
        ),
        history_plot=report(
            f"results/gradinit/{CELL}/history.png",
            caption="../report/gradinit_history.rst",
            category="GradInit",
            subcategory="{task}/{arch}/{method}",
            labels={"cell": CELL, "figure": "iterations"},
        ),
    log:
        f"logs/gradinit/{CELL}.log",
    wildcard_constraints:
        method=GRADINIT_METHODS,
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        model=model_settings_of_cell,
        settings=gradinit_settings_of_task,
        options=method_options_of_cell,
    script:
        "../scripts/gradinit.py"


rule all_gradinit:
    input:
        gradinit_outputs_of_grid(),
