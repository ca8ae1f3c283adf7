"""The training loop's stop point: SIGTERM in a job process stops training after the step in
progress, with that step's resume state saved, and the rerun ends bit-identical to a run that was
never stopped (trainmap.stopping, trainmap.training.loop)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from trainmap import stopping
from trainmap.data import TaskData, make_task_data
from trainmap.io import load_json
from trainmap.training.archive import read_archive
from trainmap.training.loop import (
    TrainConfig,
    TrainHooks,
    TrainPaths,
    build_cell_model,
    train_block,
)

# Adam moments, warm-up + cosine schedule, clipping, epochs that end between checkpoints: every
# piece of the training state a stop at an arbitrary step must carry over.
CONFIG = TrainConfig(optimizer="adam", lr=0.01, batch_size=32, steps=120, schedule="cosine",
                     warmup_steps=20, grad_clip=1.0, checkpoint_every=10,
                     resume_every=35)  # fmt: skip
#: SIGTERM arrives during the step that makes this the step count: neither a checkpoint (10) nor a
#: resume step (35) of CONFIG.
STOP_AFTER = 47

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def parity() -> TaskData:
    return make_task_data("sparse_parity", {"n_bits": 10, "k": 2, "n_train": 100, "n_test": 64})


class SigtermDuring(TrainHooks):
    """Sends this process SIGTERM during one step, as Snakemake or the job client would. The
    plain hooks otherwise (nothing else changes the arithmetic)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def after_step(self, step: int) -> None:
        if step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def train(directory: Path, data: TaskData, seeds: list[int], check_every_step: bool,
          hooks: TrainHooks | None = None) -> tuple[list[dict], list[TrainPaths]]:  # fmt: skip
    models = [build_cell_model("mlp", "kaiming", seed, data.meta, {"hidden": [32]})
              for seed in seeds]  # fmt: skip
    paths = [TrainPaths.in_directory(directory / f"seed{seed}") for seed in seeds]
    summaries = train_block(models, data, CONFIG, seeds, paths, resume_path=directory / "resume.pt",
                            progress=False, fingerprint="cell", hooks=hooks,
                            check_every_step=check_every_step)  # fmt: skip
    return summaries, paths


# A block of one with a host check every step (the CPU's way), and a block of two seeds whose
# losses are checked late (an accelerator's way: the stop point checks the interval first).
@pytest.mark.parametrize(("seeds", "check_every_step"), [([0], True), ([0, 1], False)])
def test_a_stopped_run_resumes_bit_identical(tmp_path, parity, stop_handler, seeds,
                                             check_every_step) -> None:  # fmt: skip
    reference, reference_paths = train(tmp_path / "reference", parity, seeds, check_every_step)

    stopped = tmp_path / "stopped"
    with pytest.raises(stopping.JobStopped, match=f"after step {STOP_AFTER} of 120"):
        train(stopped, parity, seeds, check_every_step, hooks=SigtermDuring(STOP_AFTER - 1))
    assert stopping.stop_requested()
    saved = torch.load(stopped / "resume.pt", weights_only=True)
    assert saved["step"] == STOP_AFTER
    assert not any(
        TrainPaths.in_directory(stopped / f"seed{seed}").model.exists() for seed in seeds
    )

    stopping.clear_stop_request()  # a fresh job process: no request pending
    torch.manual_seed(12345)  # and another global RNG state than the stopped run left
    summaries, paths = train(stopped, parity, seeds, check_every_step)
    assert not (stopped / "resume.pt").exists()
    for summary, expected, path, expected_path in zip(summaries, reference, paths, reference_paths,
                                                      strict=True):  # fmt: skip
        assert summary["resumed_from_step"] == STOP_AFTER and summary["status"] == "completed"
        final = torch.load(path.model, weights_only=True)["state_dict"]
        wanted = torch.load(expected_path.model, weights_only=True)["state_dict"]
        assert final.keys() == wanted.keys()
        assert all(torch.equal(final[name], wanted[name]) for name in wanted)
        archive, wanted_archive = (
            read_archive(path.archive.parent),
            read_archive(expected_path.archive.parent),
        )
        assert torch.equal(archive["step"], wanted_archive["step"])
        assert all(torch.equal(archive["state"][name], wanted_archive["state"][name])
                   for name in wanted_archive["state"])  # fmt: skip
        # history and metric tables have no wall-time columns: the same bytes
        assert path.history.read_bytes() == expected_path.history.read_bytes()
        assert path.metrics.read_bytes() == expected_path.metrics.read_bytes()
        got, want = load_json(path.summary), load_json(expected_path.summary)
        for key in ("wall_time_s", "steps_per_s", "metrics_s", "archive_s", "resumed_from_step"):
            got.pop(key, None), want.pop(key, None)
        assert got == want
        assert expected["resumed_from_step"] is None


def test_sigterm_after_the_last_step_stops_as_the_block_ends(tmp_path, parity, stop_handler):
    """A request that comes after the last stop point (here: during the last step) is honoured
    when training leaves its listening block: the block's outputs are written, then JobStopped."""
    with pytest.raises(stopping.JobStopped, match="after the training's last stop point"):
        train(tmp_path, parity, [0], True, hooks=SigtermDuring(CONFIG.steps - 1))
    assert TrainPaths.in_directory(tmp_path / "seed0").model.exists()
    assert not (tmp_path / "resume.pt").exists()
