"""Rule quantize: round-to-nearest and AWQ quantisation of a block's final models, packed on disk."""

from trainmap.worker import run_job

run_job(
    "trainmap.jobs.quantize:quantize_block_job",
    log=snakemake.log[0],
    block=snakemake.params.block,
    run_manifest=snakemake.input.run,
    data_path=snakemake.input.dataset,
    schemes=list(snakemake.params.schemes),
    manifest=snakemake.output.manifest,
    config=snakemake.config,
    threads=snakemake.threads,
)
