"""Rule external_metrics: metric tables and evaluation records of one external run set."""

from pathlib import Path

from trainmap.tracking import tracking_settings
from trainmap.worker import run_job

spec = snakemake.params.spec
run_job(
    "trainmap.jobs.external:external_metrics_job",
    log=snakemake.log[0],
    name=snakemake.wildcards.external,
    runs=dict(snakemake.params.runs),
    out_dir=str(Path(snakemake.output.manifest).parent),
    manifest=snakemake.output.manifest,
    tracking=tracking_settings(snakemake.config),
    threshold=spec.get("threshold"),
    heads=spec.get("heads"),
    evaluation=spec.get("evaluation", "evaluation.csv"),
    accuracy_key=spec.get("accuracy_key"),
    convention=snakemake.params.convention,
    arch=snakemake.params.arch,
    hub=snakemake.input.get("hub"),
    curves=snakemake.input.get("curves"),
    blocks=snakemake.input.get("blocks"),
    eval_tokens=snakemake.input.get("tokens"),
    # the job's defaults are the schema's: passed only where the set gives them
    **{
        key: spec[key]
        for key in ("curve", "direction", "eval_token_budget", "eval_context")
        if key in spec
    },
)
