QUANT_SCHEMES = list(config.get("quantize", {}).get("schemes", []))


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
        mem_mb=planned("quantize", "mem_mb"),
        runtime=planned("quantize", "runtime"),
    params:
        block=seed_range_of_job,
        cell_hashes=cell_hashes_of_block,
        schemes=QUANT_SCHEMES,
    script:
        "../scripts/quantize.py"
