"""Rule sparse_retrain: N:M sparsity from the dense teacher (AST, its ablations, the baselines)."""

from pathlib import Path

from trainmap.worker import run_job

run_job(
    "trainmap.jobs:sparse_job",
    log=snakemake.log[0],
    cell=dict(snakemake.wildcards.items()),
    teacher_path=snakemake.input.teacher,
    data_path=snakemake.input.dataset,
    settings=snakemake.params.settings,
    options=snakemake.params.options,
    out_dir=str(Path(snakemake.output.model).parent),
    config=snakemake.config,
    threads=snakemake.threads,
)
