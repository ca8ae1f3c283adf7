"""Rule collect_metrics: the 14 weight metrics of every checkpoint of a block's runs."""

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.metrics:collect_metrics_block_job",
    log=snakemake.log[0],
    block=snakemake.params.block,
    run_manifest=snakemake.input.run,
    manifest=snakemake.output.manifest,
    tracking=tracking_settings(snakemake.config),
    cell_hashes=snakemake.params.cell_hashes,
    convention=snakemake.params.convention,
    repvgg_weights=snakemake.params.repvgg_weights,
    threads=snakemake.threads,
)
