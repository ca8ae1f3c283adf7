rule reparam:
    input:
        dataset=DATASET,
        model=f"results/train/{CELL}/model.pt",
    output:
        deploy=f"results/reparam/{CELL}/deploy.pt",
        check=f"results/reparam/{CELL}/equivalence.json",
    log:
        f"logs/reparam/{CELL}.log",
    wildcard_constraints:
        method=DENSE_METHODS,
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    script:
        "../scripts/reparam.py"
