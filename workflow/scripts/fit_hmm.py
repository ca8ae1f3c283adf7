"""Rule fit_hmm: the training-map HMM of one group of runs (selection, states, baselines)."""

from pathlib import Path

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.analysis:fit_hmm_job",
    log=snakemake.log[0],
    group=snakemake.params.group,
    cells=snakemake.params.cells,
    metrics_paths=list(snakemake.params.metrics),
    evaluation_paths=list(snakemake.params.evaluations),
    settings=snakemake.params.settings,
    out_dir=str(Path(snakemake.output[0]).parent),
    tracking=tracking_settings(snakemake.config),
    threads=snakemake.threads,
)
