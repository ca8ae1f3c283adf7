rule reparam:
    input:
        dataset=DATASET,
        run=run_manifest_of_block,
    output:
        manifest=f"{RESULTS}/reparam/{BLOCK}.json",
    log:
        f"logs/reparam/{BLOCK}.log",
    wildcard_constraints:
        method=DENSE_METHODS,
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        block=seed_range_of_job,
        cell_hashes=cell_hashes_of_block,
    script:
        "../scripts/reparam.py"
