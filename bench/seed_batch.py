"""Seeds per second of seed-batched training against the one-seed loop, measured side by side.

For each workload, a block of S seeds (S = 1, 8, 32, 128) trains with ``trainmap.training.loop.train_block``,
the loop the workflow's ``train`` rule runs (trajectory capture and test evaluation at every
checkpoint included, outputs written), for the same number of steps as the one-seed loop
(``train_model``: a block of one, the module itself, no vmap). Throughput is seeds x steps per second
of wall time; the speedup is the block's throughput over the one-seed loop's, measured alternately
(one-seed, block, one-seed, ...) and taking the median of each, so a machine's slow spell hits both.

Workloads (the default study's shapes, params.yaml settings, fewer steps):

* ``mlp``: sparse parity (n = 40, k = 3), MLP 40-128-2, SGD, batch 32 (target at S = 32: >= 8x);
* ``cnn``: 8x8 digits, VGG-BN (16-32-64, BatchNorm), SGD momentum, cosine, batch 128 (>= 3x);
* ``transformer``: modular addition p = 113, one-layer transformer d = 128, AdamW, batch 2048 (>= 3x).

Usage::

    .venv/bin/python bench/seed_batch.py                 # every workload, S = 1, 8, 32, 128
    .venv/bin/python bench/seed_batch.py --quick         # fewer steps, S up to 32
    .venv/bin/python bench/seed_batch.py --device cuda   # on a GPU node (the block fills the device)

Last line: ``seed_batch_speedup_at_32 mlp=... cnn=... transformer=... (targets >= 8, 3, 3)``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import redirect_stderr
from dataclasses import dataclass, replace
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainmap.training.loop import TrainConfig

TARGETS = {"mlp": 8.0, "cnn": 3.0, "transformer": 3.0}


@dataclass(frozen=True)
class Workload:
    task: str
    data: dict
    arch: str
    options: dict
    #: the TrainConfig's settings (built after the arguments are parsed: no torch for --help)
    cfg: dict[str, Any]


WORKLOADS = {
    "mlp": Workload("sparse_parity", {"n_bits": 40, "k": 3, "n_train": 1000, "n_test": 100},
                    "mlp", {"hidden": [128]},
                    dict(lr=0.1, weight_decay=0.01, batch_size=32, steps=600,
                         checkpoint_every=50, resume_every=10**6)),
    "cnn": Workload("digits", {}, "vgg_bn", {},
                    dict(lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=128,
                         steps=60, schedule="cosine", checkpoint_every=5,
                         resume_every=10**6)),
    "transformer": Workload("modular_addition", {"p": 113, "train_frac": 0.3}, "transformer",
                            {"d_model": 128, "n_heads": 4, "d_mlp": 512},
                            dict(optimizer="adamw", lr=1e-3, betas=(0.9, 0.98),
                                 weight_decay=1.0, batch_size=2048, steps=12,
                                 warmup_steps=10, checkpoint_every=4,
                                 resume_every=10**6)),
}  # fmt: skip


def seconds(workload: Workload, data, size: int, cfg: TrainConfig, directory: Path) -> float:
    """Wall time of one training of ``size`` seeds as a block (a block of one: the one-seed loop,
    which is what ``train_model`` runs)."""
    from trainmap.training.loop import TrainPaths, build_cell_model, train_block

    seeds = list(range(size))
    models = [build_cell_model(workload.arch, "kaiming", s, data.meta, workload.options)
              for s in seeds]  # fmt: skip
    paths = [TrainPaths.in_directory(directory / f"seed{s}") for s in seeds]
    started = time.perf_counter()
    with redirect_stderr(StringIO()):
        train_block(models, data, cfg, seeds, paths, resume_path=directory / "resume.pt",
                    progress=False)  # fmt: skip
    return time.perf_counter() - started


def measure(name: str, sizes: list[int], rounds: int, quick: bool, device: str) -> dict[int, float]:
    """Speedup in seeds per second of each block size over the one-seed loop."""
    from trainmap.data import make_task_data
    from trainmap.training.loop import TrainConfig

    workload = WORKLOADS[name]
    cfg = replace(TrainConfig(**workload.cfg), device=device)
    if quick:
        cfg = replace(cfg, steps=max(cfg.checkpoint_every, cfg.steps // 3))
    data = make_task_data(workload.task, workload.data)
    speedups = {}
    with tempfile.TemporaryDirectory(prefix="seed-batch-") as tmp:
        seconds(workload, data, 1, replace(cfg, steps=cfg.checkpoint_every), Path(tmp) / "warm")
        seconds(workload, data, 2, replace(cfg, steps=cfg.checkpoint_every), Path(tmp) / "warm")
        for size in sizes:
            alone, block = [], []
            for index in range(rounds):
                alone.append(seconds(workload, data, 1, cfg, Path(tmp) / f"a{size}{index}"))
                block.append(seconds(workload, data, size, cfg, Path(tmp) / f"b{size}{index}"))
            one = cfg.steps / statistics.median(alone)
            many = size * cfg.steps / statistics.median(block)
            speedups[size] = many / one
            print(
                f"{name:12s} S={size:4d}  one-seed {one:9.1f} seed-steps/s   block "
                f"{many:9.1f} seed-steps/s   speedup {speedups[size]:6.2f}x",
                flush=True,
            )
    return speedups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, S up to 32")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (2 CPU cores)")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--sizes", nargs="+", type=int, default=None)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    sizes = args.sizes or ([8, 32] if args.quick else [1, 8, 32, 128])
    rounds = 1 if args.quick else args.rounds
    print(f"torch {torch.__version__}, {args.threads} threads, device {args.device}; "
          f"{rounds} alternating round(s), median", flush=True)  # fmt: skip
    at_32 = {}
    for name in args.workloads:
        at_32[name] = measure(name, sizes, rounds, args.quick, args.device).get(32, float("nan"))
    figures = " ".join(f"{name}={value:.2f}" for name, value in at_32.items())
    targets = ", ".join(f"{TARGETS[name]:g}" for name in at_32)
    print(f"seed_batch_speedup_at_32 {figures} (targets >= {targets})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
