rule sparse_retrain:
    input:
        dataset=DATASET,
        teacher=teacher_manifest_of_block,
        plugins=PLUGIN_FILES,
    output:
        manifest=f"{RESULTS}/sparse/{BLOCK}.json",
        plot=report(
            f"{RESULTS}/sparse/{BLOCK}.png",
            caption="../report/flips_block.rst",
            category="Sparsity",
            subcategory="{task}/{arch}/{method}",
            labels={"block": BLOCK, "figure": "mask flip rates"},
        ),
    log:
        f"logs/sparse/{BLOCK}.log",
    wildcard_constraints:
        method=SPARSE_METHODS,
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=planned("sparse_retrain", "mem_mb"),
        runtime=planned("sparse_retrain", "runtime"),
        gpu=planned("sparse_retrain", "gpu"),
        gpu_mem_mb=planned("sparse_retrain", "gpu_mem_mb"),
    params:
        block=seed_range_of_job,
        cell_hashes=cell_hashes_of_block,
        settings=sparse_settings_of_task,
        options=method_options_of_cell,
    script:
        "../scripts/sparse_retrain.py"


rule flip_rates:
    input:
        manifests=BLOCKS["sparse_retrain"].manifests_of_cells(retrained_sparse_cells()),
    output:
        table=f"{RESULTS}/summary/flip_rates.csv",
        plot=report(
            f"{RESULTS}/summary/flip_rates.png",
            caption="../report/flip_rates.rst",
            category="Sparsity",
            labels={"figure": "flip rates by method"},
        ),
    log:
        "logs/flip_rates.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        cells=cell_dicts(retrained_sparse_cells()),
        flips=BLOCKS["sparse_retrain"].cell_files(retrained_sparse_cells(), "flips.csv"),
    script:
        "../scripts/flip_rates.py"


rule all_transform:
    input:
        transformed_models_of_grid(),
