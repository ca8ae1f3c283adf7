"""Integration: DVC runs the same Snakemake workflow, versions data and checkpoints, round-trips a remote."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import dvc, dvc_smoke_project, git, snakemake

from trainmap.grid.roots import LOCK, MARKER
from trainmap.lineage import block_manifests, check_current, check_tree

#: The module's tests run in file order on one worker: the first ones read the reproduced project,
#: the later ones change it (a remote, a pull, an experiment).
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
    assert set(lock["stages"]) == {"settings", "data", "gradinit", "train", "transform", "evaluate",
                                   "analysis"}  # fmt: skip
    train_outs = {out["path"] for out in lock["stages"]["train"]["outs"]}
    assert train_outs == {"results/train"}
    assert "train" in lock["stages"]["train"]["params"]["params.yaml"]
    assert (dvc_project / "results/summary/evaluation.csv").exists()
    transform_outs = {out["path"] for out in lock["stages"]["transform"]["outs"]}
    assert transform_outs == {"results/reparam", "results/sparse", "results/quantize"}
    assert "sparse" in lock["stages"]["transform"]["params"]["params.yaml"]
    assert (dvc_project / "results/joint/parity_init/joint.json").exists()


def is_timing(path: Path) -> bool:
    return path.name.endswith((".timing.json", ".timing.csv"))


def results_digests(workdir: Path) -> dict[str, str]:
    """Every file under results/ but the root's own marker and lock (which name the run)."""
    results = workdir / "results"
    return {str(path.relative_to(results)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(results.rglob("*"))
            if path.is_file() and path.name not in (MARKER, LOCK)}  # fmt: skip


def cache_files(workdir: Path) -> dict[str, int]:
    cache = workdir / ".dvc" / "cache"
    return {str(path.relative_to(cache)): path.stat().st_size
            for path in cache.rglob("*") if path.is_file()}  # fmt: skip


def test_a_forced_rerun_rewrites_every_result_byte_for_byte(dvc_project: Path) -> None:
    """Same content, same bytes (tests/unit/test_reproducible_files.py): the smoke grid through
    DVC, then every Snakemake job forced to run again: every file under results/ but the timing
    sidecars is the same bytes, `dvc status` is clean, and committing the rerun adds nothing to the
    DVC cache (so the project is as the repro left it for the tests after this one)."""
    before, cache_before = results_digests(dvc_project), cache_files(dvc_project)

    snakemake("--cores", "2", "--configfile", "config/smoke.yaml", "--forceall", cwd=dvc_project)
    after = results_digests(dvc_project)

    assert before.keys() == after.keys()
    timing = {name for name in before if is_timing(Path(name))}
    assert {Path(name).name for name in timing} >= {"train.timing.json", "evaluation.timing.json",
                                                    "bootstrap.timing.json"}  # fmt: skip
    differing = sorted(name for name in before if before[name] != after[name])
    assert set(differing) <= timing, f"rewritten with other bytes: {set(differing) - timing}"
    assert len(before) - len(timing) > 100  # every results file but the sidecars was compared
    status = dvc("status", cwd=dvc_project).stdout
    assert "Data and pipelines are up to date" in status, status
    dvc("commit", "--force", cwd=dvc_project)
    assert cache_files(dvc_project) == cache_before


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
    # `dvc exp run` first restores results/ to the dvc.lock it starts from (the data stage below is
    # skipped: "didn't change"). What is there when a plain run of dvc.yaml's study ends is
    # recorded by the workflow (onsuccess: trainmap.grid.dvc_record) and kept; a file written
    # after it is not recorded, and DVC deletes it. (A run with nothing to do ends before
    # Snakemake's onsuccess: this one remakes the summary.)
    git("add", "-A", cwd=dvc_project)
    git("commit", "-qm", "the study and its lock", cwd=dvc_project)
    finished = dvc_project / "results/data/finished_when_the_plain_run_ended.txt"
    finished.write_text("finished work\n")
    plain = snakemake("--cores", "2", "--configfile", "config/smoke.yaml", "--forcerun",
                      "summary", cwd=dvc_project)  # fmt: skip
    assert "Recorded the results in DVC" in plain.stderr, plain.stderr[-2000:]
    unrecorded = dvc_project / "results/data/written_after_the_run.txt"
    unrecorded.write_text("not recorded\n")
    result = dvc("exp", "run", "-S", "train.digits.lr=0.02", cwd=dvc_project)
    assert "Running stage 'train'" in result.stdout
    assert "Stage 'data' didn't change" in result.stdout
    assert finished.read_text() == "finished work\n"
    assert not unrecorded.exists(), "DVC kept a file no lock records: the test shows nothing"
    assert md5(digits_model) != digits_before, "the digits run did not retrain"
    assert md5(sparse_model) == sparse_before, "an unchanged task was retrained"
    shown = dvc("exp", "show", "--json", cwd=dvc_project).stdout
    assert "0.02" in shown
    # Each DVC stage is its own `snakemake` call: what follows training must still be remade from
    # the retrained models (their block manifests change with their content: trainmap.lineage).
    results = dvc_project / "results"
    for cell in ("digits/vgg_bn/kaiming/seed0", "digits/repvgg/kaiming/seed0"):
        trained = json.loads((results / "train" / cell / "train.json").read_text())
        evaluated = json.loads((results / "evaluate" / cell / "evaluation.json").read_text())
        assert evaluated["test_acc"] == trained["final"]["test_acc"], (
            f"{cell}: stale evaluation\n{result.stdout[-4000:]}")  # fmt: skip
        summary = pd.read_csv(results / "summary/evaluation.csv")
        row = summary.set_index(["task", "arch", "method", "seed"]).loc[tuple(cell.split("/")[:3])
                                                                        + (0,)]  # fmt: skip
        assert row["test_acc"] == trained["final"]["test_acc"], f"{cell}: stale summary"
    for rule in ("metrics", "evaluate", "sparse", "quantize", "reparam"):
        # each block made from the manifests that sit upstream now, each file the one recorded
        for manifest in block_manifests(results / rule):
            check_current(manifest)
    assert check_tree(results) > 0
    # the metric tables were remade from the retrained trajectories (the smoke grid maps no digits
    # group: one seed each)
    metrics = results / "metrics/digits/vgg_bn/kaiming/seeds0-7.json"
    assert metrics.stat().st_mtime > digits_model.stat().st_mtime
