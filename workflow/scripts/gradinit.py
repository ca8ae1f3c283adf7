"""Rule gradinit: learn per-tensor scales of a block's initial models (GradInit or MetaInit)."""

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.gradinit:gradinit_block_job",
    log=snakemake.log[0],
    block=snakemake.params.block,
    data_path=snakemake.input.dataset,
    model_options=snakemake.params.model,
    settings=snakemake.params.settings,
    options=snakemake.params.options,
    manifest=snakemake.output.manifest,
    block_plot=snakemake.output.plot,
    tracking=tracking_settings(snakemake.config),
    cell_hashes=snakemake.params.cell_hashes,
    threads=snakemake.threads,
)
