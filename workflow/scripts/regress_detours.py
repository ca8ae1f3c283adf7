"""Rule regress_detours: detour states and trajectory dissimilarity of one group."""

from pathlib import Path

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.analysis:regress_detours_job",
    log=snakemake.log[0],
    group=snakemake.params.group,
    cells=snakemake.params.cells,
    evaluation_paths=list(snakemake.params.evaluations),
    out_dir=str(Path(snakemake.output[0]).parent),
    tracking=tracking_settings(snakemake.config),
    cell_hashes=snakemake.params.cell_hashes,
    settings=snakemake.params.settings,
)
