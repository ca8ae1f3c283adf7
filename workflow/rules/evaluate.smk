rule evaluate:
    input:
        unpack(evaluation_inputs_of_block),
    output:
        manifest=f"{RESULTS}/evaluate/{BLOCK}.json",
    log:
        f"logs/evaluate/{BLOCK}.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=planned("evaluate", "mem_mb"),
        runtime=planned("evaluate", "runtime"),
        gpu=planned("evaluate", "gpu"),
        gpu_mem_mb=planned("evaluate", "gpu_mem_mb"),
    params:
        block=seed_range_of_job,
        cell_hashes=cell_hashes_of_block,
        settings=evaluate_settings_of_task,
        device=training_device_of_task,
    script:
        "../scripts/evaluate.py"


rule summary:
    input:
        manifests=BLOCKS["evaluate"].grid_manifests(),
    output:
        table=report(
            f"{RESULTS}/summary/evaluation.csv",
            caption="../report/evaluation.rst",
            category="Evaluation",
            labels={"table": "one row per run"},
        ),
        forms=report(
            f"{RESULTS}/summary/compression.csv",
            caption="../report/compression_table.rst",
            category="Evaluation",
            labels={"table": "one row per model form"},
        ),
        metrics=f"{RESULTS}/summary/metrics.json",
        curves=report(
            f"{RESULTS}/summary/learning_curves.png",
            caption="../report/learning_curves.rst",
            category="Evaluation",
            labels={"figure": "learning curves"},
        ),
        compression=report(
            f"{RESULTS}/summary/compression.png",
            caption="../report/compression.rst",
            category="Evaluation",
            labels={"figure": "accuracy vs bytes"},
        ),
    log:
        "logs/summary.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        evaluations=BLOCKS["evaluate"].cell_files(CELLS, "evaluation.json"),
        histories=BLOCKS.run_files(CELLS, "history.csv"),
    script:
        "../scripts/summary.py"


rule all_evaluate:
    input:
        rules.summary.output,
