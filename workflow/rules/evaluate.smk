rule evaluate:
    input:
        dataset=dataset_of_task,
        model="results/train/{task}/{arch}/{method}/seed{seed}/model.pt",
        history="results/train/{task}/{arch}/{method}/seed{seed}/history.csv",
        summary="results/train/{task}/{arch}/{method}/seed{seed}/train.json",
    output:
        "results/evaluate/{task}/{arch}/{method}/seed{seed}/evaluation.json",
    log:
        "logs/evaluate/{task}/{arch}/{method}/seed{seed}.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        settings=evaluate_settings_of_task,
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
