"""Training throughput of the default study's blocks in portable mode against unpinned, side by side.

Portable mode (``trainmap.portable``) pins ATen, MKL and oneDNN to the code paths any x86-64 CPU can
take, so that a seed gives the same bits on every CPU; unpinned, each library takes the fastest path
of this CPU. Each workload trains one block of seeds with ``trainmap.training.loop.train_block``
(the ``train`` rule's loop: checkpoints, trajectories and outputs written) in a fresh process per
measurement, since the pins are read once per process; the two modes run alternately (portable,
unpinned, portable, ...) and the table shows the median seeds x steps per second of each and their
ratio (portable / unpinned). Only ``train_block`` is timed, not the start of the process.

Workloads (config/config.yaml's train blocks with params.yaml settings, fewer steps, one thread as
the ``train`` rule runs):

* ``mlp``: sparse parity (n = 40, k = 3), MLP 40-128-2, SGD, batch 32, a block of 40 seeds (the
  kaiming, GradInit and AST / one-shot retraining blocks all train this model);
* ``repvgg`` / ``repvgg_plain``: 8x8 digits, widths 8-16-32-64, SGD momentum, cosine, batch 128,
  a block of 8 seeds.

Usage::

    .venv/bin/python bench/portable.py           # 3 rounds, ~5 min on 2 cores
    .venv/bin/python bench/portable.py --quick   # 1 round, fewer steps, ~1 min

Last line: ``portable_throughput_ratio mlp=... repvgg=... repvgg_plain=... (portable / unpinned)``.
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

from trainmap.portable import PORTABLE_ENV, apply_portable_mode

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
}  # fmt: skip


def child(name: str, steps: int, portable: bool) -> None:
    """In a fresh process: pin (or not) before torch's first operation, train one block, print its
    seconds as JSON."""
    apply_portable_mode(portable)
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


def measure(name: str, steps: int, portable: bool) -> dict:
    """One training in a fresh process; the unpinned one gets none of the pinned variables."""
    import os

    environ = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENV}
    command = [sys.executable, __file__, "--child", name, "--steps", str(steps),
               "--portable", str(int(portable))]  # fmt: skip
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
    parser.add_argument("--portable", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, bool(args.portable))
        return
    rounds = 1 if args.quick else args.rounds
    header = (
        f"{'workload':<13} {'seeds':>5} {'steps':>5} {'portable':>14} {'unpinned':>14} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    ratios = {}
    for name in args.workloads.split(","):
        _, _, _, _, _, size, steps, quick_steps = WORKLOADS[name]
        steps = quick_steps if args.quick else steps
        times: dict[bool, list[float]] = {True: [], False: []}
        capability = {}
        for _ in range(rounds):
            for portable in (True, False):
                result = measure(name, steps, portable)
                times[portable].append(result["seconds"])
                capability[portable] = result["capability"]
        rate = {mode: size * steps / statistics.median(times[mode]) for mode in times}
        ratios[name] = rate[True] / rate[False]
        print(f"{name:<13} {size:>5} {steps:>5} {rate[True]:>9.0f} s.s/s {rate[False]:>9.0f} s.s/s "
              f"{ratios[name]:>6.2f}   (ATen {capability[True]} vs {capability[False]})")  # fmt: skip
    figures = " ".join(f"{name}={ratio:.2f}" for name, ratio in ratios.items())
    print(f"portable_throughput_ratio {figures} (portable / unpinned)")


if __name__ == "__main__":
    main()
