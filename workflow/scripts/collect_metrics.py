"""Rule collect_metrics: the 14 weight metrics of every checkpoint of one run."""

from trainmap.worker import run_job

run_job(
    "trainmap.jobs:collect_metrics_job",
    log=snakemake.log[0],
    cell=dict(snakemake.wildcards.items()),
    trajectory_path=snakemake.input.trajectory,
    model_path=snakemake.input.model,
    history_path=snakemake.input.history,
    output=snakemake.output[0],
    config=snakemake.config,
    convention=snakemake.params.convention,
    threads=snakemake.threads,
)
