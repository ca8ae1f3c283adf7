"""Rule quantize: round-to-nearest and AWQ quantisation of a block's final models, packed on disk."""

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.quantize:quantize_block_job",
    log=snakemake.log[0],
    block=snakemake.params.block,
    run_manifest=snakemake.input.run,
    data_path=snakemake.input.dataset,
    schemes=list(snakemake.params.schemes),
    manifest=snakemake.output.manifest,
    tracking=tracking_settings(snakemake.config),
    cell_hashes=snakemake.params.cell_hashes,
    threads=snakemake.threads,
)
