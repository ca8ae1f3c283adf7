"""Rule train: seeded init by the cell's method, training, checkpoint trajectory."""

from pathlib import Path

from trainmap.worker import run_job

run_job(
    "trainmap.jobs:train_job",
    log=snakemake.log[0],
    cell=dict(snakemake.wildcards.items()),
    data_path=snakemake.input.dataset,
    init_path=snakemake.input.get("init") or None,
    model_options=snakemake.params.model,
    train_settings=snakemake.params.train,
    out_dir=str(Path(snakemake.output.model).parent),
    config=snakemake.config,
    threads=snakemake.threads,
)
