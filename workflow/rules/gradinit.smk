rule gradinit:
    input:
        dataset=DATASET,
        plugins=PLUGIN_FILES,
    output:
        manifest=f"{RESULTS}/gradinit/{BLOCK}.json",
        plot=report(
            f"{RESULTS}/gradinit/{BLOCK}.png",
            caption="../report/gradinit_block.rst",
            category="GradInit",
            subcategory="{task}/{arch}/{method}",
            labels={"block": BLOCK, "figure": "scales and gradient norms"},
        ),
    log:
        f"logs/gradinit/{BLOCK}.log",
    wildcard_constraints:
        method=GRADINIT_METHODS,
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=planned("gradinit", "mem_mb"),
        runtime=planned("gradinit", "runtime"),
        gpu=planned("gradinit", "gpu"),
    params:
        block=seed_range_of_job,
        cell_hashes=cell_hashes_of_block,
        model=model_settings_of_cell,
        settings=gradinit_settings_of_task,
        options=method_options_of_cell,
    script:
        "../scripts/gradinit.py"


rule all_gradinit:
    input:
        BLOCKS["gradinit"].grid_manifests(),
