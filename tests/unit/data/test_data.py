"""Tests of trainmap.data: generators, readers (on files written here), dispatch, persistence."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from trainmap import data
from trainmap.data import (
    DATA_KINDS,
    REQUIRED_OPTION,
    TaskData,
    data_kind_options,
    load_task_data,
    make_digits,
    make_modular_addition,
    make_sparse_parity,
    make_task_data,
    read_cifar,
    read_mnist,
    save_task_data,
)

COMMON_META_KEYS = {"kind", "input_kind", "input_shape", "num_classes", "n_train", "n_test"}


def assert_same(a: TaskData, b: TaskData) -> None:
    for key in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, key), getattr(b, key)), key
    assert a.meta == b.meta


def assert_consistent_meta(task: TaskData) -> None:
    assert COMMON_META_KEYS <= set(task.meta)
    assert task.meta["input_shape"] == list(task.x_train.shape[1:]) == list(task.x_test.shape[1:])
    assert task.meta["n_train"] == len(task.x_train) == len(task.y_train)
    assert task.meta["n_test"] == len(task.x_test) == len(task.y_test)
    assert task.y_train.dtype == task.y_test.dtype == torch.int64
    assert int(task.y_train.min()) >= 0
    assert int(task.y_train.max()) < task.meta["num_classes"]


# --------------------------------------------------------------------------------------------------
# Sparse parity


def test_sparse_parity_shapes_and_meta():
    task = make_sparse_parity(n_bits=20, k=4, n_train=300, n_test=50, seed=3)
    assert_consistent_meta(task)
    assert task.x_train.shape == (300, 20) and task.x_test.shape == (50, 20)
    assert task.x_train.dtype == torch.float32
    assert set(task.x_train.unique().tolist()) == {-1.0, 1.0}
    meta = task.meta
    assert (meta["kind"], meta["input_kind"], meta["num_classes"]) == ("sparse_parity", "vector", 2)
    assert (meta["n_bits"], meta["k"], meta["seed"]) == (20, 4, 3)
    secret = meta["secret"]
    assert secret == sorted(secret) and len(set(secret)) == 4
    assert all(0 <= i < 20 for i in secret)


def test_sparse_parity_labels_are_parity_of_secret_bits():
    task = make_sparse_parity(n_bits=30, k=3, n_train=2000, n_test=500, seed=1)
    secret = task.meta["secret"]
    for x, y in ((task.x_train, task.y_train), (task.x_test, task.y_test)):
        for row, label in zip(x.tolist(), y.tolist(), strict=True):
            product = 1.0
            for i in secret:
                product *= row[i]
            assert label == (1 if product == -1.0 else 0)
    assert 0.45 < task.y_train.float().mean().item() < 0.55


def test_sparse_parity_is_deterministic_and_seed_dependent():
    assert_same(make_sparse_parity(seed=5), make_sparse_parity(seed=5))
    a, b = make_sparse_parity(seed=5), make_sparse_parity(seed=6)
    assert not torch.equal(a.x_train, b.x_train)
    # Train and test are separate draws, not the same examples.
    assert not torch.equal(a.x_train[:100], a.x_test)


def test_sparse_parity_rejects_bad_k():
    with pytest.raises(ValueError, match="k must be"):
        make_sparse_parity(n_bits=5, k=6)


# --------------------------------------------------------------------------------------------------
# Modular addition


def test_modular_addition_covers_every_pair_once_with_correct_labels():
    p = 13
    task = make_modular_addition(p=p, train_frac=0.4, seed=2)
    assert_consistent_meta(task)
    assert task.x_train.dtype == torch.int64
    assert task.meta["vocab_size"] == p + 1 and task.meta["num_classes"] == p
    assert task.meta["input_kind"] == "tokens" and task.meta["input_shape"] == [3]
    assert len(task.x_train) == round(0.4 * p * p)
    tokens = torch.cat([task.x_train, task.x_test])
    labels = torch.cat([task.y_train, task.y_test])
    assert (tokens[:, 2] == p).all()
    pairs = {(a, b) for a, b in tokens[:, :2].tolist()}
    assert len(pairs) == len(tokens) == p * p
    assert pairs == {(a, b) for a in range(p) for b in range(p)}
    assert torch.equal(labels, (tokens[:, 0] + tokens[:, 1]) % p)


def test_modular_addition_is_deterministic_and_seed_dependent():
    assert_same(make_modular_addition(p=11, seed=0), make_modular_addition(p=11, seed=0))
    a, b = make_modular_addition(p=11, seed=0), make_modular_addition(p=11, seed=1)
    assert not torch.equal(a.x_train, b.x_train)


@pytest.mark.parametrize(
    ("kwargs", "bad"), [({"p": 1}, "p must be >= 2, got 1"), ({"train_frac": 1.0}, "got 1.0")]
)
def test_modular_addition_validates_arguments(kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        make_modular_addition(**kwargs)


# --------------------------------------------------------------------------------------------------
# Digits


def test_digits_split_is_stratified_and_complete():
    task = make_digits(test_frac=0.25, seed=0)
    assert_consistent_meta(task)
    assert task.x_train.shape[1:] == (1, 8, 8) and task.x_train.dtype == torch.float32
    assert task.meta["n_train"] + task.meta["n_test"] == 1797
    assert 0.0 <= task.x_train.min().item() and task.x_train.max().item() <= 1.0
    assert task.x_train.max().item() == 1.0  # 16 / 16: scaled, not left in 0..16
    train_share = torch.bincount(task.y_train, minlength=10).float() / len(task.y_train)
    test_share = torch.bincount(task.y_test, minlength=10).float() / len(task.y_test)
    assert (train_share - test_share).abs().max().item() < 0.02


def test_digits_is_deterministic_and_seed_dependent():
    assert_same(make_digits(seed=4), make_digits(seed=4))
    assert not torch.equal(make_digits(seed=4).y_test, make_digits(seed=5).y_test)


# --------------------------------------------------------------------------------------------------
# MNIST (IDX)


def write_idx(path: Path, magic: int, values: np.ndarray, gzipped: bool = False) -> Path:
    """Write ``values`` (uint8) as an IDX file: big-endian magic, uint32 dims, then the bytes."""
    payload = struct.pack(">I", magic) + struct.pack(f">{values.ndim}I", *values.shape)
    payload += values.astype(np.uint8).tobytes()
    if gzipped:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)
    return path


def write_mnist(directory: Path, n_train: int = 40, n_test: int = 10, gzipped: bool = False):
    rng = np.random.default_rng(0)
    arrays = {
        "train": (
            rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
            np.arange(n_train, dtype=np.uint8) % 10,
        ),
        "t10k": (
            rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
            (np.arange(n_test, dtype=np.uint8) * 3) % 10,
        ),
    }
    for prefix, (images, labels) in arrays.items():
        write_idx(directory / f"{prefix}-images-idx3-ubyte", 0x803, images, gzipped)
        write_idx(directory / f"{prefix}-labels-idx1-ubyte", 0x801, labels, gzipped)
    return arrays


@pytest.mark.parametrize("gzipped", [False, True])
def test_read_mnist_reads_idx_values(tmp_path, gzipped):
    arrays = write_mnist(tmp_path, gzipped=gzipped)
    task = read_mnist(tmp_path)
    assert_consistent_meta(task)
    assert task.x_train.shape == (40, 1, 28, 28) and task.x_test.shape == (10, 1, 28, 28)
    assert task.x_train.dtype == torch.float32
    train_images, train_labels = arrays["train"]
    test_images, test_labels = arrays["t10k"]
    expected = torch.from_numpy(train_images.astype(np.float32) / 255.0).unsqueeze(1)
    assert torch.equal(task.x_train, expected)
    assert task.x_test[3, 0, 5, 7].item() == pytest.approx(test_images[3, 5, 7] / 255.0)
    assert task.y_train.tolist() == train_labels.tolist()
    assert task.y_test.tolist() == test_labels.tolist()
    assert task.meta["kind"] == "mnist" and task.meta["num_classes"] == 10


def test_read_mnist_rejects_bad_magic_naming_the_file(tmp_path):
    write_mnist(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", 0x0000ABCD, np.zeros(10, np.uint8))
    with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte.*magic"):
        read_mnist(tmp_path)


def test_read_mnist_rejects_truncated_file(tmp_path):
    write_mnist(tmp_path)
    file = tmp_path / "train-images-idx3-ubyte"
    file.write_bytes(file.read_bytes()[:-5])
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.*truncated"):
        read_mnist(tmp_path)


def test_read_mnist_missing_file_names_it(tmp_path):
    write_mnist(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match="train-labels-idx1-ubyte"):
        read_mnist(tmp_path)


def test_read_mnist_subsample_is_stratified_and_deterministic(tmp_path):
    write_mnist(tmp_path, n_train=200)
    task = read_mnist(tmp_path, n_train=50, seed=1)
    assert len(task.x_train) == task.meta["n_train"] == 50
    assert torch.bincount(task.y_train, minlength=10).tolist() == [5] * 10
    assert_same(task, read_mnist(tmp_path, n_train=50, seed=1))
    assert not torch.equal(task.x_train, read_mnist(tmp_path, n_train=50, seed=2).x_train)
    assert len(task.x_test) == 10  # the test set is never subsampled


# --------------------------------------------------------------------------------------------------
# CIFAR (pickles)


def cifar_batch(n: int, label_key: bytes, num_classes: int, offset: int) -> dict:
    rng = np.random.default_rng(offset)
    return {
        b"batch_label": b"batch",
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        label_key: [(offset + i) % num_classes for i in range(n)],
        b"filenames": [f"img_{offset + i}.png".encode() for i in range(n)],
    }


def dump(obj: object, path: Path, protocol: int = pickle.HIGHEST_PROTOCOL) -> None:
    with open(path, "wb") as stream:
        pickle.dump(obj, stream, protocol=protocol)


def write_cifar10(directory: Path, per_batch: int = 6, protocol: int = 5) -> list[dict]:
    directory.mkdir(parents=True, exist_ok=True)
    batches = [cifar_batch(per_batch, b"labels", 10, i * per_batch) for i in range(6)]
    for i, batch in enumerate(batches[:5], start=1):
        dump(batch, directory / f"data_batch_{i}", protocol)
    dump(batches[5], directory / "test_batch", protocol)
    return batches


@pytest.mark.parametrize("protocol", [2, 5])
def test_read_cifar10_reshapes_channel_major_rows(tmp_path, protocol):
    batches = write_cifar10(tmp_path, protocol=protocol)
    batches[0][b"data"][2, 1024 + 5 * 32 + 9] = 200  # green plane, row 5, column 9
    dump(batches[0], tmp_path / "data_batch_1", protocol)
    task = read_cifar(tmp_path)
    assert_consistent_meta(task)
    assert task.x_train.shape == (30, 3, 32, 32) and task.x_test.shape == (6, 3, 32, 32)
    assert task.x_train.dtype == torch.float32
    assert task.x_train[2, 1, 5, 9].item() == pytest.approx(200 / 255.0)
    assert task.x_train[2, 0, 0, 0].item() == pytest.approx(batches[0][b"data"][2, 0] / 255.0)
    assert task.x_train[2, 2, 31, 31].item() == pytest.approx(batches[0][b"data"][2, -1] / 255.0)
    labels = [label for batch in batches[:5] for label in batch[b"labels"]]
    assert task.y_train.tolist() == labels
    assert task.y_test.tolist() == batches[5][b"labels"]
    assert (task.meta["kind"], task.meta["num_classes"]) == ("cifar10", 10)


def test_read_cifar10_accepts_parent_directory(tmp_path):
    write_cifar10(tmp_path / "cifar-10-batches-py")
    assert_same(read_cifar(tmp_path), read_cifar(tmp_path))
    assert len(read_cifar(tmp_path).x_train) == 30


def test_read_cifar100_uses_fine_labels(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    train = cifar_batch(20, b"fine_labels", 100, 90)
    train[b"coarse_labels"] = [0] * 20
    test = cifar_batch(4, b"fine_labels", 100, 3)
    dump(train, folder / "train")
    dump(test, folder / "test")
    task = make_task_data("cifar100", {"path": str(tmp_path)})
    assert task.meta["num_classes"] == 100 and task.meta["kind"] == "cifar100"
    assert task.y_train.tolist() == train[b"fine_labels"]
    assert task.y_test.tolist() == [3, 4, 5, 6]
    assert task.x_test.shape == (4, 3, 32, 32)


def test_read_cifar_missing_file_names_it(tmp_path):
    write_cifar10(tmp_path)
    (tmp_path / "data_batch_4").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_4"):
        read_cifar(tmp_path)


class Exploit:
    """Pickles as a call to os.system: what a tampered data file could contain."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_read_cifar_refuses_code_in_pickle(tmp_path):
    write_cifar10(tmp_path)
    marker = tmp_path / "pwned"
    dump({b"data": Exploit(f"touch {marker}"), b"labels": []}, tmp_path / "test_batch")
    with pytest.raises(pickle.UnpicklingError, match="system"):
        read_cifar(tmp_path)
    assert not marker.exists()


def test_read_cifar_subsample(tmp_path):
    write_cifar10(tmp_path, per_batch=20)
    task = make_task_data("cifar10", {"path": tmp_path, "n_train": 30, "seed": 7})
    assert len(task.x_train) == len(task.y_train) == 30
    assert torch.bincount(task.y_train, minlength=10).tolist() == [3] * 10
    assert_same(task, make_task_data("cifar10", {"path": tmp_path, "n_train": 30, "seed": 7}))
    with pytest.raises(ValueError, match="n_train"):
        read_cifar(tmp_path, n_train=101)


# --------------------------------------------------------------------------------------------------
# Registry, dispatch, persistence


def test_registry_and_options():
    assert set(DATA_KINDS) == {
        "sparse_parity",
        "modular_addition",
        "digits",
        "mnist_5k",
        "mnist1d",
        "mnist",
        "cifar10",
        "cifar100",
        "image_folder",
        "arrays",
    }
    assert data_kind_options("sparse_parity") == {
        "n_bits": 40,
        "k": 3,
        "n_train": 1000,
        "n_test": 100,
        "seed": 0,
    }
    assert data_kind_options("cifar100") == {"path": REQUIRED_OPTION, "n_train": None, "seed": 0}
    assert data_kind_options("mnist_5k") == {"test_frac": 0.2, "seed": 0}
    assert data_kind_options("mnist1d") == {"num_samples": 5000, "train_split": 0.8, "seed": 42}


def test_make_task_data_dispatches_with_options():
    task = make_task_data("modular_addition", {"p": 7, "train_frac": 0.5, "seed": 1})
    assert_same(task, make_modular_addition(p=7, train_frac=0.5, seed=1))


def test_make_task_data_rejects_unknown_kind_and_option():
    with pytest.raises(ValueError, match="'imagenet'.*sparse_parity"):
        make_task_data("imagenet", {})
    with pytest.raises(ValueError, match="'n_bitz'.*n_bits"):
        make_task_data("sparse_parity", {"n_bitz": 3})
    with pytest.raises(ValueError, match="requires.*'path'"):
        make_task_data("mnist", {})


@pytest.mark.parametrize(
    "make",
    [lambda: make_sparse_parity(n_train=50), lambda: make_modular_addition(p=5), make_digits],
)
def test_save_load_round_trip(tmp_path, make):
    task = make()
    path = tmp_path / "nested" / "task.pt"
    save_task_data(task, path)
    assert [p.name for p in path.parent.iterdir()] == ["task.pt"]  # no temp file left behind
    loaded = load_task_data(path)
    assert_same(task, loaded)
    assert loaded.x_train.dtype == task.x_train.dtype


def test_load_rejects_foreign_file(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match="not a saved TaskData"):
        load_task_data(path)


def test_stratified_subsample_quotas_sum_exactly():
    labels = torch.tensor([0] * 7 + [1] * 2 + [2] * 1)
    keep = data.stratified_subsample(labels, 5, seed=0)
    assert len(keep) == len(set(keep.tolist())) == 5
    assert torch.bincount(labels[keep], minlength=3).tolist() == [4, 1, 0]
