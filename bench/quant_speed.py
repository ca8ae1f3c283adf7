"""fp32 vs int8 CPU inference throughput of the same Linear-heavy model, side by side.

An MLP 64-2048-2048-2048-10 is trained briefly on the 8x8 digits (so accuracy means something), then
timed in fp32 and through ``trainmap.quantize.int8_inference_model`` (torch's dynamic int8
quantisation of every Linear: int8 weights, activations quantised per batch, int8 GEMMs), alternating,
at batch 256, after warm-up. Prints images/s of both, the ratio (target >= 1.5x) and the test
accuracy of both forms.

Usage::

    .venv/bin/python bench/quant_speed.py            # ~1 minute
    .venv/bin/python bench/quant_speed.py --quick

Last line: ``quant_speed_ratio=... accuracy_change=... (target >= 1.5)``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from trainmap.data import make_task_data
from trainmap.quantize import int8_inference_model
from trainmap.train import TrainConfig, TrainPaths, build_cell_model, evaluate_split, train_model

TARGET = 1.5


@torch.inference_mode()
def images_per_second(model: torch.nn.Module, inputs: torch.Tensor, batches: int) -> float:
    started = time.perf_counter()
    for _ in range(batches):
        model(inputs)
    return batches * len(inputs) / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer training steps and repeats")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    parser.add_argument("--batch", type=int, default=256, help="inference batch (default 256)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = make_task_data("digits", {})
    model = build_cell_model("mlp", "kaiming", 0, data.meta, {"hidden": [2048, 2048, 2048]})
    steps = 60 if args.quick else 300
    with tempfile.TemporaryDirectory() as tmp:
        train_model(model, data, TrainConfig(lr=0.02, momentum=0.9, batch_size=128, steps=steps,
                                             checkpoint_every=steps), 0,
                    TrainPaths.in_directory(tmp), progress=False)  # fmt: skip
    model.eval()
    int8 = int8_inference_model(model)
    forms = {"fp32": model, "int8": int8}
    inputs = data.x_train[: args.batch].repeat(max(1, args.batch // len(data.x_train)) + 1, 1, 1, 1)
    inputs = inputs[: args.batch]
    for form in forms.values():
        images_per_second(form, inputs, 3)
    rounds, batches = (3, 10) if args.quick else (7, 40)
    speeds: dict[str, list[float]] = {name: [] for name in forms}
    for index in range(rounds):
        for name in list(forms) if index % 2 == 0 else list(reversed(forms)):
            speeds[name].append(images_per_second(forms[name], inputs, batches))
    accuracy = {
        name: evaluate_split(form, data.x_test, data.y_test)[1] for name, form in forms.items()
    }
    median = {name: statistics.median(values) for name, values in speeds.items()}
    print(f"MLP 64-2048-2048-2048-10, batch {args.batch}, {args.threads} threads, CPU")
    print(f"{'form':8}{'images/s':>12}{'test acc':>10}")
    for name in forms:
        print(f"{name:8}{median[name]:>12.0f}{accuracy[name]:>10.4f}")
    ratio = median["int8"] / median["fp32"]
    change = accuracy["int8"] - accuracy["fp32"]
    print(f"quant_speed_ratio={ratio:.2f} accuracy_change={change:+.4f} (target >= {TARGET})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
