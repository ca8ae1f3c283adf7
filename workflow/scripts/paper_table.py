"""Rule paper_table: the training-maps paper's tables beside trainmap's maps of the same settings."""

from pathlib import Path

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.paper:paper_table_job",
    log=snakemake.log[0],
    settings_run=list(snakemake.params.settings),
    analyses=list(snakemake.params.analyses),
    map_dirs=[str(Path(path).parent) for path in snakemake.input.detours],
    confidence=snakemake.params.confidence,
    table_md=snakemake.output.table,
    table_csv=snakemake.output.csv,
    claims_csv=snakemake.output.claims,
    figure=snakemake.output.figure,
    tracking=tracking_settings(snakemake.config),
)
