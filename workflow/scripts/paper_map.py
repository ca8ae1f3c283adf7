"""Rule paper_map: one paper setting's map under one analysis pass (authors' or trainmap's)."""

from pathlib import Path

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.paper:paper_map_job",
    log=snakemake.log[0],
    setting=snakemake.wildcards.setting,
    analysis=snakemake.wildcards.analysis,
    cells=snakemake.params.cells,
    metrics_paths=list(snakemake.params.metrics),
    evaluation_paths=list(snakemake.params.evaluations),
    settings=snakemake.params.settings,
    out_dir=str(Path(snakemake.output.detours).parent),
    tracking=tracking_settings(snakemake.config),
    threads=snakemake.threads,
)
