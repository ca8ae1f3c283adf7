"""Rule evaluate: accuracy, convergence, size and latency of a block's models, in every form."""

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.evaluate:evaluate_block_job",
    log=snakemake.log[0],
    block=snakemake.params.block,
    run_manifest=snakemake.input.run,
    data_path=snakemake.input.dataset,
    deploy_manifest=snakemake.input.get("deploy"),
    quantize_manifest=snakemake.input.get("quantized"),
    settings=snakemake.params.settings,
    manifest=snakemake.output.manifest,
    tracking=tracking_settings(snakemake.config),
    cell_hashes=snakemake.params.cell_hashes,
    threads=snakemake.threads,
    device=snakemake.params.device,
    gpu_mem_mb=snakemake.resources.get("gpu_mem_mb", 0),
)
