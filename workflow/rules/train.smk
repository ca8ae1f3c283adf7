rule train:
    input:
        dataset=DATASET,
        init=initial_model_of_cell,
    output:
        trajectory=f"results/train/{CELL}/trajectory.pt",
        model=f"results/train/{CELL}/model.pt",
        history=f"results/train/{CELL}/history.csv",
        summary=f"results/train/{CELL}/train.json",
    log:
        f"logs/train/{CELL}.log",
    wildcard_constraints:
        method=DENSE_METHODS,
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=120,
        gpu=gpus_of_task,
    params:
        model=model_settings_of_cell,
        train=train_settings_of_task,
    script:
        "../scripts/train.py"


rule all_train:
    input:
        trained_models_of_grid(),
