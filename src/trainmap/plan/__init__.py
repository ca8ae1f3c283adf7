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
request), :mod:`.report` (the plan against a node: totals, limits, the text) and :mod:`.cli` (the
command). This package re-exports their public names: ``from trainmap.plan import X`` and
``plan.X`` read the same objects.
"""

from trainmap.plan.assumptions import (
    ANALYSIS_S_PER_OBSERVATION,
    ANALYSIS_SOURCE,
    BASE_RAM,
    COLLECT_ROW_S,
    COLLECT_S,
    CPU,
    DATA_S,
    DISK_BYTES_PER_S,
    EVAL_BATCH,
    EVALUATE_S,
    GB,
    GPU,
    GRADINIT_SEED_ITERATION_S,
    OPTIMIZER_COPIES,
    QUANTIZE_S,
    QUANTIZE_SCHEME_SEED_S,
    REPARAM_S,
    REPARAM_SEED_S,
    SMALL_RULES_SOURCE,
    STARTUP_S,
    Device,
)
from trainmap.plan.cli import load_plan_config, main
from trainmap.plan.estimates import (
    MIN_MEMORY_MB,
    MIN_MINUTES,
    SAFETY_FACTOR,
    JobPlan,
    PlanError,
    analysis_job,
    analysis_jobs,
    archive_bytes,
    archive_policy,
    block_job,
    block_jobs,
    device_of,
    gradinit_job,
    job_resources,
    kept_checkpoints,
    plan_jobs,
    small_job,
    training_job,
)
from trainmap.plan.profile import ModelProfile, dataset_bytes, dataset_examples, model_profile
from trainmap.plan.report import (
    NodeLimits,
    check_limits,
    disk_bytes,
    format_plan,
    machine_problem,
    rule_totals,
)

__all__ = [
    "ANALYSIS_SOURCE",
    "ANALYSIS_S_PER_OBSERVATION",
    "BASE_RAM",
    "COLLECT_ROW_S",
    "COLLECT_S",
    "CPU",
    "DATA_S",
    "DISK_BYTES_PER_S",
    "EVALUATE_S",
    "EVAL_BATCH",
    "GB",
    "GPU",
    "GRADINIT_SEED_ITERATION_S",
    "MIN_MEMORY_MB",
    "MIN_MINUTES",
    "OPTIMIZER_COPIES",
    "QUANTIZE_S",
    "QUANTIZE_SCHEME_SEED_S",
    "REPARAM_S",
    "REPARAM_SEED_S",
    "SAFETY_FACTOR",
    "SMALL_RULES_SOURCE",
    "STARTUP_S",
    "Device",
    "JobPlan",
    "ModelProfile",
    "NodeLimits",
    "PlanError",
    "analysis_job",
    "analysis_jobs",
    "archive_bytes",
    "archive_policy",
    "block_job",
    "block_jobs",
    "check_limits",
    "dataset_bytes",
    "dataset_examples",
    "device_of",
    "disk_bytes",
    "format_plan",
    "gradinit_job",
    "job_resources",
    "kept_checkpoints",
    "load_plan_config",
    "machine_problem",
    "main",
    "model_profile",
    "plan_jobs",
    "rule_totals",
    "small_job",
    "training_job",
]
