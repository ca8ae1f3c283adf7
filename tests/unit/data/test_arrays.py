"""Data without code: the ``arrays`` data kind reads a user's .npz or torch.save file of
train/test arrays; every check names the file and the array, and the config check reads it before
any job runs."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from trainmap.data import make_task_data, model_meta, read_arrays
from trainmap.grid import ConfigError, check_config, validate_schema


def arrays(n_train: int = 60, n_test: int = 20, shape: tuple = (12,), classes: int = 3) -> dict:
    rng = np.random.default_rng(0)
    return {
        "x_train": rng.normal(size=(n_train, *shape)).astype(np.float32),
        "y_train": rng.integers(0, classes, n_train),
        "x_test": rng.normal(size=(n_test, *shape)).astype(np.float32),
        "y_test": rng.integers(0, classes, n_test),
    }


def write_npz(path: Path, **values: np.ndarray) -> Path:
    np.savez(path, **values)
    return path


def test_an_npz_file_becomes_task_data_with_its_meta(tmp_path: Path) -> None:
    stored = arrays()
    data = read_arrays(write_npz(tmp_path / "mine.npz", **stored))
    assert torch.equal(data.x_train, torch.from_numpy(stored["x_train"]))
    assert torch.equal(data.y_test, torch.from_numpy(stored["y_test"]).long())
    assert data.meta["input_kind"] == "vector" and data.meta["input_shape"] == [12]
    assert data.meta["num_classes"] == int(max(stored["y_train"].max(), stored["y_test"].max())) + 1


def test_a_torch_file_of_images_without_channel_gets_one(tmp_path: Path) -> None:
    stored = {
        key: torch.as_tensor(value) for key, value in arrays(shape=(8, 8), classes=10).items()
    }
    torch.save(stored, tmp_path / "mine.pt")
    data = read_arrays(tmp_path / "mine.pt", num_classes=10)
    assert data.meta["input_kind"] == "image" and data.meta["input_shape"] == [1, 8, 8]
    assert data.meta["num_classes"] == 10


def test_integer_inputs_are_tokens_with_a_vocabulary(tmp_path: Path) -> None:
    stored = arrays()
    stored["x_train"] = np.random.default_rng(1).integers(0, 7, (60, 3))
    stored["x_test"] = np.random.default_rng(2).integers(0, 7, (20, 3))
    data = read_arrays(write_npz(tmp_path / "tokens.npz", **stored))
    assert data.meta["input_kind"] == "tokens" and data.meta["vocab_size"] == 7
    assert data.x_train.dtype == torch.int64


def test_model_meta_of_an_array_file_is_its_data_meta(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "mine.npz", **arrays())
    made = make_task_data("arrays", {"path": str(path)}).meta
    described = model_meta("arrays", {"path": str(path)})
    assert described == {key: made[key] for key in described}


def damaged(name: str) -> dict:
    stored = arrays()
    if name == "missing array":
        del stored["y_test"]
    elif name == "NaN input":
        stored["x_train"][5, 3] = np.nan
    elif name == "label out of range":
        stored["y_test"][0] = -1
    elif name == "float labels":
        stored["y_train"] = stored["y_train"].astype(np.float32)
    elif name == "length mismatch":
        stored["y_train"] = stored["y_train"][:-1]
    elif name == "shape mismatch":
        stored["x_test"] = stored["x_test"][:, :10]
    return stored


DAMAGE = {
    "missing array": "lacks the array(s) y_test",
    "NaN input": "x_train holds 1 NaN or infinite value(s)",
    "label out of range": "y_test holds labels [-1] outside [0, ",
    "float labels": "y_train must hold integer class labels, not torch.float32",
    "length mismatch": "x_train has 60 examples but y_train 59",
    "shape mismatch": "x_train examples are [12] but x_test examples [10]",
}


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_a_bad_array_file_is_refused_naming_file_and_array(tmp_path: Path, name: str) -> None:
    path = write_npz(tmp_path / "bad.npz", **damaged(name))
    with pytest.raises(ValueError) as caught:
        read_arrays(path)
    assert str(caught.value).startswith(f"{path}: "), caught.value
    assert DAMAGE[name] in str(caught.value), caught.value


def array_study(base_config: dict, path: str) -> dict:
    config = copy.deepcopy(base_config)
    config["data"]["mine"] = {"kind": "arrays", "path": path}
    config["train"]["mine"] = copy.deepcopy(config["train"]["sparse_parity"])
    config["evaluate"]["mine"] = {"threshold": 0.9}
    config["grid"] = [{"task": "mine", "archs": ["mlp"], "methods": ["kaiming"], "seeds": [0, 1]}]
    config["analysis"]["joint"] = []
    config["quantize"]["methods"] = []
    del config["dvc"]  # dvc.configfile resolves against the workflow directory (tmp_path here)
    return config


def test_a_grid_on_an_array_file_is_accepted_relative_to_the_workflow(
    base_config: dict, tmp_path: Path
) -> None:
    write_npz(tmp_path / "mine.npz", **arrays())
    config = array_study(base_config, "mine.npz")
    validate_schema(config)
    check_config(config, base_dir=tmp_path)


def test_a_bad_array_file_stops_the_config_check(base_config: dict, tmp_path: Path) -> None:
    write_npz(tmp_path / "bad.npz", **damaged("NaN input"))
    config = array_study(base_config, "bad.npz")
    with pytest.raises(ConfigError, match=r"^config key data.mine.path: .*bad.npz: x_train holds"):
        check_config(config, base_dir=tmp_path)
    config["data"]["mine"]["path"] = "absent.npz"
    with pytest.raises(ConfigError, match=r"^config key data.mine.path: file 'absent.npz' does"):
        check_config(config, base_dir=tmp_path)
    config["data"]["mine"]["path"] = "mine.csv"
    with pytest.raises(ConfigError, match=r"^config key data.mine.path: 'mine.csv' does not match"):
        validate_schema(config)
