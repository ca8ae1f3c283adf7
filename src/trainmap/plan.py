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

import argparse
import functools
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from trainmap import data as data_module
from trainmap import grid
from trainmap.dynamics.columns import CONVENTIONS
from trainmap.grid import Cell, SeedRange
from trainmap.models import build_model
from trainmap.training.archive import ArchivePolicy, checkpoint_steps, kept_indices

#: Resources requested from a scheduler are the plan's estimate times this, once, for every rule:
#: the FLOP-based times hold to ~2x (bench/plan_accuracy.py), and a job past its request is killed.
SAFETY_FACTOR = 1.5
#: The smallest requests (a job's start-up alone: importing torch and MLflow).
MIN_MEMORY_MB = 1000
MIN_MINUTES = 5

GB = 1e9
#: The training loop's test-evaluation batch (trainmap.training.loop.EVAL_BATCH).
EVAL_BATCH = 4096
#: Optimizer state per parameter, in parameter copies (SGD: momentum buffer; Adam(W): two moments).
OPTIMIZER_COPIES = {"sgd": 1, "adam": 2, "adamw": 2}


@dataclass(frozen=True)
class Device:
    """What the plan assumes of a training device, and where each number comes from."""

    name: str
    train_flops_per_s: float
    step_overhead_s: float
    overhead_per_seed_s: float
    svd_flops_per_s: float
    context_bytes: float
    source: str
    #: Throughput of a net with conv layers (None: ``train_flops_per_s``).
    conv_flops_per_s: float | None = None
    #: Per-step overhead per parameter tensor, and per parameter tensor and seed.
    tensor_overhead_s: float = 0.0
    tensor_seed_overhead_s: float = 0.0
    #: Streamed metrics per checkpoint: a fixed cost, and per seed, convention and counted matrix.
    metrics_fixed_s: float = 0.0
    metrics_matrix_s: float = 0.0
    #: Archive writes: per file, and its bytes at this rate.
    archive_file_s: float = 0.0
    archive_bytes_per_s: float = 500e6

    def flops_per_s(self, profile: ModelProfile) -> float:
        """The training throughput for ``profile``'s model (conv or matmul-only)."""
        if profile.linear_only or self.conv_flops_per_s is None:
            return self.train_flops_per_s
        return self.conv_flops_per_s

    def step_seconds(self, profile: ModelProfile, seeds: int) -> float:
        """One step's overhead of a block of ``seeds``: fixed, per seed, per parameter tensor."""
        per_seed = self.overhead_per_seed_s + self.tensor_seed_overhead_s * profile.n_tensors
        return self.step_overhead_s + self.tensor_overhead_s * profile.n_tensors + per_seed * seeds

    def metrics_seconds(self, profile: ModelProfile, seeds: int) -> float:
        """One checkpoint's streamed metrics of ``seeds`` in every convention (float64)."""
        per_convention = (profile.n_matrices * self.metrics_matrix_s
                          + profile.svd_flops / self.svd_flops_per_s)  # fmt: skip
        return self.metrics_fixed_s + seeds * len(CONVENTIONS) * per_convention

    def archive_seconds(self, files: int, bytes_: float) -> float:
        """Writing ``files`` archive files of ``bytes_`` in all."""
        return files * self.archive_file_s + bytes_ / self.archive_bytes_per_s


#: This project's 2-core machines, a job on one thread (the rules' ``threads: 1``). Matmul nets:
#: 17-45 GFLOP/s (measured: the transformer 185 ms/step at batch 2048; 20 GFLOP/s taken). Conv nets
#: and per-step overhead: train_block steps timed here (8x8 digits, 1 thread, 30-60 steps,
#: checkpoint time taken out): RepVGG (50 parameter tensors, BatchNorm) S=1/8 x batch 16/128:
#: 27.5/47.3 ms and 58/210 ms, i.e. 8.7 GFLOP/s (BatchNorm's work is not in the FLOP count) +
#: 25 ms + 1.6 ms a seed; RepVGG-plain (23 tensors, no BN) 16.8 GFLOP/s + 7.2 ms + 0.7 ms a
#: seed; the sparse-parity MLP (4 tensors) 0.8 ms at S=1, 4.3 ms at S=40. Taken: 10 GFLOP/s for
#: conv nets, 0.25 ms a parameter tensor + 0.03 ms a tensor and seed. Streamed metrics per
#: checkpoint (the loop's metrics_s): MLP S=40 0.05 s, RepVGG S=8 0.06-0.08 s, RepVGG-plain S=8
#: 0.06 s (3 s over 49 checkpoints), ResNet-18 float64 ~2 s a seed for the three conventions (its
#: 4 m n min(m, n) count is 19.5 GFLOP): 25 ms + 0.1 ms a matrix and convention and seed + the
#: count at 30 GFLOP/s. Archive writes (archive_s): 0.8 ms a 22 kB MLP file, ~6 ms a 210 kB RepVGG
#: file: 0.6 ms a file + 40 MB/s.
CPU = Device(
    "cpu", 20e9, 0.0, 0.0, 30e9, 0.0,
    "measured: train_block steps of RepVGG, RepVGG-plain and the MLP on 1 thread here (conv nets "
    "10 GFLOP/s, matmul nets 20 GFLOP/s (17-45 measured); 0.25 ms a parameter tensor + 0.03 ms a "
    "tensor and seed per step); streamed metrics 25 ms + 0.1 ms a matrix, convention and seed + "
    "4mn min(m,n) at 30 GFLOP/s (ResNet-18: ~2 s a seed); archive 0.6 ms a file + 40 MB/s",
    conv_flops_per_s=10e9, tensor_overhead_s=0.25e-3, tensor_seed_overhead_s=0.03e-3,
    metrics_fixed_s=0.025, metrics_matrix_s=0.1e-3, archive_file_s=0.6e-3,
    archive_bytes_per_s=40e6,
)  # fmt: skip
#: A node's GPU (an H100, assumed: no GPU run of this project has been measured): fp32 ~50 TFLOP/s
#: at 40 % utilisation; ~3 ms a step of kernel launches for a vmapped block; batched float64
#: singular values at ~100 GFLOP/s; ~1 GB of CUDA context.
GPU = Device(
    "cuda", 50e12 * 0.4, 3e-3, 0.02e-3, 100e9, 1.0 * GB,
    "FLOP-based: H100 fp32 50 TFLOP/s at 40 % utilisation, 3 ms/step launch overhead, float64 "
    "SVD 100 GFLOP/s (assumed, not measured)",
)  # fmt: skip
#: Start-up of a job process: import torch (1.6 s) and MLflow (1.2 s), tracking, data load.
STARTUP_S = 15.0
#: A job process's resident memory before its work: torch + MLflow imported (measured: 1,307 MB
#: peak RSS for a 4.3 M-parameter MLP with 11 checkpoints).
BASE_RAM = 1.2 * GB
#: Sequential write speed of the node's disk (assumed).
DISK_BYTES_PER_S = 500e6
#: The analysis rules' time per observation (a run's checkpoint): the default study's joint
#: comparisons, 138 s for 80 runs x 321 checkpoints (measured 2026-11-24, 2 cores).
ANALYSIS_S_PER_OBSERVATION = 138.0 / (80 * 321)
ANALYSIS_SOURCE = (
    "measured: the default study's joint comparison, 138 s for 80 runs x 321 checkpoints "
    "(2 cores), scaled by runs x checkpoints"
)


#: The small rules' CPU time, measured from the default study's Snakemake log (2 jobs at a time on
#: 2 cores, whole seconds; bench/plan_accuracy.py): reparam 1-2 s for 8 RepVGG seeds; quantize 5-6 s
#: for 40 MLP seeds x 3 schemes; evaluate 4-8 s whatever its FLOPs; collect_metrics 4-8 s for 8 x 49
#: and 4-6 s for 40 x 321 rows; gradinit 69 s for 40 MLP seeds x 100 iterations (the scale
#: optimiser's step, ~15 ms a seed and iteration beyond its two training steps).
REPARAM_S, REPARAM_SEED_S = 0.5, 0.15
QUANTIZE_S, QUANTIZE_SCHEME_SEED_S = 3.0, 0.02
EVALUATE_S = 4.0
DATA_S = 2.0
COLLECT_S, COLLECT_ROW_S = 4.0, 0.1e-3
GRADINIT_SEED_ITERATION_S = 15e-3
SMALL_RULES_SOURCE = "measured: the default study's Snakemake log (bench/plan_accuracy.py)"


class PlanError(ValueError):
    """A plan past the limits of the node it was given; the message names the rule, the job, the
    resource, the estimate and the config key to change."""


@dataclass(frozen=True)
class NodeLimits:
    """One node: GPU memory, host RAM and disk in GB/TB, and a job's wall-time limit in hours."""

    gpu_gb: float = 80.0
    ram_gb: float = 128.0
    disk_tb: float = 1.0
    job_hours: float = 24.0


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


# --- a model's sizes, FLOPs and activations (once per task, arch and options) -------------------


@dataclass(frozen=True)
class ModelProfile:
    """What the plan needs of one (task, arch): counts, bytes and FLOPs per example.

    ``n_params``: trainable parameters; ``n_state``: floating-point numel of the state dict
    (buffers included); ``int_state_bytes``: its integer buffers' bytes (BatchNorm's counters);
    ``state_bytes``: its bytes as stored (fp32); ``forward_flops``: forward FLOPs per example
    (FlopCounterMode, batch 2 minus batch 1); ``saved_bytes``: autograd-saved activation bytes per
    example (parameters excluded); ``widest_bytes``: the largest module output per example;
    ``svd_flops``: 4 m n min(m, n) summed over every 2-D and conv weight (as (out, in*k*k));
    ``input_bytes``: one example's input; ``linear_only``: no conv layer (MLP, transformer);
    ``n_tensors``: trainable parameter tensors; ``n_matrices``: 2-D and conv weights.
    """

    n_params: int
    n_state: int
    int_state_bytes: int
    state_bytes: int
    forward_flops: float
    saved_bytes: float
    widest_bytes: float
    svd_flops: float
    input_bytes: int
    linear_only: bool
    n_tensors: int = 0
    n_matrices: int = 0


def _example_batch(meta: Mapping[str, Any], size: int) -> torch.Tensor:
    shape = (size, *meta["input_shape"])
    if meta["input_kind"] == "tokens":
        return torch.randint(0, int(meta.get("vocab_size", 2)), shape)
    return torch.randn(shape)


def _forward_flops(model: nn.Module, x: torch.Tensor) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x)
    return float(counter.get_total_flops())


def _saved_and_widest(model: nn.Module, x: torch.Tensor) -> tuple[float, float]:
    """Bytes autograd saves for backward (parameters excluded) and the largest leaf output."""
    params = {p.data_ptr() for p in model.parameters()} | {b.data_ptr() for b in model.buffers()}
    saved: dict[tuple[int, tuple[int, ...]], int] = {}
    widest = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.data_ptr() not in params:
            saved[(tensor.data_ptr(), tuple(tensor.shape))] = tensor.numel() * tensor.element_size()
        return tensor

    def record(_module: nn.Module, _inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            widest[0] = max(widest[0], output.numel() * output.element_size())

    handles = [m.register_forward_hook(record) for m in model.modules() if not list(m.children())]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(x).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    return float(sum(saved.values())), float(widest[0])


@functools.cache
def _profile(task_data_json: str, arch: str, options_json: str) -> ModelProfile:
    data_options = json.loads(task_data_json)
    kind = data_options.pop("kind")
    meta = data_module.model_meta(kind, data_options)
    torch.manual_seed(0)
    model = build_model(arch, meta, **json.loads(options_json))
    model.train()
    state = model.state_dict()
    flops = [_forward_flops(model, _example_batch(meta, size)) for size in (2, 4)]
    saved = [_saved_and_widest(model, _example_batch(meta, size)) for size in (2, 4)]
    svd_flops, n_matrices = 0.0, 0
    for tensor in state.values():
        if tensor.dim() in (2, 4) and tensor.is_floating_point():
            m, n = tensor.shape[0], tensor[0].numel()
            svd_flops += 4.0 * m * n * min(m, n)
            n_matrices += 1
    x = _example_batch(meta, 1)
    return ModelProfile(
        n_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        n_state=sum(t.numel() for t in state.values() if t.is_floating_point()),
        int_state_bytes=sum(
            t.numel() * t.element_size() for t in state.values() if not t.is_floating_point()
        ),
        state_bytes=sum(t.numel() * t.element_size() for t in state.values()),
        forward_flops=max(flops[1] - flops[0], 0.0) / 2,
        saved_bytes=max(saved[1][0] - saved[0][0], 0.0) / 2,
        widest_bytes=saved[1][1] / 4,
        svd_flops=svd_flops,
        input_bytes=x.numel() * x.element_size(),
        linear_only=not any(isinstance(m, nn.Conv2d) for m in model.modules()),
        n_tensors=sum(1 for p in model.parameters() if p.requires_grad),
        n_matrices=n_matrices,
    )


def model_profile(config: Mapping[str, Any], task: str, arch: str) -> ModelProfile:
    """The :class:`ModelProfile` of ``arch`` on ``task`` as the config builds it (data meta from
    ``data.<task>`` without the data, ``model.<task>.<arch>``); built once per process and
    settings."""
    return _profile(
        json.dumps(grid.data_settings(config, task), sort_keys=True),
        arch,
        json.dumps(grid.model_settings(config, task, arch), sort_keys=True),
    )


def dataset_examples(kind: str, options: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(n_train, n_test)`` of a data kind with ``options``, known without the data; None when
    only the data knows (``arrays``, a plugin's kind)."""
    options = {**data_module.data_kind_options(kind), **options}
    if kind == "sparse_parity":
        return int(options["n_train"]), int(options["n_test"])
    if kind == "modular_addition":
        pairs = int(options["p"]) ** 2
        n_train = int(pairs * float(options["train_frac"]))
        return n_train, pairs - n_train
    if kind == "digits":
        n_test = math.ceil(1797 * float(options["test_frac"]))
        return 1797 - n_test, n_test
    if kind == "mnist_5k":
        return data_module.mnist_5k_split_sizes(float(options["test_frac"]))
    if kind == "mnist1d":
        return data_module.mnist1d_split_sizes(
            int(options["num_samples"]), float(options["train_split"])
        )
    if kind == "mnist":
        return 60000, 10000
    if kind in ("cifar10", "cifar100"):
        return 50000, 10000
    return None


def dataset_bytes(config: Mapping[str, Any], task: str, profile: ModelProfile) -> tuple[float, int]:
    """The task's data set in bytes (inputs as the model takes them, int64 labels) and its test
    examples; a kind whose size only its data knows counts as 60000 + 10000 examples."""
    options = dict(grid.data_settings(config, task))
    kind = options.pop("kind")
    n_train, n_test = dataset_examples(kind, options) or (60000, 10000)
    return (n_train + n_test) * (profile.input_bytes + 8), n_test


# --- one job's estimate ---------------------------------------------------------------------------


@dataclass
class JobPlan:
    """One job's plan: bytes it leaves on disk (``bytes``), its transient disk use (``scratch``),
    peak host RAM and GPU memory (bytes), seconds, and where each estimate comes from."""

    rule: str
    job: str
    seeds: int
    device: str
    bytes: float
    scratch: float
    ram: float
    gpu: float
    seconds: float
    bytes_from: str
    memory_from: str
    time_from: str
    #: The config keys that change this job's size and time (named by a limit's error).
    keys: tuple[str, ...] = ()


def device_of(settings: Mapping[str, Any]) -> Device:
    return GPU if str(settings.get("device", "cpu")).startswith("cuda") else CPU


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
    on_device = weights + data_bytes + max(activations, evaluation, metrics) + device.context_bytes
    host = BASE_RAM + 2 * data_bytes + state + seeds * profile.state_bytes
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
        f"size-based: {seeds} x (weights + grads + {optimizer} optimizer copies) of "
        f"{profile.n_params:,} params, {seeds} x {batch} x "
        f"{profile.saved_bytes / 1e6:.3g} MB autograd-saved/example, data "
        f"{data_bytes / 1e6:.3g} MB, checkpoint peak max(eval {evaluation / GB:.3g} GB, float64 "
        f"metrics {metrics / GB:.3g} GB)"
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


def small_job(
    rule: str, job: str, seeds: int, bytes_: float, ram: float, seconds: float,
    bytes_from: str, memory_from: str, time_from: str, keys: tuple[str, ...] = (),
) -> JobPlan:  # fmt: skip
    """A CPU job's plan from its three numbers and their sources."""
    return JobPlan(rule, job, seeds, "cpu", bytes_, 0.0, ram, 0.0, seconds, bytes_from,
                   memory_from, time_from, keys)  # fmt: skip


def gradinit_job(config: Mapping[str, Any], block: SeedRange) -> JobPlan:
    """GradInit / MetaInit: ``iterations`` steps of two forward/backward passes (the inner step
    and the objective's) of ``batch_size`` examples, S seeds at once on the training device."""
    settings = grid.stage_settings(config, "gradinit", block.task)
    train = grid.with_train_defaults(grid.train_settings(config, block.task))
    profile = model_profile(config, block.task, block.arch)
    device, seeds = device_of(train), len(block.seeds)
    batch, iterations = int(settings.get("batch_size", 128)), int(settings.get("iterations", 100))
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
    config: Mapping[str, Any], rule: str, job: str, cells: Sequence[Cell], fraction: float = 1.0
) -> JobPlan:
    """A training-map job over ``cells``' metric tables (fit_hmm, joint_comparison, paper_map):
    memory from the observations x (14 metrics + k_max states) in float64 x 10 working copies,
    time scaled from the default study's measured joint comparison (x ``fraction`` for lighter
    rules)."""
    observations = sum(grid.run_checkpoints(config, cell) for cell in cells)
    k_max = int(grid.analysis_settings(config).get("k_max", 8))
    return small_job(
        rule,
        job,
        len(cells),
        len(cells) * 5000 + 1e6,
        BASE_RAM + observations * (14 + k_max) * 8 * 10,
        STARTUP_S + fraction * observations * ANALYSIS_S_PER_OBSERVATION,
        "size-based: a few JSON/NPZ/PNG files of the map (~1 MB) + 5 KB a run",
        f"size-based: {observations:,} observations x (14 + {k_max}) x 8 B x 10 copies",
        ANALYSIS_SOURCE + (f" x {fraction}" if fraction != 1 else ""),
        ("analysis.bootstrap", "analysis.stability", "grid seeds"),
    )


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
        # The retraining's own settings, device included (TrainConfig's default: cpu).
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
        latency = int(evaluate.get("latency_batch", 256)) * int(evaluate.get("latency_repeats", 20))
        forms = (
            1
            + grid.has_deploy_form(block.arch)
            + len(grid.quantized_schemes(config, block.cells[0]))
        )
        flops = profile.forward_flops * (n_test + latency) * forms * seeds
        return small_job(
            rule, block.id, seeds, seeds * 4000,
            BASE_RAM + 2 * data_bytes + min(n_test, EVAL_BATCH) * profile.widest_bytes * 3
            + 2 * seeds * profile.state_bytes,
            STARTUP_S + EVALUATE_S + flops / CPU.flops_per_s(profile),
            "size-based: evaluation.json + timing per seed",
            "size-based: data + one eval batch through the widest layer + 2 models",
            f"FLOP-based: test set + latency probe forward passes at "
            f"{CPU.flops_per_s(profile) / 1e9:g} GFLOP/s (CPU) + {EVALUATE_S:g} s "
            f"({SMALL_RULES_SOURCE})",
        )  # fmt: skip
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
    for name, cells in grid.joint_comparisons(config).items():
        plans.append(analysis_job(config, "joint_comparison", name, cells))
    for setting, cells in grid.paper_groups(config).items():
        for analysis in ("authors", "trainmap"):
            plans.append(analysis_job(config, "paper_map", f"{setting}/{analysis}", cells))
    return plans


def plan_jobs(config: Mapping[str, Any], results: str | None = None) -> pd.DataFrame:
    """One row per job of the config's grid (:class:`JobPlan` fields), block rules first.
    ``results``: the results root whose finished runs' timing sidecars replace the time estimate
    (None: estimates only)."""
    jobs = block_jobs(config, results) + analysis_jobs(config)
    return pd.DataFrame([asdict(job) for job in jobs])


def rule_totals(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per rule: jobs, bytes in total, the largest job's RAM, GPU memory and hours, and total
    hours (one row per rule, in plan order)."""
    order = list(dict.fromkeys(jobs["rule"]))
    totals = jobs.groupby("rule", sort=False).agg(
        jobs=("job", "size"), device=("device", lambda d: "/".join(sorted(set(d)))),
        bytes_gb=("bytes", lambda b: b.sum() / GB), ram_gb=("ram", lambda b: b.max() / GB),
        gpu_gb=("gpu", lambda b: b.max() / GB), hours_per_job=("seconds", lambda s: s.max() / 3600),
        total_hours=("seconds", lambda s: s.sum() / 3600),
    )  # fmt: skip
    return totals.loc[order]


def disk_bytes(jobs: pd.DataFrame) -> float:
    """What the grid leaves on disk, plus the largest job's transient files (a resume file)."""
    return float(jobs["bytes"].sum() + (jobs["scratch"].max() if len(jobs) else 0.0))


def check_limits(jobs: pd.DataFrame, limits: NodeLimits) -> None:
    """Raise :class:`PlanError` for the first job past ``limits`` (GPU memory, RAM, hours) or a
    grid past the disk, naming rule, job, resource, estimate and the config key to change."""
    checks = (
        ("gpu", limits.gpu_gb * GB, "GPU memory", lambda v: f"{v / GB:.1f} GB", f"{limits.gpu_gb:g} GB"),
        ("ram", limits.ram_gb * GB, "host RAM", lambda v: f"{v / GB:.1f} GB", f"{limits.ram_gb:g} GB"),
        ("seconds", limits.job_hours * 3600, "time", lambda v: f"{v / 3600:.1f} h", f"{limits.job_hours:g} h"),
    )  # fmt: skip
    for column, limit, resource, show, shown_limit in checks:
        over = jobs[jobs[column] > limit]
        if len(over):
            job = over.sort_values(column).iloc[-1]
            source = job["time_from"] if column == "seconds" else job["memory_from"]
            raise PlanError(
                f"rule {job['rule']}, job {job['job']}: {resource} {show(job[column])} planned "
                f"({source}) exceeds the node's {shown_limit}; change {' or '.join(job['keys'])}"
            )
    total = disk_bytes(jobs)
    if total > limits.disk_tb * 1e12:
        by_job = jobs.sort_values("bytes").iloc[-1]
        raise PlanError(
            f"disk: the grid writes {total / 1e12:.2f} TB (largest: rule {by_job['rule']}, job "
            f"{by_job['job']}, {by_job['bytes'] / GB:.1f} GB: {by_job['bytes_from']}) past the "
            f"node's {limits.disk_tb:g} TB; change "
            f"{' or '.join([k for k in by_job['keys'] if 'archive' in k] or by_job['keys'])}"
        )


def job_resources(config: Mapping[str, Any], rule: str, block: SeedRange | None = None,
                  group: Sequence[Cell] | None = None) -> dict[str, int]:  # fmt: skip
    """A job's scheduler request: ``mem_mb`` (host RAM), ``runtime`` (minutes) and ``gpu`` from
    its plan, times :data:`SAFETY_FACTOR` (at least :data:`MIN_MEMORY_MB`, :data:`MIN_MINUTES`).
    ``block`` for block rules, ``group`` (the cells) for analysis rules."""
    job = _job_plan(config, rule, block, group)
    return {
        "mem_mb": max(MIN_MEMORY_MB, math.ceil(job.ram * SAFETY_FACTOR / 1e6)),
        "runtime": max(MIN_MINUTES, math.ceil(job.seconds * SAFETY_FACTOR / 60)),
        "gpu": 1 if job.device == "cuda" else 0,
    }


def _job_plan(config: Mapping[str, Any], rule: str, block: SeedRange | None,
              group: Sequence[Cell] | None) -> JobPlan:  # fmt: skip
    if group is not None:
        return analysis_job(config, rule, rule, list(group))
    if block is None:
        raise PlanError(f"rule {rule}: job_resources needs the job's block or group")
    return block_job(config, rule, block)


# --- the command ------------------------------------------------------------------------------------


def format_plan(jobs: pd.DataFrame, limits: NodeLimits) -> str:
    """The plan as text: per rule totals, the grid's totals against ``limits``, the sources."""
    totals = rule_totals(jobs)
    lines = [totals.to_string(float_format=lambda v: f"{v:,.3g}")]
    lines.append(
        f"total: {len(jobs)} jobs, disk {disk_bytes(jobs) / 1e12:.3f} TB of {limits.disk_tb:g} TB; "
        f"largest job: RAM {jobs['ram'].max() / GB:.1f} of {limits.ram_gb:g} GB, GPU "
        f"{jobs['gpu'].max() / GB:.1f} of {limits.gpu_gb:g} GB, "
        f"{jobs['seconds'].max() / 3600:.2f} of {limits.job_hours:g} h; all jobs one after "
        f"another {jobs['seconds'].sum() / 3600:.1f} h"
    )
    lines.append("where the numbers come from (the largest job of each rule):")
    for rule in totals.index:
        job = jobs[jobs["rule"] == rule].sort_values("seconds").iloc[-1]
        lines.append(f"  {rule} ({job['job']}):")
        for label, column in (
            ("bytes", "bytes_from"),
            ("memory", "memory_from"),
            ("time", "time_from"),
        ):
            lines.append(f"    {label}: {job[column]}")
    return "\n".join(lines)


def load_plan_config(files: Iterable[str]) -> dict:
    """params.yaml, config/config.yaml, then ``files``, merged (:func:`trainmap.grid.merged_config`:
    files with a grid of their own start from params.yaml alone) and validated as the workflow does,
    except that a reader kind's data files (MNIST, CIFAR) need not be here: the plan knows their
    sizes (:func:`dataset_examples`). A missing data directory is a warning; the checks after it
    (the schema has passed) are then skipped."""
    from trainmap import plugins

    config = grid.merged_config("params.yaml", "config/config.yaml", *files)
    plugins.load_plugins(config.get("plugins"), Path.cwd())
    grid.validate_schema(config)
    try:
        grid.check_config(config, base_dir=Path.cwd())
    except grid.ConfigError as error:
        if not (str(error).startswith("config key data.") and ".path: " in str(error)):
            raise
        print(f"warning: {error} (planned without the data)", file=sys.stderr)
    return config


def main(argv: list[str] | None = None) -> int:
    """``python -m trainmap.plan``: print the plan of a config and check it against a node."""
    parser = argparse.ArgumentParser(
        prog="python -m trainmap.plan",
        description="Plan a config's grid before running it: per rule and in total, the bytes "
        "written, the peak host RAM and GPU memory, and the time per job, each with where it "
        "comes from (measured or FLOP-/size-based). Exit status 1 when a job or the grid exceeds "
        "the node limits, naming the key to change.",
    )
    parser.add_argument("--configfile", nargs="*", default=[], metavar="CONFIG",
                        help="config files merged over params.yaml and config/config.yaml (a "
                        "file with a grid of its own: over params.yaml alone)")  # fmt: skip
    parser.add_argument("--node-gpu-gb", type=float, default=NodeLimits.gpu_gb)
    parser.add_argument("--node-ram-gb", type=float, default=NodeLimits.ram_gb)
    parser.add_argument("--node-disk-tb", type=float, default=NodeLimits.disk_tb)
    parser.add_argument("--job-hours", type=float, default=NodeLimits.job_hours)
    parser.add_argument("--jobs", action="store_true", help="also print one line per job")
    args = parser.parse_args(argv)
    limits = NodeLimits(args.node_gpu_gb, args.node_ram_gb, args.node_disk_tb, args.job_hours)
    with grid.config_problems_reported():
        config = load_plan_config(args.configfile)
    jobs = plan_jobs(config, grid.results_root(config))
    print(f"plan of {' + '.join(grid.study_files(grid.user_layers(args.configfile)))}")
    print(format_plan(jobs, limits))
    if args.jobs:
        columns = ["rule", "job", "seeds", "device", "bytes", "ram", "gpu", "seconds"]
        print(jobs[columns].to_string(index=False))
    try:
        check_limits(jobs, limits)
    except PlanError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"fits the node: {limits}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
