rule train:
    input:
        unpack(dataset_and_init_of_block),
        plugins=PLUGIN_FILES,
    output:
        manifest=f"{RESULTS}/train/{BLOCK}.json",
    log:
        f"logs/train/{BLOCK}.log",
    wildcard_constraints:
        method=DENSE_METHODS,
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=planned("train", "mem_mb"),
        runtime=planned("train", "runtime"),
        gpu=planned("train", "gpu"),
        gpu_mem_mb=planned("train", "gpu_mem_mb"),
    params:
        block=seed_range_of_job,
        cell_hashes=cell_hashes_of_block,
        model=model_settings_of_cell,
        train=train_settings_of_task,
    script:
        "../scripts/train.py"


rule all_train:
    input:
        BLOCKS["train"].grid_manifests(),
