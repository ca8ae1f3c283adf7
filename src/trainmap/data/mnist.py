"""The ``mnist`` reader: MNIST (or any 10-class IDX set) from a directory of the four IDX files, and
the checks the config check runs on them (missing files; damaged ones, from headers and lengths).

``mnist``
    A directory with ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each optionally gzipped (``.gz``).
    IDX format: a big-endian magic number (0x00000803 for images, 0x00000801 for labels), one
    big-endian uint32 per dimension, then the uint8 values in row-major order. Nothing is
    downloaded; ``n_train`` keeps a seeded, class-stratified subsample of the training set.
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from trainmap.data.files import GZIP_MAGIC, DamagedFile, content_hint, problem_text
from trainmap.data.registry import register_data_kind
from trainmap.data.task import TaskData, require, subsample_train, task_data

_IDX_IMAGES_MAGIC = 0x00000803
_IDX_LABELS_MAGIC = 0x00000801
_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def read_mnist(path: str | os.PathLike, n_train: int | None = None, seed: int = 0) -> TaskData:
    """Read MNIST (or any 10-class IDX set) from a directory of the four standard IDX files."""
    directory = Path(path)
    arrays = {
        role: _read_idx(_find_mnist_file(directory, name)) for role, name in _MNIST_FILES.items()
    }
    x_train, y_train = _mnist_split(arrays["train_images"], arrays["train_labels"], "train")
    x_test, y_test = _mnist_split(arrays["test_images"], arrays["test_labels"], "t10k")
    require(
        x_train.shape[1:] == x_test.shape[1:],
        f"MNIST train images are {list(x_train.shape[2:])} but test images are "
        f"{list(x_test.shape[2:])} in {directory}",
    )
    x_train, y_train = subsample_train(x_train, y_train, n_train, seed)
    return task_data(
        x_train,
        y_train,
        x_test,
        y_test,
        kind="mnist",
        input_kind="image",
        num_classes=10,
        path=str(path),
        subsampled=n_train is not None,
        seed=seed,
    )


def _mnist_file_or_none(directory: Path, name: str) -> Path | None:
    """The IDX file ``name`` in ``directory``, plain or gzipped, or None."""
    return next((c for c in (directory / name, directory / f"{name}.gz") if c.is_file()), None)


def _find_mnist_file(directory: Path, name: str) -> Path:
    found = _mnist_file_or_none(directory, name)
    if found is not None:
        return found
    expected = ", ".join(_MNIST_FILES.values())
    raise FileNotFoundError(
        f"MNIST file {name!r} (or {name}.gz) not found in {directory}; expected the files "
        f"{expected}, each optionally gzipped"
    )


def _read_idx(path: Path) -> tuple[int, np.ndarray]:
    """Return ``(magic, values)`` of an IDX file of unsigned bytes, plain or gzipped."""
    try:
        with _open_maybe_gzip(path) as stream:
            raw = stream.read()
    except (OSError, EOFError) as error:  # gzip reports corrupt or cut-off archives this way
        raise ValueError(f"cannot read IDX file {path}: {error}") from error
    require(len(raw) >= 4, f"IDX file {path} is truncated: {len(raw)} bytes, no magic number")
    (magic,) = struct.unpack(">I", raw[:4])
    require(
        magic in (_IDX_IMAGES_MAGIC, _IDX_LABELS_MAGIC),
        f"IDX file {path} has bad magic number 0x{magic:08x}; expected 0x{_IDX_IMAGES_MAGIC:08x} "
        f"(images) or 0x{_IDX_LABELS_MAGIC:08x} (labels)",
    )
    n_dims = magic & 0xFF
    header_size = 4 + 4 * n_dims
    require(len(raw) >= header_size, f"IDX file {path} is truncated inside its header")
    dims = struct.unpack(f">{n_dims}I", raw[4:header_size])
    expected = header_size + int(np.prod(dims, dtype=np.int64))
    require(
        len(raw) == expected,
        f"IDX file {path} has {len(raw)} bytes but its header {list(dims)} implies {expected}"
        + (" (truncated)" if len(raw) < expected else " (trailing data)"),
    )
    values = np.frombuffer(raw, dtype=np.uint8, offset=header_size).reshape(dims)
    return magic, values


def _open_maybe_gzip(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _mnist_split(
    images: tuple[int, np.ndarray], labels: tuple[int, np.ndarray], prefix: str
) -> tuple[torch.Tensor, torch.Tensor]:
    (image_magic, image_values), (label_magic, label_values) = images, labels
    require(
        image_magic == _IDX_IMAGES_MAGIC,
        f"{prefix} images file has magic 0x{image_magic:08x}, expected 0x{_IDX_IMAGES_MAGIC:08x}",
    )
    require(
        label_magic == _IDX_LABELS_MAGIC,
        f"{prefix} labels file has magic 0x{label_magic:08x}, expected 0x{_IDX_LABELS_MAGIC:08x}",
    )
    require(
        len(image_values) == len(label_values),
        f"{prefix}: {len(image_values)} images but {len(label_values)} labels",
    )
    out_of_range = label_values[label_values >= 10]
    require(
        out_of_range.size == 0,
        f"{prefix} labels must be digits 0-9, found {out_of_range[:5].tolist()}",
    )
    x = torch.from_numpy(image_values.astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(label_values.astype(np.int64))
    return x, y


# --------------------------------------------------------------------------------------------------
# Missing and damaged files, checked before any job: the IDX headers, lengths and gzip trailers only

_GZIP_MIN_BYTES = 18  # a 10-byte header and an 8-byte trailer (CRC32, ISIZE)
_IDX_MAX_HEAD = 4 + 4 * 3  # magic and three dims, the longest header of an MNIST file


def missing_mnist_files(directory: Path) -> list[str]:
    """The four IDX files (each plain or gzipped) that ``directory`` lacks."""
    return [name for name in _MNIST_FILES.values() if _mnist_file_or_none(directory, name) is None]


def damaged_mnist_files(directory: Path) -> list[tuple[str, str]]:
    """``(file, what is wrong)`` for the present IDX files of ``directory`` that cannot be the
    standard files (magic number and dims, the length a plain file has or a ``.gz`` file's trailer
    states), then for the splits whose image and label counts differ."""
    found: list[tuple[str, str]] = []
    files: dict[str, Path] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for role, name in _MNIST_FILES.items():
        file = _mnist_file_or_none(directory, name)
        if file is None:
            continue
        files[role] = file
        try:
            shapes[role] = _idx_shape(file, images=role.endswith("_images"))
        except (DamagedFile, OSError) as error:
            found.append((str(file), problem_text(error)))
    for split in ("train", "test"):
        images, labels = shapes.get(f"{split}_images"), shapes.get(f"{split}_labels")
        if images and labels and images[0] != labels[0]:
            message = (
                f"holds {labels[0]} labels but {files[f'{split}_images'].name} holds {images[0]} "
                "images; the two files come from different sets or one is damaged"
            )
            found.append((str(files[f"{split}_labels"]), message))
    return found


def _idx_shape(file: Path, images: bool) -> tuple[int, ...]:
    """The dims of the IDX ``file`` (images: 3 dims, labels: 1) after checking its magic number
    and that its length, or for ``.gz`` its gzip trailer, matches them; else :class:`DamagedFile`."""
    gzipped = file.suffix == ".gz"
    head, length = _gzip_head_and_length(file) if gzipped else _plain_head_and_length(file)
    dims = _idx_dims(head, images, file.name)
    expected = 4 + 4 * len(dims) + math.prod(dims)
    if gzipped and length != expected % 2**32:  # ISIZE is the length modulo 2**32
        raise DamagedFile(
            f"ends with a gzip trailer stating {length:,} unpacked bytes, but an IDX file of "
            f"{_idx_content(dims)} is {expected:,} (the gzip file was cut short or is damaged)"
        )
    if not gzipped and length != expected:
        raise DamagedFile(
            f"is {length:,} bytes; an IDX file of {_idx_content(dims)} is {expected:,} "
            + ("(truncated)" if length < expected else "(trailing data)")
        )
    return dims


def _plain_head_and_length(file: Path) -> tuple[bytes, int]:
    """The first bytes of ``file`` (up to an IDX header) and its length."""
    with open(file, "rb") as stream:
        head = stream.read(_IDX_MAX_HEAD)
        length = os.fstat(stream.fileno()).st_size
    if not head:
        raise DamagedFile("is empty (0 bytes)")
    return head, length


def _gzip_head_and_length(file: Path) -> tuple[bytes, int]:
    """The first unpacked bytes of the gzipped ``file`` (only its first block is decompressed)
    and the unpacked length its trailer states, after checking the gzip frame."""
    head, size = _plain_head_and_length(file)
    if not head.startswith(GZIP_MAGIC):
        raise DamagedFile(
            f"is not gzip-compressed though its name ends in .gz: it starts with {head[:4]!r}"
            f"{content_hint(head)}; an unpacked IDX file is named {file.stem}"
        )
    if size < _GZIP_MIN_BYTES:
        raise DamagedFile(f"is {size} bytes, too short for a gzip file (truncated)")
    try:
        with gzip.open(file, "rb") as stream:
            unpacked = stream.read(_IDX_MAX_HEAD)
    except (OSError, EOFError, zlib.error) as error:
        raise DamagedFile(f"is a damaged or truncated gzip file ({error})") from None
    with open(file, "rb") as stream:
        stream.seek(-4, os.SEEK_END)
        (length,) = struct.unpack("<I", stream.read(4))
    return unpacked, length


def _idx_dims(head: bytes, images: bool, name: str) -> tuple[int, ...]:
    """The dims in the IDX header ``head`` of an images or labels file; else :class:`DamagedFile`."""
    what, expected = ("images", _IDX_IMAGES_MAGIC) if images else ("labels", _IDX_LABELS_MAGIC)
    magic = struct.unpack(">I", head[:4])[0] if len(head) >= 4 else None
    if magic != expected:
        if head.startswith(GZIP_MAGIC):
            hint = f" (it is gzip-compressed: name it {name}.gz)"
        elif magic in (_IDX_IMAGES_MAGIC, _IDX_LABELS_MAGIC):
            hint = f" (that of an IDX {'labels' if images else 'images'} file)"
        else:
            hint = content_hint(head)
        found = f"0x{magic:08x}" if magic is not None else f"only {len(head)} bytes"
        raise DamagedFile(
            f"does not start with the IDX {what} magic number 0x{expected:08x}: it starts "
            f"with {found}{hint}"
        )
    n_dims = magic & 0xFF
    if len(head) < 4 + 4 * n_dims:
        raise DamagedFile(f"is {len(head)} bytes, shorter than the header of an IDX {what} file")
    return struct.unpack(f">{n_dims}I", head[4 : 4 + 4 * n_dims])


def _idx_content(dims: tuple[int, ...]) -> str:
    """``60000 28x28 images`` or ``60000 labels``."""
    if len(dims) == 1:
        return f"{dims[0]} labels"
    return f"{dims[0]} {'x'.join(map(str, dims[1:]))} images"


register_data_kind(
    "mnist",
    read_mnist,
    "image",
    lambda o: {"input_shape": [1, 28, 28], "num_classes": 10},
    reads="directory",
    missing_files=missing_mnist_files,
    damaged_files=damaged_mnist_files,
)
