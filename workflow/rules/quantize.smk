rule quantize:
    input:
        dataset=DATASET,
        run=run_manifest_of_block,
    output:
        manifest=f"{RESULTS}/quantize/{BLOCK}.json",
    log:
        f"logs/quantize/{BLOCK}.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=minutes_of_block,
    params:
        block=seed_range_of_job,
        cell_hashes=cell_hashes_of_block,
        schemes=QUANT_SCHEMES,
    script:
        "../scripts/quantize.py"
