"""train.<task>.precision and deterministic (trainmap.training.precision): bf16 autocast trains on
the CPU close to fp32, a precision the device cannot run is refused naming the key, and the
switches are put back after a block."""

from __future__ import annotations

import pytest
import torch

from trainmap.data import make_task_data
from trainmap.grid import ConfigError, with_train_defaults
from trainmap.grid.section_checks import check_train
from trainmap.training.loop import TrainConfig, TrainPaths, build_cell_model, train_block
from trainmap.training.precision import autocast, check_precision

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def parity():
    return make_task_data("sparse_parity", {"n_bits": 10, "k": 2, "n_train": 400, "n_test": 200})


def train(directory, data, **settings):
    cfg = TrainConfig(**{"lr": 0.5, "batch_size": 32, "steps": 300, "checkpoint_every": 50,
                         "resume_every": 10**6, **settings})  # fmt: skip
    seeds = [0, 1]
    models = [build_cell_model("mlp", "kaiming", s, data.meta, {"hidden": [32]}) for s in seeds]
    paths = [TrainPaths.in_directory(directory / f"seed{s}") for s in seeds]
    summaries = train_block(models, data, cfg, seeds, paths, resume_path=directory / "r.pt",
                            progress=False)  # fmt: skip
    return summaries, paths


def test_bf16_autocast_trains_as_fp32_does_within_its_round_off(tmp_path, parity):
    """The same seeds in bf16 and fp32: the loss curves differ (autocast is on) and end at
    accuracies within a few points of each other; the weights stay float32."""
    fp32, fp32_paths = train(tmp_path / "fp32", parity)
    bf16, bf16_paths = train(tmp_path / "bf16", parity, precision="bf16")
    for a, b, path in zip(fp32, bf16, bf16_paths, strict=True):
        assert a["final"]["train_loss"] != b["final"]["train_loss"]
        assert abs(a["final"]["test_acc"] - b["final"]["test_acc"]) <= 0.05
        state = torch.load(path.model, weights_only=True)["state_dict"]
        assert all(value.dtype == torch.float32 for value in state.values())
    assert max(a["final"]["test_acc"] for a in fp32) > 0.9  # the setting learns at all


def test_deterministic_kernels_change_no_cpu_bit_and_are_switched_off_after(tmp_path, parity):
    _, plain = train(tmp_path / "plain", parity, steps=60)
    _, deterministic = train(tmp_path / "det", parity, steps=60, deterministic=True)
    assert not torch.are_deterministic_algorithms_enabled()
    for a, b in zip(plain, deterministic, strict=True):
        assert a.model.read_bytes() == b.model.read_bytes()
        assert a.metrics.read_bytes() == b.metrics.read_bytes()


def test_a_precision_the_device_cannot_run_is_refused_naming_the_key(tmp_path, parity, monkeypatch):
    with pytest.raises(ValueError, match=r"train.<task>.precision: tf32 runs on CUDA devices only"):
        train(tmp_path, parity, precision="tf32")
    assert not (tmp_path / "seed0").exists()  # refused before anything was written
    with pytest.raises(ConfigError, match=r"config key train.sparse_parity.precision: tf32"):
        check_train("train.sparse_parity", with_train_defaults({"precision": "tf32"}))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.raises(ValueError, match=r"bf16 is not supported on cuda \(Tesla T4\); use fp32"):
        check_precision("bf16", torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    with pytest.raises(ValueError, match=r"tf32 needs a CUDA device of compute capability 8.0"):
        check_precision("tf32", torch.device("cuda"))


def test_autocast_runs_a_forward_pass_in_bfloat16_only_when_asked():
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with autocast("bf16", torch.device("cpu")):
        assert layer(x).dtype == torch.bfloat16
    with autocast("fp32", torch.device("cpu")):
        assert layer(x).dtype == torch.float32


def test_a_gpu_index_the_machine_does_not_have_is_refused_naming_the_key(monkeypatch):
    from trainmap.training.setup import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(
        ValueError,
        match=r"'cuda:2' requested \(train.<task>.device\) but this "
        r"machine has 2 CUDA device\(s\), cuda:0 to cuda:1",
    ):
        resolve_device("cuda:2")
    with pytest.raises(
        ConfigError, match=r"config key train.sparse_parity.device: training device"
    ):
        check_train("train.sparse_parity", with_train_defaults({"device": "cuda:2"}))
