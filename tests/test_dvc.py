"""Integration: DVC runs the same Snakemake workflow, versions data and checkpoints, round-trips a remote."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import dvc, dvc_smoke_project

pytestmark = pytest.mark.integration


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def dvc_project(tmp_path_factory) -> Path:
    """A git + DVC clone of the workflow whose params.yaml points `dvc repro` at the smoke grid."""
    workdir = dvc_smoke_project(tmp_path_factory.mktemp("dvc"))
    result = dvc("repro", cwd=workdir)
    assert "Running stage 'train'" in result.stdout
    return workdir


def test_repro_runs_the_workflow_and_locks_outputs(dvc_project: Path) -> None:
    lock = yaml.safe_load((dvc_project / "dvc.lock").read_text())
    assert set(lock["stages"]) == {"data", "gradinit", "train", "transform", "evaluate", "analysis"}
    train_outs = {out["path"] for out in lock["stages"]["train"]["outs"]}
    assert train_outs == {"results/train"}
    assert "train" in lock["stages"]["train"]["params"]["params.yaml"]
    assert (dvc_project / "results/summary/evaluation.csv").exists()
    transform_outs = {out["path"] for out in lock["stages"]["transform"]["outs"]}
    assert transform_outs == {"results/reparam", "results/sparse", "results/quantize"}
    assert "sparse" in lock["stages"]["transform"]["params"]["params.yaml"]
    assert (dvc_project / "results/joint/parity_init/joint.json").exists()


def test_second_repro_is_a_no_op(dvc_project: Path) -> None:
    result = dvc("repro", cwd=dvc_project)
    assert "Running stage" not in result.stdout
    assert "up to date" in result.stdout


def test_metrics_show_prints_the_evaluation_summary(dvc_project: Path) -> None:
    result = dvc("metrics", "show", "--json", cwd=dvc_project)
    shown = json.loads(result.stdout)
    metrics = next(iter(shown.values()))["data"]["results/summary/metrics.json"]["data"]
    assert metrics["sparse_parity"]["mlp"]["kaiming"]["runs"] == 2


def test_push_and_pull_round_trip(dvc_project: Path, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    dvc("remote", "add", "--local", "--force", "-d", "testremote", str(remote), cwd=dvc_project)
    model = dvc_project / "results/train/digits/vgg_bn/kaiming/seed0/model.pt"
    before = md5(model)
    dvc("push", cwd=dvc_project)
    assert any(remote.rglob("*")), "push wrote nothing to the remote"
    shutil.rmtree(dvc_project / "results/train")
    shutil.rmtree(dvc_project / ".dvc/cache")
    dvc("pull", "train", cwd=dvc_project)
    assert md5(model) == before


def test_exp_run_with_one_changed_hyperparameter(dvc_project: Path) -> None:
    sparse_model = dvc_project / "results/train/sparse_parity/mlp/kaiming/seed0/model.pt"
    digits_model = dvc_project / "results/train/digits/vgg_bn/kaiming/seed0/model.pt"
    sparse_before, digits_before = md5(sparse_model), md5(digits_model)
    result = dvc("exp", "run", "-S", "train.digits.lr=0.02", cwd=dvc_project)
    assert "Running stage 'train'" in result.stdout
    assert md5(digits_model) != digits_before, "the digits run did not retrain"
    assert md5(sparse_model) == sparse_before, "an unchanged task was retrained"
    shown = dvc("exp", "show", "--json", cwd=dvc_project).stdout
    assert "0.02" in shown
