"""Rule reparam: fuse a trained RepVGG into plain 3x3 convs and check it on the test set."""

from trainmap.worker import run_job

run_job(
    "trainmap.jobs:reparam_job",
    log=snakemake.log[0],
    cell=dict(snakemake.wildcards.items()),
    model_path=snakemake.input.model,
    data_path=snakemake.input.dataset,
    deploy_path=snakemake.output.deploy,
    check_path=snakemake.output.check,
    config=snakemake.config,
    threads=snakemake.threads,
)
