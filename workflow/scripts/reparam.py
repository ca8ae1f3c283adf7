"""Rule reparam: fuse a block's trained RepVGGs into plain 3x3 convs, checked on the test set."""

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.reparam:reparam_block_job",
    log=snakemake.log[0],
    block=snakemake.params.block,
    train_manifest=snakemake.input.run,
    data_path=snakemake.input.dataset,
    manifest=snakemake.output.manifest,
    tracking=tracking_settings(snakemake.config),
    cell_hashes=snakemake.params.cell_hashes,
    threads=snakemake.threads,
)
