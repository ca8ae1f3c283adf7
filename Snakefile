# trainmap: seed x architecture x method grids of training runs, their evaluation and training maps.
# This file only wires: configuration, validation, the rule families and the default target.
from snakemake.utils import min_version

from trainmap.config import check_config_files, validate_schema

min_version("9.20")

# YAML syntax errors (file and line) and repeated keys, before Snakemake merges the files.
check_config_files(
    ["params.yaml", "config/config.yaml", *workflow.overwrite_configfiles]
)


configfile: "params.yaml"
configfile: "config/config.yaml"


# workflow/schemas/config.schema.yaml; an error's first line reads `config key <path>: ...`.
validate_schema(config)


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/gradinit.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/reparam.smk"
include: "workflow/rules/sparse.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/analysis.smk"


rule all:
    input:
        "results/summary/evaluation.csv",
        "results/summary/metrics.json",
        "results/summary/learning_curves.png",
        summary_figures(),
        analysis_outputs(),
