"""Same content, same bytes: every file trainmap writes is byte-identical when what it holds is, so
DVC sees a rerun that reproduces a result as no change. Measured times are the one
exception, and they live in named places: the timing sidecars (``*.timing.json``, ``*.timing.csv``;
trainmap.io.timing_path), which .dvcignore lists."""

from __future__ import annotations

import hashlib
import shutil
import struct
import time
import zipfile
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
import torch

from trainmap.data import make_task_data
from trainmap.figures import save_figure, save_png
from trainmap.io import (
    CHECKSUM_PREFIX,
    TIMING_KEYS,
    load_json,
    load_timing,
    load_torch,
    save_json,
    save_table,
    save_torch,
    timing_path,
    verify_checksum,
)
from trainmap.training.loop import TrainConfig, TrainPaths, build_cell_model, train_block

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def state_dict() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {"weight": torch.randn(8, 4, generator=generator), "bias": torch.zeros(8),
            "steps": torch.arange(5)}  # fmt: skip


# --- checkpoints ----------------------------------------------------------------------------------


def test_the_same_state_saved_to_two_paths_is_the_same_bytes(tmp_path):
    first, second = tmp_path / "a" / "model.pt", tmp_path / "b" / "other_name.pt"
    save_torch({"format": "dense", "state_dict": state_dict()}, first)
    save_torch({"format": "dense", "state_dict": state_dict()}, second)
    assert sha256(first) == sha256(second)
    # torch.save names the archive's folder after a path; trainmap gives it a stream.
    assert {name.split("/")[0] for name in zipfile.ZipFile(first).namelist()} == {"archive"}


def test_the_checksum_still_verifies_and_still_catches_damage(tmp_path):
    path = tmp_path / "model.pt"
    save_torch({"state_dict": state_dict()}, path)
    assert verify_checksum(path) is True
    assert torch.equal(load_torch(path)["state_dict"]["weight"], state_dict()["weight"])
    assert torch.equal(torch.load(path, weights_only=True)["state_dict"]["bias"], torch.zeros(8))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(OSError, match="does not match the checksum"):
        load_torch(path)


def test_checkpoints_written_under_a_temporary_name_still_load(tmp_path):
    """Files an earlier trainmap wrote: torch.save to a random temporary name (the archive's folder
    is that name), then the checksum comment."""
    path = tmp_path / ".model.pt.0123456789abcdef.tmp"
    torch.save({"state_dict": state_dict()}, path)
    with open(path, "r+b") as stream:
        size = stream.seek(0, 2)
        stream.seek(0)
        digest = hashlib.sha256(stream.read(size - 2)).hexdigest().encode()
        stream.seek(size - 2)
        stream.write(struct.pack("<H", len(CHECKSUM_PREFIX) + 64) + CHECKSUM_PREFIX + digest)
    old = path.rename(tmp_path / "model.pt")
    assert zipfile.ZipFile(old).namelist()[0].startswith(".model.pt.0123456789abcdef/")
    assert verify_checksum(old) is True
    assert torch.equal(load_torch(old)["state_dict"]["weight"], state_dict()["weight"])


# --- JSON and tables: times beside the result -----------------------------------------------------


def test_times_go_to_the_timing_sidecar_and_come_back_on_load(tmp_path):
    record = {"status": "completed", "wall_time_s": 1.5, "steps_per_s": 200.0,
              "forms": [{"form": "trained", "latency_ms": 3.0}, {"form": "int8"}],
              "bootstrap": {"seconds": 0.4, "n_resamples": 20}}  # fmt: skip
    first, second = tmp_path / "a" / "evaluation.json", tmp_path / "b" / "evaluation.json"
    save_json(record, first)
    save_json(record | {"wall_time_s": 9.0, "steps_per_s": 1.0}, second)  # another run's times
    assert first.read_bytes() == second.read_bytes()
    assert timing_path(first) == tmp_path / "a" / "evaluation.timing.json"
    assert not TIMING_KEYS & set(load_json(first, timing=False))
    assert load_json(first) == record
    assert load_timing(first) == {"wall_time_s": 1.5, "steps_per_s": 200.0,
                                  "forms": [{"latency_ms": 3.0}, {}],
                                  "bootstrap": {"seconds": 0.4}}  # fmt: skip
    save_json({"status": "completed"}, first)  # no times any more: no stale sidecar either
    assert not timing_path(first).exists()
    assert load_json(first) == {"status": "completed"}


def test_a_sidecar_that_does_not_fit_its_file_is_named_and_left_out(tmp_path):
    path = tmp_path / "evaluation.json"
    save_json({"forms": [{"form": "trained", "latency_ms": 1.0}]}, path)
    save_json({"forms": [{"form": "trained"}, {"form": "int8"}]}, tmp_path / "other.json")
    path.write_bytes((tmp_path / "other.json").read_bytes())  # a file rewritten without its times
    with pytest.warns(UserWarning, match="evaluation.timing.json does not fit"):
        assert load_json(path) == {"forms": [{"form": "trained"}, {"form": "int8"}]}


def test_json_is_the_same_bytes_whatever_the_key_order(tmp_path):
    save_json({"b": 0.1 + 0.2, "a": [1, 2], "c": float("nan")}, tmp_path / "x.json")
    save_json({"c": float("nan"), "a": [1, 2], "b": 0.1 + 0.2}, tmp_path / "y.json")
    assert (tmp_path / "x.json").read_bytes() == (tmp_path / "y.json").read_bytes()


def test_a_table_leaves_its_time_columns_beside_it(tmp_path):
    frame = pd.DataFrame({"task": ["a", "b"], "seed": [0, 1], "test_acc": [0.5, 0.75],
                          "latency_ms": [1.25, 2.5]})  # fmt: skip
    save_table(frame, tmp_path / "evaluation.csv", keys=("task", "seed"))
    assert list(pd.read_csv(tmp_path / "evaluation.csv").columns) == ["task", "seed", "test_acc"]
    times = pd.read_csv(tmp_path / "evaluation.timing.csv")
    assert times.to_dict("list") == {"task": ["a", "b"], "seed": [0, 1], "latency_ms": [1.25, 2.5]}


# --- figures --------------------------------------------------------------------------------------


def draw() -> plt.Figure:
    figure, axis = plt.subplots(figsize=(3, 2))
    axis.plot(np.arange(10), np.arange(10) ** 2, label="curve")
    axis.fill_between(np.arange(10), 0, np.arange(10), alpha=0.3)  # a clip path: an SVG id
    axis.legend()
    return figure


@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_a_figure_saved_twice_is_the_same_bytes(tmp_path, fmt):
    save_figure(draw(), tmp_path / f"a.{fmt}", fmt)
    time.sleep(0.01)  # a date written at save time would differ
    save_figure(draw(), tmp_path / f"b.{fmt}", fmt)
    assert (tmp_path / f"a.{fmt}").read_bytes() == (tmp_path / f"b.{fmt}").read_bytes()
    save_png(draw(), tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_an_svg_saved_without_save_figure_is_the_same_bytes_too(tmp_path):
    """The training map's SVG is written with a plain savefig: trainmap.figures fixes the salt of its
    element ids and (SOURCE_DATE_EPOCH) its date."""
    for name in ("a.svg", "b.svg"):
        figure = draw()
        figure.savefig(tmp_path / name, format="svg")
        plt.close(figure)
        time.sleep(0.01)
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()


# --- training: resume state and outputs -----------------------------------------------------------


def train_twice_capturing_resume(tmp_path: Path) -> list[Path]:
    """Train the same two-seed block in two directories; copy each run's resume file of step 20
    (written after the checkpoint of step 20, seen at the checkpoint of step 30)."""
    data = make_task_data("sparse_parity", {"n_bits": 10, "k": 2, "n_train": 100, "n_test": 64})
    cfg = TrainConfig(lr=0.1, momentum=0.9, steps=40, checkpoint_every=10, resume_every=20)
    runs = []
    for run in ("a", "b"):
        out = tmp_path / run
        resume = out / "seeds0-1.resume.pt"
        captured = out / "captured"

        def capture(index: int, metrics: dict, step: int, resume=resume, captured=captured) -> None:
            if step == 30 and index == 0:
                captured.mkdir()
                shutil.copy2(resume, captured / resume.name)
                shutil.copy2(timing_path(resume), captured / timing_path(resume).name)

        models = [build_cell_model("mlp", "kaiming", seed, data.meta, {"hidden": [16]})
                  for seed in (0, 1)]  # fmt: skip
        train_block(models, data, cfg, [0, 1], [TrainPaths.in_directory(out / f"seed{s}")
                                                 for s in (0, 1)],
                    resume_path=resume, on_checkpoint=capture, progress=False,
                    fingerprint="cell")  # fmt: skip
        assert not resume.exists() and not timing_path(resume).exists()
        runs.append(out)
    return runs


def test_resume_files_and_training_outputs_are_the_same_bytes(tmp_path, one_thread):
    first, second = train_twice_capturing_resume(tmp_path)
    resume = Path("captured/seeds0-1.resume.pt")
    assert sha256(first / resume) == sha256(second / resume)
    saved = torch.load(first / resume, weights_only=True)
    assert saved["step"] == 20 and "elapsed_s" not in saved
    assert load_timing(first / resume)["elapsed_s"] > 0  # the time so far, beside the file
    for seed in ("seed0", "seed1"):
        archive = sorted(p.relative_to(first / seed).as_posix()
                         for p in (first / seed / "checkpoints").iterdir())  # fmt: skip
        assert archive
        for name in ("checkpoint_metrics.csv", "model.pt", "history.csv", "train.json", *archive):
            assert sha256(first / seed / name) == sha256(second / seed / name), f"{seed}/{name}"
        timing = load_json(first / seed / "train.timing.json")
        assert set(timing) == {
            "wall_time_s",
            "steps_per_s",
            "metrics_s",
            "archive_s",
            "resumed_from_step",
        }  # where a run resumed: how it went, beside it
        assert "resumed_from_step" not in load_json(first / seed / "train.json", timing=False)


# --- the workflow, rerun: tests/integration/test_dvc.py (a forced rerun of the DVC smoke project
# rewrites every result byte for byte), which shares that project's `dvc repro` ------------------
