"""Rule external_map: the training map of one external run set."""

from pathlib import Path

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.external:external_map_job",
    log=snakemake.log[0],
    name=snakemake.wildcards.external,
    run_ids=list(snakemake.params.run_ids),
    metrics_paths=list(snakemake.params.metrics),
    evaluation_paths=list(snakemake.params.evaluations),
    settings=snakemake.params.settings,
    out_dir=str(Path(snakemake.output.model).parent),
    tracking=tracking_settings(snakemake.config),
    threads=snakemake.threads,
    outlier_share=snakemake.params.outlier_share,
)
