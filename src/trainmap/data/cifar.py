"""The ``cifar10`` and ``cifar100`` readers: the python-version CIFAR batches from a local directory,
unpickled safely, and the checks the config check runs on them (missing files; damaged ones, from
the first and last bytes).

``cifar10`` / ``cifar100``
    The "python version" archives, extracted: ``data_batch_1`` .. ``data_batch_5`` and
    ``test_batch`` (CIFAR-10, labels under ``b"labels"``) or ``train`` and ``test`` (CIFAR-100,
    labels under ``b"fine_labels"``), in the directory or in the archive's folder below it
    (``cifar-10-batches-py``, ``cifar-100-python``). Each file is a pickled dict with bytes keys
    whose ``b"data"`` is a uint8 array (N, 3072) in channel-major order: 1024 red, 1024 green, 1024
    blue values, each plane 32 rows of 32. The pickles are read with a restricted unpickler that can
    only rebuild numpy arrays, so a tampered file cannot run code. Nothing is downloaded;
    ``n_train`` keeps a seeded, class-stratified subsample of the training set.
"""

from __future__ import annotations

import functools
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainmap.data.files import DamagedFile, content_hint, problem_text
from trainmap.data.registry import register_data_kind
from trainmap.data.task import TaskData, require, subsample_train, task_data

_CIFAR_LAYOUT = {
    10: {
        "folder": "cifar-10-batches-py",
        "train": [f"data_batch_{i}" for i in range(1, 6)],
        "test": ["test_batch"],
        "label_key": b"labels",
    },
    100: {
        "folder": "cifar-100-python",
        "train": ["train"],
        "test": ["test"],
        "label_key": b"fine_labels",
    },
}
_CIFAR_PIXELS = 3 * 32 * 32


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    # Python 3 pickles bytes with protocols 2 and lower as _codecs.encode(text, "latin1"); only that
    # exact round trip is allowed, not arbitrary codecs.
    if encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"forbidden encoding {encoding!r} in _codecs.encode")
    return text.encode("latin1")


def _numpy_global(module: str, name: str) -> Any:
    # Pickles written by numpy 1.x name numpy.core, those by 2.x numpy._core; resolve both through
    # whichever exists so that old files load without numpy's deprecation warning.
    suffix = module.split(".", 2)[2]
    internals = getattr(np, "_core", None) or np.core
    return getattr(getattr(internals, suffix), name)


_ALLOWED_GLOBALS: dict[tuple[str, str], Callable[[], Any]] = {
    ("numpy", "ndarray"): lambda: np.ndarray,
    ("numpy", "dtype"): lambda: np.dtype,
    ("_codecs", "encode"): lambda: _latin1_encode,
    **{
        (f"{package}.{module}", name): functools.partial(_numpy_global, f"{package}.{module}", name)
        for package in ("numpy.core", "numpy._core")
        for module, name in (
            ("multiarray", "_reconstruct"),
            ("multiarray", "scalar"),
            ("numeric", "_frombuffer"),
        )
    },
}


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that can rebuild numpy arrays and plain containers, and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        resolve = _ALLOWED_GLOBALS.get((module, name))
        if resolve is None:
            raise pickle.UnpicklingError(f"forbidden global {module}.{name} in pickle")
        return resolve()


def restricted_unpickle(path: str | os.PathLike) -> Any:
    """Unpickle ``path`` with :class:`RestrictedUnpickler` (bytes keys, as in the CIFAR files)."""
    with open(path, "rb") as stream:
        return RestrictedUnpickler(stream, encoding="bytes").load()


def read_cifar(
    path: str | os.PathLike, num_classes: int = 10, n_train: int | None = None, seed: int = 0
) -> TaskData:
    """Read CIFAR-10 or CIFAR-100 (python version) from its directory or the directory above it."""
    require(num_classes in _CIFAR_LAYOUT, f"num_classes must be 10 or 100, got {num_classes}")
    layout = _CIFAR_LAYOUT[num_classes]
    directory = _cifar_directory(Path(path), layout["folder"])
    x_train, y_train = _read_cifar_files(directory, layout["train"], layout, num_classes)
    x_test, y_test = _read_cifar_files(directory, layout["test"], layout, num_classes)
    x_train, y_train = subsample_train(x_train, y_train, n_train, seed)
    return task_data(
        x_train,
        y_train,
        x_test,
        y_test,
        kind=f"cifar{num_classes}",
        input_kind="image",
        num_classes=num_classes,
        path=str(path),
        subsampled=n_train is not None,
        seed=seed,
    )


def read_cifar10(path: str | os.PathLike, n_train: int | None = None, seed: int = 0) -> TaskData:
    """CIFAR-10: :func:`read_cifar` with ``num_classes=10``."""
    return read_cifar(path, num_classes=10, n_train=n_train, seed=seed)


def read_cifar100(path: str | os.PathLike, n_train: int | None = None, seed: int = 0) -> TaskData:
    """CIFAR-100 with its 100 fine labels: :func:`read_cifar` with ``num_classes=100``."""
    return read_cifar(path, num_classes=100, n_train=n_train, seed=seed)


def _cifar_directory(path: Path, folder: str) -> Path:
    nested = path / folder
    return nested if nested.is_dir() else path


def _read_cifar_files(
    directory: Path, names: list[str], layout: dict, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    batches = [_read_cifar_batch(directory, name, layout, num_classes) for name in names]
    data = np.concatenate([data for data, _ in batches])
    labels = np.concatenate([labels for _, labels in batches])
    # Rows are channel-major (1024 red, 1024 green, 1024 blue; each plane row by row), which is
    # exactly (3, 32, 32) in C order.
    x = torch.from_numpy(data.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0)
    return x, torch.from_numpy(labels)


def _read_cifar_batch(
    directory: Path, name: str, layout: dict, num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    file = directory / name
    if not file.is_file():
        expected = ", ".join(layout["train"] + layout["test"])
        raise FileNotFoundError(
            f"CIFAR-{num_classes} file {name!r} not found in {directory}; expected {expected} "
            f"in that directory or in its subdirectory {layout['folder']}/"
        )
    batch = restricted_unpickle(file)
    label_key = layout["label_key"]
    require(
        isinstance(batch, dict) and b"data" in batch and label_key in batch,
        f"CIFAR file {file} is not a dict with keys b'data' and {label_key!r}",
    )
    data = batch[b"data"]
    require(
        isinstance(data, np.ndarray)
        and data.dtype == np.uint8
        and data.ndim == 2
        and data.shape[1] == _CIFAR_PIXELS,
        f"CIFAR file {file}: b'data' must be a uint8 array (N, {_CIFAR_PIXELS})",
    )
    labels = np.asarray(batch[label_key], dtype=np.int64)
    require(
        labels.shape == (len(data),),
        f"CIFAR file {file}: {len(data)} images but {labels.size} labels",
    )
    require(
        labels.size == 0 or (labels.min() >= 0 and labels.max() < num_classes),
        f"CIFAR file {file}: labels must lie in [0, {num_classes})",
    )
    return data, labels


# --------------------------------------------------------------------------------------------------
# Missing and damaged files, checked before any job: each batch's first and last bytes only

# A pickle of protocol 2 and above starts with PROTO; protocols 0 and 1 start a dict with MARK or
# EMPTY_DICT. Every pickle ends with STOP.
_PICKLE_FIRST_BYTES = (b"\x80", b"(", b"}")
_PICKLE_STOP = b"."


def missing_cifar_files(directory: Path, num_classes: int = 10) -> list[str]:
    """The CIFAR-``num_classes`` batches that ``directory`` (or its archive folder) lacks."""
    layout = _CIFAR_LAYOUT[num_classes]
    folder = _cifar_directory(directory, layout["folder"])
    return [name for name in (*layout["train"], *layout["test"]) if not (folder / name).is_file()]


def damaged_cifar_files(directory: Path, num_classes: int = 10) -> list[tuple[str, str]]:
    """``(file, what is wrong)`` for the present CIFAR-``num_classes`` batches in ``directory``
    (or its archive folder) that do not start and end as a pickle does."""
    layout = _CIFAR_LAYOUT[num_classes]
    folder = _cifar_directory(directory, layout["folder"])
    found = []
    for file in (folder / name for name in (*layout["train"], *layout["test"])):
        if not file.is_file():
            continue
        try:
            _check_pickle_file(file)
        except (DamagedFile, OSError) as error:
            found.append((str(file), problem_text(error)))
    return found


def _check_pickle_file(file: Path) -> None:
    """``file`` starts as a pickle does and ends with the STOP opcode; else :class:`DamagedFile`."""
    with open(file, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        head = stream.read(4)
        if not head:
            raise DamagedFile("is empty (0 bytes)")
        stream.seek(-1, os.SEEK_END)
        last = stream.read(1)
    if head[:1] not in _PICKLE_FIRST_BYTES:
        raise DamagedFile(
            f"is not a python pickle: it starts with {head!r}{content_hint(head)}; the python "
            "version of the CIFAR batches is needed, not the binary or MATLAB one"
        )
    if last != _PICKLE_STOP:
        raise DamagedFile(
            f"is {size:,} bytes and does not end with a pickle's STOP opcode (truncated)"
        )


register_data_kind(
    "cifar10",
    read_cifar10,
    "image",
    lambda o: {"input_shape": [3, 32, 32], "num_classes": 10},
    reads="directory",
    missing_files=missing_cifar_files,
    damaged_files=damaged_cifar_files,
)
register_data_kind(
    "cifar100",
    read_cifar100,
    "image",
    lambda o: {"input_shape": [3, 32, 32], "num_classes": 100},
    reads="directory",
    missing_files=functools.partial(missing_cifar_files, num_classes=100),
    damaged_files=functools.partial(damaged_cifar_files, num_classes=100),
)
