"""Training throughput of the default study's blocks in portable mode against unpinned, side by side.

Portable mode (``trainmap.portable``) pins ATen, MKL, oneDNN, OpenBLAS and numpy to the code paths
of a level (``avx2``: any AVX2 x86-64 CPU, the default; ``baseline``: any x86-64 CPU), so that a
seed gives the same bits on every CPU of the level; unpinned, each library takes the fastest path
of this CPU. Each workload trains one block of seeds with ``trainmap.training.loop.train_block``
(the ``train`` rule's loop: checkpoints, trajectories and outputs written) in a fresh process per
measurement, since the pins are read once per process; the two modes run alternately (portable,
unpinned, portable, ...) and the table shows the median seeds x steps per second of each and their
ratios (each level / unpinned). Only ``train_block`` is timed, not the start of the process.

Workloads (config/config.yaml's train blocks with params.yaml settings, fewer steps, one thread as
the ``train`` rule runs):

* ``mlp``: sparse parity (n = 40, k = 3), MLP 40-128-2, SGD, batch 32, a block of 40 seeds (the
  kaiming, GradInit and AST / one-shot retraining blocks all train this model);
* ``repvgg`` / ``repvgg_plain``: 8x8 digits, widths 8-16-32-64, SGD momentum, cosine, batch 128,
  a block of 8 seeds;
* ``transformer_ln``: the paper's stabilised modular addition (``make paper``), a one-layer
  transformer with LayerNorm (d 128, 4 heads, MLP 512), AdamW, batch 256, one seed.

Usage::

    .venv/bin/python bench/portable.py           # 3 rounds, ~5 min on 2 cores
    .venv/bin/python bench/portable.py --quick   # 1 round, fewer steps, ~1 min

Last line: ``portable_throughput_ratio mlp:avx2=... mlp:baseline=... ... (portable / unpinned)``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stderr
from io import StringIO
from pathlib import Path

from trainmap.portable import LEVELS, apply_portable_mode

#: (task, data options, arch, model options, train settings, seeds per block, steps, quick steps)
WORKLOADS = {
    "mlp": ("sparse_parity", {"n_bits": 40, "k": 3, "n_train": 1000, "n_test": 100}, "mlp",
            {"hidden": [128]}, {"lr": 0.1, "weight_decay": 0.01, "batch_size": 32,
                                "checkpoint_every": 50, "resume_every": 2000}, 40, 400, 100),
    "repvgg": ("digits", {}, "repvgg", {"widths": [8, 16, 32, 64]},
               {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4, "batch_size": 128,
                "schedule": "cosine", "grad_clip": 1.0, "checkpoint_every": 5,
                "resume_every": 100}, 8, 30, 10),
    "repvgg_plain": ("digits", {}, "repvgg_plain", {"widths": [8, 16, 32, 64]},
                     {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4, "batch_size": 128,
                      "schedule": "cosine", "grad_clip": 1.0, "checkpoint_every": 5,
                      "resume_every": 100}, 8, 30, 10),
    # the paper's stabilised modular addition (make paper): one seed per job on a CPU
    "transformer_ln": ("modular_addition", {"p": 113, "train_frac": 0.3, "seed": 0},
                       "transformer_ln", {"d_model": 128, "n_heads": 4, "d_mlp": 512},
                       {"optimizer": "adamw", "lr": 0.001, "betas": [0.9, 0.98],
                        "weight_decay": 1.0, "batch_size": 256, "warmup_steps": 10,
                        "checkpoint_every": 50, "resume_every": 1000}, 1, 200, 50),
}  # fmt: skip


def child(name: str, steps: int, level: str) -> None:
    """In a fresh process: pin (or not) before torch's first operation, train one block, print its
    seconds as JSON."""
    apply_portable_mode(level if level != "0" else False)
    import torch

    from trainmap.data import make_task_data
    from trainmap.training.loop import TrainConfig, TrainPaths, build_cell_model, train_block

    torch.set_num_threads(1)
    task, data_options, arch, options, settings, size, _, _ = WORKLOADS[name]
    data = make_task_data(task, data_options)
    cfg = TrainConfig.from_dict({**settings, "steps": steps})
    seeds = list(range(size))
    models = [build_cell_model(arch, "kaiming", s, data.meta, options) for s in seeds]
    with tempfile.TemporaryDirectory() as directory, redirect_stderr(StringIO()):
        paths = [TrainPaths.in_directory(Path(directory) / f"seed{s}") for s in seeds]
        started = time.perf_counter()
        train_block(models, data, cfg, seeds, paths, resume_path=Path(directory) / "resume.pt",
                    progress=False, fingerprint=name)  # fmt: skip
        seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "capability": torch.backends.cpu.get_cpu_capability()}))


def measure(name: str, steps: int, level: str) -> dict:
    """One training in a fresh process at portable ``level`` ("0": unpinned, none of the pinned
    variables set)."""
    import os

    pinned = {name for level_env in LEVELS.values() for name in level_env}
    environ = {k: v for k, v in os.environ.items() if k not in pinned}
    command = [sys.executable, __file__, "--child", name, "--steps", str(steps),
               "--portable", level]  # fmt: skip
    result = subprocess.run(command, env=environ, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one round, fewer steps (~1 min)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--portable", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.portable)
        return
    rounds = 1 if args.quick else args.rounds
    modes = (*LEVELS, "0")
    header = (
        f"{'workload':<13} {'seeds':>5} {'steps':>5} "
        + " ".join(f"{'unpinned' if m == '0' else m:>14}" for m in modes)
        + "  ratios to unpinned"
    )
    print(header)
    print("-" * len(header))
    ratios = {}
    for name in args.workloads.split(","):
        _, _, _, _, _, size, steps, quick_steps = WORKLOADS[name]
        steps = quick_steps if args.quick else steps
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        for _ in range(rounds):
            for mode in modes:  # alternating, so drifts of the machine hit every mode alike
                times[mode].append(measure(name, steps, mode)["seconds"])
        rate = {mode: size * steps / statistics.median(times[mode]) for mode in modes}
        ratios[name] = {level: rate[level] / rate["0"] for level in LEVELS}
        print(f"{name:<13} {size:>5} {steps:>5} "
              + " ".join(f"{rate[m]:>8.0f} s.s/s" for m in modes) + "  "
              + " ".join(f"{level} {ratio:.2f}" for level, ratio in ratios[name].items()))  # fmt: skip
    figures = " ".join(f"{name}:{level}={ratio:.2f}" for name, by_level in ratios.items()
                       for level, ratio in by_level.items())  # fmt: skip
    print(f"portable_throughput_ratio {figures} (portable / unpinned)")


if __name__ == "__main__":
    main()
