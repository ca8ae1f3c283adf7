"""Rule flip_rates: the mask flip rates of every sparse retraining, compared across methods."""

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

run_job(
    "trainmap.jobs.sparse:flip_rates_job",
    log=snakemake.log[0],
    cells=snakemake.params.cells,
    flips_paths=list(snakemake.params.flips),
    table_path=snakemake.output.table,
    plot_path=snakemake.output.plot,
    tracking=tracking_settings(snakemake.config),
)
