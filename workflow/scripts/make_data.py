"""Rule data: generate or read one task's data set."""

from trainmap.jobs import data_job, logged_to

with logged_to(snakemake.log[0]):
    data_job(snakemake.wildcards.task, snakemake.params.settings, snakemake.output[0],
             snakemake.config)  # fmt: skip
