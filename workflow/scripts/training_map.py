"""Rule training_map: the map of one fitted group, drawn with its detour states."""

from pathlib import Path

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.analysis:training_map_job",
    log=snakemake.log[0],
    group=snakemake.params.group,
    cells=snakemake.params.cells,
    metrics_paths=list(snakemake.params.metrics),
    evaluation_paths=list(snakemake.params.evaluations),
    out_dir=str(Path(snakemake.output[0]).parent),
    tracking=tracking_settings(snakemake.config),
)
