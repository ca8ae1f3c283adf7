"""What a block is built from before its first step: the training device and the data on it, a
seed per purpose derived from a cell's seed, a cell's seeded initial model, and the architecture
whose layout the streamed metrics count."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from trainmap.data import TaskData
from trainmap.methods import check_method
from trainmap.models import build_model


def resolve_device(name: str) -> torch.device:
    """``cpu`` or ``cuda[:i]``; asking for CUDA on a machine without it is an error, not a fallback."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"training device {name!r} requested (train.<task>.device) but this "
                         "machine has no CUDA device; use device: cpu here")  # fmt: skip
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"training device {name!r} is not supported; use cpu or cuda")
    if device.type == "cuda" and device.index is not None:
        count = torch.cuda.device_count()
        if device.index >= count:
            raise ValueError(f"training device {name!r} requested (train.<task>.device) but this "
                             f"machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}; "
                             "use cuda (each job then gets a free GPU of the node)")  # fmt: skip
    return device


def on_device(data: TaskData, device: torch.device) -> TaskData:
    """The task's tensors on ``device`` (the data sets here are small enough to live there)."""
    if device.type == "cpu":
        return data
    return TaskData(data.x_train.to(device), data.y_train.to(device), data.x_test.to(device),
                    data.y_test.to(device), data.meta)  # fmt: skip


def derive_seed(seed: int, purpose: str) -> int:
    """A seed for one purpose (init, batch order, ...) derived from the grid cell's seed."""
    digest = hashlib.sha256(f"{seed}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def build_cell_model(
    arch: str, method: str, seed: int, meta: dict, model_options: dict | None = None
) -> nn.Module:
    """The seeded initial model of a grid cell: build the architecture, then apply the method's init."""
    torch.manual_seed(derive_seed(seed, "build"))
    model = build_model(arch, meta, **(model_options or {}))
    generator = torch.Generator().manual_seed(derive_seed(seed, "init"))
    check_method(method).initialise(model, generator)
    return model


def metric_structure(model: nn.Module, info: Mapping[str, Any] | None) -> nn.Module:
    """The architecture whose layout the streamed metrics count: rebuilt from ``model_info``
    ``info`` (``arch``, ``meta``, ``model_options``) when given, so a sparse run counts its dense
    layers; else ``model`` itself."""
    info = info or {}
    if {"arch", "meta"} <= set(info):
        with torch.random.fork_rng(devices=[]):  # building it draws no number the run would draw
            return build_model(info["arch"], info["meta"], **info.get("model_options", {}))
    return model
