"""One job's estimate: the bytes it leaves on disk, its peak host RAM and GPU memory and its time,
each with its source (:class:`JobPlan`), for every job of a config's grid (:func:`plan_jobs`),
and a job's scheduler request from it (:func:`job_resources`).

What a training block (``S`` seeds of one task, arch and method, ``train.<task>.seed_block``)
costs, per the training loop's contract:

* bytes: per seed, the kept checkpoints (``train.<task>.archive``: ``{schedule: all | none |
  "every N" | "log K", dtype: float32 | bfloat16 | float16}``, :func:`kept_checkpoints`) x the
  state dict's numel x the dtype's bytes, plus ``model.pt`` (the final fp32 state), ``history.csv``
  and ``checkpoint_metrics.csv`` (one row per checkpoint) and ``train.json``; the resume file (the
  block's state, optimizer state: SGD momentum 1x, Adam/AdamW 2x the parameters) exists while the
  job runs and counts towards the disk's peak;
* device memory: weights, gradients and optimizer state of S models, the buffers, S x batch x the
  autograd-saved bytes per example, the data set (the loop keeps it on the device), and at a
  checkpoint the larger of the test-set evaluation (``EVAL_BATCH`` examples x S through the widest
  layer) and the float64 metric transient (~3 x S x n_params x 8 bytes);
* time: steps x (per-step overhead + 3 x forward FLOPs x batch x S / throughput) + per checkpoint
  the test evaluation, the streamed metrics of every convention (float64 singular values of every
  counted matrix) and the archive writes, + the job's start-up. The per-step overhead is per
  parameter tensor (each adds forward, backward, clipping and optimizer ops: small nets are
  overhead-bound) and per tensor and seed; conv nets run at a lower throughput than matmuls.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pandas as pd

from trainmap import grid
from trainmap.evaluation import latency_probe
from trainmap.grid import Cell, SeedRange
from trainmap.plan.assumptions import (
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
from trainmap.plan.jobplan import (
    MIN_MEMORY_MB,
    MIN_MINUTES,
    SAFETY_FACTOR,
    JobPlan,
    PlanError,
    map_job,
    small_job,
)
from trainmap.plan.profile import ModelProfile, dataset_bytes, dataset_examples, model_profile
from trainmap.schema import section_defaults
from trainmap.training.archive import ArchivePolicy, checkpoint_steps, kept_indices
from trainmap.training.config import TRAIN_DEFAULTS

# --- checkpoints and the archive ------------------------------------------------------------------


def kept_checkpoints(steps: list[int], schedule: str) -> list[int]:
    """The checkpoint ``steps`` an archive ``schedule`` writes to disk: the training loop's own
    rule (:meth:`trainmap.training.archive.ArchivePolicy.kept_steps`)."""
    return ArchivePolicy.from_value({"schedule": schedule}).kept_steps(list(steps))


def archive_policy(settings: Mapping[str, Any], key: str) -> ArchivePolicy:
    """The archive policy of train-style ``settings`` found at config ``key`` (omitted: all,
    float32); a bad value is a :class:`PlanError` naming ``<key>.archive``."""
    try:
        return ArchivePolicy.from_value(settings.get("archive"))
    except ValueError as error:
        raise PlanError(str(error).replace("train.<task>", key)) from None


def archive_bytes(profile: ModelProfile, n_checkpoints: int, policy: ArchivePolicy) -> int:
    """Bytes of one run's archive: kept checkpoints x (floating-point state entries x the dtype's
    bytes + integer buffers as they are); safetensors headers (a few kB a file) left out."""
    kept = len(kept_indices(n_checkpoints, policy.schedule))
    return policy.bytes_per_run(n_checkpoints, profile.n_state) + kept * profile.int_state_bytes


# --- one job's estimate ---------------------------------------------------------------------------


def device_of(settings: Mapping[str, Any]) -> Device:
    """Where train-style ``settings`` train (``device``; omitted: the schema's default)."""
    return GPU if str(settings.get("device", TRAIN_DEFAULTS["device"])).startswith("cuda") else CPU


#: Host bytes of one history row the training loop keeps per seed and checkpoint: a dict of six
#: numbers, 420 bytes by ``sys.getsizeof`` of the dict and its values, plus the list's pointer
#: and the allocator's rounding.
HISTORY_ROW_BYTES = 500


def training_job(
    config: Mapping[str, Any],
    rule: str,
    block: SeedRange,
    settings: Mapping[str, Any],
    key: str,
    flop_factor: float = 1.0,
    results: str | None = None,
) -> JobPlan:
    """The plan of a training block job (rules train, sparse_retrain): see the module docstring.
    ``settings``: the train-style mapping at config ``key``; ``flop_factor``: extra forward work
    per step (a distillation teacher: 4/3)."""
    settings = grid.with_train_defaults(settings)
    profile = model_profile(config, block.task, block.arch)
    device = device_of(settings)
    seeds = len(block.seeds)
    steps = checkpoint_steps(int(settings["steps"]), int(settings["checkpoint_every"]))
    policy = archive_policy(settings, key)
    kept = policy.kept_steps(steps)
    archive = archive_bytes(profile, len(steps), policy)
    per_seed = archive + profile.state_bytes + len(steps) * (120 + 3 * 16 * 20) + 2000
    optimizer = OPTIMIZER_COPIES.get(str(settings["optimizer"]), 2)
    state = seeds * (profile.state_bytes + 4 * profile.n_params * optimizer)
    data_bytes, n_test = dataset_bytes(config, block.task, profile)
    batch = int(settings["batch_size"])
    weights = seeds * (profile.state_bytes + 4 * profile.n_params * (1 + optimizer))
    activations = seeds * batch * profile.saved_bytes * flop_factor
    evaluation = 3 * seeds * min(n_test, EVAL_BATCH) * profile.widest_bytes
    metrics = 3 * seeds * profile.n_params * 8
    # on an accelerator, the copy of the training state an interval with a divergence runs again
    # from (model and optimiser state, kept on the device from one check to the next)
    kept_copy = state if device is GPU else 0
    on_device = (
        weights
        + kept_copy
        + data_bytes
        + max(activations, evaluation, metrics)
        + device.context_bytes
    )
    # each seed's history rows stay in memory (one a checkpoint); metric rows go to disk as they come
    histories = seeds * len(steps) * HISTORY_ROW_BYTES
    host = BASE_RAM + 2 * data_bytes + state + seeds * profile.state_bytes + histories
    step_flops = 3 * profile.forward_flops * batch * seeds * flop_factor
    throughput = device.flops_per_s(profile)
    step_s = device.step_seconds(profile, seeds) + step_flops / throughput
    checkpoint_s = profile.forward_flops * n_test * seeds / throughput + device.metrics_seconds(
        profile, seeds
    )
    seconds = STARTUP_S + steps[-1] * step_s + len(steps) * checkpoint_s
    seconds += device.archive_seconds(seeds * len(kept), seeds * archive)
    seconds += seeds * profile.state_bytes / DISK_BYTES_PER_S
    time_from = (
        f"{device.source}; {3 * profile.forward_flops * flop_factor / 1e6:.3g} MFLOP/example/step "
        f"(3 x FlopCounterMode forward), {profile.n_tensors} parameter tensors"
    )
    measured = _measured_wall_time(results, rule, block)
    if measured is not None:
        seconds, time_from = measured
    memory_from = (
        f"size-based: {seeds} x (weights + grads + {optimizer} optimizer copies"
        f"{' + the kept copy of weights and optimizer state' if kept_copy else ''}) of "
        f"{profile.n_params:,} params, {seeds} x {batch} x "
        f"{profile.saved_bytes / 1e6:.3g} MB autograd-saved/example, data "
        f"{data_bytes / 1e6:.3g} MB, checkpoint peak max(eval {evaluation / GB:.3g} GB, float64 "
        f"metrics {metrics / GB:.3g} GB); host: + {len(steps)} history rows a seed "
        f"({histories / GB:.3g} GB; metric rows are appended to disk, not kept)"
    )
    bytes_from = (
        f"size-based: {seeds} seeds x ({len(kept)} of {len(steps)} checkpoints ({policy.schedule}) "
        f"x {profile.n_state:,} x {policy.dtype} + model.pt + tables)"
    )
    on_gpu = device is GPU
    return JobPlan(
        rule, block.id, seeds, device.name, seeds * per_seed, state, host + (0 if on_gpu else on_device),
        on_device if on_gpu else 0.0, seconds, bytes_from, memory_from, time_from,
        (f"train.{block.task}.seed_block", f"{key}.archive", f"{key}.steps"),
    )  # fmt: skip


def _measured_wall_time(
    results: str | None, rule: str, block: SeedRange
) -> tuple[float, str] | None:
    """A finished block's wall time from its seeds' timing sidecars under ``results`` (the
    block's, not the sum: the seeds train together), or None."""
    if results is None:
        return None
    rule_dir = {"train": "train", "sparse_retrain": "sparse"}[rule]
    times = []
    for cell in block.cells:
        path = Path(results) / rule_dir / cell.id / "train.timing.json"
        if not path.is_file():
            return None
        times.append(float(json.loads(path.read_text()).get("wall_time_s", math.nan)))
    if not times or any(math.isnan(t) for t in times):
        return None
    return max(times), f"measured: {results}/{rule_dir}/{block.id} train.timing.json wall_time_s"


def gradinit_job(config: Mapping[str, Any], block: SeedRange) -> JobPlan:
    """GradInit / MetaInit: ``iterations`` steps of two forward/backward passes (the inner step
    and the objective's) of ``batch_size`` examples, S seeds at once on the training device."""
    # an omitted setting takes the schema's default, as the stage does (methods.gradinit)
    given = grid.stage_settings(config, "gradinit", block.task)
    settings = {**section_defaults("gradinit"), **given}
    train = grid.with_train_defaults(grid.train_settings(config, block.task))
    profile = model_profile(config, block.task, block.arch)
    device, seeds = device_of(train), len(block.seeds)
    batch, iterations = int(settings["batch_size"]), int(settings["iterations"])
    step_s = 2 * device.step_seconds(profile, seeds)
    step_s += 2 * 3 * profile.forward_flops * batch * seeds / device.flops_per_s(profile)
    if device is CPU:
        step_s += GRADINIT_SEED_ITERATION_S * seeds
    data_bytes, _ = dataset_bytes(config, block.task, profile)
    on_device = (seeds * (3 * profile.state_bytes + 2 * batch * profile.saved_bytes)
                 + data_bytes + device.context_bytes)  # fmt: skip
    host = BASE_RAM + 2 * data_bytes + seeds * profile.state_bytes
    on_gpu = device is GPU
    return JobPlan(
        "gradinit", block.id, seeds, device.name, seeds * (profile.state_bytes + 50_000), 0.0,
        host + (0 if on_gpu else on_device), on_device if on_gpu else 0.0,
        STARTUP_S + iterations * step_s,
        "size-based: init.pt (the state dict) + scales/history/diagnostics per seed",
        "size-based: 3 state copies + 2 x batch x autograd-saved bytes per seed, data",
        f"{device.source}; 2 x 3 x forward FLOPs x batch x {iterations} iterations"
        + (f"; {SMALL_RULES_SOURCE}: {GRADINIT_SEED_ITERATION_S * 1e3:g} ms a seed and iteration"
           if device is CPU else ""),
        (f"train.{block.task}.seed_block", f"gradinit.{block.task}.iterations"),
    )  # fmt: skip


def analysis_job(
    config: Mapping[str, Any], rule: str, job: str, cells: Sequence[Cell], fraction: float = 1.0,
    external_observations: int = 0,
) -> JobPlan:  # fmt: skip
    """A training-map job over ``cells``' metric tables (fit_hmm, joint_comparison, paper_map)
    and ``external_observations`` checkpoints of external runs it pools
    (:func:`~trainmap.plan.jobplan.map_job`)."""
    observations = sum(grid.run_checkpoints(config, cell) for cell in cells) + external_observations
    return map_job(config, rule, job, len(cells), observations, fraction)


# --- the plan of a grid -----------------------------------------------------------------------------


def block_jobs(config: Mapping[str, Any], results: str | None = None) -> list[JobPlan]:
    """Every block job of the grid (data, gradinit, train, sparse_retrain, reparam, quantize,
    evaluate, collect_metrics), in rule order."""
    cells = grid.expand_grid(config)
    plans = []
    for task in grid.grid_tasks(config):
        settings = dict(grid.data_settings(config, task))
        kind = settings.pop("kind")
        sizes = dataset_examples(kind, settings)
        arch = next(c.arch for c in cells if c.task == task)
        profile = model_profile(config, task, arch)
        data_bytes, _ = dataset_bytes(config, task, profile)
        plans.append(small_job(
            "data", task, 0, data_bytes, BASE_RAM + 3 * data_bytes,
            STARTUP_S + DATA_S + data_bytes / 50e6,
            "size-based: (n_train + n_test) x input bytes" + ("" if sizes else " (70,000 assumed)"),
            "size-based: 3 copies of the data set while it is read and saved",
            f"assumed: start-up + {DATA_S:g} s (the default study's 1-3 s) + reading at 50 MB/s",
            (f"data.{task}.n_train", f"data.{task}.size") if kind == "image_folder" else (),
        ))  # fmt: skip
    for rule in grid.BLOCK_RULES:
        for block in grid.seed_ranges_of(config, rule.cells(config, cells)):
            plans.append(block_job(config, rule.name, block, results))
    return plans


def block_job(
    config: Mapping[str, Any], rule: str, block: SeedRange, results: str | None = None
) -> JobPlan:
    """The plan of one block job of ``rule`` (gradinit, train, sparse_retrain, reparam, quantize,
    evaluate, collect_metrics); ``results``: a results root whose timing sidecars replace the
    time estimate of a finished training block."""
    seeds = len(block.seeds)
    if rule == "train":
        return training_job(config, rule, block, grid.train_settings(config, block.task),
                            f"train.{block.task}", results=results)  # fmt: skip
    if rule == "gradinit":
        return gradinit_job(config, block)
    profile = model_profile(config, block.task, block.arch)
    if rule == "sparse_retrain" and grid.method_retrains(block.method):
        # The retraining's own settings, device included (omitted: the schema's default).
        sparse = grid.stage_settings(config, "sparse", block.task).get("train", {})
        return training_job(config, rule, block, sparse, f"sparse.{block.task}.train", 4 / 3,
                            results)  # fmt: skip
    if rule == "sparse_retrain":
        return small_job(
            rule, block.id, seeds, seeds * profile.state_bytes * 2,
            BASE_RAM + 4 * seeds * profile.state_bytes, STARTUP_S + 2.0 * seeds,
            "size-based: the pruned model + its mask per seed", "size-based: 4 state copies a seed",
            "assumed: 2 s a seed (pruning, one calibration batch)",
        )  # fmt: skip
    if rule == "reparam":
        return small_job(
            rule, block.id, seeds, seeds * profile.state_bytes,
            BASE_RAM + 3 * seeds * profile.state_bytes,
            STARTUP_S + REPARAM_S + REPARAM_SEED_S * seeds,
            "size-based: the deploy model per seed (<= the training state)",
            "size-based: 3 state copies a seed",
            f"{SMALL_RULES_SOURCE}: {REPARAM_S:g} s + {REPARAM_SEED_S:g} s a seed (fusion + "
            "equivalence check)",
        )  # fmt: skip
    if rule == "quantize":
        schemes = len(grid.quantized_schemes(config, block.cells[0]))
        return small_job(
            rule, block.id, seeds, seeds * schemes * profile.state_bytes,
            BASE_RAM + 4 * seeds * profile.state_bytes,
            STARTUP_S + QUANTIZE_S + QUANTIZE_SCHEME_SEED_S * schemes * seeds,
            f"size-based: {schemes} schemes x (model + packed file) <= the fp32 state per seed",
            "size-based: 4 state copies a seed",
            f"{SMALL_RULES_SOURCE}: {QUANTIZE_S:g} s + {QUANTIZE_SCHEME_SEED_S:g} s a scheme and "
            "seed (the MLP's AWQ calibration)",
        )  # fmt: skip
    if rule == "evaluate":
        data_bytes, n_test = dataset_bytes(config, block.task, profile)
        evaluate = grid.evaluate_settings(config, block.task)
        where = grid.latency_device(evaluate)
        latency_batch, latency_repeats = latency_probe(evaluate)
        latency = 0 if where == "none" else int(latency_batch) * int(latency_repeats)
        forms = (
            1
            + grid.has_deploy_form(block.arch)
            + len(grid.quantized_schemes(config, block.cells[0]))
        )
        device = device_of({"device": grid.training_device(config, block.task)})
        on_device_examples = n_test + (latency if where == "device" else 0)
        on_cpu_examples = latency if where == "cpu" else 0
        seconds = STARTUP_S + EVALUATE_S + profile.forward_flops * forms * seeds * (
            on_device_examples / device.flops_per_s(profile)
            + on_cpu_examples / CPU.flops_per_s(profile)
        )  # fmt: skip
        batch_bytes = min(n_test, EVAL_BATCH) * profile.widest_bytes * 3
        plan = small_job(
            rule, block.id, seeds, seeds * 4000,
            BASE_RAM + 2 * data_bytes + batch_bytes + 2 * seeds * profile.state_bytes,
            seconds,
            "size-based: evaluation.json + timing per seed",
            "size-based: data + one eval batch through the widest layer + 2 models",
            f"FLOP-based: test set on {device.name} at "
            f"{device.flops_per_s(profile) / 1e9:g} GFLOP/s, latency probe ({where}) "
            f"+ {EVALUATE_S:g} s ({SMALL_RULES_SOURCE})",
        )  # fmt: skip
        if device is GPU:  # the data, one model and one eval batch on the GPU
            plan = replace(plan, device=device.name, gpu=data_bytes + batch_bytes
                           + profile.state_bytes + device.context_bytes)  # fmt: skip
        return plan
    if rule == "collect_metrics":
        n_ckpt = grid.run_checkpoints(config, block.cells[0])
        return small_job(
            rule, block.id, seeds, seeds * n_ckpt * 22 * 20,
            BASE_RAM + seeds * n_ckpt * 3 * 22 * 8 * 4,
            STARTUP_S + COLLECT_S + COLLECT_ROW_S * n_ckpt * seeds,
            f"size-based: metrics.csv, {n_ckpt} rows x 22 columns x ~20 B per seed",
            "size-based: each seed's checkpoint_metrics.csv rows (3 conventions) in pandas",
            f"{SMALL_RULES_SOURCE}: {COLLECT_S:g} s + {COLLECT_ROW_S * 1e3:g} ms a checkpoint row "
            "(the metrics come with the run)",
        )  # fmt: skip
    raise PlanError(f"rule {rule!r}: the plan has no estimate for its jobs (block rules: "
                    f"{', '.join(r.name for r in grid.BLOCK_RULES)})")  # fmt: skip


def analysis_jobs(config: Mapping[str, Any]) -> list[JobPlan]:
    """The training-map jobs: fit_hmm (+ regress_detours, training_map) per group, joint_comparison
    per joint comparison, paper_map per paper setting and analysis (authors', trainmap's)."""
    plans = []
    for name, cells in grid.analysis_groups(config).items():
        plans.append(analysis_job(config, "fit_hmm", name, cells))
        plans.append(analysis_job(config, "regress_detours", name, cells, 0.05))
        plans.append(analysis_job(config, "training_map", name, cells, 0.02))
    from trainmap.plan.suites import fetched_checkpoints

    fetched = fetched_checkpoints(config)
    pooled = {spec["name"]: sum(fetched.get(name, 0) for name in spec.get("external", []))
              for spec in config.get("analysis", {}).get("joint", [])}  # fmt: skip
    for name, cells in grid.joint_comparisons(config).items():
        plans.append(analysis_job(config, "joint_comparison", name, cells,
                                  external_observations=pooled.get(name, 0)))  # fmt: skip
    for setting, cells in grid.paper_groups(config).items():
        for analysis in ("authors", "trainmap"):
            plans.append(analysis_job(config, "paper_map", f"{setting}/{analysis}", cells))
    return plans


def plan_jobs(config: Mapping[str, Any], results: str | None = None) -> pd.DataFrame:
    """One row per job of the config's grid (:class:`JobPlan` fields), block rules first.
    ``results``: the results root whose finished runs' timing sidecars replace the time estimate
    (None: estimates only)."""
    from trainmap.plan.suites import fetched_suite_jobs

    jobs = block_jobs(config, results) + analysis_jobs(config) + fetched_suite_jobs(config)
    return pd.DataFrame([asdict(job) for job in jobs])


# --- a job's scheduler request --------------------------------------------------------------------


def job_resources(config: Mapping[str, Any], rule: str, block: SeedRange | None = None,
                  group: Sequence[Cell] | None = None) -> dict[str, int]:  # fmt: skip
    """A job's scheduler request: ``mem_mb`` (host RAM), ``runtime`` (minutes), ``gpu`` and
    ``gpu_mem_mb`` (device memory: how :mod:`trainmap.gpus` packs jobs onto a node's GPUs) from
    its plan, times :data:`SAFETY_FACTOR` (at least :data:`MIN_MEMORY_MB`, :data:`MIN_MINUTES`).
    ``block`` for block rules, ``group`` (the cells) for analysis rules."""
    job = _job_plan(config, rule, block, group)
    return {
        "mem_mb": max(MIN_MEMORY_MB, math.ceil(job.ram * SAFETY_FACTOR / 1e6)),
        "runtime": max(MIN_MINUTES, math.ceil(job.seconds * SAFETY_FACTOR / 60)),
        "gpu": 1 if job.device == "cuda" else 0,
        "gpu_mem_mb": math.ceil(job.gpu * SAFETY_FACTOR / 1e6) if job.device == "cuda" else 0,
    }


def _job_plan(config: Mapping[str, Any], rule: str, block: SeedRange | None,
              group: Sequence[Cell] | None) -> JobPlan:  # fmt: skip
    if group is not None:
        return analysis_job(config, rule, rule, list(group))
    if block is None:
        raise PlanError(f"rule {rule}: job_resources needs the job's block or group")
    return block_job(config, rule, block)
