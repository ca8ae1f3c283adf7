"""Errors that show the search: when the command line finds fewer than 2 runs it lists each place
it looked at and why that is not a run; a CSV is a trainmap metric table only if its header says
so (another tool's metrics.csv, such as Lightning's, is not taken for a damaged one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmap.dynamics.__main__ import find_runs, not_a_metric_table


def lightning_layout(root: Path) -> Path:
    """lightning_logs/version_0/ with Lightning's own metrics.csv and hparams.yaml but no
    checkpoints (a run logged without ModelCheckpoint): no run."""
    version = root / "lightning_logs" / "version_0"
    (version / "checkpoints").mkdir(parents=True)
    (version / "hparams.yaml").write_text("lr: 0.01\n")
    (version / "metrics.csv").write_text("epoch,step,val_acc\n0,100,0.5\n,,\n")
    return root / "lightning_logs"


def test_another_tools_metrics_csv_is_not_a_metric_table(tmp_path) -> None:
    logs = lightning_layout(tmp_path)
    why = not_a_metric_table(logs / "version_0" / "metrics.csv")
    assert why is not None and "header: epoch, step, val_acc" in why
    table = tmp_path / "metrics.csv"
    table.write_text("step,l1,l2,test_acc\n0,1.0,2.0,0.1\n")
    assert not_a_metric_table(table) is None


def test_zero_runs_lists_each_place_looked_at_and_why(tmp_path) -> None:
    logs = lightning_layout(tmp_path)
    with pytest.raises(SystemExit) as error:
        find_runs([logs])
    message = str(error.value)
    assert "found 0 run(s)" in message and "Looked at:" in message
    assert f"{logs / 'version_0' / 'metrics.csv'}: not a trainmap metric table" in message
    assert f"{logs / 'version_0'}: no checkpoint files" in message
    assert "it holds checkpoints, hparams.yaml, metrics.csv" in message


def test_checkpoint_folders_without_weights_are_named_in_the_search(tmp_path) -> None:
    """A folder of ``checkpoint-N/`` folders without weights (a Trainer run saved without its
    model) is no run: the error says what it holds instead of only counting."""
    for run in ("lr0.01_seed0", "lr0.01_seed1"):
        for step in (20, 40):
            folder = tmp_path / "runs" / run / f"checkpoint-{step}"
            folder.mkdir(parents=True)
            (folder / "training_args.bin").write_bytes(b"")
        (tmp_path / "runs" / run / "trainer_state.json").write_text("{}")
    with pytest.raises(SystemExit) as error:
        find_runs([tmp_path / "runs"])
    message = str(error.value)
    assert (f"{tmp_path / 'runs' / 'lr0.01_seed0'}: no checkpoint files (.pt, .pth, "
            ".safetensors, .ckpt) directly inside, no checkpoint-<step>/ folders with weights "
            "(Hugging Face), no checkpoints/*.ckpt (Lightning); it holds checkpoint-20, "
            "checkpoint-40, trainer_state.json") in message  # fmt: skip


def test_metric_tables_are_still_found_beside_foreign_csvs(tmp_path) -> None:
    for seed in (0, 1):
        run = tmp_path / "study" / f"seed{seed}"
        run.mkdir(parents=True)
        (run / "metrics.csv").write_text("step,l1,l2\n0,1.0,2.0\n10,1.1,2.1\n")
    lightning_layout(tmp_path / "study")
    found = find_runs([tmp_path / "study"])
    assert sorted(found) == ["seed0", "seed1"]
