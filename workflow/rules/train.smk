rule train:
    input:
        dataset=dataset_of_task,
    output:
        trajectory="results/train/{task}/{arch}/{method}/seed{seed}/trajectory.pt",
        model="results/train/{task}/{arch}/{method}/seed{seed}/model.pt",
        history="results/train/{task}/{arch}/{method}/seed{seed}/history.csv",
        summary="results/train/{task}/{arch}/{method}/seed{seed}/train.json",
    log:
        "logs/train/{task}/{arch}/{method}/seed{seed}.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=120,
    params:
        model=model_settings_of_cell,
        train=train_settings_of_task,
    script:
        "../scripts/train.py"


rule all_train:
    input:
        files_of_grid("train", "model.pt"),
