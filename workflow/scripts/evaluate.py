"""Rule evaluate: accuracy, convergence step, size and latency of one trained run."""

from trainmap.config import Cell
from trainmap.jobs import evaluate_job, logged_to

with logged_to(snakemake.log[0]):
    evaluate_job(
        Cell.from_wildcards(snakemake.wildcards),
        model_path=snakemake.input.model,
        history_path=snakemake.input.history,
        train_summary_path=snakemake.input.summary,
        data_path=snakemake.input.dataset,
        settings=snakemake.params.settings,
        output=snakemake.output[0],
        config=snakemake.config,
        threads=snakemake.threads,
    )
