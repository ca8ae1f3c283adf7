rule evaluate:
    input:
        dataset=dataset_of_task,
        model="results/train/" + CELL_PATTERN + "/model.pt",
        history="results/train/" + CELL_PATTERN + "/history.csv",
        summary="results/train/" + CELL_PATTERN + "/train.json",
    output:
        "results/evaluate/" + CELL_PATTERN + "/evaluation.json",
    params:
        settings=evaluate_settings_of_task,
    log:
        "logs/evaluate/" + CELL_PATTERN + ".log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    script:
        "../scripts/evaluate.py"


rule summary:
    input:
        evaluations=files_of_grid("evaluate", "evaluation.json"),
        histories=files_of_grid("train", "history.csv"),
    output:
        table="results/summary/evaluation.csv",
        metrics="results/summary/metrics.json",
        curves="results/summary/learning_curves.png",
    log:
        "logs/summary.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    script:
        "../scripts/summary.py"
