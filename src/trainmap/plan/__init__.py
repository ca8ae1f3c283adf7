"""A plan before the work: for every job of a config's grid, the bytes it writes, its peak memory
(host RAM, and GPU memory where its task trains on cuda) and its time, before anything runs.

``python -m trainmap.plan [--configfile CONFIG ...]`` prints the plan per rule and in total and
checks it against one node (default: 1 GPU of 80 GB, 128 GB RAM, 1 TB disk, 24 hours a job); a job
or a grid past a limit is a :class:`PlanError` naming the rule, the job, the resource, the estimate
and the config key to change, and the command exits with status 1. The workflow's SLURM resources
(``mem_mb``, ``runtime``, ``gpu``) come from the same estimates (:func:`job_resources`), times
:data:`SAFETY_FACTOR`.

Every estimate says where it comes from: ``measured: <what>`` (a finished run's timing sidecar, or
a number measured on this project's 2-core machines), ``FLOP-based: <assumption>`` (forward
FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` on a tiny batch, x3 for a training
step, at a stated device throughput) or ``size-based: <what>`` (bytes counted from the model's
state dict, the autograd-saved tensors of a tiny batch, the config's checkpoint counts). Models are
built once per (task, arch, options) on the CPU (:func:`model_profile`, cached): a dry run of the
workflow pays that once per architecture, never per job.

The modules, each one concern: :mod:`.assumptions` (what the plan assumes of a device and of a
job's fixed costs, with their sources), :mod:`.profile` (a model's and a data set's sizes and
FLOPs), :mod:`.estimates` (one job's bytes, memory and time; the grid's jobs; a job's scheduler
request), :mod:`.limits` (one node's limits), :mod:`.report` (the plan against a node: totals,
limits, the text) and :mod:`.cli` (the command). This package re-exports their public names, each
imported on first use: ``from trainmap.plan import X`` and ``plan.X`` read the same objects.
"""

from __future__ import annotations

from trainmap import exports_on_first_use

# Name -> the module that defines it, imported on first use (PEP 562), not with the package:
# ``python -m trainmap.plan --help`` then imports neither the estimates (torch) nor pandas.
_EXPORTS = {
    "ANALYSIS_SOURCE": "trainmap.plan.assumptions",
    "ANALYSIS_S_PER_OBSERVATION": "trainmap.plan.assumptions",
    "BASE_RAM": "trainmap.plan.assumptions",
    "COLLECT_ROW_S": "trainmap.plan.assumptions",
    "COLLECT_S": "trainmap.plan.assumptions",
    "CPU": "trainmap.plan.assumptions",
    "DATA_S": "trainmap.plan.assumptions",
    "DISK_BYTES_PER_S": "trainmap.plan.assumptions",
    "Device": "trainmap.plan.assumptions",
    "EVALUATE_S": "trainmap.plan.assumptions",
    "EVAL_BATCH": "trainmap.plan.assumptions",
    "GB": "trainmap.plan.assumptions",
    "GPU": "trainmap.plan.assumptions",
    "GRADINIT_SEED_ITERATION_S": "trainmap.plan.assumptions",
    "OPTIMIZER_COPIES": "trainmap.plan.assumptions",
    "QUANTIZE_S": "trainmap.plan.assumptions",
    "QUANTIZE_SCHEME_SEED_S": "trainmap.plan.assumptions",
    "REPARAM_S": "trainmap.plan.assumptions",
    "REPARAM_SEED_S": "trainmap.plan.assumptions",
    "SMALL_RULES_SOURCE": "trainmap.plan.assumptions",
    "STARTUP_S": "trainmap.plan.assumptions",
    "load_plan_config": "trainmap.plan.cli",
    "main": "trainmap.plan.cli",
    "JobPlan": "trainmap.plan.jobplan",
    "MIN_MEMORY_MB": "trainmap.plan.jobplan",
    "MIN_MINUTES": "trainmap.plan.jobplan",
    "PlanError": "trainmap.plan.jobplan",
    "SAFETY_FACTOR": "trainmap.plan.jobplan",
    "analysis_job": "trainmap.plan.estimates",
    "analysis_jobs": "trainmap.plan.estimates",
    "archive_bytes": "trainmap.plan.estimates",
    "archive_policy": "trainmap.plan.estimates",
    "block_job": "trainmap.plan.estimates",
    "block_jobs": "trainmap.plan.estimates",
    "device_of": "trainmap.plan.estimates",
    "gradinit_job": "trainmap.plan.estimates",
    "job_resources": "trainmap.plan.estimates",
    "kept_checkpoints": "trainmap.plan.estimates",
    "plan_jobs": "trainmap.plan.estimates",
    "small_job": "trainmap.plan.jobplan",
    "map_job": "trainmap.plan.jobplan",
    "training_job": "trainmap.plan.estimates",
    "NodeLimits": "trainmap.plan.limits",
    "ModelProfile": "trainmap.plan.profile",
    "dataset_bytes": "trainmap.plan.profile",
    "dataset_examples": "trainmap.plan.profile",
    "model_profile": "trainmap.plan.profile",
    "set_profile_directory": "trainmap.plan.profile",
    "check_limits": "trainmap.plan.report",
    "disk_bytes": "trainmap.plan.report",
    "format_plan": "trainmap.plan.report",
    "machine_problem": "trainmap.plan.report",
    "rule_totals": "trainmap.plan.report",
}
__all__ = sorted(_EXPORTS)


__getattr__ = exports_on_first_use(__name__, _EXPORTS)
