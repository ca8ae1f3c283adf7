"""Seed blocks (trainmap.training.seed_block, trainmap.training.loop.train_block): many seeds trained as one vectorised
model must equal each seed trained alone, resume bit-identically, and diverge seed by seed."""

from __future__ import annotations

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

from trainmap.data import TaskData, make_task_data
from trainmap.io import load_json
from trainmap.training.archive import read_archive
from trainmap.training.loop import (
    TrainConfig,
    TrainHooks,
    TrainPaths,
    build_cell_model,
    lr_factor,
    train_block,
    train_model,
)
from trainmap.training.seed_block import SeedBlock

REPO_ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def parity() -> TaskData:
    return make_task_data("sparse_parity", {"n_bits": 10, "k": 2, "n_train": 100, "n_test": 64})


@pytest.fixture(scope="module")
def digits() -> TaskData:
    return make_task_data("digits", {})


def as_float64(data: TaskData) -> TaskData:
    return TaskData(data.x_train.double(), data.y_train, data.x_test.double(), data.y_test,
                    data.meta)  # fmt: skip


def cell_models(arch, seeds, data, options, dtype=torch.float32):
    return [build_cell_model(arch, "kaiming", seed, data.meta, options).to(dtype) for seed in seeds]


def run_block(directory, arch, seeds, data, cfg, options, dtype=torch.float32, **kwargs):
    paths = [TrainPaths.in_directory(directory / f"seed{seed}") for seed in seeds]
    kwargs.setdefault("progress", False)
    summaries = train_block(cell_models(arch, seeds, data, options, dtype), data, cfg, seeds,
                            paths, resume_path=directory / "resume.pt", **kwargs)  # fmt: skip
    return summaries, paths


def run_alone(directory, arch, seed, data, cfg, options, dtype=torch.float32, **kwargs):
    (model,) = cell_models(arch, [seed], data, options, dtype)
    paths = TrainPaths.in_directory(directory)
    kwargs.setdefault("progress", False)
    return train_model(model, data, cfg, seed, paths, **kwargs), paths


def max_relative_difference(left: dict, right: dict) -> float:
    worst = 0.0
    for name, a in left.items():
        b = right[name]
        if not a.dtype.is_floating_point:
            assert torch.equal(a, b), name
            continue
        scale = b.abs().max().clamp(min=1e-12)
        worst = max(worst, float((a - b).abs().max() / scale))
    return worst


# (arch, options, config): an MLP with SGD momentum + weight decay, a BatchNorm CNN with Adam,
# warm-up + cosine and per-seed gradient clipping, a no-BN CNN with AdamW and clipping.
CASES = {
    "mlp": ("parity", "mlp", {"hidden": [16, 16]},
            TrainConfig(lr=0.1, momentum=0.9, weight_decay=0.01, batch_size=32, steps=200,
                        checkpoint_every=20, resume_every=10**6)),
    "vgg_bn": ("digits", "vgg_bn", {"widths": [4, 8], "convs_per_stage": [1, 1]},
               TrainConfig(optimizer="adam", lr=0.01, batch_size=16, steps=200, schedule="cosine",
                           warmup_steps=10, grad_clip=0.5, checkpoint_every=40,
                           resume_every=10**6)),
    "vgg_deep": ("digits", "vgg_deep", {"widths": [4, 4], "convs_per_stage": [2, 2]},
                 TrainConfig(optimizer="adamw", lr=0.01, weight_decay=0.1, batch_size=16,
                             steps=200, grad_clip=0.2, checkpoint_every=50, resume_every=10**6)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_a_seed_in_a_block_equals_the_seed_alone_in_float64(tmp_path, request, case):
    """Every checkpoint of every seed, and the history, agree to 1e-10 (relative) over 200 steps;
    BatchNorm running statistics and per-seed clipping included."""
    data_name, arch, options, cfg = CASES[case]
    data = as_float64(request.getfixturevalue(data_name))
    seeds = [0, 1, 2]
    summaries, paths = run_block(tmp_path / "block", arch, seeds, data, cfg, options,
                                 torch.float64)  # fmt: skip
    assert [s["seed_block"] for s in summaries] == [3, 3, 3]
    for seed, block_paths in zip(seeds, paths, strict=True):
        _, alone = run_alone(tmp_path / f"alone{seed}", arch, seed, data, cfg, options,
                             torch.float64)  # fmt: skip
        in_block, by_itself = (
            read_archive(block_paths.archive.parent),
            read_archive(alone.archive.parent),
        )
        assert torch.equal(in_block["step"], by_itself["step"])
        assert max_relative_difference(in_block["state"], by_itself["state"]) < 1e-10
        block_history = block_paths.history.read_text().splitlines()
        alone_history = alone.history.read_text().splitlines()
        assert len(block_history) == len(alone_history)


def test_a_seed_in_a_block_keeps_its_float32_loss_curve(tmp_path, digits):
    """float32: the test-loss curves of block and alone agree within 1e-4."""
    _, arch, options, cfg = CASES["vgg_bn"]
    import pandas as pd

    _, paths = run_block(tmp_path / "block", arch, [4, 5], digits, cfg, options)
    for seed, block_paths in zip([4, 5], paths, strict=True):
        _, alone = run_alone(tmp_path / f"alone{seed}", arch, seed, digits, cfg, options)
        block_curve = pd.read_csv(block_paths.history)
        alone_curve = pd.read_csv(alone.history)
        for column in ("train_loss", "test_loss"):
            difference = (block_curve[column] - alone_curve[column]).abs().max()
            assert difference < 1e-4, (seed, column, difference)


@pytest.mark.parametrize("arch", ["transformer", "repvgg", "fixup_resnet", "resnet_bn"])
def test_every_kind_of_architecture_trains_in_a_block(tmp_path, arch):
    """Transformers (tokens, attention), RepVGG's branches, FixUp's scalar parameters, residual BN
    nets: a block of two equals each seed alone (float64, a few steps)."""
    if arch.startswith("transformer"):
        data = make_task_data("modular_addition", {"p": 11, "train_frac": 0.5})
        options = {"d_model": 16, "n_heads": 2, "d_mlp": 32}
    else:
        data = as_float64(make_task_data("digits", {}))
        options = {"widths": [4, 8], "blocks_per_stage": [1, 1]} if arch != "repvgg" else {}
    cfg = TrainConfig(optimizer="adam", lr=1e-3, batch_size=8, steps=6, checkpoint_every=3,
                      resume_every=10**6)  # fmt: skip
    _, paths = run_block(tmp_path / "block", arch, [0, 1], data, cfg, options, torch.float64)
    for seed, block_paths in zip([0, 1], paths, strict=True):
        _, alone = run_alone(tmp_path / f"alone{seed}", arch, seed, data, cfg, options,
                             torch.float64)  # fmt: skip
        difference = max_relative_difference(read_archive(block_paths.archive.parent)["state"],
                                             read_archive(alone.archive.parent)["state"])  # fmt: skip
        assert difference < 1e-10, (arch, seed, difference)


def test_block_outputs_are_per_seed_and_models_hold_their_weights(tmp_path, parity):
    _, arch, options, cfg = CASES["mlp"]
    models = cell_models(arch, [7, 8], parity, options)
    paths = [TrainPaths.in_directory(tmp_path / f"seed{s}") for s in (7, 8)]
    train_block(models, parity, cfg, [7, 8], paths, resume_path=tmp_path / "resume.pt",
                progress=False, model_info=[{"seed": 7}, {"seed": 8}])  # fmt: skip
    for model, seed_paths, seed in zip(models, paths, (7, 8), strict=True):
        saved = torch.load(seed_paths.model, weights_only=True)
        assert saved["seed"] == seed
        for name, value in model.state_dict().items():
            assert torch.equal(saved["state_dict"][name], value)
        assert load_json(seed_paths.summary)["status"] == "completed"
    assert not torch.equal(models[0].layers[1].weight, models[1].layers[1].weight)
    assert not (tmp_path / "resume.pt").exists()


class Crash(Exception):
    pass


def test_block_resume_after_crash_is_bit_identical(tmp_path, digits, monkeypatch):
    """A crash after the metric tables got rows past the last resume point: the rerun cuts them
    back and every file (metric tables included) equals an uninterrupted run's; the resume file
    counts the tables' rows instead of holding them."""
    monkeypatch.setattr("trainmap.training.record.FLUSH_S", 0.0)  # rows on disk at every checkpoint
    _, arch, options, cfg = CASES["vgg_bn"]
    cfg = TrainConfig(**{**vars(cfg), "steps": 90, "checkpoint_every": 10, "resume_every": 25})
    seeds = [0, 1, 2]
    _, reference = run_block(tmp_path / "a", arch, seeds, digits, cfg, options, fingerprint="x")

    def crash(index, metrics, step):
        if step == 90:
            raise Crash

    with pytest.raises(Crash):
        run_block(tmp_path / "b", arch, seeds, digits, cfg, options, fingerprint="x",
                  on_checkpoint=crash)  # fmt: skip
    saved = torch.load(tmp_path / "b" / "resume.pt", weights_only=True)
    rows_per_checkpoint = len(pd.read_csv(reference[0].metrics).query("step == 0"))
    assert saved["step"] == 75
    assert saved["recorder"] == {"written": [8 * rows_per_checkpoint] * 3}  # steps 0-70
    assert len(pd.read_csv(tmp_path / "b" / "seed0" / "checkpoint_metrics.csv")) == (
        9 * rows_per_checkpoint  # step 80's rows too, past the resume point
    )
    torch.manual_seed(999)
    summaries, resumed = run_block(tmp_path / "b", arch, seeds, digits, cfg, options,
                                   fingerprint="x")  # fmt: skip
    assert all(s["resumed_from_step"] == 75 for s in summaries)
    for a, b in zip(reference, resumed, strict=True):
        assert_same_files(a, b)
        assert a.metrics.read_bytes() == b.metrics.read_bytes()
        # appended rows are written as pandas writes the whole table
        whole = pd.read_csv(a.metrics).to_csv(index=False)
        assert a.metrics.read_bytes() == whole.encode()


def test_a_resume_file_whose_tables_lost_rows_starts_over(tmp_path, parity):
    """A metric table shorter than its resume file counts (removed by hand, say): the run starts
    from step 0 rather than continue a table with a hole in it."""
    _, arch, options, cfg = CASES["mlp"]
    cfg = TrainConfig(**{**vars(cfg), "steps": 60, "checkpoint_every": 10, "resume_every": 25})

    def crash(index, metrics, step):
        if step == 30:
            raise Crash

    with pytest.raises(Crash):
        run_block(tmp_path, arch, [0, 1], parity, cfg, options, fingerprint="x",
                  on_checkpoint=crash)  # fmt: skip
    (tmp_path / "seed1" / "checkpoint_metrics.csv").unlink()
    summaries, paths = run_block(tmp_path, arch, [0, 1], parity, cfg, options, fingerprint="x")
    assert [s["resumed_from_step"] for s in summaries] == [None, None]
    _, reference = run_block(tmp_path / "ref", arch, [0, 1], parity, cfg, options)
    for a, b in zip(reference, paths, strict=True):
        assert a.metrics.read_bytes() == b.metrics.read_bytes()


def assert_same_files(a: TrainPaths, b: TrainPaths) -> None:
    left, right = read_archive(a.archive.parent), read_archive(b.archive.parent)
    assert torch.equal(left["step"], right["step"])
    for name in left["state"]:
        assert torch.equal(left["state"][name], right["state"][name]), name
    left_model = torch.load(a.model, weights_only=True)["state_dict"]
    right_model = torch.load(b.model, weights_only=True)["state_dict"]
    assert all(torch.equal(left_model[k], right_model[k]) for k in left_model)
    assert a.history.read_bytes() == b.history.read_bytes()


KILL_SCRIPT = """
import sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from trainmap.data import make_task_data
from trainmap.training.loop import TrainConfig, TrainPaths, build_cell_model, train_block

out, delay = Path(sys.argv[1]), float(sys.argv[2])
data = make_task_data("sparse_parity", {"n_bits": 10, "k": 2, "n_train": 100, "n_test": 64})
cfg = TrainConfig(lr=0.05, momentum=0.9, batch_size=32, steps=500, checkpoint_every=10,
                  resume_every=40)
seeds = [3, 4, 5, 6]
models = [build_cell_model("mlp", "kaiming", s, data.meta, {"hidden": [32]}) for s in seeds]
paths = [TrainPaths.in_directory(out / f"seed{s}") for s in seeds]
hook = (lambda index, metrics, step: time.sleep(delay)) if delay > 0 else None
train_block(models, data, cfg, seeds, paths, resume_path=out / "resume.pt", on_checkpoint=hook,
            progress=False, fingerprint="block")
"""


@pytest.mark.integration  # starts a program (a subprocess)
def test_block_resume_after_sigkill_is_bit_identical(tmp_path):
    script = tmp_path / "train_block.py"
    script.write_text(textwrap.dedent(KILL_SCRIPT))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "src"), env.get("PYTHONPATH", "")])
    killed, reference = tmp_path / "killed", tmp_path / "reference"
    process = subprocess.Popen([sys.executable, str(script), str(killed), "0.005"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (killed / "resume.pt").exists():
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "no resume file appeared"
            time.sleep(0.02)
        time.sleep(0.15)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    assert not (killed / "seed3" / "model.pt").exists(), "the block finished before the kill"
    resume_step = torch.load(killed / "resume.pt", weights_only=True)["step"]
    assert 40 <= resume_step < 500
    for directory in (killed, reference):  # finish the killed block; train the reference
        result = subprocess.run([sys.executable, str(script), str(directory), "0"], env=env,
                                capture_output=True, text=True, timeout=300)  # fmt: skip
        assert result.returncode == 0, result.stderr
    assert load_json(killed / "seed3" / "train.json")["resumed_from_step"] == resume_step
    for seed in (3, 4, 5, 6):
        assert_same_files(TrainPaths.in_directory(reference / f"seed{seed}"),
                          TrainPaths.in_directory(killed / f"seed{seed}"))  # fmt: skip


def test_a_diverging_seed_is_frozen_and_the_others_go_on(tmp_path, parity):
    """Seed 1's weights are poisoned with inf: it diverges at its first step and keeps its state;
    seeds 0 and 2 train on and equal their runs alone (float64, to 1e-10: seed 1's NaN never
    reaches them)."""
    _, arch, options, cfg = CASES["mlp"]
    parity = as_float64(parity)
    seeds = [0, 1, 2]
    models = cell_models(arch, seeds, parity, options, torch.float64)
    with torch.no_grad():
        models[1].layers[1].weight[0, 0] = float("inf")
    poisoned = {k: v.clone() for k, v in models[1].state_dict().items()}
    paths = [TrainPaths.in_directory(tmp_path / f"seed{s}") for s in seeds]
    summaries = train_block(models, parity, cfg, seeds, paths, resume_path=tmp_path / "r.pt",
                            progress=False)  # fmt: skip
    assert summaries[1]["status"] == "diverged" and summaries[1]["diverged_step"] == 1
    assert summaries[1]["n_checkpoints"] == 1 and summaries[1]["steps_done"] == 0
    saved = torch.load(paths[1].model, weights_only=True)["state_dict"]
    for name, value in poisoned.items():
        assert torch.equal(saved[name], value), name
    assert read_archive(paths[1].archive.parent)["step"].tolist() == [0]
    for index in (0, 2):
        assert summaries[index]["status"] == "completed"
        assert summaries[index]["steps_done"] == cfg.steps
        _, alone = run_alone(tmp_path / f"alone{index}", arch, seeds[index], parity, cfg, options,
                             torch.float64)  # fmt: skip
        difference = max_relative_difference(read_archive(paths[index].archive.parent)["state"],
                                              read_archive(alone.archive.parent)["state"])  # fmt: skip
        assert difference < 1e-10


def test_seed_block_views_and_state(parity):
    models = cell_models("mlp", [0, 1], parity, {"hidden": [8]})
    block = SeedBlock(models)
    weight = block.tensor("layers.1.weight")
    assert weight.shape == (2, *models[0].layers[1].weight.shape)
    assert torch.equal(weight[1], models[1].layers[1].weight)
    single = SeedBlock([models[0]])
    assert single.tensor("layers.1.weight").shape == (1, *models[0].layers[1].weight.shape)
    assert single.tensor("layers.1.weight").data_ptr() == models[0].layers[1].weight.data_ptr()
    inputs = parity.x_train[:4]
    assert torch.allclose(block.forward_shared(inputs)[1], models[1](inputs), atol=1e-6)
    with pytest.raises(ValueError, match="at least one model"):
        SeedBlock([])


class PoisonAt(TrainHooks):
    """Sets a weight of each listed seed to inf after the given optimiser step (its loss is not
    finite from the next step on)."""

    def __init__(self, poison: dict[int, int]) -> None:
        self.poison = poison  # seed index -> the step after which it is poisoned
        self.seen: list[int] = []  # state a rerun interval must restore (as AST's flip rates)

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        self.seen.append(step)
        for index, at in self.poison.items():
            if step == at:
                first = next(iter(self.block.parameters))
                self.block.tensor(first)[index].view(-1)[0] = float("inf")

    def state_dict(self) -> dict:
        return {"seen": list(self.seen)}

    def load_state_dict(self, state: dict) -> None:
        self.seen = list(state["seen"])


def assert_same_outputs(a: TrainPaths, b: TrainPaths) -> None:
    """Every file the same bytes; a frozen seed's model may hold NaN (BatchNorm statistics of the
    step it diverged at), which the file bytes compare as equal."""
    left_archive, right_archive = read_archive(a.archive.parent), read_archive(b.archive.parent)
    assert torch.equal(left_archive["step"], right_archive["step"])
    for name, value in left_archive["state"].items():
        assert torch.equal(value, right_archive["state"][name]), name
    assert a.model.read_bytes() == b.model.read_bytes()
    assert a.history.read_bytes() == b.history.read_bytes()
    assert a.metrics.read_bytes() == b.metrics.read_bytes()
    assert a.summary.read_bytes() == b.summary.read_bytes()


@pytest.mark.parametrize(
    ("case", "poison"),
    [("mlp", {1: 13}), ("mlp", {0: 3, 2: 27}), ("mlp", {0: 21, 1: 21, 2: 21}), ("vgg_bn", {1: 17}),
     ("vgg_bn_augmented", {1: 17})],
)  # fmt: skip
def test_losses_checked_late_give_the_files_of_per_step_checks(tmp_path, request, case, poison):
    """Losses kept on the device and checked only at checkpoints and resume points (the GPU's
    way): an interval in which a seed diverged runs again step by step, so each seed freezes at the
    step it diverged at and every file equals the per-step check's (the CPU's way), bit for bit:
    one seed, two in different intervals, every seed of the block; BatchNorm buffers too, and the
    augmentation draws the replay takes again."""
    augment = None
    if case == "vgg_bn_augmented":
        case, augment = "vgg_bn", {"crop": 8, "padding": 1, "flip": True, "cutout": 3, "mixup": 0.4}
    data_name, arch, options, cfg = CASES[case]
    data = request.getfixturevalue(data_name)
    cfg = TrainConfig(**{**vars(cfg), "steps": 40, "checkpoint_every": 10, "resume_every": 25,
                         "augment": augment})  # fmt: skip
    seeds = [0, 1, 2]
    runs, hooks = {}, {}
    for check in (True, False):
        hooks[check] = PoisonAt(poison)
        summaries, paths = run_block(tmp_path / str(check), arch, seeds, data, cfg, options,
                                     hooks=hooks[check], check_every_step=check)  # fmt: skip
        runs[check] = summaries, paths
    assert hooks[False].seen == hooks[True].seen  # the hooks' state rolled back with the rest
    for index in range(len(seeds)):
        expected = runs[True][0][index]
        if index in poison:
            assert expected["status"] == "diverged"
            assert expected["diverged_step"] == poison[index] + 2  # the step after the poison
        else:
            assert expected["status"] == "completed"
        assert_same_outputs(runs[True][1][index], runs[False][1][index])


@pytest.mark.parametrize("case", ["mlp", "vgg_deep"])
def test_a_block_holds_a_sweep_each_seed_as_alone_with_its_values(tmp_path, request, case):
    """Per-seed settings (lists: seed s takes position s mod length): in one block each seed trains
    as alone with its own learning rate and weight decay (float64, 1e-10); a seed whose values
    equal a shared setting's has that block's bits; the history and summary carry its values."""
    from dataclasses import replace

    data_name, arch, options, cfg = CASES[case]
    data = request.getfixturevalue(data_name)
    seeds = [0, 1, 2]
    sweep = replace(cfg, lr=(cfg.lr, cfg.lr / 3), weight_decay=(cfg.weight_decay, 0.05))
    summaries, paths = run_block(tmp_path / "sweep", arch, seeds, as_float64(data), sweep, options,
                                 torch.float64)  # fmt: skip
    for seed, block_paths, summary in zip(seeds, paths, summaries, strict=True):
        own = replace(cfg, lr=sweep.lr[seed % 2], weight_decay=sweep.weight_decay[seed % 2])
        assert summary["seed_settings"] == {"lr": own.lr, "weight_decay": own.weight_decay}
        _, alone = run_alone(tmp_path / f"alone{seed}", arch, seed, as_float64(data), sweep,
                             options, torch.float64)  # fmt: skip
        assert max_relative_difference(read_archive(block_paths.archive.parent)["state"],
                                       read_archive(alone.archive.parent)["state"]) < 1e-10  # fmt: skip
        history = pd.read_csv(block_paths.history)
        assert history["lr"].iloc[-1] == own.lr * lr_factor(own.steps, own)
    # float32: seeds 0 and 2 have the shared setting's values, so that block's bits
    _, swept = run_block(tmp_path / "sweep32", arch, seeds, data, sweep, options)
    _, shared = run_block(tmp_path / "shared32", arch, seeds, data, cfg, options)
    for index in (0, 2):
        assert swept[index].model.read_bytes() == shared[index].model.read_bytes()
    assert swept[1].model.read_bytes() != shared[1].model.read_bytes()
