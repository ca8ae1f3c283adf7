# trainmap: seed x architecture x method grids of training runs, their evaluation and training maps.
# This file only wires: configuration, validation, the rule families and the default target.
from snakemake.utils import min_version, validate

min_version("9.20")


configfile: "params.yaml"
configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


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
