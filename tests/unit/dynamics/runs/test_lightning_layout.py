"""Runs trained with the real Lightning library, read as Lightning leaves them: a sweep's
``lr<x>/lightning_logs/version_<n>/`` folders with ``checkpoints/epoch=<e>-step=<n>.ckpt`` (and
``last.ckpt``), the CSVLogger's ``metrics.csv`` (validation and training rows interleaved, blank
where another call logged) and ``hparams.yaml``. Found, read and grouped by their own
hyperparameters without conversion; the metrics equal those of the same weights in the plain
layout."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import lightning as L
import pandas as pd
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainmap.dynamics.__main__ import GroupingError, find_runs, main, run_groups
from trainmap.dynamics.runs.external import (
    ExternalRunError,
    external_run_metrics,
    read_external_run,
    run_files,
    run_hyperparameters,
)
from trainmap.dynamics.runs.layouts import is_lightning_run
from trainmap.recorder.lightning import MetricCallback

STEPS, EVERY = 24, 8


class Net(L.LightningModule):
    """A small MLP held as ``self.model``: its weights are named ``model.0.weight``, ..."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

    def training_step(self, batch, index):
        x, y = batch
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, index):
        x, y = batch
        out = self.model(x)
        self.log("val_loss", nn.functional.cross_entropy(out, y))
        self.log("val_acc", (out.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def train(root: Path, seed: int, lr: float, recorded: Path) -> Path:
    """One Lightning run under ``root``: validation and a checkpoint every :data:`EVERY` steps,
    training loss logged every 4 (rows interleaved with the validation rows), and the recorder's
    callback writing the same run's metric table to ``recorded``."""
    L.seed_everything(seed, verbose=False)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=generator)
    y = (x[:, 0] > 0).long()
    data = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    checkpoints = ModelCheckpoint(every_n_train_steps=EVERY, save_top_k=-1, save_last=True)
    trainer = L.Trainer(max_steps=STEPS, val_check_interval=EVERY, check_val_every_n_epoch=None,
                        callbacks=[checkpoints, MetricCallback(recorded)],
                        logger=CSVLogger(root), log_every_n_steps=4,
                        enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", devices=1)  # fmt: skip
    trainer.fit(Net(lr), data, DataLoader(TensorDataset(x, y), batch_size=256))
    return Path(trainer.logger.log_dir)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Two learning rates x two seeds, each under ``sweep/lr<x>/lightning_logs/version_<seed>``
    (the recorder's tables beside the sweep, in ``recorded/lr<x>_seed<seed>``)."""
    root, threads = tmp_path_factory.mktemp("lightning"), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for lr in (0.1, 0.01):
            for seed in (0, 1):
                train(root / "sweep" / f"lr{lr}", seed, lr, root / f"recorded/lr{lr}_seed{seed}")
    finally:
        torch.set_num_threads(threads)
    return root / "sweep"


def test_a_lightning_run_reads_as_it_is(sweep: Path) -> None:
    version = sweep / "lr0.1/lightning_logs/version_0"
    assert is_lightning_run(version)
    run = read_external_run(version)
    # step=8, 16, 24 from the names; last.ckpt repeats step 24 and is passed over
    assert list(run.checkpoints) == [8, 16, 24]
    assert run.checkpoints[24].name.endswith("step=24.ckpt")
    logged = pd.read_csv(version / "metrics.csv")
    assert logged["val_acc"].isna().any()  # the training rows are blank there
    validation = logged.dropna(subset=["val_acc"])
    # Lightning logs the validation after 8 steps at step 7: read one step on
    assert list(validation["step"]) == [7, 15, 23]
    assert list(run.evaluation["step"]) == [8, 16, 24]
    assert run.evaluation["test_acc"].tolist() == validation["val_acc"].tolist()
    assert run.evaluation["test_loss"].tolist() == validation["val_loss"].tolist()
    assert {path.name for path in run_files(version)} == {
        "metrics.csv", "last.ckpt", "epoch=0-step=8.ckpt", "epoch=1-step=16.ckpt",
        "epoch=2-step=24.ckpt"}  # fmt: skip


def test_its_metrics_equal_the_same_weights_in_the_plain_layout(sweep: Path, tmp_path) -> None:
    version = sweep / "lr0.01/lightning_logs/version_1"
    lightning = read_external_run(version)
    plain = tmp_path / "plain"
    plain.mkdir()
    for step, path in lightning.checkpoints.items():
        state = torch.load(path, weights_only=True, map_location="cpu")["state_dict"]
        torch.save({key.removeprefix("model."): value for key, value in state.items()},
                   plain / f"step_{step}.pt")  # fmt: skip
    lightning.evaluation.to_csv(plain / "evaluation.csv", index=False)
    expected = external_run_metrics(read_external_run(plain))
    pd.testing.assert_frame_equal(external_run_metrics(lightning), expected)


def test_a_missing_accuracy_column_names_the_columns_logged(sweep: Path) -> None:
    with pytest.raises(ExternalRunError, match=r"no column 'val_accuracy' \(columns logged: "
                       r"epoch, train_loss, val_acc, val_loss\)"):  # fmt: skip
        read_external_run(sweep / "lr0.1/lightning_logs/version_0", accuracy_key="val_accuracy")


def test_the_sweep_is_found_below_its_root_and_grouped_by_its_hyperparameters(sweep) -> None:
    runs = find_runs([sweep])
    assert sorted(runs) == [f"lr{lr}/lightning_logs/version_{seed}"
                            for lr in ("0.01", "0.1") for seed in (0, 1)]  # fmt: skip
    assert run_hyperparameters(runs["lr0.1/lightning_logs/version_1"]) == {"lr": "0.1"}
    grouped = run_groups(runs, options(group_by="lr"))
    assert grouped == {run: f"lr={run[2:].split('/')[0]}" for run in runs}
    by_path = run_groups(runs, options(group_by_path=r"^lr([\d.]+)/"))
    assert sorted(set(by_path.values())) == ["0.01", "0.1"]
    with pytest.raises(GroupingError, match=r"--group-by momentum: run .* has no such "
                       r"hyperparameter \(found: lr;"):  # fmt: skip
        run_groups(runs, options(group_by="momentum"))
    with pytest.raises(GroupingError, match="does not match run"):
        run_groups(runs, options(group_by_path=r"^seed(\d+)"))


def test_a_wrong_groups_file_stops_before_any_work(sweep: Path, tmp_path: Path) -> None:
    groups = tmp_path / "groups.csv"
    groups.write_text("run,group\nlr0.1/lightning_logs/version_0,fast\nversion_9,slow\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"names runs that were not found: \['version_9'\]"):
        main([str(sweep), "--out", str(out), "--threshold", "0.8", "--groups", str(groups)])
    assert not out.exists()  # nothing was read or fitted, no metric table written
    groups.write_text("run,group\nlr0.1/lightning_logs/version_0,fast\n")
    with pytest.raises(SystemExit, match="has no group for runs"):
        main([str(sweep), "--out", str(out), "--threshold", "0.8", "--groups", str(groups)])
    assert not out.exists()


def test_the_command_line_maps_the_sweep_by_learning_rate(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main([str(sweep), "--out", str(out), "--threshold", "0.8", "--group-by", "lr",
                 "--k-max", "2", "--restarts", "1", "--bootstrap", "0", "--stability", "0"]) == 0  # fmt: skip
    assert len(list((out / "metrics").rglob("metrics.csv"))) == 4
    verdicts = pd.read_csv(out / "joint/verdicts.csv")
    assert set(verdicts["second"]) | set(verdicts["first"]) == {"lr=0.1", "lr=0.01"}


def options(**chosen) -> argparse.Namespace:
    return argparse.Namespace(**({"groups": None, "group_by": None, "group_by_path": None}
                                 | chosen))  # fmt: skip


def test_a_configs_external_set_takes_lightning_runs(sweep: Path) -> None:
    """config key external: the same runs, matched by a pattern, pass the checks made before any
    job, and a missing accuracy column is refused there, naming the key."""
    from trainmap.grid import ConfigError
    from trainmap.grid.external import check_external, external_runs

    spec = {"name": "fast", "runs": ["lr0.1/lightning_logs/version_*"], "threshold": 0.8}
    assert sorted(external_runs(spec, sweep)) == ["version_0", "version_1"]
    check_external({"external": [spec]}, sweep)
    with pytest.raises(ConfigError, match=r"config key external\[0\]\.runs: .*no column 'acc'"):
        check_external({"external": [spec | {"accuracy_key": "acc"}]}, sweep)


def test_each_checkpoint_is_read_once_from_the_config_check_to_its_metrics(
    sweep: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run set's config check (every file's step and shapes), then its metric job (the runs
    read again, then their metrics): each checkpoint's header is read once (memory-mapped: the
    pickled structure, not the tensors' data) and its weights once; last.ckpt, a repeat of a
    saved step, only for its header."""
    import shutil
    from collections import Counter

    from trainmap.grid.external import check_external, external_runs

    for version in ("version_0", "version_1"):  # fresh paths: nothing read in this process yet
        shutil.copytree(sweep / f"lr0.1/lightning_logs/{version}", tmp_path / version)
    loads: Counter = Counter()
    real_load = torch.load

    def counted_load(path, *args, **kwargs):
        loads[Path(path).relative_to(tmp_path).as_posix(), bool(kwargs.get("mmap"))] += 1
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counted_load)
    spec = {"name": "fast", "runs": ["version_*"], "threshold": 0.8}
    check_external({"external": [spec]}, tmp_path)
    for run_dir in external_runs(spec, tmp_path).values():
        external_run_metrics(read_external_run(run_dir))
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.ckpt"))
    assert len(files) == 8
    for name in files:
        weights = 0 if name.endswith("last.ckpt") else 1
        assert (loads[name, True], loads[name, False]) == (1, weights), name
    assert sum(loads.values()) == len(files) + 6


def test_the_recorders_callback_equals_the_checkpoints(sweep: Path) -> None:
    """MetricCallback in the same Trainer: its table holds the metrics of the checkpoints saved
    at the same steps, and the accuracy and loss Lightning logged there."""
    from trainmap.dynamics.metrics.columns import METRIC_NAMES

    run = read_external_run(sweep / "lr0.1/lightning_logs/version_1")
    expected = external_run_metrics(run)
    recorded = pd.read_csv(sweep.parent / "recorded/lr0.1_seed1/metrics.csv")
    assert recorded["step"].tolist() == [8, 16, 24] == expected["step"].tolist()
    difference = (recorded[list(METRIC_NAMES)] - expected[list(METRIC_NAMES)]).abs().to_numpy()
    assert difference.max() <= 1e-12 * max(1.0, expected[list(METRIC_NAMES)].abs().to_numpy().max())
    assert recorded["test_acc"].tolist() == pytest.approx(run.evaluation["test_acc"].tolist())
    assert recorded["test_loss"].tolist() == pytest.approx(run.evaluation["test_loss"].tolist())


class Opaque:
    """An object a checkpoint may hold besides tensors (unpickling it could run code)."""


def test_a_checkpoint_holding_a_pickled_object_is_refused_naming_it(tmp_path: Path) -> None:
    run = tmp_path / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    path = run / "checkpoints/epoch=0-step=8.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2, 2)}, "global_step": 8, "extra": Opaque()}, path)
    (run / "metrics.csv").write_text("step,val_acc\n7,0.5\n")
    with pytest.raises(ExternalRunError, match=r"epoch=0-step=8.ckpt: damaged or not a state "
                       rf"dict: it holds a pickled {re.escape(Opaque.__module__)}.Opaque, which "
                       r"loading with weights_only=True refuses"):  # fmt: skip
        read_external_run(run)  # refused when the run is read, before any metric


def test_a_folder_with_two_layouts_is_refused(sweep: Path, tmp_path: Path) -> None:
    import shutil

    mixed = tmp_path / "mixed"
    shutil.copytree(sweep / "lr0.1/lightning_logs/version_0", mixed)
    (mixed / "checkpoint-8").mkdir()
    shutil.copy(mixed / "checkpoints/epoch=0-step=8.ckpt", mixed / "checkpoint-8/pytorch_model.bin")
    with pytest.raises(ExternalRunError, match="holds runs in Hugging Face and Lightning layouts"):
        read_external_run(mixed)


def test_a_checkpoint_named_for_another_step_is_refused(sweep: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "version_0"
    shutil.copytree(sweep / "lr0.1/lightning_logs/version_0", run)
    (run / "checkpoints/epoch=0-step=8.ckpt").rename(run / "checkpoints/epoch=0-step=12.ckpt")
    with pytest.raises(ExternalRunError, match=r"step=12.ckpt: global_step 8 but the name says "
                       r"step 12"):  # fmt: skip
        read_external_run(run)


@pytest.mark.integration
def test_the_workflow_maps_a_lightning_sweep_as_a_config_of_its_own(sweep: Path, tmp_path) -> None:
    """A config holding only two external sets of Lightning runs (one per learning rate) and
    their joint comparison: snakemake reads the runs as Lightning left them and maps both."""
    import shutil

    from conftest import copy_workflow, snakemake

    workdir = copy_workflow(tmp_path / "project")
    shutil.copytree(sweep, workdir / "sweep")
    (workdir / "sweep.yaml").write_text(
        "external:\n"
        "  - {name: fast, runs: ['sweep/lr0.1/lightning_logs/version_*'], threshold: 0.8}\n"
        "  - {name: slow, runs: ['sweep/lr0.01/lightning_logs/version_*'], threshold: 0.8}\n"
        "analysis:\n  bootstrap: 0\n  stability: 0\n  k_max: 2\n  restarts: 1\n"
        "  joint: [{name: lr, external: [fast, slow]}]\n"
    )
    snakemake("--cores", "2", "--configfile", "sweep.yaml", cwd=workdir)
    results = workdir / "results"
    joint = json.loads((results / "joint/lr/joint.json").read_text())
    assert set(joint["groups"]) == {"fast", "slow"}
    assert not (results / "train").exists()  # no grid: nothing of the default study ran
