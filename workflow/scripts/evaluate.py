"""Rule evaluate: accuracy, convergence, size and latency of a run's model, in every form."""

from trainmap.worker import run_job

run_job(
    "trainmap.jobs:evaluate_job",
    log=snakemake.log[0],
    cell=dict(snakemake.wildcards.items()),
    model_path=snakemake.input.model,
    history_path=snakemake.input.history,
    train_summary_path=snakemake.input.summary,
    data_path=snakemake.input.dataset,
    deploy_path=snakemake.input.get("deploy"),
    quantized_manifest=snakemake.input.get("quantized"),
    settings=snakemake.params.settings,
    output=snakemake.output[0],
    config=snakemake.config,
    threads=snakemake.threads,
)
