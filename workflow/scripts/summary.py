"""Rule summary: the evaluation table, the compression view, DVC metrics and figures."""

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.evaluate:summary_job",
    log=snakemake.log[0],
    evaluation_paths=list(snakemake.params.evaluations),
    history_paths=list(snakemake.params.histories),
    table_path=snakemake.output.table,
    forms_path=snakemake.output.forms,
    metrics_path=snakemake.output.metrics,
    curves_path=snakemake.output.curves,
    compression_path=snakemake.output.compression,
    tracking=tracking_settings(snakemake.config),
)
