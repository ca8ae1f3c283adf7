"""Checkpoint joint_round: one round of an adaptive joint comparison, and whether it stops."""

from pathlib import Path

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.analysis:joint_comparison_job",
    log=snakemake.log[0],
    name=snakemake.wildcards.name,
    cells=snakemake.params.cells,
    labels=snakemake.params.groups,
    metrics_paths=list(snakemake.params.metrics),
    evaluation_paths=list(snakemake.params.evaluations),
    settings=snakemake.params.settings,
    out_dir=str(Path(snakemake.output.summary).parent),
    tracking=tracking_settings(snakemake.config),
    cell_hashes=snakemake.params.cell_hashes,
    threads=snakemake.threads,
    external=list(snakemake.params.external),
    adaptive_round=snakemake.params.adaptive,
)
