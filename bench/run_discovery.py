"""How long finding a large run set takes, and what the recorder adds to a training step.

**Discovery.** ``python -m trainmap.dynamics`` and a config's ``external:`` sets start by finding
the runs below the paths given (:func:`trainmap.dynamics.__main__.find_runs`). Here: 1,000 run
directories with 200 checkpoint files each (empty ``step_<n>.pt`` files and an
``evaluation.csv``: discovery reads names, not contents) under one root, found and named; then
each run's checkpoints listed by step (:func:`trainmap.dynamics.runs.layouts.find_checkpoints`, what
reading a run starts with). Target: discovery under 2 s.

**Recorder overhead.** A plain PyTorch loop timed side by side with and without
``MetricRecorder.log(model, step, test_acc=...)`` at the default study's checkpoint interval
(``params.yaml``: sparse parity every 50 steps), each over the same steps in one process,
alternating blocks (best of 3 each). The model is sparse parity's MLP (40 inputs, ``hidden:
[128]``, 2 classes), batch 32, SGD.

Usage: ``.venv/bin/python bench/run_discovery.py [--runs 1000 --checkpoints 200]``;
``--quick``: the 1,000 runs with 20 checkpoint files each and 500 loop steps per block (the
discovery target is set for 200 files a run).
Last line: ``run_discovery discover_s=... list_s=... recorder_overhead=...``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainmap.recorder import MetricRecorder


def make_runs(root: Path, runs: int, checkpoints: int) -> None:
    for index in range(runs):
        run = root / f"lr{index % 4}" / f"seed{index}"
        run.mkdir(parents=True)
        for step in range(checkpoints):
            (run / f"step_{step * 10}.pt").touch()
        (run / "evaluation.csv").write_text("step,test_acc\n")


def loop_seconds(steps: int, every: int, recorder: MetricRecorder | None) -> float:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 128), nn.ReLU(), nn.Linear(128, 2))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 40), torch.randint(0, 2, (32,))
    started = time.perf_counter()
    for step in range(1, steps + 1):
        optimiser.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimiser.step()
        if recorder is not None and step % every == 0:
            recorder.log(model, step, test_acc=0.5)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--checkpoints", type=int, help="files per run (default 200, quick 20)")
    parser.add_argument("--steps", type=int, help="steps per timed block (default 2000, quick 500)")
    parser.add_argument("--every", type=int, default=50, help="checkpoint interval")
    parser.add_argument("--quick", action="store_true", help="20 files a run, 500 steps a block")
    args = parser.parse_args()
    import torch

    from trainmap.dynamics.__main__ import find_runs
    from trainmap.dynamics.runs.layouts import find_checkpoints
    from trainmap.recorder import MetricRecorder

    args.checkpoints = args.checkpoints or (20 if args.quick else 200)
    args.steps = args.steps or (500 if args.quick else 2000)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "runs"
        started = time.perf_counter()
        make_runs(root, args.runs, args.checkpoints)
        print(f"made {args.runs} runs x {args.checkpoints} checkpoint files in "
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip
        started = time.perf_counter()
        found = find_runs([root])
        discover = time.perf_counter() - started
        assert len(found) == args.runs, len(found)
        started = time.perf_counter()
        listed = sum(len(find_checkpoints(path)) for path in found.values())
        listing = time.perf_counter() - started
        assert listed == args.runs * args.checkpoints
        target = "target < 2 s" if args.checkpoints >= 200 else "target < 2 s at 200 files a run"
        print(f"discovery: {len(found)} runs in {discover:.2f} s ({target}); their "
              f"{listed} checkpoints listed by step in {listing:.2f} s")  # fmt: skip
        plain, recorded = [], []
        for block in range(3):  # alternating, the same work each time
            plain.append(loop_seconds(args.steps, args.every, None))
            recorder = MetricRecorder(Path(scratch) / f"recorded{block}")
            recorded.append(loop_seconds(args.steps, args.every, recorder))
        base, with_recorder = min(plain), min(recorded)
        overhead = with_recorder / base - 1
        print(f"loop of {args.steps} steps, log every {args.every}: plain {base:.2f} s, with the "
              f"recorder {with_recorder:.2f} s (best of 3 each): +{overhead:.1%} per step")  # fmt: skip
    print(f"run_discovery discover_s={discover:.2f} list_s={listing:.2f} "
          f"recorder_overhead={overhead:.3f} (runs={args.runs} checkpoints={args.checkpoints} "
          f"steps={args.steps})")  # fmt: skip


if __name__ == "__main__":
    main()
