"""Rule summary: the evaluation table across the grid, DVC metrics and learning curves."""

from trainmap.jobs import logged_to, summary_job

with logged_to(snakemake.log[0]):
    summary_job(
        evaluation_paths=snakemake.input.evaluations,
        history_paths=snakemake.input.histories,
        table_path=snakemake.output.table,
        metrics_path=snakemake.output.metrics,
        curves_path=snakemake.output.curves,
        config=snakemake.config,
    )
