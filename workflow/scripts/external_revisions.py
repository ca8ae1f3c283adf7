"""Rule external_revisions: one block of one run's revisions of a suite fetched from the Hub."""

from trainmap.grid.external_hub import fetch_setting
from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

spec = snakemake.params.spec
run_job(
    "trainmap.jobs.external:external_revisions_job",
    log=snakemake.log[0],
    name=snakemake.wildcards.external,
    run=snakemake.wildcards.suite_run,
    block=snakemake.wildcards.revisions,
    steps=list(snakemake.params.steps),
    hub=snakemake.input.hub,
    rows=snakemake.params.rows,
    output=snakemake.output[0],
    tracking=tracking_settings(snakemake.config),
    heads=spec.get("heads"),
    convention=snakemake.params.convention,
    arch=snakemake.params.arch,
    keep_weights=bool(fetch_setting(spec, "keep_weights")),
    fetch_jobs=int(fetch_setting(spec, "fetch_jobs")),
    eval_tokens=snakemake.input.get("tokens"),
    # the job's defaults are the schema's: passed only where the set gives them
    **{key: spec[key] for key in ("eval_token_budget", "eval_context") if key in spec},
)
