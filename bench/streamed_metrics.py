"""Streamed metrics against the separate metrics job, ResNet-18's metric cost, the loop's memory and
the archive's bytes, each measured side by side in one run.

Four sections (``--section``, default all):

``share``
    Blocks of the default study's settings (params.yaml extended by config/config.yaml) and
    MNIST-5k: sparse parity MLP (40 seeds), digits RepVGG (8 seeds, widths 8-16-32-64), MNIST-5k
    MLP (8 seeds), trained by ``train_block`` as the ``train`` rule does (archive: the default, every
    checkpoint in float32). Per block: the training wall time, the seconds inside it on the
    streamed metrics of every convention (``metrics_s``, target <= 10 % of the wall time) and on
    archive writes (``archive_s``), and, side by side, the old way: a separate job running
    ``collect_run_metrics`` over each run's whole trajectory (read back with ``read_archive``,
    timed apart) in one convention (``analysis.metrics``), summed over the block's runs.
``resnet18``
    ResNet-18 (CIFAR-100 shape, 11.2 M parameters), S = 1 and 4 seeds stacked: seconds per
    checkpoint and seed of ``StreamedMetrics(...).rows`` (every convention) and of each
    convention's ``trajectory_metrics`` alone, against the bound any all-matrix metric code pays:
    ``torch.linalg.svdvals`` (float64) of every matrix the ``extended`` convention counts (conv
    kernels as (out, in * kh * kw), Linear weights); also ``singular_values`` (the Gram route) on
    the same matrices. Median of alternating rounds.
``memory``
    Peak RSS and resume-file bytes of a training block
    (tests/unit/dynamics/metrics/test_streamed_metrics.py's ``MEMORY_PROBE``: a ResNet-18-sized model,
    2 seeds, Adam, a checkpoint every step), each count of checkpoints in a fresh process, as
    ratios to 20 checkpoints (flat: no checkpoint is held).
``bytes``
    Bytes per run of each archive policy (``ArchivePolicy.bytes_per_run``; no training) for the
    default study's models, MNIST-5k's MLP, ResNet-18 on CIFAR-100 (config/paper/cifar100.yaml)
    and the modular-addition transformer (config/paper/modular_addition.yaml): MB per run and GB
    per 40 seeds.

Usage::

    .venv/bin/python bench/streamed_metrics.py                     # full steps, ~20 min on 2 cores
    .venv/bin/python bench/streamed_metrics.py --quick             # a tenth of the steps, ~4 min
    .venv/bin/python bench/streamed_metrics.py --section resnet18 bytes

Last line: ``streamed_metrics_share sparse_parity=... digits=... mnist_5k=... (target <= 0.10)``
(share of the training job's wall time spent on the streamed metrics; ``nan`` where ``share`` was
not run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import redirect_stderr
from dataclasses import dataclass, replace
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING

from trainmap.dynamics.metrics.columns import CONVENTIONS

if TYPE_CHECKING:
    import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("share", "resnet18", "memory", "bytes")
RESNET18_META = {"input_kind": "image", "input_shape": [3, 32, 32], "num_classes": 100}
RESNET18_OPTIONS = {"widths": [64, 128, 256, 512], "blocks_per_stage": [2, 2, 2, 2]}
#: the archive policies compared: each one's ArchivePolicy arguments (schedule, dtype)
POLICIES = {
    "all f32": ("all", "float32"),
    "all bf16": ("all", "bfloat16"),
    "every 10 f32": ("every 10", "float32"),
    "log 20 bf16": ("log 20", "bfloat16"),
    "none": ("none", "float32"),
}
SHARE_TARGET = 0.10


def default_study() -> dict:
    """params.yaml extended by config/config.yaml, validated: what ``make run`` trains."""
    from trainmap.grid import load_config

    return load_config(REPO_ROOT / "params.yaml", REPO_ROOT / "config/config.yaml",
                       check_paths_from=REPO_ROOT)  # fmt: skip


def paper_setting(name: str) -> dict:
    """params.yaml extended by config/paper/<name>.yaml (merged as Snakemake does; not validated,
    since its data files need not be here)."""
    from trainmap.grid import merge_config, read_config_file

    return merge_config(read_config_file(REPO_ROOT / "params.yaml"),
                        read_config_file(REPO_ROOT / f"config/paper/{name}.yaml"))  # fmt: skip


def task_data(config: dict, task: str):
    from trainmap.data import make_task_data
    from trainmap.grid import data_settings

    settings = dict(data_settings(config, task))
    return make_task_data(settings.pop("kind"), settings)


# --- section share: streamed metrics vs the separate metrics job ------------------------------------


@dataclass(frozen=True)
class Block:
    task: str
    arch: str
    seeds: int


BLOCKS = (Block("sparse_parity", "mlp", 40), Block("digits", "repvgg", 8),
          Block("mnist_5k", "mlp", 8))  # fmt: skip


def train_one_block(config: dict, block: Block, quick: bool, root: Path) -> dict:
    """Train ``block`` as the ``train`` rule does, then time the old metrics job on its archive."""
    import pandas as pd

    from trainmap.dynamics.metrics.weights import collect_run_metrics
    from trainmap.grid import model_settings, train_settings
    from trainmap.models import build_model
    from trainmap.models.repvgg import RepVGG, deploy_trajectory
    from trainmap.training.archive import read_archive
    from trainmap.training.loop import TrainConfig, TrainPaths, build_cell_model, train_block

    data = task_data(config, block.task)
    options = dict(model_settings(config, block.task, block.arch))
    cfg = TrainConfig.from_dict(dict(train_settings(config, block.task)))
    if quick:  # a tenth of the steps, at least ten checkpoints
        cfg = replace(cfg, steps=max(cfg.steps // 10, 10 * cfg.checkpoint_every))
    seeds = list(range(block.seeds))
    models = [build_cell_model(block.arch, "kaiming", s, data.meta, options) for s in seeds]
    paths = [TrainPaths.in_directory(root / f"seed{s}") for s in seeds]
    infos = [{"arch": block.arch, "method": "kaiming", "seed": s, "model_options": options,
              "meta": data.meta} for s in seeds]  # fmt: skip
    with redirect_stderr(StringIO()):
        summary = train_block(models, data, cfg, seeds, paths, resume_path=root / "resume.pt",
                              progress=False, model_info=infos)[0]  # fmt: skip
    convention = config["analysis"]["metrics"]
    structure = build_model(block.arch, data.meta, **options)
    read_s = old_s = deploy_s = 0.0
    archive_bytes = 0
    for seed_paths in paths:
        run_dir = seed_paths.archive.parent
        archive_bytes += sum(f.stat().st_size for f in seed_paths.archive.iterdir())
        history = pd.read_csv(seed_paths.history)
        started = time.perf_counter()
        trajectory = read_archive(run_dir)
        read_s += time.perf_counter() - started
        started = time.perf_counter()
        collect_run_metrics(trajectory, structure, history, convention)
        old_s += time.perf_counter() - started
        if isinstance(structure, RepVGG):  # analysis.repvgg_weights: deploy, from the archive
            started = time.perf_counter()
            fused, deploy = deploy_trajectory(trajectory["state"], structure)
            collect_run_metrics({"step": trajectory["step"], "state": fused}, deploy, history,
                                convention)  # fmt: skip
            deploy_s += time.perf_counter() - started
    return {
        "checkpoints": len(cfg.checkpoint_steps),
        "steps": cfg.steps,
        "wall_s": summary["wall_time_s"],
        "metrics_s": summary["metrics_s"],
        "archive_s": summary["archive_s"],
        "old_s": old_s,
        "read_s": read_s,
        "deploy_s": deploy_s,
        "archive_mb_per_run": archive_bytes / len(paths) / 1e6,
        "convention": convention,
    }


def section_share(quick: bool) -> dict[str, float]:
    config = default_study()
    print("\n== share: streamed metrics (every convention, in the loop) vs the separate metrics "
          "job (one convention, after training), of the training job's wall time", flush=True)  # fmt: skip
    header = (f"{'block':22}{'steps':>6}{'ckpts':>6}{'train s':>9}{'metrics s':>10}"
              f"{'archive s':>10}{'share':>7}{'old s':>8}{'old share':>10}{'read s':>8}"
              f"{'old/streamed':>13}{'MB/run':>8}")  # fmt: skip
    print(header, flush=True)
    shares, notes = {}, []
    with tempfile.TemporaryDirectory(prefix="streamed-metrics-") as tmp:
        for block in BLOCKS:
            label = f"{block.task} {block.arch} x{block.seeds}"
            r = train_one_block(config, block, quick, Path(tmp) / block.task)
            shares[block.task] = r["metrics_s"] / r["wall_s"]
            print(f"{label:22}{r['steps']:>6}{r['checkpoints']:>6}{r['wall_s']:>9.2f}"
                  f"{r['metrics_s']:>10.2f}{r['archive_s']:>10.2f}{shares[block.task]:>7.1%}"
                  f"{r['old_s']:>8.2f}{r['old_s'] / r['wall_s']:>10.1%}{r['read_s']:>8.2f}"
                  f"{r['old_s'] / r['metrics_s']:>13.2f}{r['archive_mb_per_run']:>8.2f}",
                  flush=True)  # fmt: skip
            if r["deploy_s"]:
                notes.append(f"  {label}: deploy form (fuse + {r['convention']}) from the archive "
                             f"{r['deploy_s']:.2f} s ({r['deploy_s'] / r['wall_s']:.1%} of "
                             "training): what collect_metrics still computes under "
                             "analysis.repvgg_weights: deploy, since a full archive streams only "
                             "the train form")  # fmt: skip
    convention = config["analysis"]["metrics"]
    print(f"(share = metrics_s / train s, target <= {SHARE_TARGET:.0%}; old = collect_run_metrics "
          f"of every run's whole trajectory, convention {convention}, summed over the block; "
          "read s = read_archive; old/streamed = old s / metrics s; MB/run: the archive on disk)")  # fmt: skip
    for note in notes:
        print(note)
    return shares


# --- section resnet18: per-checkpoint cost against the svdvals bound --------------------------------


def stacked_resnet18(size: int) -> tuple[dict[str, torch.Tensor], torch.nn.Module]:
    """``size`` seeds of ResNet-18 (CIFAR-100 shape) stacked: ``{name: [S, ...]}``."""
    import torch

    from trainmap.training.loop import build_cell_model

    models = [build_cell_model("resnet_bn", "kaiming", s, RESNET18_META, RESNET18_OPTIONS)
              for s in range(size)]  # fmt: skip
    states = [m.state_dict() for m in models]
    return {k: torch.stack([s[k] for s in states]) for k in states[0]}, models[0]


def extended_matrices(state: dict[str, torch.Tensor], model: torch.nn.Module) -> list[torch.Tensor]:
    """Every matrix the ``extended`` convention counts, ``[S, rows, cols]`` in float64 (a conv
    kernel as (out, in * kh * kw))."""
    import torch

    from trainmap.dynamics.metrics.weights import layout_of_model

    matrices = []
    for matrix in layout_of_model(model, "extended").matrices:
        tensor = state[matrix.name].to(torch.float64)
        tensor = tensor if matrix.rows is None else tensor[:, matrix.rows]
        matrices.append(tensor.reshape(tensor.shape[0], tensor.shape[1], -1).contiguous())
    return matrices


def resnet18_jobs(size: int) -> tuple[dict[str, Callable[[], object]], dict[str, int]]:
    """What is timed on ``size`` stacked ResNet-18 seeds, by name; the matrices each convention
    counts."""
    import torch

    from trainmap.dynamics.metrics.streamed import StreamedMetrics
    from trainmap.dynamics.metrics.weights import (
        layout_of_model,
        singular_values,
        trajectory_metrics,
    )

    state, model = stacked_resnet18(size)
    streamed = StreamedMetrics(model, deploy=False)
    layouts = {c: layout_of_model(model, c) for c in CONVENTIONS}
    matrices = extended_matrices(state, model)
    jobs = {
        "streamed, every convention": lambda: streamed.rows(state, 0),
        **{f"trajectory_metrics {c}": (lambda c=c: trajectory_metrics(state, layouts[c], c))
           for c in CONVENTIONS},
        "svdvals bound (extended)": lambda: [torch.linalg.svdvals(m) for m in matrices],
        "singular_values (Gram)": lambda: [singular_values(m) for m in matrices],
    }  # fmt: skip
    return jobs, {c: len(layouts[c].matrices) for c in CONVENTIONS}


def section_resnet18(quick: bool) -> None:
    rounds = 1 if quick else 3
    sizes = (1, 4)
    n_params = sum(p.numel() for p in stacked_resnet18(1)[1].parameters())
    print(f"\n== resnet18: ResNet-18 (CIFAR-100 shape, {n_params / 1e6:.1f} M parameters), seconds "
          f"per checkpoint per seed, median of {rounds} alternating round(s)", flush=True)  # fmt: skip
    seconds: dict[str, dict[int, float]] = {}
    counts: dict[str, int] = {}
    for size in sizes:
        jobs, counts = resnet18_jobs(size)
        if size == sizes[0]:  # warm-up: first-call costs of each kernel
            for job in jobs.values():
                job()
        times: dict[str, list[float]] = {name: [] for name in jobs}
        names = list(jobs)
        for index in range(rounds):
            order = names if index % 2 == 0 else names[::-1]
            for name in order:
                started = time.perf_counter()
                jobs[name]()
                times[name].append(time.perf_counter() - started)
        for name in names:
            seconds.setdefault(name, {})[size] = statistics.median(times[name]) / size
        print(f"  S={size} done", flush=True)
    bound = "svdvals bound (extended)"
    print(f"{'':36}" + "".join(f"{f's/ckpt/seed S={s}':>17}" for s in sizes)
          + "".join(f"{f'/bound S={s}':>12}" for s in sizes))  # fmt: skip
    for name, by_size in seconds.items():
        print(f"{name:36}" + "".join(f"{by_size[s]:>17.3f}" for s in sizes)
              + "".join(f"{by_size[s] / seconds[bound][s]:>12.2f}" for s in sizes))  # fmt: skip
    print(f"(matrices counted: {', '.join(f'{c} {n}' for c, n in counts.items())}; the bound: "
          "svdvals in float64 of every extended matrix, the least the old all-matrix metrics "
          "computed; /bound < 1: cheaper than that bound)")  # fmt: skip


# --- section memory: peak RSS and resume bytes against the checkpoint count -------------------------


def memory_probe_source() -> str:
    """``MEMORY_PROBE`` of tests/unit/dynamics/metrics/test_streamed_metrics.py (the test's own probe,
    not a copy)."""
    path = REPO_ROOT / "tests" / "unit" / "dynamics" / "test_streamed_metrics.py"
    spec = importlib.util.spec_from_file_location("_streamed_metrics_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MEMORY_PROBE


def section_memory(quick: bool) -> None:
    counts = (20, 100) if quick else (20, 100, 200)
    print("\n== memory: a ResNet-18-sized block (11.2 M parameters, 2 seeds, Adam, a checkpoint "
          "every step, archive 'log 4'), a fresh process per count", flush=True)  # fmt: skip
    measured = {}
    with tempfile.TemporaryDirectory(prefix="streamed-memory-") as tmp:
        probe = Path(tmp) / "probe.py"
        probe.write_text(memory_probe_source())
        for count in counts:
            started = time.perf_counter()
            done = subprocess.run([sys.executable, str(probe), str(count), str(Path(tmp) / str(count))],
                                  capture_output=True, text=True, cwd=REPO_ROOT)  # fmt: skip
            if done.returncode != 0:
                print(f"  {count} checkpoints: probe failed\n{done.stderr[-2000:]}")
                return
            measured[count] = json.loads(done.stdout.strip().splitlines()[-1])
            measured[count]["wall_s"] = time.perf_counter() - started
    first = measured[counts[0]]
    print(f"{'checkpoints':>12}{'peak MB':>10}{'resume MB':>11}{'peak ratio':>12}"
          f"{'resume ratio':>14}{'wall s':>8}")  # fmt: skip
    for count, m in measured.items():
        print(f"{count:>12}{m['peak_mb']:>10.1f}{m['resume_bytes'] / 1e6:>11.2f}"
              f"{m['peak_mb'] / first['peak_mb']:>12.3f}"
              f"{m['resume_bytes'] / first['resume_bytes']:>14.4f}{m['wall_s']:>8.1f}")  # fmt: skip
    print(
        f"(ratios to {counts[0]} checkpoints; holding every checkpoint would add 45 MB per seed "
        "and checkpoint)"
    )


# --- section bytes: archive bytes per run and policy ------------------------------------------------


def section_bytes() -> None:
    from trainmap.grid import model_settings, train_settings
    from trainmap.models import build_model
    from trainmap.training.archive import ArchivePolicy, checkpoint_steps

    policies = {name: ArchivePolicy(*arguments) for name, arguments in POLICIES.items()}
    study = default_study()
    cifar = paper_setting("cifar100")
    modular = paper_setting("modular_addition")
    rows = []
    for label, config, task, arch, meta in (
        ("sparse_parity mlp", study, "sparse_parity", "mlp", None),
        ("digits repvgg 8-64", study, "digits", "repvgg", None),
        ("mnist_5k mlp 800", study, "mnist_5k", "mlp", None),
        ("cifar100 resnet18", cifar, "cifar100", "resnet_bn", RESNET18_META),
        ("modular_add transformer", modular, "modular_addition", "transformer", None),
    ):
        meta = meta or task_data(config, task).meta
        model = build_model(arch, meta, **model_settings(config, task, arch))
        elements = sum(v.numel() for v in model.state_dict().values() if v.is_floating_point())
        train = train_settings(config, task)
        n = len(checkpoint_steps(int(train["steps"]), int(train["checkpoint_every"])))
        rows.append((label, elements, n))
    print("\n== bytes: archive bytes per run (ArchivePolicy.bytes_per_run; safetensors adds a few "
          "kB of header per file)", flush=True)  # fmt: skip
    head = f"{'model':25}{'floats':>11}{'ckpts':>6}"
    print("MB per run (kept checkpoints)")
    print(head + "".join(f"{name:>17}" for name in POLICIES))
    for label, elements, n in rows:
        cells = [f"{policy.bytes_per_run(n, elements) / 1e6:.2f} ({len(policy.kept_steps(list(range(n))))})"
                 for policy in policies.values()]  # fmt: skip
        print(f"{label:25}{elements:>11,}{n:>6}" + "".join(f"{c:>17}" for c in cells))
    print("GB per 40 seeds")
    print(head + "".join(f"{name:>17}" for name in POLICIES))
    for label, elements, n in rows:
        print(f"{label:25}{elements:>11,}{n:>6}"
              + "".join(f"{40 * p.bytes_per_run(n, elements) / 1e9:>17.3f}"
                        for p in policies.values()))  # fmt: skip
    print(
        "(checkpoints: default study and MNIST-5k from params.yaml/config/config.yaml; "
        "cifar100 and modular addition from config/paper/)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a tenth of the training steps (>= 10 checkpoints), 1 round, memory "
                             "at 20 and 100 checkpoints")  # fmt: skip
    parser.add_argument("--section", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                        help="which measurements (default: all)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), sections {' '.join(args.section)}"
          f"{' (quick)' if args.quick else ''}", flush=True)  # fmt: skip
    shares: dict[str, float] = {}
    if "share" in args.section:
        shares = section_share(args.quick)
    if "resnet18" in args.section:
        section_resnet18(args.quick)
    if "memory" in args.section:
        section_memory(args.quick)
    if "bytes" in args.section:
        section_bytes()
    figures = " ".join(f"{b.task}={shares.get(b.task, float('nan')):.3f}" for b in BLOCKS)
    print(f"streamed_metrics_share {figures} (target <= {SHARE_TARGET:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
