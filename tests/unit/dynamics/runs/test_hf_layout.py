"""A Hugging Face Trainer output directory read as it is: ``checkpoint-<step>/`` folders holding
``model.safetensors`` or ``pytorch_model.bin``, the accuracy from ``trainer_state.json``'s
``log_history`` under a key the user names; its metrics equal those of the same weights laid out
as a plain external run; a bad folder is refused naming the file and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from trainmap.dynamics.__main__ import find_runs
from trainmap.dynamics.runs.external import (
    ExternalRunError,
    external_run_metrics,
    read_external_run,
)
from trainmap.dynamics.runs.layouts import is_hf_run

STEPS = (10, 20, 30)


def weights(seed: int, step: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * seed + step)
    return {"net.0.weight": torch.randn(16, 8, generator=generator),
            "net.0.bias": torch.randn(16, generator=generator),
            "net.2.weight": torch.randn(2, 16, generator=generator),
            "net.2.bias": torch.randn(2, generator=generator)}  # fmt: skip


def hf_run(root: Path, seed: int, binary: bool = False, key: str = "eval_accuracy") -> Path:
    """A run as transformers.Trainer writes it (weights, per-checkpoint and run state files)."""
    history = []
    for step in STEPS:
        folder = root / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        if binary:
            torch.save(weights(seed, step), folder / "pytorch_model.bin")
        else:
            save_file(weights(seed, step), folder / "model.safetensors")
        history += [{"epoch": step / 10, "step": step, "loss": 1.0 / step},
                    {"epoch": step / 10, "step": step, key: step / 40, "eval_loss": 2.0 / step}]  # fmt: skip
        (folder / "trainer_state.json").write_text(json.dumps(
            {"global_step": step, "log_history": list(history)}))  # fmt: skip
    (root / "trainer_state.json").write_text(json.dumps({"global_step": STEPS[-1],
                                                        "log_history": history}))  # fmt: skip
    return root


def plain_run(root: Path, seed: int) -> Path:
    """The same weights as a plain external run (step_N.safetensors and evaluation.csv)."""
    root.mkdir(parents=True)
    for step in STEPS:
        save_file(weights(seed, step), root / f"step_{step}.safetensors")
    pd.DataFrame({"step": STEPS, "test_acc": [s / 40 for s in STEPS],
                  "test_loss": [2.0 / s for s in STEPS]}).to_csv(root / "evaluation.csv", index=False)  # fmt: skip
    return root


@pytest.mark.parametrize("binary", [False, True])
def test_a_trainer_run_reads_as_it_is_and_equals_the_plain_layout(tmp_path, binary) -> None:
    run = hf_run(tmp_path / "hf" / "seed0", 0, binary)
    assert is_hf_run(run)
    read = read_external_run(run)
    assert list(read.checkpoints) == list(STEPS)
    assert read.checkpoints[10].name == ("pytorch_model.bin" if binary else "model.safetensors")
    assert read.evaluation["test_acc"].tolist() == [s / 40 for s in STEPS]
    plain = read_external_run(plain_run(tmp_path / "plain" / "seed0", 0))
    pd.testing.assert_frame_equal(external_run_metrics(read), external_run_metrics(plain))


def test_the_command_line_finds_trainer_runs_and_takes_the_accuracy_key(tmp_path) -> None:
    for seed in (0, 1):
        hf_run(tmp_path / "out" / f"lr0.01_seed{seed}", seed, key="eval_acc")
    found = find_runs([tmp_path / "out"])
    assert sorted(found) == ["lr0.01_seed0", "lr0.01_seed1"]
    with pytest.raises(ExternalRunError, match=r"no log_history entry has 'eval_accuracy' \(keys "
                                               r"logged: epoch, eval_acc, eval_loss, loss\)"):  # fmt: skip
        read_external_run(found["lr0.01_seed0"])
    assert read_external_run(found["lr0.01_seed0"], accuracy_key="eval_acc").evaluation[
        "test_acc"].tolist() == [s / 40 for s in STEPS]  # fmt: skip


def test_a_checkpoint_whose_step_disagrees_with_its_folder_is_refused(tmp_path) -> None:
    run = hf_run(tmp_path / "seed0", 0)
    state = run / "checkpoint-20" / "trainer_state.json"
    state.write_text(json.dumps({"global_step": 25, "log_history": []}))
    with pytest.raises(ExternalRunError, match=r"trainer_state.json: global_step 25 but the "
                                               r"folder says step 20"):  # fmt: skip
        read_external_run(run)


def test_an_accuracy_missing_at_a_checkpoint_names_the_steps(tmp_path) -> None:
    run = hf_run(tmp_path / "seed0", 0)
    state = json.loads((run / "trainer_state.json").read_text())
    state["log_history"] = [e for e in state["log_history"]
                            if not (e["step"] == 30 and "eval_accuracy" in e)]  # fmt: skip
    (run / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(ExternalRunError, match=r"'eval_accuracy' is not logged at checkpoint "
                                               r"step\(s\) \[30\]"):  # fmt: skip
        read_external_run(run)


def test_a_config_external_set_of_trainer_runs_is_checked_with_its_accuracy_key(tmp_path) -> None:
    from conftest import REPO_ROOT

    from trainmap.dynamics.runs.external import run_files
    from trainmap.grid import ConfigError, load_config

    for seed in (0, 1):
        hf_run(tmp_path / "hf" / f"lr0.01_seed{seed}", seed, key="eval_acc")
    spec = '{name: trainer, runs: ["hf/lr*"], threshold: 0.5%s}'
    config = tmp_path / "c.yaml"
    config.write_text(f"dvc: {{configfile: c.yaml}}\nexternal: [{spec % ''}]\n")
    with pytest.raises(ConfigError, match=r"config key external\[0\]\.runs: .*no log_history "
                                          r"entry has 'eval_accuracy'"):  # fmt: skip
        load_config(REPO_ROOT / "params.yaml", REPO_ROOT / "config/config.yaml", config,
                    check_paths_from=tmp_path)  # fmt: skip
    config.write_text(f"dvc: {{configfile: c.yaml}}\n"
                      f"external: [{spec % ', accuracy_key: eval_acc'}]\n")  # fmt: skip
    loaded = load_config(REPO_ROOT / "params.yaml", REPO_ROOT / "config/config.yaml", config,
                         check_paths_from=tmp_path)  # fmt: skip
    assert loaded["external"][0]["accuracy_key"] == "eval_acc"
    # the workflow reruns a set's metrics when any file it reads changes: weights and states
    files = {p.relative_to(tmp_path / "hf" / "lr0.01_seed0").as_posix()
             for p in run_files(tmp_path / "hf" / "lr0.01_seed0")}  # fmt: skip
    assert files == {"trainer_state.json", *(f"checkpoint-{s}/{n}" for s in STEPS
                                             for n in ("model.safetensors", "trainer_state.json"))}  # fmt: skip
