"""Rule gradinit: learn per-tensor scales of the cell's initial model (GradInit or MetaInit)."""

from trainmap.worker import run_job

run_job(
    "trainmap.jobs:gradinit_job",
    log=snakemake.log[0],
    cell=dict(snakemake.wildcards.items()),
    data_path=snakemake.input.dataset,
    model_options=snakemake.params.model,
    settings=snakemake.params.settings,
    options=snakemake.params.options,
    outputs={name: snakemake.output[name] for name in snakemake.output.keys()},
    config=snakemake.config,
    threads=snakemake.threads,
)
