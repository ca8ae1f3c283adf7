"""Rule effective_settings: the settings the grid's jobs read, as DVC metrics (dvc exp show)."""

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.settings:effective_settings_job",
    log=snakemake.log[0],
    settings=snakemake.params.settings,
    output=snakemake.output.settings,
    tracking=tracking_settings(snakemake.config),
)
