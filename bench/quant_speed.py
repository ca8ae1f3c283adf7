"""fp32 vs int8 CPU inference throughput of the same Linear-heavy model, side by side, per batch size.

An MLP 64-2048-2048-2048-10 is trained briefly on the 8x8 digits (so accuracy means something), then
timed in fp32 and through ``trainmap.methods.quantize.int8_inference_model`` (torch's dynamic int8
quantisation of every Linear: int8 weights, activations quantised per batch, int8 GEMMs), alternating,
after warm-up, at several batch sizes (default 1, 16 and 256). Prints images/s of both forms and
their ratio per batch size (target >= 1.5x), and the test accuracy of both forms.

Why several batch sizes: at small batches a Linear layer is a matrix-vector-like product limited by
reading its weights from memory, and int8 weights are 4x fewer bytes; at large batches it is a
compute-bound GEMM, where int8 gains only what the CPU's int8 instructions give over fp32 FMA
(without AVX-512 VNNI, little). Both regimes are printed; neither is hidden.

Usage::

    .venv/bin/python bench/quant_speed.py            # ~1 minute
    .venv/bin/python bench/quant_speed.py --quick
    .venv/bin/python bench/quant_speed.py --batches 1,64,1024

Last line: ``quant_speed_ratio=<at the smallest batch> ... ratio_b<batch>=... per batch ...
accuracy_change=... (target >= 1.5)``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

TARGET = 1.5


def images_per_second(model: torch.nn.Module, inputs: torch.Tensor, batches: int) -> float:
    import torch

    with torch.inference_mode():
        started = time.perf_counter()
        for _ in range(batches):
            model(inputs)
        return batches * len(inputs) / (time.perf_counter() - started)


def median_speeds(forms: dict[str, torch.nn.Module], pool: torch.Tensor, batch: int,
                  quick: bool) -> dict[str, float]:  # fmt: skip
    """Median images/s of each form at ``batch``, alternating the forms' order every round."""
    inputs = pool.repeat(batch // len(pool) + 1, 1, 1, 1)[:batch]
    batches = max(3 if quick else 10, (256 if quick else 1024) // batch)
    for form in forms.values():
        images_per_second(form, inputs, 3)
    speeds: dict[str, list[float]] = {name: [] for name in forms}
    for index in range(3 if quick else 7):
        for name in list(forms) if index % 2 == 0 else list(reversed(forms)):
            speeds[name].append(images_per_second(forms[name], inputs, batches))
    return {name: statistics.median(values) for name, values in speeds.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer training steps and repeats")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    parser.add_argument(
        "--batches",
        default="1,16,256",
        help="comma-separated inference batch sizes (default 1,16,256)",
    )
    args = parser.parse_args(argv)
    import torch

    from trainmap.data import make_task_data
    from trainmap.methods.quantize import int8_inference_model
    from trainmap.training.loop import (
        TrainConfig,
        TrainPaths,
        build_cell_model,
        evaluate_split,
        train_model,
    )

    batch_sizes = [int(value) for value in args.batches.split(",")]
    torch.set_num_threads(args.threads)
    data = make_task_data("digits", {})
    model = build_cell_model("mlp", "kaiming", 0, data.meta, {"hidden": [2048, 2048, 2048]})
    steps = 60 if args.quick else 300
    with tempfile.TemporaryDirectory() as tmp:
        train_model(model, data, TrainConfig(lr=0.02, momentum=0.9, batch_size=128, steps=steps,
                                             checkpoint_every=steps), 0,
                    TrainPaths.in_directory(tmp), progress=False)  # fmt: skip
    model.eval()
    forms = {"fp32": model, "int8": int8_inference_model(model)}
    accuracy = {
        name: evaluate_split(form, data.x_test, data.y_test)[1] for name, form in forms.items()
    }
    print(f"MLP 64-2048-2048-2048-10, {args.threads} threads, CPU; test acc fp32 "
          f"{accuracy['fp32']:.4f}, int8 {accuracy['int8']:.4f}")  # fmt: skip
    print(f"{'batch':>6}{'fp32 images/s':>16}{'int8 images/s':>16}{'int8/fp32':>11}")
    ratios = {}
    for batch in batch_sizes:
        median = median_speeds(forms, data.x_train, batch, args.quick)
        ratios[batch] = median["int8"] / median["fp32"]
        print(f"{batch:>6}{median['fp32']:>16.0f}{median['int8']:>16.0f}{ratios[batch]:>11.2f}")
    change = accuracy["int8"] - accuracy["fp32"]
    per_batch = " ".join(f"ratio_b{batch}={ratio:.2f}" for batch, ratio in ratios.items())
    print(
        f"quant_speed_ratio={ratios[batch_sizes[0]]:.2f} {per_batch} "
        f"accuracy_change={change:+.4f} (target >= {TARGET})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
