"""What batch augmentation does to generalisation: final test accuracy and the train-test gap with
and without ``train.<task>.augment``, on data this machine has.

Each case trains ``--seeds`` seeds through the one training loop
(:func:`trainmap.training.loop.train_block`) twice, without and with augmentation, from the same
initial models and batch orders; a run's training accuracy is its final model's on the whole,
unaugmented training set (evaluation's transform: normalised only), so the gap is comparable
between the two.

* ``digits`` (scikit-learn's 8 x 8 digits), ``vgg_bn`` at the registry's defaults, the default
  study's recipe (params.yaml ``train.digits``); augmentation: crop 8 pad 1 and flip.
* a generated image folder (:func:`trainmap.data.image_folder.generate_image_folder`: ``--classes``
  classes of oriented stripes under pixel noise ``--noise``, ``--per-class`` training images each,
  32 px; the defaults, 40 x 10 under noise 1, make a task a small CNN overfits), ``vgg_bn``
  16/32/64, 400 steps; augmentation: ``gradinit_cifar``.
* ``cifar10`` from ``data/cifar10`` (``--cifar-train`` images, ``resnet18`` with the CIFAR stem)
  when the directory holds the CIFAR-10 python batches; otherwise the table says it was not there.

Usage::

    .venv/bin/python bench/augment_accuracy.py            # ~4 min on 2 cores
    .venv/bin/python bench/augment_accuracy.py --quick    # ~2 min

Writes ``bench/results/augment_accuracy.md`` unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "augment_accuracy.md"
CIFAR = Path("data/cifar10")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="2 seeds, shorter runs")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per case (default 4)")
    parser.add_argument("--per-class", type=int, default=10,
                        help="generated folder: training images per class (default 10)")  # fmt: skip
    parser.add_argument("--classes", type=int, default=40,
                        help="generated folder: classes (default 40)")  # fmt: skip
    parser.add_argument("--noise", type=float, default=1.0,
                        help="generated folder: pixel noise SD (default 1.0)")  # fmt: skip
    parser.add_argument("--only", choices=["digits", "folder", "cifar10"], default=None,
                        help="run one case")  # fmt: skip
    parser.add_argument("--cifar-train", type=int, default=5000,
                        help="CIFAR-10 training images (a stratified subsample; default 5000)")  # fmt: skip
    parser.add_argument("--no-write", action="store_true", help="print only")
    return parser.parse_args(argv)


def run_case(data, arch: str, options: dict, cfg_settings: dict, augment: dict, seeds: list[int]):
    """Per seed (test accuracy, clean training accuracy), without and with ``augment``."""
    import torch

    from trainmap.training.augment import evaluation_inputs, recipe_of
    from trainmap.training.loop import (
        TrainConfig,
        TrainPaths,
        build_cell_model,
        evaluate_split,
        train_block,
    )

    results = {}
    for label, recipe_settings in (("none", None), ("augmented", augment)):
        cfg = TrainConfig.from_dict({**cfg_settings, "augment": recipe_settings})
        models = [build_cell_model(arch, "kaiming", seed, data.meta, options) for seed in seeds]
        with tempfile.TemporaryDirectory() as scratch:
            paths = [TrainPaths.in_directory(Path(scratch) / f"s{seed}") for seed in seeds]
            train_block(models, data, cfg, seeds, paths, resume_path=Path(scratch) / "r.pt",
                        progress=False)  # fmt: skip
        prepare = evaluation_inputs(recipe_of(recipe_settings), data.x_train.dtype)
        rows = []
        with torch.no_grad():
            for model in models:
                _, test_acc = evaluate_split(model, data.x_test, data.y_test, prepare)
                _, train_acc = evaluate_split(model, data.x_train, data.y_train, prepare)
                rows.append((test_acc, train_acc))
        results[label] = rows
    return results


def summary_rows(name: str, results: dict) -> list[str]:
    lines = []
    for label, rows in results.items():
        test = [t for t, _ in rows]
        gap = [tr - t for t, tr in rows]
        lines.append(f"| {name} | {label} | {statistics.mean(test):.3f} "
                     f"({min(test):.3f}-{max(test):.3f}) | {statistics.mean([tr for _, tr in rows]):.3f} "
                     f"| {statistics.mean(gap):+.3f} |")  # fmt: skip
    return lines


def digits_case(args: argparse.Namespace, seeds: list[int]) -> list[str]:
    """scikit-learn's digits, vgg_bn, the default study's recipe; crop 8 pad 1 and flip."""
    from trainmap.data import make_task_data

    digits = make_task_data("digits", {})
    train = {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0001,
             "batch_size": 128, "steps": 120 if args.quick else 240, "schedule": "cosine",
             "grad_clip": 1.0, "checkpoint_every": 40 if args.quick else 80,
             "resume_every": 10**6}  # fmt: skip
    augment = {"crop": 8, "padding": 1, "flip": True}
    return summary_rows("digits (crop 8 pad 1, flip)",
                        run_case(digits, "vgg_bn", {}, train, augment, seeds))  # fmt: skip


def folder_case(args: argparse.Namespace, seeds: list[int]) -> list[str]:
    """A generated image folder (``--classes`` classes of noisy stripes, ``--per-class`` training
    images each, 32 px), vgg_bn 16/32/64; gradinit_cifar."""
    from trainmap.data import make_task_data
    from trainmap.data.image_folder import generate_image_folder

    with tempfile.TemporaryDirectory() as scratch:
        root = generate_image_folder(Path(scratch) / "folder", n_classes=args.classes,
                                     n_train=args.per_class, n_val=30, size=32, seed=0,
                                     noise=args.noise)  # fmt: skip
        folder = make_task_data("image_folder", {"path": str(root), "size": 32})
    train = {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0005,
             "batch_size": 64, "steps": 200 if args.quick else 400, "schedule": "cosine",
             "checkpoint_every": 100, "resume_every": 10**6}  # fmt: skip
    options = {"widths": [16, 32, 64], "convs_per_stage": [1, 1, 1]}
    name = (f"generated folder ({args.classes} classes x {args.per_class} images, noise "
            f"{args.noise:g}; gradinit_cifar)")  # fmt: skip
    return summary_rows(name, run_case(folder, "vgg_bn", options, train,
                                       {"preset": "gradinit_cifar"}, seeds))  # fmt: skip


def cifar_case(args: argparse.Namespace, seeds: list[int]) -> list[str]:
    """CIFAR-10 from data/cifar10 (a subsample), resnet18 with the CIFAR stem; gradinit_cifar."""
    from trainmap.data import make_task_data

    if not (CIFAR / "data_batch_1").exists():
        return ["", f"CIFAR-10: `{CIFAR}` holds no CIFAR-10 python batches here; not measured."]
    cifar = make_task_data("cifar10", {"path": str(CIFAR), "n_train": args.cifar_train})
    train = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005,
             "batch_size": 128, "steps": 400, "schedule": "cosine", "checkpoint_every": 200,
             "resume_every": 10**6}  # fmt: skip
    return summary_rows(
        "cifar10 (gradinit_cifar)",
        run_case(
            cifar, "resnet18", {"cifar_stem": True}, train, {"preset": "gradinit_cifar"}, seeds[:2]
        ),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from trainmap.portable import cpu_model_and_flags

    seeds = list(range(args.seeds or (2 if args.quick else 4)))
    lines = [
        "# Augmentation and generalisation",
        "",
        f"`bench/augment_accuracy.py{' --quick' if args.quick else ''}` on "
        f"{cpu_model_and_flags()[0]}, {torch.get_num_threads()} threads, "
        f"{len(seeds)} seeds a case. Test accuracy: mean (min-max); train: the final model on the "
        "whole unaugmented training set; gap: train - test.",
        "",
        "| data | augment | test acc | train acc | gap |",
        "|---|---|---|---|---|",
    ]
    if args.only in (None, "digits"):
        lines += digits_case(args, seeds)
    if args.only in (None, "folder"):
        lines += folder_case(args, seeds)
    if args.only in (None, "cifar10"):
        lines += cifar_case(args, seeds)
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
