"""Rule train: seeded init by the cell's method, training, checkpoint trajectory."""

from pathlib import Path

from trainmap.config import Cell
from trainmap.jobs import logged_to, train_job

with logged_to(snakemake.log[0]):
    train_job(
        Cell.from_wildcards(snakemake.wildcards),
        data_path=snakemake.input.dataset,
        model_options=snakemake.params.model,
        train_settings=snakemake.params.train,
        out_dir=Path(snakemake.output.model).parent,
        config=snakemake.config,
        threads=snakemake.threads,
    )
