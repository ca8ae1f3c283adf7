"""Model checkpoints: one file format per model form, loaded without knowing which rule wrote it.

Every model file trainmap writes is a ``torch.save`` dict of tensors and plain containers with a
``format`` key naming its form:

``dense``
    A network of the architecture registry (the ``train`` rule's ``model.pt``): ``state_dict``,
    ``arch``, ``model_options``, ``meta`` (the data description) and the cell's ``method``/``seed``.
    Files from before the key existed are read as ``dense``.
``deploy``
    A RepVGG model fused into plain convolutions (``trainmap.models.repvgg``).
``sparse``
    An N:M sparse network (``trainmap.methods.sparse``).
``quantized``
    Integer weights with per-channel scales (``trainmap.methods.quantize``).

Files are written and read through :func:`trainmap.io.save_torch` / :func:`trainmap.io.load_torch`,
so each carries a SHA-256 of its content that every load verifies (a damaged file raises
:class:`trainmap.io.DamagedFileError` naming it), and the same content is the same bytes wherever
it is saved (DVC sees a retrained model with unchanged weights as no change). :func:`load_model`
reads the key and calls the loader of that form. Loaders are named here as
``module:function`` and imported on first use, so reading a dense model never imports the methods'
code, and a deploy model loads without any RepVGG block code.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from torch import nn

from trainmap.io import load_torch, save_torch

FORMAT_KEY = "format"
LOADERS = {
    "dense": "trainmap.training.checkpoints:model_from_dense",
    "deploy": "trainmap.models.repvgg:model_from_deploy",
    "sparse": "trainmap.methods.sparse_layers:model_from_sparse",
    "quantized": "trainmap.methods.quantize:model_from_quantized",
}


def save_dense(model: nn.Module, path: str | os.PathLike, **info: Any) -> None:
    """Save a registry network with what rebuilds it (``arch``, ``model_options``, ``meta``, ...)."""
    save_torch({FORMAT_KEY: "dense", "state_dict": model.state_dict(), **info}, path)


def model_from_dense(saved: dict[str, Any]) -> nn.Module:
    """Rebuild a registry network from a loaded ``dense`` checkpoint."""
    from trainmap.models import build_model

    model = build_model(saved["arch"], saved["meta"], **saved["model_options"])
    model.load_state_dict(saved["state_dict"])
    return model


def checkpoint_format(saved: dict[str, Any]) -> str:
    """The form of a loaded checkpoint (``dense`` when the file predates the ``format`` key)."""
    return saved.get(FORMAT_KEY, "dense")


def model_from_checkpoint(saved: dict[str, Any]) -> nn.Module:
    """The model of a loaded checkpoint, in eval mode, built by the loader of its form."""
    form = checkpoint_format(saved)
    if form not in LOADERS:
        raise ValueError(f"unknown checkpoint format {form!r}; known: {', '.join(sorted(LOADERS))}")
    module_name, function_name = LOADERS[form].split(":")
    loader = getattr(importlib.import_module(module_name), function_name)
    return loader(saved).eval()


def load_model(path: str | os.PathLike) -> nn.Module:
    """Read any trainmap model file (``weights_only=True``) and return the model in eval mode."""
    return model_from_checkpoint(load_torch(path))
