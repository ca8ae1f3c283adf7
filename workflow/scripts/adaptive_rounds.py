"""Rule adaptive_rounds: the trace of an adaptive comparison's rounds (adaptive.json)."""

from trainmap.worker import run_job

run_job(
    "trainmap.jobs.analysis:adaptive_rounds_job",
    log=snakemake.log[0],
    decisions=list(snakemake.input.rounds),
    trace_path=snakemake.output.trace,
)
