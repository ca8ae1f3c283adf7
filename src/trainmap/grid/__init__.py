"""The study's grid: its configuration read strictly (:mod:`.files`) and merged into a study
(:mod:`.study`), validated (:mod:`.validate`: the JSON schema, then what a schema cannot express,
each concern's checks in a ``*_checks`` module of its own) and expanded into cells and seed ranges
(:mod:`.cells`) and into the seed ranges each of the workflow's block rules runs (:mod:`.blocks`);
what the jobs read and the params.yaml edits a DVC run must honour (:mod:`.effective`). Errors:
:class:`ConfigError` (:mod:`trainmap.errors`). ``python -m trainmap.grid FILE`` checks a config file as the
workflow will."""

from __future__ import annotations

from trainmap import exports_on_first_use

# Name -> the module that defines it. Imported on first use (PEP 562), not with the package: a
# command's ``--help`` (``trainmap check``, ``plan``), ``import trainmap.grid.study`` and
# ``from trainmap.grid import results_root`` then cost what that name needs, not the checks
# (torch, by the models they build) and the JSON schema's validator.
_EXPORTS = {
    "ConfigError": "trainmap.errors",
    "did_you_mean": "trainmap.errors",
    "key_path": "trainmap.errors",
    "BLOCK_RULES": "trainmap.grid.blocks",
    "BlockRule": "trainmap.grid.blocks",
    "RuleBlocks": "trainmap.grid.blocks",
    "StudyBlocks": "trainmap.grid.blocks",
    "run_rule_of": "trainmap.grid.blocks",
    "study_blocks": "trainmap.grid.blocks",
    "AdaptiveJoint": "trainmap.grid.cells",
    "Cell": "trainmap.grid.cells",
    "MIN_RUNS_PER_GROUP": "trainmap.grid.cells",
    "SeedRange": "trainmap.grid.cells",
    "adaptive_cells": "trainmap.grid.cells",
    "adaptive_joints": "trainmap.grid.cells",
    "analysis_groups": "trainmap.grid.cells",
    "analysis_settings": "trainmap.grid.cells",
    "canonical": "trainmap.grid.cells",
    "cell_hash": "trainmap.grid.cells",
    "data_settings": "trainmap.grid.cells",
    "dense_cells_of": "trainmap.grid.cells",
    "evaluate_settings": "trainmap.grid.cells",
    "expand_grid": "trainmap.grid.cells",
    "grid_tasks": "trainmap.grid.cells",
    "has_deploy_form": "trainmap.grid.cells",
    "in_joint": "trainmap.grid.cells",
    "is_sparse": "trainmap.grid.cells",
    "joint_comparisons": "trainmap.grid.cells",
    "joint_labels": "trainmap.grid.cells",
    "joint_settings": "trainmap.grid.cells",
    "latency_device": "trainmap.grid.cells",
    "method_of": "trainmap.grid.cells",
    "method_retrains": "trainmap.grid.cells",
    "methods_with_stage": "trainmap.grid.cells",
    "methods_without_stage": "trainmap.grid.cells",
    "model_settings": "trainmap.grid.cells",
    "names_regex": "trainmap.grid.cells",
    "paper_groups": "trainmap.grid.cells",
    "quantized_schemes": "trainmap.grid.cells",
    "retrains": "trainmap.grid.cells",
    "round_ranges": "trainmap.grid.cells",
    "run_checkpoints": "trainmap.grid.cells",
    "seed_block": "trainmap.grid.cells",
    "seed_ranges_of": "trainmap.grid.cells",
    "stage_job_settings": "trainmap.grid.cells",
    "stage_settings": "trainmap.grid.cells",
    "teacher_cell": "trainmap.grid.cells",
    "train_settings": "trainmap.grid.cells",
    "trained_cells": "trainmap.grid.cells",
    "training_device": "trainmap.grid.cells",
    "with_train_defaults": "trainmap.grid.cells",
    "without_off_keys": "trainmap.grid.cells",
    "check_params_edits": "trainmap.grid.effective",
    "effective_settings": "trainmap.grid.effective",
    "params_edits": "trainmap.grid.effective",
    "save_effective_settings": "trainmap.grid.effective",
    "external_arch": "trainmap.grid.external",
    "external_metrics_memory_mb": "trainmap.grid.external",
    "external_runs": "trainmap.grid.external",
    "external_sets": "trainmap.grid.external",
    "joint_external_sets": "trainmap.grid.external",
    "YAML_LOADER": "trainmap.grid.files",
    "check_config_files": "trainmap.grid.files",
    "merge_config": "trainmap.grid.files",
    "read_config_file": "trainmap.grid.files",
    "REPO_ROOT": "trainmap.grid.schema_checks",
    "TASK_SECTIONS": "trainmap.grid.schema_checks",
    "validate_schema": "trainmap.grid.schema_checks",
    "STAGE_VALIDATORS": "trainmap.grid.section_checks",
    "is_own_study": "trainmap.grid.study",
    "merged_config": "trainmap.grid.study",
    "own_study": "trainmap.grid.study",
    "results_root": "trainmap.grid.study",
    "study_files": "trainmap.grid.study",
    "user_layers": "trainmap.grid.study",
    "DATABASE_DRIVERS": "trainmap.grid.tracking_checks",
    "TRACKING_SCHEMES": "trainmap.grid.tracking_checks",
    "tracking_uri_problem": "trainmap.grid.tracking_checks",
    "VERBOSE_ENV": "trainmap.grid.validate",
    "check_config": "trainmap.grid.validate",
    "config_problems_reported": "trainmap.grid.validate",
    "load_config": "trainmap.grid.validate",
    "SCHEMA_PATH": "trainmap.schema",
}
__all__ = sorted(_EXPORTS)


__getattr__ = exports_on_first_use(__name__, _EXPORTS)
