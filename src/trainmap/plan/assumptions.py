"""What the plan assumes of a training device and of a job's fixed costs, each number with where it
comes from: a device's throughput and per-step, per-checkpoint and archive overheads
(:class:`Device`: :data:`CPU` measured here, :data:`GPU` assumed), a job's start-up and base
memory, the analysis rules' and the small rules' measured times."""

from __future__ import annotations

from dataclasses import dataclass

from trainmap.dynamics.metrics.columns import CONVENTIONS
from trainmap.plan.profile import ModelProfile

GB = 1e9
#: The training loop's test-evaluation batch (trainmap.training.scores.EVAL_BATCH).
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
#: singular values at ~100 GFLOP/s; ~1 GB of CUDA context. ``bench/gpu.py`` measures each of
#: these (ms a step by block size, the metrics' share, peak memory against this plan): its
#: numbers replace these where a GPU has run it.
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
#: A suite fetched from the Hub (trainmap.plan.suites): the Hub's download speed to one node
#: (assumed: no network is reachable from this project's machines) and each revision's requests
#: besides its bytes (the local fake Hub's fetch took 0.19 s a revision for 27 MB, bench/results/
#: suite_fetch.md; taken 0.5 s for the Hub's round trips).
HUB_BYTES_PER_S = 50e6
HUB_REVISION_S = 0.5
#: Reading and measuring one revision, by its parameters: (parameters, seconds) of GPT-NeoX
#: checkpoints of Pythia's 14m and 160m shapes on the 2-core EPYC (read + measure, heads split:
#: 0.02 + 0.10 s and 0.08 + 5.87 s, bench/results/suite_read.md). Between and beyond them the
#: plan takes the power law through both (the spectra grow faster than the parameters).
MEASURED_REVISIONS = ((14_067_712, 0.12), (162_322_944, 5.95))
#: Bytes of one revision's metrics row (a CSV row of the 14 metrics and their per-layer columns).
SUITE_ROW_BYTES = 20_000
SUITE_SOURCE = (
    f"assumed: download {HUB_BYTES_PER_S / 1e6:g} MB/s + {HUB_REVISION_S:g} s a revision; "
    "measured: read and measure 0.12 s at 14 M parameters, 5.95 s at 162 M, a power law between "
    "(bench/results/suite_read.md)"
)
