"""Damaged local data files (MNIST IDX, CIFAR pickles) are refused when the config is checked.

Each test writes small but valid reader files into a temporary directory (the readers in
trainmap.data read them), damages one the way downloads and copies go wrong (cut short, empty, a
saved HTML error page, the wrong file) and loads a config whose grid trains on that directory:
``load_config`` must refuse it with a message naming the config key, the task, the file and the
fix, before any job could read the file. The healthy directories are the positive controls.
"""

from __future__ import annotations

import gzip
import pickle
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from trainmap.data import damaged_data_files, read_cifar, read_mnist
from trainmap.grid import ConfigError, load_config

N_TRAIN, N_TEST = 10, 6
HTML_PAGE = b"<!DOCTYPE html>\n<html><body>404 Not Found</body></html>\n"
FIX = ["Replace each with the standard file", "nothing is downloaded by trainmap"]

# --------------------------------------------------------------------------------------------------
# Writing reader files and configs


def idx_bytes(magic: int, values: np.ndarray) -> bytes:
    """``values`` as an IDX file: big-endian magic, uint32 dims, then the unsigned bytes."""
    header = struct.pack(">I", magic) + struct.pack(f">{values.ndim}I", *values.shape)
    return header + values.astype(np.uint8).tobytes()


def write_mnist(directory: Path, gzipped: bool = False) -> dict[str, Path]:
    """The four MNIST IDX files (10 train and 6 test 28x28 images); role -> file."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    files = {}
    for split, prefix, n in (("train", "train", N_TRAIN), ("test", "t10k", N_TEST)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = np.arange(n, dtype=np.uint8) % 10
        for role, magic, values in (("images", 0x803, images), ("labels", 0x801, labels)):
            payload = idx_bytes(magic, values)
            file = directory / f"{prefix}-{role}-idx{values.ndim}-ubyte"
            if gzipped:
                file = file.with_name(file.name + ".gz")
                payload = gzip.compress(payload)
            file.write_bytes(payload)
            files[f"{split}_{role}"] = file
    return files


def cifar_batch(n: int, label_key: bytes, num_classes: int) -> dict:
    rng = np.random.default_rng(n)
    return {
        b"batch_label": b"batch",
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        label_key: [i % num_classes for i in range(n)],
    }


def write_cifar(directory: Path, num_classes: int = 10, protocol: int = 2) -> dict[str, Path]:
    """Tiny CIFAR-10 (or -100) python batches in the archive's folder below ``directory``."""
    layout = {
        10: ("cifar-10-batches-py", [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]),
        100: ("cifar-100-python", ["train", "test"]),
    }
    folder, names = layout[num_classes]
    label_key = b"labels" if num_classes == 10 else b"fine_labels"
    (directory / folder).mkdir(parents=True, exist_ok=True)
    files = {}
    for name in names:
        files[name] = directory / folder / name
        batch = cifar_batch(4, label_key, num_classes)
        files[name].write_bytes(pickle.dumps(batch, protocol=protocol))
    return files


def load(repo_root: Path, tmp_path: Path, task: str, kind: str, directory: Path) -> dict:
    """The default study with a grid of one ``task`` cell reading ``directory``."""
    override = tmp_path / "override.yaml"
    grid = [{"task": task, "archs": ["mlp"], "methods": ["kaiming"], "seeds": [0]}]
    data = {task: {"kind": kind, "path": str(directory)}}
    no_joint = {"joint": []}  # the default joint maps name tasks outside this grid (a warning)
    settings = {"grid": grid, "data": data, "analysis": no_joint}
    if task != kind:  # a task of the user's own: the settings params.yaml gives the kind's task
        params = yaml.safe_load((repo_root / "params.yaml").read_text())
        settings |= {key: {task: params[key][kind]} for key in ("model", "train", "evaluate")}
    override.write_text(yaml.safe_dump(settings))
    return load_config(
        repo_root / "params.yaml",
        repo_root / "config/config.yaml",
        override,
        check_paths_from=repo_root,
    )


def refused(repo_root: Path, tmp_path: Path, task: str, kind: str, directory: Path) -> str:
    """The message with which ``load_config`` refuses the grid, checked for key, task and fix."""
    with pytest.raises(ConfigError) as caught:
        load(repo_root, tmp_path, task, kind, directory)
    message = str(caught.value)
    assert message.startswith(f"config key data.{task}.path: "), message
    assert f"task {task!r}" in message and all(text in message for text in FIX), message
    return message


# --------------------------------------------------------------------------------------------------
# Healthy directories pass (and the readers read them)


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzipped"])
def test_healthy_mnist_directory_passes(repo_root: Path, tmp_path: Path, gzipped: bool) -> None:
    directory = tmp_path / "mnist"
    write_mnist(directory, gzipped)
    assert damaged_data_files("mnist", directory) == []
    load(repo_root, tmp_path, "mnist", "mnist", directory)
    task = read_mnist(directory)
    assert (len(task.x_train), len(task.x_test)) == (N_TRAIN, N_TEST)


@pytest.mark.parametrize(("kind", "protocol"), [("cifar10", 2), ("cifar10", 5), ("cifar100", 2)])
def test_healthy_cifar_directory_passes(
    repo_root: Path, tmp_path: Path, kind: str, protocol: int
) -> None:
    num_classes = int(kind.removeprefix("cifar"))
    write_cifar(tmp_path / "data", num_classes, protocol)
    assert damaged_data_files(kind, tmp_path / "data") == []
    load(repo_root, tmp_path, kind, kind, tmp_path / "data")
    assert read_cifar(tmp_path / "data", num_classes).meta["num_classes"] == num_classes


def test_generated_kinds_have_no_files_to_check(tmp_path: Path) -> None:
    assert damaged_data_files("digits", tmp_path / "nowhere") == []


def test_missing_files_are_left_to_the_missing_check(tmp_path: Path) -> None:
    files = write_mnist(tmp_path)
    files["train_labels"].unlink()
    assert damaged_data_files("mnist", tmp_path) == []  # missing_data_files reports it


# --------------------------------------------------------------------------------------------------
# Damaged MNIST files are refused, naming the file and what is wrong


def cut(keep: int) -> Callable[[bytes], bytes]:
    """The first ``keep`` bytes (all but the last ``-keep`` if negative)."""
    return lambda raw: raw[:keep]


def regzip(change: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
    """A valid gzip file of the changed unpacked IDX bytes."""
    return lambda raw: gzip.compress(change(gzip.decompress(raw)))


def relabel(magic: int) -> Callable[[bytes], bytes]:
    return lambda raw: struct.pack(">I", magic) + raw[4:]


# (id, gzipped, role of the damaged file, damage, substrings of the message besides the file)
MNIST_DAMAGE = [
    ("truncated_plain", False, "train_images", cut(-5),
     ["is 7,851 bytes", "an IDX file of 10 28x28 images is 7,856", "(truncated)"]),
    ("trailing_data", False, "test_labels", lambda raw: raw + b"\0\0",
     ["is 16 bytes", "an IDX file of 6 labels is 14", "(trailing data)"]),
    ("zero_length_plain", False, "train_labels", cut(0), ["is empty (0 bytes)"]),
    ("magic_cut", False, "test_images", cut(3),
     ["does not start with the IDX images magic number 0x00000803", "only 3 bytes"]),
    ("header_cut", False, "test_images", cut(7),
     ["is 7 bytes, shorter than the header of an IDX images file"]),
    ("wrong_magic", False, "test_labels", relabel(0x0000ABCD),
     ["IDX labels magic number 0x00000801", "starts with 0x0000abcd"]),
    ("labels_file_as_images", False, "train_images", relabel(0x801),
     ["IDX images magic number 0x00000803", "(that of an IDX labels file)"]),
    ("html_page", False, "train_images", lambda raw: HTML_PAGE,
     ["IDX images magic number", "HTML or XML page"]),
    ("gzip_under_plain_name", False, "train_labels", gzip.compress,
     ["gzip-compressed: name it train-labels-idx1-ubyte.gz"]),
    ("count_mismatch", False, "train_labels", lambda raw: idx_bytes(0x801, np.zeros(9, np.uint8)),
     ["holds 9 labels but train-images-idx3-ubyte holds 10 images"]),
    ("truncated_gz", True, "train_images", lambda raw: raw[: len(raw) // 2], ["gzip"]),
    ("gz_of_truncated_idx", True, "test_images", regzip(cut(-100)),
     ["gzip trailer stating 4,620 unpacked bytes", "6 28x28 images is 4,720"]),
    ("zero_length_gz", True, "test_labels", cut(0), ["is empty (0 bytes)"]),
    ("gz_too_short", True, "test_labels", cut(12), ["too short for a gzip file"]),
    ("plain_under_gz_name", True, "train_labels", gzip.decompress,
     ["not gzip-compressed though its name ends in .gz", "named train-labels-idx1-ubyte"]),
    ("html_under_gz_name", True, "test_images", lambda raw: HTML_PAGE, ["HTML or XML page"]),
    ("wrong_magic_gz", True, "test_labels", regzip(relabel(0x0803)),
     ["IDX labels magic number 0x00000801", "(that of an IDX images file)"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("gzipped", "role", "damage", "expected"),
    [case[1:] for case in MNIST_DAMAGE],
    ids=[case[0] for case in MNIST_DAMAGE],
)
def test_damaged_mnist_file_is_refused(
    repo_root: Path,
    tmp_path: Path,
    gzipped: bool,
    role: str,
    damage: Callable[[bytes], bytes],
    expected: list[str],
) -> None:
    directory = tmp_path / "mnist"
    files = write_mnist(directory, gzipped)
    file = files[role]
    file.write_bytes(damage(file.read_bytes()))
    message = refused(repo_root, tmp_path, "mnist", "mnist", directory)
    assert f"{file} " in message, message
    assert all(text in message for text in expected), message
    with pytest.raises(ValueError):  # the reader refuses the file too, only later, in a job
        read_mnist(directory)


def test_every_damaged_file_is_named(repo_root: Path, tmp_path: Path) -> None:
    files = write_mnist(tmp_path / "mnist")
    files["train_images"].write_bytes(b"")
    files["test_labels"].write_bytes(HTML_PAGE)
    damaged = damaged_data_files("mnist", tmp_path / "mnist")
    assert [file for file, _ in damaged] == [str(files["train_images"]), str(files["test_labels"])]
    message = refused(repo_root, tmp_path, "mnist", "mnist", tmp_path / "mnist")
    assert str(files["train_images"]) in message and str(files["test_labels"]) in message


# --------------------------------------------------------------------------------------------------
# Damaged CIFAR pickles are refused


# (id, damage, substrings of the message besides the file)
CIFAR_DAMAGE = [
    ("truncated_pickle", lambda raw: raw[:-1], ["does not end with a pickle's STOP opcode"]),
    ("cut_in_half", lambda raw: raw[: len(raw) // 2], ["(truncated)"]),
    ("zero_length", lambda raw: b"", ["is empty (0 bytes)"]),
    ("html_page", lambda raw: HTML_PAGE, ["is not a python pickle", "HTML or XML page"]),
    ("gzip_archive", gzip.compress, ["is not a python pickle", "gzip file: unpack it"]),
    ("binary_version", lambda raw: bytes([3]) + bytes(3072), ["is not a python pickle"]),
]


@pytest.mark.parametrize(
    ("damage", "expected"), [case[1:] for case in CIFAR_DAMAGE], ids=[c[0] for c in CIFAR_DAMAGE]
)
def test_damaged_cifar_file_is_refused(
    repo_root: Path, tmp_path: Path, damage: Callable[[bytes], bytes], expected: list[str]
) -> None:
    file = write_cifar(tmp_path / "data")["data_batch_3"]
    file.write_bytes(damage(file.read_bytes()))
    message = refused(repo_root, tmp_path, "cifar10", "cifar10", tmp_path / "data")
    assert f"{file} " in message, message
    assert all(text in message for text in expected), message
    with pytest.raises(Exception):  # noqa: B017, PT011 - the unpickler's errors vary with the damage
        read_cifar(tmp_path / "data")


def test_damaged_cifar100_names_the_task_key(repo_root: Path, tmp_path: Path) -> None:
    """The message names the grid's task key, not only the data kind."""
    file = write_cifar(tmp_path / "data", num_classes=100)["test"]
    task = "my_cifar"
    load(repo_root, tmp_path, task, "cifar100", tmp_path / "data")  # healthy: accepted
    file.write_bytes(file.read_bytes()[:-10])
    message = refused(repo_root, tmp_path, task, "cifar100", tmp_path / "data")
    assert "damaged cifar100 file(s)" in message and str(file) in message
    assert "data.cifar100" not in message
