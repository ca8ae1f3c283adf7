"""Rule quantize: round-to-nearest and AWQ quantisation of a cell's final model, packed on disk."""

from trainmap.worker import run_job

run_job(
    "trainmap.jobs:quantize_job",
    log=snakemake.log[0],
    cell=dict(snakemake.wildcards.items()),
    model_path=snakemake.input.model,
    data_path=snakemake.input.dataset,
    schemes=list(snakemake.params.schemes),
    manifest_path=snakemake.output.manifest,
    config=snakemake.config,
    threads=snakemake.threads,
)
