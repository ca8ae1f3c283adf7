# trainmap: seed x architecture x method grids of training runs, their evaluation and training maps.
# This file only wires: configuration, validation, the rule families and the default target.
from snakemake.utils import min_version

from trainmap.grid import (
    check_config,
    check_config_files,
    check_params_edits,
    config_problems_reported,
    own_study,
    read_config_file,
    study_files,
    user_layers,
    validate_schema,
)
from trainmap.plugins import load_plugins

min_version("9.20")

# A configuration problem prints its message only, first line leading with the key, and stops
# before any job (TRAINMAP_VERBOSE=1 or --verbose adds the traceback).
VERBOSE = workflow.output_settings.verbose

# YAML syntax errors (file and line) and repeated keys, before Snakemake merges the files.
with config_problems_reported(VERBOSE):
    check_config_files(
        ["params.yaml", "config/config.yaml", *workflow.overwrite_configfiles]
    )


configfile: "params.yaml"
configfile: "config/config.yaml"


# Plugins (config key plugins, installed trainmap.plugins entry points) register their
# architectures, data kinds and methods first; then workflow/schemas/config.schema.yaml and what a
# schema cannot express (trainmap.grid). An error's first line reads `config key <path>: ...`.
# Under DVC, a params.yaml key `dvc exp run -S` set must be the value the jobs read.
# Your config file is your study: --configfile files that bring their own grid (or only external
# run sets) start from params.yaml, not from the default study (trainmap.grid.own_study).
with config_problems_reported(VERBOSE):
    USER_LAYERS = user_layers(workflow.overwrite_configfiles)
    own_study(
        config,
        USER_LAYERS,
        base=read_config_file("params.yaml"),
        overrides=workflow.config_settings.overwrite_config,
    )
    load_plugins(config.get("plugins"), workflow.basedir)
    validate_schema(config)
    # The main process reads every external run's checkpoint headers; a cluster job's parse
    # of this file does not read them again.
    check_config(
        config, base_dir=Path(workflow.basedir), read_runs=workflow.is_main_process
    )
    check_params_edits(config, study_files(USER_LAYERS))


report: "workflow/report/workflow.rst"


# Each rule family's rules, after its input functions (<family>_inputs.smk) where it has any.
include: "workflow/rules/common.smk"
include: "workflow/rules/data_inputs.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/gradinit_inputs.smk"
include: "workflow/rules/gradinit.smk"
include: "workflow/rules/train_inputs.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/reparam.smk"
include: "workflow/rules/sparse_inputs.smk"
include: "workflow/rules/sparse.smk"
include: "workflow/rules/quantize.smk"
include: "workflow/rules/evaluate_inputs.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/external_inputs.smk"
include: "workflow/rules/external.smk"
include: "workflow/rules/analysis_inputs.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/paper_inputs.smk"
include: "workflow/rules/paper.smk"
include: "workflow/rules/settings.smk"


rule all:
    input:
        grid_summary(),
        analysis_outputs(),
        unfinished_manifests(),
        # Every dataset is a target too: a killed (forced) data job's missing file is remade by
        # the next plain run, and what depends on it reruns.
        datasets_of_grid(),
        # What the jobs read, as DVC metrics (dvc exp show; stage settings in dvc.yaml).
        f"{RESULTS}/summary/settings.json",
