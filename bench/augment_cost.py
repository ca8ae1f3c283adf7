"""What batch augmentation (``train.<task>.augment``) costs, measured side by side in one process.

1. **Step cost, ResNet-18 on CIFAR-sized batches** (torchvision's ``resnet18`` with the CIFAR stem,
   the training-maps authors' network; 3 x 32 x 32 uint8 pixels, batch ``--batch``): the loop's own
   step (:func:`trainmap.training.loop._forward_step`: gather, augmentation, forward, loss; then
   backward and the SGD step) without augmentation and with each preset, alternated over
   ``--rounds`` rounds; the table gives the median seconds per step and the ratio to none (goal:
   the full ``gradinit_cifar`` preset adds at most 15 %).
2. **Seed block against single runs** (a small BatchNorm CNN, ``vgg_bn`` widths 16/32, on the same
   kind of batches, :func:`~trainmap.training.loop.train_block` whole): a block of 8 seeds with and
   without ``gradinit_cifar`` against 8 single runs with and without it; the ratio of ratios
   (block with/without over singles with/without; goal within 10 % of 1).
3. **An image folder's first epoch** (decode and cache, :mod:`trainmap.data.image_folder`) against
   a later epoch (the cached uint8 tensors): a generated folder of ``--images`` PNGs.

Usage::

    .venv/bin/python bench/augment_cost.py            # ~6 min on 2 cores
    .venv/bin/python bench/augment_cost.py --quick    # ~2 min

Writes ``bench/results/augment_cost.md`` (the tables) unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "augment_cost.md"
PRESETS = ("gradinit_cifar", "training_maps_cifar")
STEP_GOAL, BLOCK_GOAL = 0.15, 0.10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds (~2 min)")
    parser.add_argument("--batch", type=int, default=128, help="ResNet-18 batch (default 128)")
    parser.add_argument("--rounds", type=int, default=None, help="alternations (default 3)")
    parser.add_argument("--images", type=int, default=None,
                        help="images in the generated folder (default 2000; quick 600)")  # fmt: skip
    parser.add_argument("--no-write", action="store_true", help="print only")
    return parser.parse_args(argv)


def cifar_like(n: int, seed: int = 0):
    """``n`` random uint8 3 x 32 x 32 images with 10 labels, as a TaskData."""
    import torch

    from trainmap.data.task import task_data

    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=generator)
    y = torch.randint(0, 10, (n,), generator=generator)
    return task_data(x, y, x[:256], y[:256], kind="bench", input_kind="image", num_classes=10)


def timed_steps(model, data, cfg, recipe, steps: int) -> float:
    """Seconds of ``steps`` of the loop's own step (gather, augmentation, forward, loss; backward
    and the optimiser step) for one seed of ``model`` on ``data``."""
    import torch

    from trainmap.training.loop import _forward_step, _sampler
    from trainmap.training.seed_block import SeedBlock
    from trainmap.training.step import BlockBatches, make_optimizer

    block, optimizer = SeedBlock([model]), make_optimizer(model, cfg)
    shape = tuple(data.x_train.shape[1:])
    batches = BlockBatches([_sampler(len(data.x_train), cfg, 0, recipe, shape)],
                           torch.device("cpu"))  # fmt: skip
    started = time.perf_counter()
    for _ in range(steps):
        _, _, _, loss = _forward_step(block, batches, data, recipe)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return time.perf_counter() - started


def step_cost(batch: int, rounds: int, steps: int) -> list[dict]:
    """Median seconds per ResNet-18 step without and with each preset (the loop's step)."""
    import torch

    from trainmap.models import build_model
    from trainmap.training.augment import augmentation
    from trainmap.training.loop import TrainConfig

    data = cifar_like(4 * batch)
    torch.manual_seed(0)
    model = build_model("resnet18", data.meta, cifar_stem=True)
    cfg = TrainConfig(lr=0.1, momentum=0.9, weight_decay=5e-4, batch_size=batch)
    recipes = {"none": None, **{p: augmentation({"preset": p}) for p in PRESETS}}
    times: dict[str, list[float]] = {name: [] for name in recipes}

    def run(recipe) -> float:
        return timed_steps(model, data, cfg, recipe, steps) / steps

    for recipe in recipes.values():  # warm-up: first-call costs of every path
        run(recipe)
    for _ in range(rounds):
        for name, recipe in recipes.items():
            times[name].append(run(recipe))
    base = statistics.median(times["none"])
    return [{"augment": name, "s_per_step": statistics.median(values),
             "ratio": statistics.median(values) / base} for name, values in times.items()]  # fmt: skip


def block_against_singles(rounds: int, steps: int) -> dict:
    """Wall time of a block of 8 and of 8 single runs, each with and without gradinit_cifar."""
    import torch

    from trainmap.training.loop import TrainConfig, TrainPaths, build_cell_model, train_block

    data = cifar_like(2048)
    seeds = list(range(8))
    options = {"widths": [16, 32], "convs_per_stage": [1, 1]}
    torch.set_num_threads(torch.get_num_threads())

    def wall(size: int, augment) -> float:
        cfg = TrainConfig(lr=0.05, momentum=0.9, batch_size=64, steps=steps,
                          checkpoint_every=steps, resume_every=10**6, augment=augment)  # fmt: skip
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as scratch:
            for start in range(0, len(seeds), size):
                chunk = seeds[start : start + size]
                models = [
                    build_cell_model("vgg_bn", "kaiming", s, data.meta, options) for s in chunk
                ]
                paths = [TrainPaths.in_directory(Path(scratch) / f"s{s}") for s in chunk]
                train_block(models, data, cfg, chunk, paths,
                            resume_path=Path(scratch) / f"r{start}.pt", progress=False)  # fmt: skip
        return time.perf_counter() - started

    preset = {"preset": "gradinit_cifar"}
    cases = {"block, none": (8, None), "block, gradinit_cifar": (8, preset),
             "singles, none": (1, None), "singles, gradinit_cifar": (1, preset)}  # fmt: skip
    wall(8, preset)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (size, augment) in cases.items():
            times[name].append(wall(size, augment))
    medians = {name: statistics.median(values) for name, values in times.items()}
    block = medians["block, gradinit_cifar"] / medians["block, none"]
    singles = medians["singles, gradinit_cifar"] / medians["singles, none"]
    return {"medians": medians, "block_ratio": block, "singles_ratio": singles,
            "ratio_of_ratios": block / singles}  # fmt: skip


def folder_epochs(images: int) -> dict:
    """Seconds to decode and cache a generated folder, and of one epoch over the cache."""
    import torch

    from trainmap.data import make_task_data
    from trainmap.data.image_folder import generate_image_folder
    from trainmap.models import build_model
    from trainmap.training.augment import augmentation
    from trainmap.training.loop import TrainConfig

    with tempfile.TemporaryDirectory() as scratch:
        root = generate_image_folder(Path(scratch) / "folder", n_classes=10, n_train=images // 10,
                                     n_val=max(1, images // 50), size=32, seed=0)  # fmt: skip
        started = time.perf_counter()
        data = make_task_data("image_folder", {"path": str(root), "size": 32})
        decode = time.perf_counter() - started
    torch.manual_seed(0)
    model = build_model("vgg_bn", data.meta, widths=[16, 32], convs_per_stage=[1, 1])
    cfg = TrainConfig(lr=0.05, momentum=0.9, batch_size=64)
    recipe = augmentation({"preset": "gradinit_cifar"})
    epoch = timed_steps(model, data, cfg, recipe, len(data.x_train) // 64)
    return {"images": len(data.x_train) + len(data.x_test), "decode_s": decode, "epoch_s": epoch,
            "first_epoch_s": decode + epoch, "first_over_later": (decode + epoch) / epoch}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from trainmap.portable import cpu_model_and_flags

    rounds = args.rounds or 3
    images = args.images or (600 if args.quick else 2000)
    threads = torch.get_num_threads()
    steps = step_cost(args.batch, rounds, 2 if args.quick else 4)
    blocks = block_against_singles(1 if args.quick else rounds, 20 if args.quick else 60)
    folder = folder_epochs(images)
    lines = [
        "# Batch augmentation's cost",
        "",
        f"`bench/augment_cost.py{' --quick' if args.quick else ''}` on {cpu_model_and_flags()[0]}, "
        f"{threads} threads, torch {torch.__version__}.",
        "",
        f"## A ResNet-18 step (CIFAR stem, batch {args.batch}, median of {rounds} rounds)",
        "",
        "| augment | s / step | ratio to none |",
        "|---|---:|---:|",
        *[f"| {row['augment']} | {row['s_per_step']:.3f} | {row['ratio']:.3f} |" for row in steps],
        "",
        f"Goal: `gradinit_cifar` adds at most {STEP_GOAL:.0%} to the step.",
        "",
        "## A block of 8 seeds against 8 single runs (vgg_bn 16/32, batch 64)",
        "",
        "| run | wall s |",
        "|---|---:|",
        *[f"| {name} | {value:.1f} |" for name, value in blocks["medians"].items()],
        "",
        f"With/without gradinit_cifar: block {blocks['block_ratio']:.3f}, singles "
        f"{blocks['singles_ratio']:.3f}; ratio of ratios {blocks['ratio_of_ratios']:.3f} "
        f"(goal within {BLOCK_GOAL:.0%} of 1).",
        "",
        f"## An image folder ({folder['images']} generated PNGs, 32 px)",
        "",
        f"Decode and cache {folder['decode_s']:.2f} s; a later epoch {folder['epoch_s']:.2f} s; "
        f"the first epoch (decode + epoch) is {folder['first_over_later']:.2f}x a later one.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    gradinit = next(row for row in steps if row["augment"] == "gradinit_cifar")["ratio"]
    print(f"augment_cost step_ratio={gradinit:.3f} (goal <= {1 + STEP_GOAL:.2f}) "
          f"block_ratio_of_ratios={blocks['ratio_of_ratios']:.3f}")  # fmt: skip
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
