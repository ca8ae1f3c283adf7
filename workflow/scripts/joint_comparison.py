"""Rule joint_comparison: one shared training map for several methods or architectures (an
adaptive comparison's: its last round's, with the trace of its rounds)."""

from pathlib import Path

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

out_dir = str(Path(snakemake.output[0]).parent)
if snakemake.params.adaptive:
    run_job(
        "trainmap.jobs.analysis:adaptive_joint_job",
        log=snakemake.log[0],
        name=snakemake.wildcards.name,
        trace_path=snakemake.input.adaptive[0],
        out_dir=out_dir,
        tracking=tracking_settings(snakemake.config),
    )
else:
    run_job(
        "trainmap.jobs.analysis:joint_comparison_job",
        log=snakemake.log[0],
        name=snakemake.wildcards.name,
        cells=snakemake.params.cells,
        labels=snakemake.params.groups,
        metrics_paths=list(snakemake.params.metrics),
        evaluation_paths=list(snakemake.params.evaluations),
        settings=snakemake.params.settings,
        out_dir=out_dir,
        tracking=tracking_settings(snakemake.config),
        cell_hashes=snakemake.params.cell_hashes,
        threads=snakemake.threads,
        external=list(snakemake.params.external),
    )
