"""RepVGG inference throughput: the training-time (multi-branch) form vs the deploy (fused) form.

The same model, in eval mode, is timed in both forms side by side, alternating, at batch 128, fp32,
on the CPU with all cores, after warm-up; images/s is the median over repeats. The paper's table 6
reports 1061 -> 1810 images/s (1.71x) for RepVGG-B0 on a 1080Ti GPU; the target here is >= 1.5x on
the CPU. Also printed: parameters and multiply-accumulates (MACs, convolutions and Linear layers) of
each form. BN statistics are randomised: the speed does not depend on training.

Usage::

    .venv/bin/python bench/repvgg_speed.py           # small-input RepVGG at 32x32 and B0 at 224
    .venv/bin/python bench/repvgg_speed.py --quick   # fewer repeats, B0 at batch 32

Last line: ``repvgg_deploy_speedup repvgg=... repvgg_b0=... (target >= 1.5)``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

TARGET = 1.5


def count_macs(model: nn.Module, shape: tuple[int, ...]) -> int:
    """Multiply-accumulates of Conv2d and Linear layers for one forward pass of ``shape``."""
    import torch
    from torch import nn

    total = 0

    def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Conv2d):
            per_output = (
                module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
            )
            total += output.numel() * per_output
        elif isinstance(module, nn.Linear):
            total += output.numel() * module.in_features

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, nn.Conv2d | nn.Linear)]  # fmt: skip
    with torch.no_grad():
        model(torch.zeros(shape))
    for handle in handles:
        handle.remove()
    return total


def throughput(model: nn.Module, inputs: torch.Tensor, batches: int) -> float:
    """Images per second over ``batches`` forward passes (after the caller's warm-up)."""
    import torch

    with torch.inference_mode():
        started = time.perf_counter()
        for _ in range(batches):
            model(inputs)
        return batches * len(inputs) / (time.perf_counter() - started)


def randomise_bn(model: nn.Module) -> None:
    import torch
    from torch import nn

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
                module.running_mean.copy_(torch.randn(module.num_features, generator=generator))


def measure(arch: str, image: int, channels: int, batch: int, batches: int, rounds: int,
            channels_last: bool = False) -> float:  # fmt: skip
    import torch

    from trainmap.models import build_model, count_parameters
    from trainmap.models.repvgg import to_deploy

    meta = {"input_kind": "image", "input_shape": [channels, image, image], "num_classes": 1000
            if image >= 224 else 10}  # fmt: skip
    torch.manual_seed(0)
    train_form = build_model(arch, meta).eval()
    randomise_bn(train_form)
    deploy_form = to_deploy(train_form).eval()
    inputs = torch.randn(batch, channels, image, image)
    forms = {"train-time": train_form, "deploy": deploy_form}
    if channels_last:
        inputs = inputs.to(memory_format=torch.channels_last)
        forms = {name: m.to(memory_format=torch.channels_last) for name, m in forms.items()}
    with torch.inference_mode():
        for model in forms.values():  # warm-up
            for _ in range(2):
                model(inputs)
    speeds: dict[str, list[float]] = {name: [] for name in forms}
    for index in range(rounds):
        order = list(forms) if index % 2 == 0 else list(reversed(forms))
        for name in order:
            speeds[name].append(throughput(forms[name], inputs, batches))
    median = {name: statistics.median(values) for name, values in speeds.items()}
    print(f"\n{arch} at {image}x{image}, batch {batch}:")
    print(f"  {'form':12}{'images/s':>12}{'params (M)':>12}{'MACs (G)':>10}")
    shape = (1, channels, image, image)
    for name, model in forms.items():
        print(f"  {name:12}{median[name]:>12.1f}{count_parameters(model) / 1e6:>12.3f}"
              f"{count_macs(model, shape) / 1e9:>10.3f}")  # fmt: skip
    ratio = median["deploy"] / median["train-time"]
    print(f"  deploy / train-time = {ratio:.2f}x")
    return ratio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats; B0 at batch 32")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    parser.add_argument("--channels-last", action="store_true",
                        help="NHWC memory format for both forms (often faster on CPU)")  # fmt: skip
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    layout = "channels_last" if args.channels_last else "contiguous (NCHW)"
    print(f"CPU, fp32, {args.threads} threads, {layout}, median of alternating rounds")
    rounds = 3 if args.quick else 7
    ratios = {
        "repvgg": measure(
            "repvgg", 32, 3, 128, 3 if args.quick else 20, rounds, args.channels_last
        ),  # fmt: skip
        "repvgg_b0": measure(
            "repvgg_b0", 224, 3, 32 if args.quick else 128, 1, rounds, args.channels_last
        ),  # fmt: skip
    }
    verdict = " ".join(f"{name}={ratio:.2f}" for name, ratio in ratios.items())
    print(f"repvgg_deploy_speedup {verdict} (target >= {TARGET})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
