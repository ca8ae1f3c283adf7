rule sparse_retrain:
    input:
        dataset=DATASET,
        teacher=teacher_model_of_cell,
    output:
        model=f"results/sparse/{CELL}/model.pt",
        trajectory=f"results/sparse/{CELL}/trajectory.pt",
        history=f"results/sparse/{CELL}/history.csv",
        summary=f"results/sparse/{CELL}/train.json",
        flips=f"results/sparse/{CELL}/flips.csv",
        flips_plot=report(
            f"results/sparse/{CELL}/flips.png",
            caption="../report/flips.rst",
            category="Sparsity",
            subcategory="{task}/{arch}/{method}",
            labels={"cell": CELL, "figure": "mask flip rates"},
        ),
    log:
        f"logs/sparse/{CELL}.log",
    wildcard_constraints:
        method=SPARSE_METHODS,
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=120,
    params:
        settings=sparse_settings_of_task,
        options=method_options_of_cell,
    script:
        "../scripts/sparse_retrain.py"


rule quantize:
    input:
        unpack(run_files_of_cell),
        dataset=DATASET,
    output:
        manifest=f"results/quantize/{CELL}/quantize.json",
        models=expand(
            f"results/quantize/{CELL}/{{scheme}}.pt",
            scheme=QUANT_SCHEMES,
            allow_missing=True,
        ),
    log:
        f"logs/quantize/{CELL}.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        schemes=QUANT_SCHEMES,
    script:
        "../scripts/quantize.py"


rule flip_rates:
    input:
        flips=flips_of_grid(),
    output:
        table="results/summary/flip_rates.csv",
        plot=report(
            "results/summary/flip_rates.png",
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
        cells=retrained_sparse_cells(),
    script:
        "../scripts/flip_rates.py"


rule all_transform:
    input:
        transformed_models_of_grid(),
