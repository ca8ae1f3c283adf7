"""The ``arrays`` reader: a user's own train/test data from one local ``.npz`` or ``.pt`` file, no
code; every check names the file and the array. Its input kind and sizes are what the file holds,
so the config check reads the file (once per process and options) before any job.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainmap.data.registry import INPUT_KIND_CHOICES, register_data_kind
from trainmap.data.task import TaskData, require, subsample_train, task_data

ARRAY_NAMES = ("x_train", "y_train", "x_test", "y_test")
ARRAY_SUFFIXES = (".npz", ".pt", ".pth")


def read_arrays(
    path: str | os.PathLike,
    input_kind: str | None = None,
    num_classes: int | None = None,
    n_train: int | None = None,
    seed: int = 0,
) -> TaskData:
    """Train/test data from one local file: an ``.npz`` (``numpy.savez``, read without pickle) or a
    ``torch.save`` dict of tensors (``.pt``, read with ``weights_only=True``) holding ``x_train``,
    ``y_train``, ``x_test`` and ``y_test``.

    Inputs are float (vectors, images) or integer token ids; labels are integer class indices in
    ``[0, num_classes)`` (default: the largest label + 1). ``input_kind`` defaults to what the inputs
    are: integers -> ``tokens``; per example 1-D -> ``vector``, 2-D (H, W) -> ``image`` with one
    channel, 3-D (C, H, W) -> ``image``. Every check names the file and the array.
    """
    arrays = _load_arrays(Path(path))
    x_train, y_train, x_test, y_test = (arrays[name] for name in ARRAY_NAMES)
    kind = _array_input_kind(path, x_train, input_kind)
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        require(
            y.dim() == 1, f"{path}: y_{split} must be 1-D class labels, got shape {list(y.shape)}"
        )
        require(len(x) == len(y), f"{path}: x_{split} has {len(x)} examples but y_{split} {len(y)}")
        require(len(x) > 0, f"{path}: x_{split} is empty")
        if x.is_floating_point():
            bad = int((~torch.isfinite(x)).sum())
            require(bad == 0, f"{path}: x_{split} holds {bad} NaN or infinite value(s)")
    require(x_train.shape[1:] == x_test.shape[1:],
           f"{path}: x_train examples are {list(x_train.shape[1:])} but x_test examples "
           f"{list(x_test.shape[1:])}")  # fmt: skip
    classes = num_classes or int(max(y_train.max(), y_test.max())) + 1
    for split, y in (("train", y_train), ("test", y_test)):
        outside = y[(y < 0) | (y >= classes)]
        require(outside.numel() == 0, f"{path}: y_{split} holds labels {outside[:5].tolist()} "
               f"outside [0, {classes}) (num_classes = {classes})")  # fmt: skip
    if kind == "image" and x_train.dim() == 3:  # (N, H, W): one channel
        x_train, x_test = x_train.unsqueeze(1), x_test.unsqueeze(1)
    extra: dict[str, Any] = {}
    if kind == "tokens":
        extra["vocab_size"] = int(max(x_train.max(), x_test.max())) + 1
    else:
        x_train, x_test = x_train.float(), x_test.float()
    x_train, y_train = subsample_train(x_train, y_train, n_train, seed)
    return task_data(x_train, y_train, x_test, y_test, kind="arrays", input_kind=kind,
                      num_classes=classes, path=str(path), subsampled=n_train is not None,
                      seed=seed, **extra)  # fmt: skip


def _load_arrays(path: Path) -> dict[str, torch.Tensor]:
    """The four arrays of ``path`` as tensors (labels int64); errors name the file and array."""
    require(path.suffix in ARRAY_SUFFIXES, f"{path}: an array file ends in "
           f"{', '.join(ARRAY_SUFFIXES)} (numpy.savez or torch.save of a dict of tensors)")  # fmt: skip
    require(path.is_file(), f"{path}: no such file")
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as stored:
                found = {name: stored[name] for name in stored.files}
        except (ValueError, OSError) as error:
            raise ValueError(f"{path}: not a readable .npz file ({error})") from None
    else:
        found = torch.load(path, weights_only=True, map_location="cpu")
        require(isinstance(found, dict), f"{path}: holds a {type(found).__name__}, not a dict of "
               f"tensors named {', '.join(ARRAY_NAMES)}")  # fmt: skip
    missing = [name for name in ARRAY_NAMES if name not in found]
    require(not missing, f"{path}: lacks the array(s) {', '.join(missing)}; it needs "
           f"{', '.join(ARRAY_NAMES)}")  # fmt: skip
    arrays = {}
    for name in ARRAY_NAMES:
        value = found[name]
        tensor = torch.as_tensor(np.asarray(value)) if not torch.is_tensor(value) else value
        if name.startswith("y"):
            require(not tensor.is_floating_point() and tensor.dtype != torch.bool,
                   f"{path}: {name} must hold integer class labels, not {tensor.dtype}")  # fmt: skip
            tensor = tensor.long()
        else:
            require(tensor.is_floating_point() or tensor.dtype in _INTEGER_DTYPES,
                   f"{path}: {name} must hold numbers (float inputs or integer token ids), not "
                   f"{tensor.dtype}")  # fmt: skip
        arrays[name] = tensor
    return arrays


_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _array_input_kind(path: str | os.PathLike, x: torch.Tensor, input_kind: str | None) -> str:
    """``input_kind`` as given (checked against the inputs), or what the inputs are."""
    per_example = x.dim() - 1
    inferred = ("tokens" if not x.is_floating_point()
                else {1: "vector", 2: "image", 3: "image"}.get(per_example))  # fmt: skip
    kind = input_kind or inferred
    require(kind in INPUT_KIND_CHOICES, f"{path}: x_train examples of shape {list(x.shape[1:])} "
           f"and dtype {x.dtype} fit no input kind; give input_kind "
           f"({', '.join(INPUT_KIND_CHOICES)})")  # fmt: skip
    if kind == "image":
        require(per_example in (2, 3), f"{path}: input_kind image needs x_train examples of shape "
               f"(H, W) or (C, H, W), got {list(x.shape[1:])}")  # fmt: skip
    if kind == "tokens":
        require(not x.is_floating_point(), f"{path}: input_kind tokens needs integer token ids in "
               f"x_train, got {x.dtype}")  # fmt: skip
    return kind


@functools.cache
def _array_model_meta(options_json: str) -> dict[str, Any]:
    """What a model builder reads from the ``meta`` of the file the options name: read it."""
    options = json.loads(options_json)
    meta = read_arrays(options["path"], options.get("input_kind"), options.get("num_classes")).meta
    keys = ("input_kind", "input_shape", "num_classes", "vocab_size")
    return {key: meta[key] for key in keys if key in meta}


register_data_kind(
    "arrays",
    read_arrays,
    None,  # the input_kind option, else what the file holds: model_meta reads it
    lambda o: _array_model_meta(json.dumps(o, sort_keys=True, default=str)),
    reads="file",
)
