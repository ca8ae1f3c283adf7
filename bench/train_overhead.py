"""Overhead of trainmap's training loop over a bare PyTorch loop, measured side by side.

Two loops train the same seeded initial model on the same data with the same optimiser, batch size
and batch order, alternately, for a few rounds; the table shows the median steps/s of each and
their ratio (trainmap / bare; target >= 0.95).

trainmap
    ``train_model(..., on_checkpoint=run.log_metrics)`` inside ``rule_run``, exactly as the workflow's
    ``train_job`` calls it: MLflow logging to a SQLite store in a temporary directory, the tqdm bar
    written to a log file (the workflow redirects stderr into the job's log), trajectory capture.
bare
    randperm batches (same generator seed, drop-last, as ``BatchSampler``), forward, cross-entropy,
    ``zero_grad``, ``backward``, ``step``, and the test-set loss and accuracy at the same checkpoint
    steps (eval mode, no_grad): the one thing any training loop of a study of convergence must
    compute, since the convergence step is read off it. No trajectory, no running train
    loss/accuracy, no resume files, no logging, no LR schedule (the digits workload's cosine
    schedule only changes the LR value, not the work per step).

What the timings include and exclude (the same for both loops):

* Excluded, one-time set-up: data generation, model build and init (``build_cell_model``; each
  round copies the initial model), MLflow client creation, ``init_tracking`` and ``create_run``
  (``rule_run`` is entered before the clock starts). Constructing the first optimizer in a process
  lazily imports ``torch._dynamo`` (~2 s); an untimed warm-up (one ``torch.optim.SGD``, then one
  short run of each loop) pays that and other first-call costs before any timing.
* Included in both: optimizer construction (cheap once warm), every training step.
* Included for trainmap only, since they are part of its loop: the LR scheduler, per-step loss and
  accuracy bookkeeping, test-set evaluation and trajectory capture at every checkpoint, resume
  files every ``resume_every`` steps, writing the outputs at the end (trajectory, model, history,
  summary) and the metric logging (``run.log_metrics`` per checkpoint plus the final
  ``run.flush()`` that sends the buffered metrics to the store, timed explicitly instead of
  happening untimed when ``rule_run`` exits).

Usage::

    .venv/bin/python bench/train_overhead.py            # 5 rounds, ~2.5 min on one core
    .venv/bin/python bench/train_overhead.py --quick    # fewer steps, ~30 s
    .venv/bin/python bench/train_overhead.py --profile  # + cProfile of both loops, diffed

The last line is machine-readable, e.g.
``train_overhead_ratio sparse_parity=0.97 digits=0.99 (target >= 0.95)``.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from contextlib import redirect_stderr
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from trainmap.data import TaskData
    from trainmap.training.loop import TrainConfig

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

TARGET = 0.95


@dataclass(frozen=True)
class Workload:
    """One grid cell's training set-up (values as in params.yaml, steps shortened)."""

    name: str
    arch: str
    data: dict[str, Any]
    model: dict[str, Any]
    train: dict[str, Any]
    steps: int
    quick_steps: int


WORKLOADS = (
    Workload(
        name="sparse_parity",
        arch="mlp",  # 40-128-2
        data={
            "kind": "sparse_parity",
            "n_bits": 40,
            "k": 3,
            "n_train": 1000,
            "n_test": 100,
            "seed": 0,
        },
        model={"hidden": [128]},
        train={
            "optimizer": "sgd",
            "lr": 0.1,
            "momentum": 0.0,
            "weight_decay": 0.01,
            "batch_size": 32,
            "schedule": "constant",
            "checkpoint_every": 50,
            "resume_every": 2000,
        },
        steps=6000,
        quick_steps=1500,
    ),
    Workload(
        name="digits",
        arch="vgg_bn",
        data={"kind": "digits", "test_frac": 0.2, "seed": 0},
        model={},
        train={
            "optimizer": "sgd",
            "lr": 0.05,
            "momentum": 0.9,
            "weight_decay": 0.0001,
            "batch_size": 128,
            "schedule": "cosine",
            "checkpoint_every": 10,
            "resume_every": 200,
        },
        steps=300,
        quick_steps=60,
    ),
)


class Bench:
    """Data, initial model and MLflow set-up of one workload, built once (untimed)."""

    def __init__(self, workload: Workload, steps: int, workdir: Path, config: dict) -> None:
        from trainmap.data import make_task_data
        from trainmap.grid import Cell
        from trainmap.training.loop import TrainConfig, build_cell_model

        self.workload = workload
        self.cell = Cell(workload.name, workload.arch, "kaiming", 0)
        options = {key: value for key, value in workload.data.items() if key != "kind"}
        self.data: TaskData = make_task_data(workload.data["kind"], options)
        self.cfg = TrainConfig.from_dict({**workload.train, "steps": steps})
        self.initial = build_cell_model(
            self.cell.arch, self.cell.method, self.cell.seed, self.data.meta, workload.model
        )
        self.workdir = workdir
        self.config = {
            **config,
            "data": {workload.name: workload.data},
            "model": {workload.name: {workload.arch: workload.model}},
            "train": {workload.name: {**workload.train, "steps": steps}},
        }
        self.runs = 0

    def fresh_model(self) -> nn.Module:
        return copy.deepcopy(self.initial)

    def time_trainmap(
        self,
        model: nn.Module,
        cfg: TrainConfig | None = None,
        profiler: cProfile.Profile | None = None,
    ) -> float:
        """Seconds for ``train_model`` + the final metric flush, as ``train_job`` runs it."""
        from trainmap.grid import cell_hash
        from trainmap.tracking import rule_run, tracking_settings
        from trainmap.training.loop import TrainPaths, train_model

        cfg = cfg or self.cfg
        self.runs += 1
        out_dir = self.workdir / f"{self.workload.name}-run{self.runs}"
        out_dir.mkdir(parents=True)
        paths = TrainPaths.in_directory(out_dir)
        params = {"model": self.workload.model, "train": asdict(cfg), "threads": 1}
        fingerprint = cell_hash(self.config, self.cell)
        with (
            rule_run(
                tracking_settings(self.config),
                "train",
                cell=self.cell,
                params=params,
                config_hash=fingerprint,
            ) as run,
            open(out_dir / "train.log", "w", buffering=1) as log,
            redirect_stderr(log),
        ):
            if profiler is not None:
                profiler.enable()
            started = time.perf_counter()
            train_model(
                model,
                self.data,
                cfg,
                self.cell.seed,
                paths,
                on_checkpoint=run.log_metrics,
                progress=True,
                fingerprint=fingerprint,
                description=self.cell.id,
                model_info={
                    "arch": self.cell.arch,
                    "method": self.cell.method,
                    "seed": self.cell.seed,
                    "model_options": self.workload.model,
                    "meta": self.data.meta,
                },
            )
            run.flush()
            elapsed = time.perf_counter() - started
            if profiler is not None:
                profiler.disable()
        return elapsed

    def time_bare(
        self,
        model: nn.Module,
        cfg: TrainConfig | None = None,
        profiler: cProfile.Profile | None = None,
    ) -> float:
        """Seconds for a plain PyTorch loop over the same batches."""
        cfg = cfg or self.cfg
        x, y = self.data.x_train, self.data.y_train
        if profiler is not None:
            profiler.enable()
        started = time.perf_counter()
        bare_loop(model, (x, y), (self.data.x_test, self.data.y_test), cfg, self.cell.seed)
        elapsed = time.perf_counter() - started
        if profiler is not None:
            profiler.disable()
        return elapsed


def test_metrics(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Test loss and accuracy in eval mode, as a plain loop computes them at a checkpoint."""
    import torch
    import torch.nn.functional as F

    model.eval()
    with torch.no_grad():
        logits = model(x)
        metrics = F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()
    model.train()
    return metrics


def bare_loop(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    cfg: TrainConfig,
    seed: int,
) -> list[tuple[float, float]]:
    """The plain loop: same optimiser and batch order as ``train_model``, and the test metrics at
    the same checkpoint steps; nothing else."""
    import torch
    import torch.nn.functional as F

    from trainmap.training.loop import derive_seed

    x, y = train
    optimizer = torch.optim.SGD(
        model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    generator = torch.Generator().manual_seed(derive_seed(seed, "batches"))
    n, size = len(x), min(cfg.batch_size, len(x))
    model.train()
    step = 0
    curve = [test_metrics(model, *test)]
    while step < cfg.steps:
        order = torch.randperm(n, generator=generator)
        for start in range(0, n - size + 1, size):  # drop-last, like BatchSampler
            if step == cfg.steps:
                break
            indices = order[start : start + size]
            loss = F.cross_entropy(model(x[indices]), y[indices])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                curve.append(test_metrics(model, *test))
    return curve


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def warm_up() -> None:
    """Pay lazy imports (torch._dynamo on the first optimizer) before anything is timed."""
    import torch
    from torch import nn

    torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)


def measure(bench: Bench, rounds: int) -> dict[str, Any]:
    """Warm up both loops, then alternate them ``rounds`` times; medians of the timings."""
    short = replace(bench.cfg, steps=min(bench.cfg.steps, 2 * bench.cfg.checkpoint_every))
    bench.time_bare(bench.fresh_model(), short)
    bench.time_trainmap(bench.fresh_model(), short)
    times: dict[str, list[float]] = {"trainmap": [], "bare": []}
    identical = True
    for index in range(rounds):
        # Alternate which loop goes first so drift (thermal, other load) hits both alike.
        order = ("bare", "trainmap") if index % 2 == 0 else ("trainmap", "bare")
        models = {}
        for loop in order:
            models[loop] = bench.fresh_model()
            timer = bench.time_bare if loop == "bare" else bench.time_trainmap
            times[loop].append(timer(models[loop]))
        identical = identical and same_weights(models["bare"], models["trainmap"])
    median = {loop: statistics.median(values) for loop, values in times.items()}
    steps = bench.cfg.steps
    return {
        "times": times,
        "median": median,
        "steps_per_s": {loop: steps / value for loop, value in median.items()},
        "ratio": median["bare"] / median["trainmap"],
        "round_ratios": [b / t for b, t in zip(times["bare"], times["trainmap"], strict=True)],
        "identical": identical,
    }


def profile_difference(bench: Bench, top: int) -> str:
    """cProfile one run of each loop (timed region only): where trainmap spends more time.

    Two listings: functions by own-time difference (trainmap minus bare; these add up to the total
    extra), and functions only trainmap calls, by cumulative time. cProfile adds a fixed cost per
    Python call, so absolute numbers are inflated, most for the small MLP; the ranking still holds.
    """
    profiles = {}
    for loop in ("bare", "trainmap"):
        profiler = cProfile.Profile()
        timer = bench.time_bare if loop == "bare" else bench.time_trainmap
        timer(bench.fresh_model(), profiler=profiler)
        profiles[loop] = pstats.Stats(profiler).strip_dirs().stats
    total = {loop: sum(row[2] for row in stats.values()) for loop, stats in profiles.items()}
    empty = (0, 0, 0.0, 0.0, {})
    rows = []
    for key in profiles["bare"].keys() | profiles["trainmap"].keys():
        bare, mine = profiles["bare"].get(key, empty), profiles["trainmap"].get(key, empty)
        rows.append((mine[2] - bare[2], mine[3], mine[1], bare[1], key))

    def listing(title: str, chosen: list[tuple]) -> list[str]:
        lines = [title, f"{'d own s':>9} {'cum s':>8} {'calls':>7} {'bare':>7}  function"]
        for d_own, cum, calls_mine, calls_bare, (file, line, func) in chosen[:top]:
            lines.append(
                f"{d_own:>9.3f} {cum:>8.3f} {calls_mine:>7} {calls_bare:>7}  {file}:{line}({func})"
            )
        return lines

    by_own = sorted(rows, key=lambda row: row[0], reverse=True)
    only_mine = sorted(
        (row for row in rows if row[3] == 0 and row[4][2] != "train_model"),
        key=lambda row: row[1],
        reverse=True,
    )
    lines = [
        f"profiled: bare {total['bare']:.3f} s, trainmap {total['trainmap']:.3f} s "
        f"(extra {total['trainmap'] - total['bare']:+.3f} s over {bench.cfg.steps} steps)",
        *listing("-- by own time, trainmap minus bare", by_own),
        *listing(
            "-- called only by trainmap, by cumulative time (train_model, the loop itself, "
            "left out; LambdaLR's step wrapper includes optimizer.step)",
            only_mine,
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="steps/s of trainmap's train loop (trajectory capture + MLflow logging on) "
        "vs a bare PyTorch loop on the same model, data, optimiser and batch order",
    )
    parser.add_argument("--quick", action="store_true", help="fewer steps (a quick smoke run)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument(
        "--workload",
        choices=[w.name for w in WORKLOADS],
        action="append",
        help="only this workload (repeatable; default: all)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile one run of each loop per workload; list where trainmap spends more",
    )
    parser.add_argument("--top", type=int, default=25, help="rows per profile listing")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    import torch

    from trainmap.tracking import init_tracking

    torch.set_num_threads(1)  # one Snakemake job gets one thread
    warm_up()
    load_before = os.getloadavg()[0]
    selected = [w for w in WORKLOADS if not args.workload or w.name in args.workload]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="train_overhead-") as tmp:
        workdir = Path(tmp)
        uri = f"sqlite:///{workdir / 'mlflow.db'}"
        config = {"mlflow": {"tracking_uri": uri, "experiment": "train_overhead"}}
        init_tracking(uri, "train_overhead")  # schema creation and migrations: one-time, untimed
        for workload in selected:
            steps = workload.quick_steps if args.quick else workload.steps
            bench = Bench(workload, steps, workdir, config)
            print(
                f"measuring {workload.name} ({workload.arch}, {steps} steps, {args.rounds} rounds)",
                file=sys.stderr,
                flush=True,
            )
            results[workload.name] = measure(bench, args.rounds)
            results[workload.name]["steps"] = steps
            results[workload.name]["cfg"] = bench.cfg
            if args.profile:
                results[workload.name]["profile"] = profile_difference(bench, args.top)

    header = (
        f"{'workload':<14} {'loop':<9} {'steps':>6} {'ckpt':>5} {'median s':>9} "
        f"{'steps/s':>9} {'us/step':>8}  rounds (s)"
    )
    load_after, cores = os.getloadavg()[0], os.cpu_count() or 1
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
        f"load average {load_before:.2f} before, {load_after:.2f} after, {cores} cores"
    )
    if max(load_before, load_after) > cores - 0.5:
        print("warning: the machine was busy; other processes skew timings (rerun when idle)")
    print(header)
    print("-" * len(header))
    for name, result in results.items():
        for loop in ("bare", "trainmap"):
            median = result["median"][loop]
            rounds = " ".join(f"{value:.3f}" for value in result["times"][loop])
            print(
                f"{name:<14} {loop:<9} {result['steps']:>6} {result['cfg'].checkpoint_every:>5} "
                f"{median:>9.3f} {result['steps_per_s'][loop]:>9.1f} "
                f"{1e6 * median / result['steps']:>8.1f}  {rounds}"
            )
        extra_us = 1e6 * (result["median"]["trainmap"] - result["median"]["bare"]) / result["steps"]
        weights = "identical" if result["identical"] else "differ"
        if not result["identical"] and result["cfg"].schedule != "constant":
            weights += f" (expected: {result['cfg'].schedule} LR schedule only in trainmap)"
        paired = " ".join(f"{value:.3f}" for value in result["round_ratios"])
        print(
            f"{name:<14} ratio {result['ratio']:.3f} (per round: {paired}); trainmap overhead "
            f"{extra_us:+.1f} us/step; final weights {weights}"
        )
    for name, result in results.items():
        if "profile" in result:
            print(f"\n== cProfile, trainmap minus bare: {name}\n{result['profile']}")
    ratios = " ".join(f"{name}={result['ratio']:.2f}" for name, result in results.items())
    below = [name for name, result in results.items() if result["ratio"] < TARGET]
    if below:
        print(f"below target {TARGET}: {', '.join(below)} (profile with --profile)")
    print(f"train_overhead_ratio {ratios} (target >= {TARGET})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
