"""Rule train: a block of seeds, each seeded by its method, trained as one vectorised model."""

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.train:train_block_job",
    log=snakemake.log[0],
    block=snakemake.params.block,
    data_path=snakemake.input.dataset,
    init_manifest=snakemake.input.get("init") or None,
    model_options=snakemake.params.model,
    train_settings=snakemake.params.train,
    manifest=snakemake.output.manifest,
    tracking=tracking_settings(snakemake.config),
    cell_hashes=snakemake.params.cell_hashes,
    threads=snakemake.threads,
    gpu_mem_mb=snakemake.resources.get("gpu_mem_mb", 0),
)
