"""Tests for the training loop (trainmap.training.loop): learning, determinism, resume, divergence."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

from trainmap.data import TaskData, make_task_data
from trainmap.io import load_json
from trainmap.models import count_parameters
from trainmap.training.archive import read_archive
from trainmap.training.loop import (
    TrainConfig,
    TrainPaths,
    build_cell_model,
    lr_factor,
    train_model,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
SMALL_MLP = {"hidden": [32]}
# Exercises every piece of resume state: Adam moments, warm-up + cosine schedule, gradient clipping,
# epochs that do not divide into batches (sampler position), and resume steps that fall between
# checkpoints (running means of the unfinished checkpoint interval).
RESUME_CONFIG = TrainConfig(
    optimizer="adam",
    lr=0.01,
    batch_size=32,
    steps=200,
    schedule="cosine",
    warmup_steps=20,
    grad_clip=1.0,
    checkpoint_every=10,
    resume_every=35,
)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def parity_small() -> TaskData:
    """A sparse parity problem an MLP solves in a couple of hundred steps; 100 examples, so an
    epoch (3 batches of 32, drop-last) ends mid-way between checkpoints."""
    return make_task_data("sparse_parity", {"n_bits": 10, "k": 2, "n_train": 100, "n_test": 64})


class Crash(Exception):
    """Stands in for a killed process: raised from the checkpoint hook, it unwinds the training."""


def crash_at(step_to_crash: int):
    def hook(metrics: dict[str, float], step: int) -> None:
        if step == step_to_crash:
            raise Crash(step)

    return hook


def run(
    directory: Path,
    data: TaskData,
    cfg: TrainConfig,
    seed: int = 0,
    *,
    init_seed: int | None = None,
    model_options: dict | None = None,
    **kwargs,
) -> tuple[dict, TrainPaths, nn.Module]:
    """Build the seeded cell model and train it into ``directory``."""
    model = build_cell_model(
        "mlp", "kaiming", seed if init_seed is None else init_seed, data.meta,
        SMALL_MLP if model_options is None else model_options,
    )  # fmt: skip
    paths = TrainPaths.in_directory(directory)
    kwargs.setdefault("progress", False)
    summary = train_model(model, data, cfg, seed, paths, **kwargs)
    return summary, paths, model


def load_state(paths: TrainPaths) -> dict[str, torch.Tensor]:
    return torch.load(paths.model, weights_only=True)["state_dict"]


def assert_states_equal(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    for name in left:
        assert torch.equal(left[name], right[name]), f"state entry {name} differs"


def assert_same_outputs(a: TrainPaths, b: TrainPaths) -> None:
    """Final weights, trajectory and history of two runs are bit-identical."""
    assert_states_equal(load_state(a), load_state(b))
    traj_a, traj_b = read_archive(a.archive.parent), read_archive(b.archive.parent)
    assert torch.equal(traj_a["step"], traj_b["step"])
    assert_states_equal(traj_a["state"], traj_b["state"])
    # history.csv has no wall-time columns, so the files must match byte for byte.
    assert a.history.read_bytes() == b.history.read_bytes()


def states_differ(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(left[name], right[name]) for name in left)


# --- learning -------------------------------------------------------------------------------------


def test_training_loss_falls_on_sparse_parity_40_3(tmp_path):
    # n_bits=40, k=3 with 1000 examples: within ~1000 steps the MLP fits the training set (loss
    # falls steadily) while test accuracy is still at chance -- the generalisation plateau lasts
    # thousands of steps. So this asserts the optimiser makes progress on the training loss only.
    data = make_task_data("sparse_parity", {"n_bits": 40, "k": 3, "n_train": 1000, "n_test": 100})
    cfg = TrainConfig(lr=0.1, batch_size=32, steps=800, checkpoint_every=50, resume_every=10**6)
    summary, paths, _ = run(tmp_path, data, cfg, model_options={"hidden": [128]})
    assert summary["status"] == "completed"
    history = pd.read_csv(paths.history)
    first = history["train_loss"].iloc[1]  # mean over steps 1-50 (step 0 has no training loss)
    last = history["train_loss"].iloc[-3:].mean()  # steps 701-800
    assert first > 0.6  # starts near ln 2 = 0.69: no shortcut
    assert last < 0.5 * first
    assert history["train_acc"].iloc[-1] > 0.85


def test_small_sparse_parity_is_solved(tmp_path):
    # n_bits=10, k=2 is past its plateau in ~100 steps: this one asserts generalisation.
    data = make_task_data("sparse_parity", {"n_bits": 10, "k": 2, "n_train": 1000, "n_test": 200})
    cfg = TrainConfig(lr=0.1, batch_size=32, steps=300, checkpoint_every=50, resume_every=10**6)
    summary, paths, _ = run(tmp_path, data, cfg, model_options={"hidden": [128]})
    history = pd.read_csv(paths.history)
    assert history["test_acc"].iloc[0] < 0.7  # chance at initialisation
    assert summary["final"]["test_acc"] >= 0.95
    assert summary["final"]["step"] == 300
    assert history["train_loss"].iloc[-1] < 0.1


# --- determinism ----------------------------------------------------------------------------------


def test_same_seed_same_run_and_different_seed_different_weights(tmp_path, parity_small):
    cfg = TrainConfig(lr=0.1, momentum=0.9, steps=60, checkpoint_every=20, resume_every=10**6)
    _, first, _ = run(tmp_path / "a", parity_small, cfg, seed=1)
    _, second, _ = run(tmp_path / "b", parity_small, cfg, seed=1)
    assert_same_outputs(first, second)

    _, other_seed, _ = run(tmp_path / "c", parity_small, cfg, seed=2)
    assert states_differ(load_state(first), load_state(other_seed))
    # The training seed alone (same initial weights) changes the batch order, hence the weights.
    _, other_order, _ = run(tmp_path / "d", parity_small, cfg, seed=2, init_seed=1)
    initial_first = {k: v[0] for k, v in read_archive(first.archive.parent)["state"].items()}
    initial_other = {k: v[0] for k, v in read_archive(other_order.archive.parent)["state"].items()}
    assert_states_equal(initial_first, initial_other)
    assert states_differ(load_state(first), load_state(other_order))


# --- resume ---------------------------------------------------------------------------------------


def test_resume_after_crash_is_bit_identical(tmp_path, parity_small):
    summary_a, paths_a, _ = run(tmp_path / "a", parity_small, RESUME_CONFIG, fingerprint="cell")
    assert summary_a["resumed_from_step"] is None

    # Run B dies at the checkpoint of step 110; the last resume file was written at step 105, in
    # the middle of a checkpoint interval.
    with pytest.raises(Crash):
        run(
            tmp_path / "b",
            parity_small,
            RESUME_CONFIG,
            fingerprint="cell",
            on_checkpoint=crash_at(110),
        )
    paths_b = TrainPaths.in_directory(tmp_path / "b")
    assert not paths_b.model.exists() and not paths_b.history.exists()
    assert torch.load(paths_b.resume, weights_only=True)["step"] == 105

    # A fresh process state: a new model from the same cell, a different global RNG state.
    torch.manual_seed(12345)
    seen_steps = []
    summary_b, _, model_b = run(
        tmp_path / "b", parity_small, RESUME_CONFIG, fingerprint="cell",
        on_checkpoint=lambda metrics, step: seen_steps.append(step),
    )  # fmt: skip
    assert summary_b["resumed_from_step"] == 105
    assert summary_b["status"] == "completed"
    assert seen_steps == list(range(110, 201, 10))  # only checkpoints after the resume point
    assert not paths_b.resume.exists()
    assert_same_outputs(paths_a, paths_b)
    assert_states_equal(model_b.state_dict(), load_state(paths_a))
    summary_a_file, summary_b_file = load_json(paths_a.summary), load_json(paths_b.summary)
    for key in ("wall_time_s", "steps_per_s", "metrics_s", "archive_s", "resumed_from_step"):
        summary_a_file.pop(key), summary_b_file.pop(key)
    assert summary_a_file == summary_b_file


def test_resume_file_with_other_fingerprint_is_ignored(tmp_path, parity_small):
    _, reference, _ = run(tmp_path / "a", parity_small, RESUME_CONFIG, fingerprint="new")
    with pytest.raises(Crash):
        run(
            tmp_path / "b",
            parity_small,
            RESUME_CONFIG,
            fingerprint="old",
            on_checkpoint=crash_at(110),
        )
    paths = TrainPaths.in_directory(tmp_path / "b")
    assert paths.resume.exists()

    seen_steps = []
    summary, _, _ = run(
        tmp_path / "b", parity_small, RESUME_CONFIG, fingerprint="new",
        on_checkpoint=lambda metrics, step: seen_steps.append(step),
    )  # fmt: skip
    assert summary["resumed_from_step"] is None
    assert seen_steps[0] == 0  # trained from step 0
    assert not paths.resume.exists()
    assert_same_outputs(reference, paths)


KILL_SCRIPT = """
import sys, time
import torch
torch.set_num_threads(1)
from trainmap.data import make_task_data
from trainmap.training.loop import TrainConfig, TrainPaths, build_cell_model, train_model

out, delay = sys.argv[1], float(sys.argv[2])
data = make_task_data("sparse_parity", {"n_bits": 10, "k": 2, "n_train": 100, "n_test": 64})
cfg = TrainConfig(lr=0.05, momentum=0.9, batch_size=32, steps=500, checkpoint_every=10,
                  resume_every=40)
model = build_cell_model("mlp", "kaiming", 3, data.meta, {"hidden": [32]})
hook = (lambda metrics, step: time.sleep(delay)) if delay > 0 else None
train_model(model, data, cfg, 3, TrainPaths.in_directory(out), on_checkpoint=hook,
            progress=False, fingerprint="cell")
"""


@pytest.mark.integration  # starts a program (a subprocess)
def test_resume_after_sigkill_is_bit_identical(tmp_path, parity_small):
    script = tmp_path / "train_cell.py"
    script.write_text(textwrap.dedent(KILL_SCRIPT))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "src"), env.get("PYTHONPATH", "")])
    killed = tmp_path / "killed"
    paths = TrainPaths.in_directory(killed)

    # A 20 ms pause per checkpoint (50 checkpoints) keeps the run alive ~1 s past its first resume
    # file; the pause does not touch the arithmetic.
    process = subprocess.Popen(
        [sys.executable, str(script), str(killed), "0.02"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not paths.resume.exists():
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "no resume file appeared"
            time.sleep(0.02)
        time.sleep(0.15)  # let it go on past the resume point, then kill it mid-run
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    assert not paths.model.exists(), "the run finished before it was killed; the test is void"
    resume_step = torch.load(paths.resume, weights_only=True)["step"]
    assert 40 <= resume_step < 500 and resume_step % 40 == 0

    # Finish it here, in a fresh model and optimiser (the subprocess's state is gone).
    cfg = TrainConfig(lr=0.05, momentum=0.9, batch_size=32, steps=500, checkpoint_every=10,
                      resume_every=40)  # fmt: skip
    summary, _, _ = run(killed, parity_small, cfg, seed=3, fingerprint="cell")
    assert summary["resumed_from_step"] == resume_step
    assert not paths.resume.exists()

    # The uninterrupted reference, trained with the same settings and one thread.
    _, reference, _ = run(tmp_path / "reference", parity_small, cfg, seed=3, fingerprint="cell")
    assert_same_outputs(reference, paths)


# --- divergence -----------------------------------------------------------------------------------


def test_divergence_stops_the_run_and_writes_outputs(tmp_path, parity_small):
    cfg = TrainConfig(lr=1e6, steps=50, checkpoint_every=1, resume_every=10**6)
    summary, paths, _ = run(tmp_path, parity_small, cfg, model_options={"hidden": [16]})
    assert summary["status"] == "diverged"
    diverged = summary["diverged_step"]
    assert isinstance(diverged, int) and 1 <= diverged < 50
    assert summary["steps_done"] == diverged - 1  # the step with the non-finite loss is not taken

    on_disk = load_json(paths.summary)
    assert on_disk["status"] == "diverged" and on_disk["diverged_step"] == diverged
    history = pd.read_csv(paths.history)
    assert history["step"].tolist() == list(range(diverged))  # checkpoint_every=1: every step
    assert summary["n_checkpoints"] == len(history)
    assert read_archive(paths.archive.parent)["step"].tolist() == list(range(diverged))
    metrics = pd.read_csv(paths.metrics)
    assert sorted(set(metrics["step"])) == list(range(diverged))
    saved = torch.load(paths.model, weights_only=True)
    model = build_cell_model("mlp", "kaiming", 0, parity_small.meta, {"hidden": [16]})
    model.load_state_dict(saved["state_dict"])
    assert not paths.resume.exists()


def test_nan_weight_diverges_at_the_first_step(tmp_path, parity_small):
    model = build_cell_model("mlp", "kaiming", 0, parity_small.meta, SMALL_MLP)
    with torch.no_grad():
        model.layers[1].weight[0, 0] = math.nan
    cfg = TrainConfig(steps=20, checkpoint_every=5)
    paths = TrainPaths.in_directory(tmp_path)
    summary = train_model(model, parity_small, cfg, 0, paths, progress=False)
    assert summary["status"] == "diverged"
    assert summary["diverged_step"] == 1
    assert summary["steps_done"] == 0
    assert pd.read_csv(paths.history)["step"].tolist() == [0]
    for path in (paths.metrics, paths.archive, paths.model, paths.history, paths.summary):
        assert path.exists()


def test_completed_run_reports_no_divergence(tmp_path, parity_small):
    cfg = TrainConfig(steps=30, checkpoint_every=10)
    summary, paths, model = run(tmp_path, parity_small, cfg)
    assert summary["status"] == "completed"
    assert summary["diverged_step"] is None
    assert summary["steps_done"] == 30
    assert summary["n_params"] == count_parameters(model)
    assert load_json(paths.summary)["final"]["step"] == 30


# --- trajectory format ----------------------------------------------------------------------------


@pytest.mark.parametrize(("steps", "expected"), [(50, [0, 10, 20, 30, 40, 50]),
                                                 (45, [0, 10, 20, 30, 40, 45])])  # fmt: skip
def test_trajectory_format(tmp_path, parity_small, steps, expected):
    model = build_cell_model("mlp", "kaiming", 0, parity_small.meta, SMALL_MLP)
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    cfg = TrainConfig(steps=steps, checkpoint_every=10, momentum=0.9)
    paths = TrainPaths.in_directory(tmp_path)
    summary = train_model(model, parity_small, cfg, 0, paths, progress=False)

    trajectory = read_archive(paths.archive.parent)
    assert set(trajectory) == {"step", "state"}
    assert trajectory["step"].dtype == torch.long
    assert trajectory["step"].tolist() == expected
    assert summary["n_checkpoints"] == len(expected)
    final = load_state(paths)
    assert trajectory["state"].keys() == initial.keys() == final.keys()
    for name, stacked in trajectory["state"].items():
        assert stacked.shape == (len(expected), *initial[name].shape)
        assert torch.equal(stacked[0], initial[name])
        assert torch.equal(stacked[-1], final[name])
        assert torch.equal(stacked[-1], model.state_dict()[name])
        assert not torch.equal(stacked[0], stacked[-1])  # it did train
    assert pd.read_csv(paths.history)["step"].tolist() == expected


# --- schedules and config -------------------------------------------------------------------------


def test_lr_factor_warmup_then_cosine():
    cfg = TrainConfig(steps=110, warmup_steps=10, schedule="cosine")
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(4, cfg) == pytest.approx(0.5)
    assert lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0)  # end of warm-up: cosine starts at its top
    assert lr_factor(35, cfg) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))  # 0.853553
    assert lr_factor(60, cfg) == pytest.approx(0.5)  # half-way through the decay
    assert lr_factor(110, cfg) == pytest.approx(0.0, abs=1e-12)


def test_lr_factor_constant_with_and_without_warmup():
    cfg = TrainConfig(steps=100, warmup_steps=4)
    assert [lr_factor(step, cfg) for step in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1, 1, 1])
    assert lr_factor(99, cfg) == 1.0
    no_warmup = TrainConfig(steps=100)
    assert lr_factor(0, no_warmup) == lr_factor(100, no_warmup) == 1.0
    cosine = TrainConfig(steps=100, schedule="cosine")
    assert lr_factor(0, cosine) == 1.0
    assert lr_factor(50, cosine) == pytest.approx(0.5)


def test_optimizer_follows_the_schedule(tmp_path, parity_small):
    # History's lr column is the learning rate of the next step: base lr * lr_factor(step).
    cfg = TrainConfig(lr=0.2, steps=40, warmup_steps=10, schedule="cosine", checkpoint_every=5)
    _, paths, _ = run(tmp_path, parity_small, cfg)
    history = pd.read_csv(paths.history)
    expected = [0.2 * lr_factor(step, cfg) for step in history["step"]]
    assert history["lr"].tolist() == pytest.approx(expected, abs=1e-12)


def test_train_config_from_dict():
    cfg = TrainConfig.from_dict({"lr": 0.5, "betas": [0.8, 0.9], "steps": 7})
    assert cfg.lr == 0.5 and cfg.steps == 7 and cfg.betas == (0.8, 0.9)
    with pytest.raises(ValueError, match=r"unknown training settings \['epochs', 'lrr'\]"):
        TrainConfig.from_dict({"lr": 0.1, "lrr": 0.1, "epochs": 3})


def test_unknown_optimizer_is_rejected(tmp_path, parity_small):
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        run(tmp_path, parity_small, TrainConfig(optimizer="rmsprop", steps=5))


# --- cell models ----------------------------------------------------------------------------------


def test_kaiming_mlp_init():
    meta = {"input_kind": "vector", "input_shape": [512], "num_classes": 2}
    torch.manual_seed(1)
    model = build_cell_model("mlp", "kaiming", 7, meta, {"hidden": [1024]})
    wide = model.layers[1]
    assert wide.weight.shape == (1024, 512)
    # 524288 draws from N(0, 2/512): the sample std is within ~0.1% of sqrt(2/512) = 0.0625.
    assert wide.weight.std().item() == pytest.approx(math.sqrt(2 / 512), rel=0.02)
    assert abs(wide.weight.mean().item()) < 1e-3
    readout = model.layers[3]
    assert readout.weight.std().item() == pytest.approx(math.sqrt(2 / 1024), rel=0.1)
    for layer in (wide, readout):
        assert torch.count_nonzero(layer.bias) == 0

    torch.manual_seed(999)  # the global RNG state must not matter
    again = build_cell_model("mlp", "kaiming", 7, meta, {"hidden": [1024]})
    assert_states_equal(model.state_dict(), again.state_dict())
    other = build_cell_model("mlp", "kaiming", 8, meta, {"hidden": [1024]})
    assert states_differ(model.state_dict(), other.state_dict())


def test_kaiming_conv_init():
    meta = {"input_kind": "image", "input_shape": [1, 8, 8], "num_classes": 10}
    options = {"widths": [64, 128], "convs_per_stage": [1, 1]}
    model = build_cell_model("vgg", "kaiming", 0, meta, options)
    convs = [module for module in model.modules() if isinstance(module, nn.Conv2d)]
    assert len(convs) == 2
    wide = convs[1]  # 128 x 64 x 3 x 3: fan_in 576
    assert wide.weight.std().item() == pytest.approx(math.sqrt(2 / 576), rel=0.03)
    for module in model.modules():
        if isinstance(module, nn.Conv2d | nn.Linear):
            assert module.bias is not None and torch.count_nonzero(module.bias) == 0

    bn = build_cell_model("vgg_bn", "kaiming", 0, meta, {"widths": [8], "convs_per_stage": [1]})
    norms = [module for module in bn.modules() if isinstance(module, nn.BatchNorm2d)]
    assert norms and all(torch.all(n.weight == 1) and torch.all(n.bias == 0) for n in norms)
    again = build_cell_model("vgg_bn", "kaiming", 0, meta, {"widths": [8], "convs_per_stage": [1]})
    assert_states_equal(bn.state_dict(), again.state_dict())


def test_unknown_method_is_rejected():
    meta = {"input_kind": "vector", "input_shape": [4], "num_classes": 2}
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        build_cell_model("mlp", "nope", 0, meta)


def test_the_checkpoint_count_is_the_length_of_the_steps_without_listing_them():
    """n_checkpoints (what the config check and the plan count) equals the steps the loop takes
    checkpoints at, multiples and remainders alike."""
    from trainmap.training.archive import checkpoint_steps, n_checkpoints

    for steps in (1, 2, 7, 10, 99, 100, 101, 1000):
        for every in (1, 3, 10, 100, steps):
            if every <= steps:
                assert n_checkpoints(steps, every) == len(checkpoint_steps(steps, every))
    assert n_checkpoints(1_000_000_000, 1) == 1_000_000_001
