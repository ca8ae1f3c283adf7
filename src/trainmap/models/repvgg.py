"""RepVGG: a multi-branch block for training, fused into one 3x3 convolution for inference.

Ding et al., "RepVGG: Making VGG-style ConvNets Great Again" (CVPR 2021).

Training-time block (sec. 3.3, fig. 4): ``ReLU(BN(conv3x3(x)) + BN(conv1x1(x)) + BN(x))``, both convs
without bias, the 1x1 with padding 0 where the 3x3 pads by 1, the identity branch only when the
block keeps the channels and does not stride; groupwise blocks use the same groups in both convs.

Structural re-parameterisation (eq. 3 and the branch sums): a conv followed by BN in eval mode is
the conv with kernel W' = W * t and bias b' = beta - mu * t, t = gamma / sqrt(sigma^2 + eps) per output
channel. The 1x1 kernel is zero-padded to 3x3 (its weight at the centre); the identity is a 3x3 kernel
with a 1 at the centre of [i, i mod (C / groups)]. Summing the three kernels and biases gives one 3x3
conv with bias that computes the block exactly, in eval mode only (fusion uses running statistics).

Architectures (Tables 2 and 3): five stages of [1, 2, 4, 14, 1] (A) or [1, 4, 6, 16, 1] (B) blocks,
widths [min(64, 64a), 64a, 128a, 256a, 512b], the first block of each stage strided; global average
pooling and a Linear classifier. A0 (a, b) = (0.75, 2.5), A1 (1, 2.5), A2 (1.5, 2.75), B0 (1, 2.5),
B1 (2, 4), B2 (2.5, 5), B3 (3, 5); g2/g4 set 2 or 4 groups on layers 2, 4, ..., 26 (0-based; the
paper's 3rd, 5th, ..., 27th). Small-input variants stride only while the map is at least 4 pixels,
so 8x8 digits keep a 2x2 final map. Table 6's ablations drop the identity and/or the 1x1 branch; with
neither, the training-time model is the plain VGG-style baseline with the same deploy structure.
Registered here: ``repvgg``, ``repvgg_idonly``, ``repvgg_1x1only``, ``repvgg_plain`` (small images)
and ``repvgg_a0`` .. ``repvgg_b3g4`` (Table 3).

A deploy model is a plain ``nn.Sequential`` of Conv2d (with bias), ReLU, AdaptiveAvgPool2d, Flatten
and Linear, saved with a list of its layers (checkpoint format ``deploy``), so loading it needs no
RepVGG code at all.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from trainmap.io import save_torch
from trainmap.models.registry import (
    ArchSpec,
    check_flag,
    check_positive,
    check_sizes,
    image_shape,
    register_architecture,
)

#: (a, b) width multipliers of Table 3.
FAMILY_MULTIPLIERS = {
    "a0": (0.75, 2.5),
    "a1": (1.0, 2.5),
    "a2": (1.5, 2.75),
    "b0": (1.0, 2.5),
    "b1": (2.0, 4.0),
    "b2": (2.5, 5.0),
    "b3": (3.0, 5.0),
}
FAMILY_DEPTHS = {"a": [1, 2, 4, 14, 1], "b": [1, 4, 6, 16, 1]}
GROUPWISE_LAYERS = tuple(range(2, 27, 2))


class ConvBN(nn.Sequential):
    """A bias-free convolution followed by BatchNorm (one branch of a RepVGG block)."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int,
                 padding: int, groups: int) -> None:  # fmt: skip
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel, stride, padding, groups=groups,
                              bias=False)  # fmt: skip
        self.bn = nn.BatchNorm2d(out_channels)


def fuse_bn(kernel: torch.Tensor, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (3): conv then BN (eval) = conv with kernel W * t and bias beta - mu * t,
    t = gamma / sqrt(running_var + eps)."""
    t = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    return kernel * t.reshape(-1, 1, 1, 1), bn.bias - bn.running_mean * t


def identity_kernel(channels: int, groups: int, like: torch.Tensor) -> torch.Tensor:
    """The identity as a 3x3 grouped kernel: a 1 at the centre of [i, i mod (C / groups)]."""
    per_group = channels // groups
    kernel = torch.zeros(channels, per_group, 3, 3, dtype=like.dtype, device=like.device)
    for i in range(channels):
        kernel[i, i % per_group, 1, 1] = 1.0
    return kernel


class RepVGGBlock(nn.Module):
    """ReLU(BN(conv3x3(x)) + BN(conv1x1(x)) + BN(x)); it knows its own fusion."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, groups: int = 1,
                 identity_branch: bool = True, conv1x1_branch: bool = True) -> None:  # fmt: skip
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"groups={groups} must divide the channels {in_channels} -> "
                             f"{out_channels}")  # fmt: skip
        self.in_channels, self.out_channels = in_channels, out_channels
        self.stride, self.groups = stride, groups
        self.conv3x3 = ConvBN(in_channels, out_channels, 3, stride, 1, groups)
        self.conv1x1 = (
            ConvBN(in_channels, out_channels, 1, stride, 0, groups) if conv1x1_branch else None
        )
        keeps_shape = in_channels == out_channels and stride == 1
        self.identity = nn.BatchNorm2d(in_channels) if identity_branch and keeps_shape else None
        self.relu = nn.ReLU()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The sum of the branches, then ReLU."""
        out = self.conv3x3(inputs)
        if self.conv1x1 is not None:
            out = out + self.conv1x1(inputs)
        if self.identity is not None:
            out = out + self.identity(inputs)
        return self.relu(out)

    @torch.no_grad()
    def equivalent_kernel_bias(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The 3x3 kernel and bias of the single conv that computes this block in eval mode."""
        kernel, bias = fuse_bn(self.conv3x3.conv.weight, self.conv3x3.bn)
        if self.conv1x1 is not None:
            k1, b1 = fuse_bn(self.conv1x1.conv.weight, self.conv1x1.bn)
            kernel = kernel + nn.functional.pad(k1, [1, 1, 1, 1])
            bias = bias + b1
        if self.identity is not None:
            k_id = identity_kernel(self.in_channels, self.groups, kernel)
            k_id, b_id = fuse_bn(k_id, self.identity)
            kernel, bias = kernel + k_id, bias + b_id
        return kernel, bias

    def to_deploy(self) -> nn.Sequential:
        """The deploy form: one 3x3 conv with bias, then ReLU (in place: nothing else reads the
        conv's output, and inference skips one allocation per layer)."""
        kernel, bias = self.equivalent_kernel_bias()
        conv = nn.Conv2d(self.in_channels, self.out_channels, 3, self.stride, 1,
                         groups=self.groups, bias=True).to(kernel.dtype)  # fmt: skip
        conv.weight.data.copy_(kernel)
        conv.bias.data.copy_(bias)
        return nn.Sequential(conv, nn.ReLU(inplace=True))


class RepVGG(nn.Module):
    """Stages of RepVGG blocks, global average pooling and a Linear classifier."""

    def __init__(self, blocks: Sequence[RepVGGBlock], channels: int, num_classes: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten(start_dim=1)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, num_classes)``."""
        return self.classifier(self.flatten(self.pool(self.blocks(inputs))))


def to_deploy(model: RepVGG) -> nn.Sequential:
    """A NEW model of plain Conv2d/ReLU/pool/Linear modules computing ``model`` in eval mode.

    ``model`` itself is not changed (BN fusion uses its running statistics).
    """
    if not isinstance(model, RepVGG):
        raise TypeError(f"to_deploy needs a RepVGG model, got {type(model).__name__}")
    layers: list[nn.Module] = []
    for block in model.blocks:
        layers += list(block.to_deploy())
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(start_dim=1), copy.deepcopy(model.classifier)]
    return nn.Sequential(*layers).eval()


def deploy_trajectory(
    state: Mapping[str, torch.Tensor], model: RepVGG
) -> tuple[dict[str, torch.Tensor], nn.Sequential]:
    """The trajectory of ``model``'s deploy form: every checkpoint of a stacked training-time
    trajectory (``[n_checkpoints, *shape]`` per state-dict entry) fused by eq. 3 and the branch sums,
    in float64, and the deploy structure the fused entries belong to.

    A RepVGG and its plain ablation (``repvgg_plain``) have the same deploy structure, so their
    fused trajectories live in one weight space (params.yaml ``analysis.repvgg_weights: deploy``).
    """
    if not isinstance(model, RepVGG):
        raise TypeError(f"deploy_trajectory needs a RepVGG model, got {type(model).__name__}")
    model = copy.deepcopy(model).to(torch.float64).eval()
    n_checkpoints = next(iter(state.values())).shape[0]
    fused: list[dict[str, torch.Tensor]] = []
    deploy = None
    for index in range(n_checkpoints):
        checkpoint = {name: value[index] for name, value in state.items()}
        model.load_state_dict(checkpoint)  # copied into the float64 model
        deploy = to_deploy(model)
        fused.append(deploy.state_dict())
    stacked = {name: torch.stack([entry[name] for entry in fused]) for name in fused[0]}
    return stacked, deploy


# --- the deploy checkpoint (format "deploy"): plain modules only -------------------------------


def layer_specs(model: nn.Sequential) -> list[dict[str, Any]]:
    """A JSON-able description of a plain stack, enough to rebuild it with torch.nn alone."""
    specs = []
    for module in model:
        if isinstance(module, nn.Conv2d):
            specs.append({"type": "conv2d", "in_channels": module.in_channels,
                          "out_channels": module.out_channels, "kernel_size": module.kernel_size[0],
                          "stride": module.stride[0], "padding": module.padding[0],
                          "groups": module.groups})  # fmt: skip
        elif isinstance(module, nn.ReLU):
            specs.append({"type": "relu"})
        elif isinstance(module, nn.AdaptiveAvgPool2d):
            specs.append({"type": "adaptive_avg_pool2d", "output_size": 1})
        elif isinstance(module, nn.Flatten):
            specs.append({"type": "flatten"})
        elif isinstance(module, nn.Linear):
            specs.append({"type": "linear", "in_features": module.in_features,
                          "out_features": module.out_features})  # fmt: skip
        else:
            raise TypeError(f"a deploy model holds only plain layers, not {type(module).__name__}")
    return specs


def save_deploy(model: nn.Sequential, path: str | os.PathLike, **info: Any) -> None:
    """Write a deploy model: ``{"format": "deploy", "layers": [...], "state_dict": ..., **info}``."""
    save_torch({"format": "deploy", "layers": layer_specs(model),
                "state_dict": model.state_dict(), **info}, path)  # fmt: skip


def deploy_skeleton(specs: list[dict[str, Any]]) -> nn.Sequential:
    """The plain stack a layer list describes, built from torch.nn modules only (no weights)."""
    builders = {
        "conv2d": lambda s: nn.Conv2d(s["in_channels"], s["out_channels"], s["kernel_size"],
                                      s["stride"], s["padding"], groups=s["groups"], bias=True),
        "relu": lambda s: nn.ReLU(inplace=True),
        "adaptive_avg_pool2d": lambda s: nn.AdaptiveAvgPool2d(s["output_size"]),
        "flatten": lambda s: nn.Flatten(start_dim=1),
        "linear": lambda s: nn.Linear(s["in_features"], s["out_features"]),
    }  # fmt: skip
    return nn.Sequential(*[builders[spec["type"]](spec) for spec in specs])


def model_from_deploy(saved: dict[str, Any]) -> nn.Sequential:
    """Rebuild a deploy model from its layer list and state, with torch.nn modules only."""
    model = deploy_skeleton(saved["layers"])
    model.load_state_dict(saved["state_dict"])
    return model.eval()


@torch.no_grad()
def check_equivalence(
    train_model: nn.Module,
    deploy_model: nn.Module,
    inputs: torch.Tensor,
    batch_size: int = 512,
    prepare: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Largest absolute logit difference and whether every prediction agrees (both in eval mode);
    ``prepare``: what each batch of ``inputs`` goes through first (the run's normalisation)."""
    train_model.eval()
    deploy_model.eval()
    largest, same, scale = 0.0, True, 0.0
    for start in range(0, len(inputs), batch_size):
        x = inputs[start : start + batch_size]
        x = x if prepare is None else prepare(x)
        reference, fused = train_model(x), deploy_model(x)
        largest = max(largest, float((reference - fused).abs().max()))
        scale = max(scale, float(reference.abs().max()))
        same = same and bool((reference.argmax(1) == fused.argmax(1)).all())
    return {"max_abs_logit_diff": largest, "max_abs_logit": scale,
            "predictions_identical": same, "examples": len(inputs)}  # fmt: skip


# --- builders and registration -------------------------------------------------------------------


def _auto_strides(depths: Sequence[int], height: int, width: int) -> list[int]:
    """Stride 2 entering every stage but the first while the map is at least 4 pixels."""
    strides = []
    for index in range(len(depths)):
        stride = 2 if index > 0 and min(height, width) >= 4 else 1
        strides.append(stride)
        if stride == 2:
            height, width = (height + 1) // 2, (width + 1) // 2
    return strides


def build_repvgg(
    meta: dict,
    depths: Sequence[int] = (1, 2, 3, 1),
    widths: Sequence[int] = (16, 32, 64, 128),
    strides: Sequence[int] | None = None,
    groups: int = 1,
    group_layers: Sequence[int] = GROUPWISE_LAYERS,
    identity_branch: bool = True,
    conv1x1_branch: bool = True,
) -> RepVGG:
    """A RepVGG for ``meta``'s images. ``strides`` per stage (None: the small-input rule); blocks
    whose 0-based index is in ``group_layers`` use ``groups`` groups."""
    _check_repvgg_options({"depths": depths, "widths": widths, "strides": strides,
                           "groups": groups, "group_layers": group_layers,
                           "identity_branch": identity_branch,
                           "conv1x1_branch": conv1x1_branch})  # fmt: skip
    channels, height, width = image_shape(meta)
    strides = list(strides) if strides is not None else _auto_strides(depths, height, width)
    blocks, index = [], 0
    for depth, stage_width, stride in zip(depths, widths, strides, strict=True):
        for position in range(depth):
            block_groups = groups if index in group_layers else 1
            blocks.append(RepVGGBlock(channels, stage_width, stride if position == 0 else 1,
                                      block_groups, identity_branch, conv1x1_branch))  # fmt: skip
            channels = stage_width
            index += 1
    return RepVGG(blocks, channels, meta["num_classes"])


def _check_repvgg_options(options: dict) -> None:
    check_sizes("depths", options["depths"])
    check_sizes("widths", options["widths"])
    if len(options["depths"]) != len(options["widths"]):
        raise ValueError("options 'depths' and 'widths' must have one entry per stage")
    if options["strides"] is not None:
        check_sizes("strides", options["strides"])
        if len(options["strides"]) != len(options["depths"]):
            raise ValueError("option 'strides' must have one entry per stage (or be null)")
    check_positive("groups", options["groups"])
    check_flag("identity_branch", options["identity_branch"])
    check_flag("conv1x1_branch", options["conv1x1_branch"])


def family_options(name: str, groups: int = 1) -> dict[str, Any]:
    """Options of a Table 3 family member (e.g. ``"b0"``) for 224-pixel inputs."""
    a, b = FAMILY_MULTIPLIERS[name]
    return {
        "depths": FAMILY_DEPTHS[name[0]],
        "widths": [min(64, int(64 * a)), int(64 * a), int(128 * a), int(256 * a), int(512 * b)],
        "strides": [2, 2, 2, 2, 2],
        "groups": groups,
    }


_BASE = {"depths": [1, 2, 3, 1], "widths": [16, 32, 64, 128], "strides": None, "groups": 1,
         "group_layers": list(GROUPWISE_LAYERS), "identity_branch": True,
         "conv1x1_branch": True}  # fmt: skip
_SMALL = {
    "repvgg": ({}, "RepVGG for small images: 3x3 + 1x1 + identity branches, fused for deploy"),
    "repvgg_idonly": ({"conv1x1_branch": False}, "RepVGG ablation: identity branch, no 1x1"),
    "repvgg_1x1only": ({"identity_branch": False}, "RepVGG ablation: 1x1 branch, no identity"),
    "repvgg_plain": ({"identity_branch": False, "conv1x1_branch": False},
                     "RepVGG ablation: neither branch (the plain VGG-style baseline)"),
}  # fmt: skip
_FAMILIES = {f"repvgg_{name}": family_options(name) for name in FAMILY_MULTIPLIERS}
_FAMILIES |= {f"repvgg_{name}g{g}": family_options(name, g) for name in ("b1", "b2", "b3")
              for g in (2, 4)}  # fmt: skip


def _register_repvgg(name: str, options: dict[str, Any], description: str) -> None:
    register_architecture(
        ArchSpec(
            name=name,
            builder=build_repvgg,
            defaults={**_BASE, **options},
            input_kinds=frozenset({"image"}),
            description=description,
            check_options=_check_repvgg_options,
            deploy_form=True,
        )
    )


for _name, (_changes, _description) in _SMALL.items():
    _register_repvgg(_name, _changes, _description)
for _name, _options in _FAMILIES.items():
    _register_repvgg(_name, _options, f"RepVGG-{_name[7:].upper()} (Table 3, 224-pixel inputs)")
