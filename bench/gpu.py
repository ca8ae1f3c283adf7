"""Training throughput on one GPU, with the loop the train rule runs, against the plan.

One script, one device, within about 8 minutes on an H100/H200-class GPU. Every row trains a real
block with ``trainmap.training.loop.train_block`` (metrics at the setting's checkpoint interval,
test evaluation, archive and outputs written to a temporary directory), for a cut number of steps:

* ``mlp``: the sparse-parity MLP (n = 40, k = 3, 40-128-2, SGD, batch 32; checkpoint every 100
  steps, the paper's setting) at 1, 40, 400 and 1,000 seeds, and at 1,000 seeds again with the
  losses read on the host every step (side by side: what checking them at checkpoints saves), and
  with a learning-rate sweep of 4 values inside the block (what per-seed settings cost);
* ``transformer``: the stabilised modular-addition transformer (d = 128, LayerNorm, AdamW, batch
  256, checkpoint every 50) at 40 seeds;
* ``resnet18``: ResNet-18 (BatchNorm, 64-512) on CIFAR-shaped data (32 x 32 x 3, 100 classes,
  generated: the machine has no network; the arithmetic is CIFAR-100's) at 1, 8 and 20 seeds, in
  each precision (``fp32``, ``tf32``, ``bf16``); checkpoint every 195 steps as the paper; with the
  paper config's augmentation (``training_maps_cifar``: crop, flip, normalisation, applied on the
  device), and at 8 seeds in fp32 once more without it (side by side: what augmentation costs).

Per row: ms per step of the block, seed-steps/s, the share of the wall time spent on the streamed
metrics (``metrics_s`` of ``train.timing.json``), peak device memory against the plan's estimate
(``trainmap.plan``), the plan's time for the same steps, and the achieved FLOP rate (3 x the
forward FLOPs of ``FlopCounterMode`` x batch x seeds per step) as a fraction of the device's dense
peak for the precision (a table of known devices; unknown devices report no fraction). A size the
plan says does not fit the device is skipped and listed.

It runs from the source tree on the GPU image's own Python and torch (3.11 or later, torch 2.10
or later)::

    PYTHONPATH=src python bench/gpu.py                       # writes bench/results/gpu.md
    PYTHONPATH=src python bench/gpu.py --device cpu --quick  # the same rows, CPU-sized (a check)

Last line: ``gpu_bench device=... mlp1000_ms_per_step=... transformer40_speedup_vs_h100=...
resnet18_peak_fraction=...``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainmap.io import load_timing
from trainmap.portable import cpu_model_and_flags

if TYPE_CHECKING:
    import torch

    from trainmap.data import TaskData

ROOT = Path(__file__).resolve().parents[1]
#: The one earlier GPU figure: the stabilised transformer's 40 seeds x 5,000 steps on an H100.
H100_TRANSFORMER_S = 148.6
#: Dense (no sparsity) peak TFLOP/s per precision, from the vendors' data sheets (SXM parts).
PEAKS = {
    "H200": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4},
    "H100": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0},
}


@dataclass(frozen=True)
class Workload:
    """One block to time: a paper setting's task, architecture and training settings."""

    name: str
    task: str
    arch: str
    seeds: int
    steps: int
    precision: str = "fp32"
    #: True: read the losses on the host every step (the CPU's way; on a GPU, the side-by-side
    #: measure of what checking them at checkpoints saves)
    check_every_step: bool | None = None
    #: a learning-rate sweep inside the block: this many values (halving), seed s the (s mod n)-th
    lr_sweep: int = 0
    #: False: the setting's augmentation (train.<task>.augment) turned off
    augment: bool = True


def full_rows() -> list[Workload]:
    rows = [Workload("mlp", "sparse_parity", "mlp", s, 1000) for s in (1, 40, 400, 1000)]
    rows.append(Workload("mlp, host check each step", "sparse_parity", "mlp", 1000, 1000,
                         check_every_step=True))  # fmt: skip
    rows.append(Workload("mlp, lr sweep of 4", "sparse_parity", "mlp", 1000, 1000, lr_sweep=4))
    rows.append(Workload("transformer", "modular_addition_stabilised", "transformer_ln", 40, 500))
    for precision in ("fp32", "tf32", "bf16"):
        for seeds in (1, 8, 20):
            rows.append(Workload("resnet18", "cifar100", "resnet_bn", seeds, 20, precision))
    rows.append(Workload("resnet18, no augmentation", "cifar100", "resnet_bn", 8, 20,
                         augment=False))  # fmt: skip
    return rows


def quick_rows(device: torch.device) -> list[Workload]:
    precisions = ("fp32", "bf16") if device.type == "cpu" else ("fp32", "tf32", "bf16")
    rows = [Workload("mlp", "sparse_parity", "mlp", s, 200) for s in (1, 40)]
    rows.append(Workload("mlp, host check each step", "sparse_parity", "mlp", 40, 200,
                         check_every_step=True))  # fmt: skip
    rows.append(Workload("mlp, lr sweep of 4", "sparse_parity", "mlp", 40, 200, lr_sweep=4))
    rows.append(Workload("transformer", "modular_addition_stabilised", "transformer_ln", 4, 20))
    rows += [Workload("resnet18", "cifar100", "resnet_bn", 2, 2, p) for p in precisions]
    rows.append(Workload("resnet18, no augmentation", "cifar100", "resnet_bn", 2, 2,
                         augment=False))  # fmt: skip
    return rows


#: ``--quick``: ResNet-18's layout at an eighth of its widths (a CPU check, not a measurement).
QUICK_RESNET = {"widths": [8, 16, 32, 64], "blocks_per_stage": [2, 2, 2, 2]}


def paper_config() -> dict[str, Any]:
    """params.yaml under config/paper.yaml, unchecked (its data paths need not exist here)."""
    from trainmap.grid.study import merged_config

    return merged_config(str(ROOT / "params.yaml"), str(ROOT / "config/paper.yaml"))


def cifar_shaped(n_train: int, n_test: int) -> TaskData:
    """Generated images of CIFAR-100's shape and classes (a fixed generator)."""
    import torch

    from trainmap.data import TaskData

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n_train + n_test, 3, 32, 32, generator=generator)
    y = torch.randint(0, 100, (n_train + n_test,), generator=generator)
    meta = {"kind": "cifar100", "input_kind": "image", "input_shape": [3, 32, 32],
            "num_classes": 100, "n_train": n_train, "n_test": n_test}  # fmt: skip
    return TaskData(x[:n_train], y[:n_train], x[n_train:], y[n_train:], meta)


def task_data(config: Mapping[str, Any], task: str, quick: bool) -> TaskData:
    from trainmap.data import make_task_data

    if task == "cifar100":  # CIFAR-100's sizes: the plan's test evaluation is the same work
        return cifar_shaped(512, 128) if quick else cifar_shaped(50_000, 10_000)
    options = {k: v for k, v in config["data"][task].items() if k != "kind"}
    return make_task_data(config["data"][task]["kind"], options)


def forward_flops(model: torch.nn.Module, example: torch.Tensor) -> float:
    """FLOPs of one example's forward pass (``FlopCounterMode``)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model.eval()(example[None])
    return float(counter.get_total_flops())


def peak_tflops(device: torch.device, precision: str) -> float | None:
    if device.type != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name(device)
    for key, peaks in PEAKS.items():
        if key in name:
            return peaks[precision]
    return None


def measure(config: dict[str, Any], row: Workload, device: torch.device, quick: bool) -> dict:
    """Train ``row``'s block for its steps on ``device``; measured and planned numbers."""
    import torch

    from trainmap import grid
    from trainmap.plan import STARTUP_S
    from trainmap.plan.estimates import block_job
    from trainmap.training.loop import TrainConfig, TrainPaths, build_cell_model, train_block

    settings = grid.with_train_defaults(grid.train_settings(config, row.task))
    settings.update(steps=row.steps, resume_every=row.steps + 1, device=str(device),
                    precision=row.precision, archive={"schedule": "none"})  # fmt: skip
    settings["checkpoint_every"] = min(settings["checkpoint_every"], row.steps)
    if not row.augment:
        settings["augment"] = None
    if row.lr_sweep:
        settings["lr"] = [settings["lr"] / 2**index for index in range(row.lr_sweep)]
    options = grid.model_settings(config, row.task, row.arch)
    if quick and row.task == "cifar100":
        options = QUICK_RESNET
    seeds = tuple(range(row.seeds))
    planned_config = json.loads(json.dumps(config))
    planned_config["train"][row.task] = {**settings, "seed_block": row.seeds}
    planned_config["model"][row.task][row.arch] = options
    block = grid.SeedRange(row.task, row.arch, "kaiming", 0, row.seeds - 1, seeds)
    plan = block_job(planned_config, "train", block)
    result = {"workload": row.name, "seeds": row.seeds, "precision": row.precision,
              "steps": row.steps, "planned_gpu_gb": plan.gpu / 1e9,
              "planned_s": plan.seconds - STARTUP_S}  # fmt: skip
    if device.type == "cuda":
        capacity = torch.cuda.get_device_properties(device).total_memory
        if plan.gpu > capacity:
            return {**result, "skipped": f"plan: {plan.gpu / 1e9:.0f} GB > {capacity / 1e9:.0f} GB"}
        torch.cuda.reset_peak_memory_stats(device)
    data = task_data(config, row.task, quick)
    models = [build_cell_model(row.arch, "kaiming", s, data.meta, options) for s in seeds]
    flops = forward_flops(models[0], data.x_train[0])
    cfg = TrainConfig.from_dict(settings)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [TrainPaths.in_directory(Path(tmp) / f"seed{s}") for s in seeds]
        started = time.perf_counter()
        train_block(models, data, cfg, seeds, paths, resume_path=Path(tmp) / "resume.pt",
                    progress=False, check_every_step=row.check_every_step)  # fmt: skip
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - started
        timing = load_timing(paths[0].summary)
    step_flops = 3 * flops * cfg.batch_size * row.seeds
    achieved = step_flops * row.steps / wall / 1e12
    peak = peak_tflops(device, row.precision)
    return {
        **result,
        "wall_s": wall,
        "ms_per_step": 1e3 * wall / row.steps,
        "seed_steps_per_s": row.seeds * row.steps / wall,
        "metrics_share": timing.get("metrics_s", math.nan) / wall,
        "peak_gpu_gb": (
            torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else math.nan
        ),
        "tflops": achieved,
        "peak_fraction": achieved / peak if peak else math.nan,
    }


def report(rows: list[dict], device: str, elapsed: float) -> str:
    import torch

    lines = [
        "# GPU training throughput (bench/gpu.py)",
        "",
        f"Device: **{device}**; torch {torch.__version__}, Python {platform.python_version()}; "
        f"{elapsed:.0f} s in all. Steps are cut; times include checkpoints (metrics, test "
        "evaluation) at the setting's interval.",
        "",
        "| workload | seeds | precision | steps | ms/step | seed-steps/s | metrics share | "
        "peak GB (plan) | plan s (measured) | TFLOP/s | of dense peak |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        head = f"| {row['workload']} | {row['seeds']} | {row['precision']} | {row['steps']} |"
        if "skipped" in row:
            lines.append(f"{head} skipped: {row['skipped']} | | | | | | |")
            continue
        memory = "-" if math.isnan(row["peak_gpu_gb"]) else f"{row['peak_gpu_gb']:.2f}"
        fraction = "-" if math.isnan(row["peak_fraction"]) else f"{row['peak_fraction']:.1%}"
        lines.append(
            f"{head} {row['ms_per_step']:.2f} | {row['seed_steps_per_s']:,.1f} | "
            f"{row['metrics_share']:.1%} | {memory} ({row['planned_gpu_gb']:.2f}) | "
            f"{row['planned_s']:.1f} ({row['wall_s']:.1f}) | {row['tflops']:.3f} | {fraction} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None,
                        help="cuda or cpu (default: cuda where there is one, else cpu)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="CPU-sized rows (a check)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the report (default: bench/results/gpu.md on a GPU, "
                        "logs/bench/gpu-check.md for a --quick or CPU pass)")  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=450.0,
                        help="start no row after this many seconds (default 450: the script "
                        "ends within 8 minutes); the rows left are listed as skipped")  # fmt: skip
    args = parser.parse_args()
    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu" and not args.quick:
        print("gpu_bench: skipped: no CUDA device here; on a GPU node run `PYTHONPATH=src python "
              "bench/gpu.py`; `--device cpu --quick` checks the script on the CPU")  # fmt: skip
        return 0
    if args.out is None:
        measured_run = device.type == "cuda" and not args.quick
        args.out = ROOT / ("bench/results/gpu.md" if measured_run else "logs/bench/gpu-check.md")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model_and_flags()[0]
    config = paper_config()
    rows = quick_rows(device) if args.quick else full_rows()
    started = time.perf_counter()
    measured: list[dict] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for row in rows:
        head = {"workload": row.name, "seeds": row.seeds, "precision": row.precision,
                "steps": row.steps}  # fmt: skip
        if time.perf_counter() - started > args.budget_s:  # finish within the device's time
            result = {**head, "skipped": f"past the {args.budget_s:g} s budget"}
        else:
            try:
                result = measure(config, row, device, args.quick)
            except Exception as error:  # noqa: BLE001 - one row's failure must not lose the rest
                result = {**head, "skipped": f"failed: {type(error).__name__}: {error}"[:300]}
            if device.type == "cuda":
                torch.cuda.empty_cache()
        measured.append(result)
        print(json.dumps(result), flush=True)
        # the report so far, after every row: a run cut short still leaves its rows
        args.out.write_text(report(measured, name or device.type, time.perf_counter() - started))
    print(args.out.read_text())
    done = [r for r in measured if "wall_s" in r]
    parts = [f"gpu_bench device={(name or device.type).replace(' ', '_')}"]
    mlp = [r for r in done if r["workload"] == "mlp"]
    if mlp:
        largest = max(mlp, key=lambda r: r["seeds"])
        parts.append(f"mlp{largest['seeds']}_ms_per_step={largest['ms_per_step']:.3f}")
    transformer = [r for r in done if r["workload"] == "transformer"]
    if transformer:
        per_step = transformer[0]["wall_s"] / transformer[0]["steps"]
        parts.append(f"transformer{transformer[0]['seeds']}_speedup_vs_h100="
                     f"{H100_TRANSFORMER_S / (per_step * 5000):.2f}")  # fmt: skip
    fractions = [r["peak_fraction"] for r in done if r["workload"] == "resnet18"]
    parts.append(f"resnet18_peak_fraction={max(fractions, default=math.nan):.3f}")
    parts.append(f"rows={len(done)}/{len(measured)}")
    print(" ".join(parts))
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main())
