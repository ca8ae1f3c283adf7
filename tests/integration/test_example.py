"""Integration: the worked example examples/my_cnn, a user's CNN and init scheme from a
plugin and data from an .npz file, through train -> evaluate -> metrics -> a joint training map with
verdicts, at smoke size (examples/my_cnn/smoke.yaml) in a temporary copy of the workflow."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import REPO_ROOT, copy_workflow, run_command, snakemake

from trainmap.io import load_torch
from trainmap.training.archive import read_archive

pytestmark = pytest.mark.integration

EXAMPLE = "examples/my_cnn"
CONFIG = f"{EXAMPLE}/config.yaml"
SMOKE = f"{EXAMPLE}/smoke.yaml"
TASK, ARCH, JOINT = "my_digits", "small_cnn", "my_cnn_init"


@pytest.fixture(scope="module")
def example_run(tmp_path_factory) -> Path:
    """The example's files in a copy of the workflow, its data written by its own script (never a
    leftover digits.npz of the checkout), then the smoke grid run once with `snakemake --cores 2`."""
    workdir = copy_workflow(tmp_path_factory.mktemp("example"))
    shutil.copytree(REPO_ROOT / EXAMPLE, workdir / EXAMPLE,
                    ignore=shutil.ignore_patterns("__pycache__", "*.npz"))  # fmt: skip
    run_command([sys.executable, f"{EXAMPLE}/make_data.py"], cwd=workdir)
    snakemake("--cores", "2", "--configfile", CONFIG, SMOKE, cwd=workdir)
    return workdir


def smoke_grid(workdir: Path) -> tuple[list[str], list[int]]:
    (entry,) = yaml.safe_load((workdir / SMOKE).read_text())["grid"]
    assert entry["task"] == TASK and entry["archs"] == [ARCH]
    return entry["methods"], entry["seeds"]


def test_the_data_file_is_what_the_arrays_kind_reads(example_run: Path) -> None:
    with np.load(example_run / EXAMPLE / "digits.npz", allow_pickle=False) as stored:
        assert sorted(stored.files) == ["x_test", "x_train", "y_test", "y_train"]
        assert stored["x_train"].shape == (1437, 1, 8, 8) and stored["x_train"].dtype == np.float32
        assert stored["y_test"].shape == (360,) and set(stored["y_test"]) == set(range(10))


def test_the_full_size_config_passes_the_config_check(example_run: Path) -> None:
    result = run_command([sys.executable, "-m", "trainmap.grid", CONFIG], cwd=example_run)
    assert "define 64 grid cells" in result.stdout


def test_every_seed_was_trained_evaluated_and_measured(example_run: Path) -> None:
    methods, seeds = smoke_grid(example_run)
    assert methods == ["kaiming", "lecun"]
    for method in methods:
        for seed in seeds:
            cell = f"{TASK}/{ARCH}/{method}/seed{seed}"
            train = json.loads((example_run / "results/train" / cell / "train.json").read_text())
            assert train["status"] == "completed", cell
            evaluation = json.loads(
                (example_run / "results/evaluate" / cell / "evaluation.json").read_text()
            )
            assert evaluation["status"] == "completed" and evaluation["test_acc"] > 0.5, cell
            metrics = pd.read_csv(example_run / "results/metrics" / cell / "metrics.csv")
            assert len(metrics) == train["n_checkpoints"], cell
            # Two convs (L1/L2 only) and two Linear layers (every metric) are counted.
            assert metrics[["l2", "spectral", "sv_mean", "b_var"]].notna().all().all(), cell
            assert (metrics["n_matrices"] == 4).all(), cell


def test_the_plugin_architecture_and_init_were_used(example_run: Path) -> None:
    methods, seeds = smoke_grid(example_run)
    initial = {}
    for method in methods:
        for seed in seeds[:2]:
            run = example_run / "results/train" / TASK / ARCH / method / f"seed{seed}"
            saved = load_torch(run / "model.pt")
            assert (saved["arch"], saved["method"], saved["seed"]) == (ARCH, method, seed)
            assert saved["model_options"] == {"channels": 16, "hidden": 64}
            trajectory = read_archive(run)
            assert int(trajectory["step"][0]) == 0
            initial[method, seed] = {name: values[0] for name, values in
                                     trajectory["state"].items()}  # fmt: skip
    weights = [name for name in initial["lecun", seeds[0]] if name.endswith("weight")]
    assert len(weights) == 4  # conv, conv, hidden Linear, classifier
    for name in weights:
        lecun, kaiming = initial["lecun", seeds[0]][name], initial["kaiming", seeds[0]][name]
        bound = math.sqrt(3.0 / lecun[0].numel())  # LeCun uniform: U(-bound, bound)
        assert lecun.abs().max() <= bound, name
        assert kaiming.abs().max() > bound, name  # He-normal (std sqrt(2/fan_in)) goes past it
        assert not lecun.equal(initial["lecun", seeds[1]][name]), f"{name}: seeds must differ"
    for name in initial["lecun", seeds[0]]:
        if name.endswith("bias"):
            assert not initial["lecun", seeds[0]][name].any(), name


def test_the_joint_map_compares_both_methods_with_verdicts(example_run: Path) -> None:
    methods, seeds = smoke_grid(example_run)
    joint_dir = example_run / "results/joint" / JOINT
    joint = json.loads((joint_dir / "joint.json").read_text())
    assert set(joint["groups"]) == set(methods)
    assert all(group["runs"] == len(seeds) for group in joint["groups"].values())
    verdicts = pd.read_csv(joint_dir / "verdicts.csv")
    assert set(verdicts["first"]) == {"kaiming"} and set(verdicts["second"]) == {"lecun"}
    assert "convergence step" in set(verdicts["quantity"])
    # 3 seeds per method: no verdict can be significant, and the table says so.
    assert set(verdicts["verdict"]) == {"not enough runs"}
    table = (joint_dir / "verdicts.md").read_text()
    assert "| lecun vs kaiming |" in table and "not enough runs" in table
    assert (joint_dir / "map.png").read_bytes()[:4] == b"\x89PNG"
    # Only the joint map: every group is in it (analysis.group_maps: outside_joint).
    assert not (example_run / "results/hmm").exists()


def test_editing_the_plugin_reruns_what_it_builds(example_run: Path) -> None:
    """The plugin's file is an input of the rules that build data and models (like trainmap's own
    code for collect_metrics): after an edit, a dry run plans training again, and what follows."""
    plugin = example_run / EXAMPLE / "plugin.py"
    before = snakemake("-n", "--cores", "1", "--configfile", CONFIG, SMOKE, cwd=example_run)
    assert "Nothing to be done" in before.stdout + before.stderr
    plugin.write_text(plugin.read_text() + "\n# an edit\n")
    after = snakemake("-n", "--cores", "1", "--configfile", CONFIG, SMOKE, cwd=example_run)
    planned = after.stdout + after.stderr
    assert "rule train:" in planned and "rule joint_comparison:" in planned
    assert "examples/my_cnn/plugin.py" in planned  # the reason: an updated input
