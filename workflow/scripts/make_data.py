"""Rule data: generate or read one task's data set."""

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.data:data_job",
    log=snakemake.log[0],
    task=snakemake.wildcards.task,
    settings=snakemake.params.settings,
    output=snakemake.output[0],
    tracking=tracking_settings(snakemake.config),
)
