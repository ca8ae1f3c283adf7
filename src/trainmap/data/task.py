"""One task's data: :class:`TaskData` (train/test tensors and their ``meta``), how a kind bundles and
subsamples it, and its file (saved and loaded checksummed).

Inputs are float32 for vector and image tasks and int64 token ids for token tasks; labels are int64
class indices. ``meta`` always holds ``kind``, ``input_kind`` (``"vector"``, ``"image"`` or
``"tokens"``), ``input_shape`` (per-example shape), ``num_classes``, ``n_train``, ``n_test``,
``vocab_size`` (token tasks only) and the options that produced the data.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch

from trainmap.io import load_torch, save_torch

_TENSOR_KEYS = ("x_train", "y_train", "x_test", "y_test")


@dataclass
class TaskData:
    """Train/test tensors of one task and the JSON-serialisable description that produced them."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    meta: dict


def task_data(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    **meta: Any,
) -> TaskData:
    """Bundle tensors with ``meta``, filling in the sizes and per-example shape from the tensors
    (what every kind returns)."""
    meta["input_shape"] = list(x_train.shape[1:])
    meta["n_train"] = int(x_train.shape[0])
    meta["n_test"] = int(x_test.shape[0])
    return TaskData(x_train, y_train, x_test, y_test, meta)


def require(condition: bool, message: str) -> None:
    """Raise a ValueError with ``message`` unless ``condition`` holds (every kind's checks)."""
    if not condition:
        raise ValueError(message)


# --------------------------------------------------------------------------------------------------
# A seeded, class-stratified subsample of a training split (the readers' ``n_train``)


def stratified_subsample(labels: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """Indices (ascending) of a seeded subsample of size ``n`` keeping class proportions."""
    require(1 <= n <= len(labels), f"n_train must be in [1, {len(labels)}], got {n}")
    classes, counts = torch.unique(labels, return_counts=True)
    quotas = _largest_remainder_quotas(counts, n)
    generator = torch.Generator().manual_seed(seed)
    chosen = []
    for cls, quota in zip(classes.tolist(), quotas, strict=True):
        members = torch.nonzero(labels == cls).flatten()
        chosen.append(members[torch.randperm(len(members), generator=generator)[:quota]])
    return torch.cat(chosen).sort().values


def _largest_remainder_quotas(counts: torch.Tensor, n: int) -> list[int]:
    # Hamilton's method: floor the proportional shares, then hand the leftover slots to the classes
    # with the largest fractional parts, so the quotas sum to exactly n.
    total = int(counts.sum())
    shares = [int(c) * n / total for c in counts.tolist()]
    quotas = [int(s) for s in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: (quotas[i] - shares[i], i))
    for i in by_remainder[: n - sum(quotas)]:
        quotas[i] += 1
    return quotas


def subsample_train(
    x_train: torch.Tensor, y_train: torch.Tensor, n_train: int | None, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole training split when ``n_train`` is None, else its :func:`stratified_subsample`."""
    if n_train is None:
        return x_train, y_train
    keep = stratified_subsample(y_train, n_train, seed)
    return x_train[keep], y_train[keep]


# --------------------------------------------------------------------------------------------------
# Persistence


def save_task_data(data: TaskData, path: str | os.PathLike) -> None:
    """Save ``data`` atomically and checksummed (trainmap.io); ``meta`` as a JSON string."""
    payload: dict[str, Any] = {key: _compact(getattr(data, key)) for key in _TENSOR_KEYS}
    # A JSON string keeps arbitrary (JSON-serialisable) meta loadable under weights_only=True.
    payload["meta"] = json.dumps(data.meta, sort_keys=True)
    save_torch(payload, path)


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    # torch.save writes a view's whole underlying storage; copy views so files hold only their data.
    if tensor.is_contiguous() and tensor.untyped_storage().nbytes() == tensor.nbytes:
        return tensor
    return tensor.contiguous().clone()


def load_task_data(path: str | os.PathLike) -> TaskData:
    """Load a file written by :func:`save_task_data` (tensors and a JSON string only)."""
    payload = load_torch(path)
    expected = set(_TENSOR_KEYS) | {"meta"}
    require(
        isinstance(payload, dict) and set(payload) == expected,
        f"{path} is not a saved TaskData: expected keys {sorted(expected)}",
    )
    require(isinstance(payload["meta"], str), f"{path}: meta must be stored as a JSON string")
    tensors = {key: payload[key] for key in _TENSOR_KEYS}
    return TaskData(**tensors, meta=json.loads(payload["meta"]))
