"""Rules joint_comparison and joint_round: one shared training map for several methods or
architectures (a round of an adaptive comparison: the map of that round's seeds and whether to go
on; an adaptive comparison's final rule: its last round's files with the trace of its rounds)."""

from pathlib import Path

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

params = dict(snakemake.params.items())
out_dir = str(Path(snakemake.output[0]).parent)
if params.get("adaptive"):
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
        cells=params["cells"],
        labels=params["groups"],
        metrics_paths=list(params["metrics"]),
        evaluation_paths=list(params["evaluations"]),
        settings=params["settings"],
        out_dir=out_dir,
        tracking=tracking_settings(snakemake.config),
        cell_hashes=params["cell_hashes"],
        threads=snakemake.threads,
        external=list(params["external"]),
        adaptive_round=params.get("adaptive_round"),
    )
