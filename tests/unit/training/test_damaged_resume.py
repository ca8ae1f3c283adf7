"""A damaged resume.pt no longer fails its cell on every rerun.

Snakemake does not track resume files, so it never remakes a damaged one; before, its cell failed
at load on every rerun. Now the training loop (trainmap.training.loop via trainmap.io.load_resume_or_none)
verifies it like a checkpoint, warns, deletes it and trains from the start.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainmap.data import make_task_data
from trainmap.io import load_torch
from trainmap.training.loop import TrainConfig, TrainPaths, build_cell_model, train_model

CONFIG = TrainConfig(optimizer="sgd", lr=0.1, batch_size=32, steps=60, checkpoint_every=10,
                     resume_every=25)  # fmt: skip

pytestmark = pytest.mark.usefixtures("one_thread")


class Crash(Exception):
    pass


def _crash_at(step_to_crash: int):
    def hook(metrics: dict, step: int) -> None:
        if step == step_to_crash:
            raise Crash(step)

    return hook


def _train(directory: Path, data, **kwargs) -> dict:
    model = build_cell_model("mlp", "kaiming", 0, data.meta, {"hidden": [16]})
    paths = TrainPaths.in_directory(directory)
    return train_model(model, data, CONFIG, 0, paths, fingerprint="cell", progress=False, **kwargs)


def test_a_damaged_resume_file_restarts_training_from_step_0(tmp_path: Path) -> None:
    data = make_task_data("sparse_parity", {"n_bits": 8, "k": 2, "n_train": 64, "n_test": 32})
    reference = _train(tmp_path / "reference", data)
    with pytest.raises(Crash):
        _train(tmp_path / "run", data, on_checkpoint=_crash_at(40))
    paths = TrainPaths.in_directory(tmp_path / "run")
    assert load_torch(paths.resume)["step"] == 25
    damaged = bytearray(paths.resume.read_bytes())
    for index in range(len(damaged) // 2, len(damaged) // 2 + 64):
        damaged[index] ^= 0xFF
    paths.resume.write_bytes(bytes(damaged))

    with pytest.warns(UserWarning, match="damaged resume file .*resume.pt.*starts from step 0"):
        summary = _train(tmp_path / "run", data)
    assert summary["status"] == "completed" and summary["resumed_from_step"] is None
    assert not paths.resume.exists()
    # From the start, the run is the uninterrupted one (training is deterministic on the CPU).
    final = load_torch(paths.model)["state_dict"]
    expected = load_torch(TrainPaths.in_directory(tmp_path / "reference").model)["state_dict"]
    assert all(torch.equal(final[name], expected[name]) for name in expected)
    assert reference["status"] == "completed"
