"""A trainmap plugin: your own CNN and your own init scheme, usable in a grid like the built-ins.

A config file lists it under ``plugins: [examples/my_cnn/plugin.py]``; trainmap imports it before
checking the config, so ``small_cnn`` and ``lecun`` are names the grid may use (and the config check
refuses a misspelt option of them as it would a built-in's).
"""

import math

from torch import nn

from trainmap.methods import MethodSpec, register_method
from trainmap.models import ArchSpec, check_positive, image_shape, register_architecture


def build_small_cnn(meta, channels=16, hidden=64):
    """Two 3x3 convs (the second halves the image), a hidden Linear layer and the classifier.
    ``meta`` describes one example of the task's data: ``input_shape`` (C, H, W), ``num_classes``."""
    in_channels, height, width = image_shape(meta)
    flat = 2 * channels * ((height + 1) // 2) * ((width + 1) // 2)
    return nn.Sequential(
        nn.Conv2d(in_channels, channels, 3, padding=1), nn.ReLU(),
        nn.Conv2d(channels, 2 * channels, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(flat, hidden), nn.ReLU(),
        nn.Linear(hidden, meta["num_classes"]),
    )  # fmt: skip


def check_small_cnn(options):
    """Refuse options the builder cannot use, before any job runs (a ValueError names the option)."""
    check_positive("channels", options["channels"])
    check_positive("hidden", options["hidden"])


register_architecture(ArchSpec(
    name="small_cnn", builder=build_small_cnn, defaults={"channels": 16, "hidden": 64},
    input_kinds=frozenset({"image"}), description="two 3x3 convs, a hidden layer, the classifier",
    check_options=check_small_cnn,
))  # fmt: skip


def lecun_init(model, generator):
    """LeCun uniform: weights from U(-sqrt(3 / fan_in), +sqrt(3 / fan_in)) (variance 1 / fan_in, half
    of Kaiming's 2 / fan_in), zero biases. Every draw uses ``generator``, which trainmap seeds from the
    grid cell's seed: the same seed gives the same initial weights, in a seed block or alone."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d | nn.Linear):
            bound = math.sqrt(3.0 / module.weight[0].numel())  # fan_in = in_channels * kh * kw
            nn.init.uniform_(module.weight, -bound, bound, generator=generator)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


register_method(MethodSpec(
    name="lecun", description="LeCun uniform init (variance 1/fan_in), zero biases",
    initialise=lecun_init,
))  # fmt: skip
