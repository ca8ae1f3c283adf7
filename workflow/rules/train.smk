rule train:
    input:
        dataset=dataset_of_task,
    output:
        trajectory="results/train/" + CELL_PATTERN + "/trajectory.pt",
        model="results/train/" + CELL_PATTERN + "/model.pt",
        history="results/train/" + CELL_PATTERN + "/history.csv",
        summary="results/train/" + CELL_PATTERN + "/train.json",
    params:
        model=model_settings_of_cell,
        train=train_settings_of_task,
    log:
        "logs/train/" + CELL_PATTERN + ".log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=120,
    script:
        "../scripts/train.py"


rule all_train:
    input:
        files_of_grid("train", "model.pt"),
