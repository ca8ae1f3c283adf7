"""Rule sparse_retrain: N:M sparsity for a block of seeds from their dense teachers (AST, its
ablations, the baselines), retrained as one vectorised model."""

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.sparse:sparse_block_job",
    log=snakemake.log[0],
    block=snakemake.params.block,
    teacher_manifest=snakemake.input.teacher,
    data_path=snakemake.input.dataset,
    settings=snakemake.params.settings,
    options=snakemake.params.options,
    manifest=snakemake.output.manifest,
    block_plot=snakemake.output.plot,
    tracking=tracking_settings(snakemake.config),
    cell_hashes=snakemake.params.cell_hashes,
    threads=snakemake.threads,
    gpu_mem_mb=snakemake.resources.get("gpu_mem_mb", 0),
)
