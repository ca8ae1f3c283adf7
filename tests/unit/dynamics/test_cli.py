"""`python -m trainmap.dynamics`: the analysis on per-run metric tables, outside Snakemake."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trainmap.dynamics.metrics.tables import REGENERATE
from trainmap.dynamics.metrics.weights import METRIC_NAMES

#: Every test here runs the command line in a subprocess: the integration tier.
pytestmark = pytest.mark.integration


def write_tables(directory: Path, n_runs: int = 8, seed: int = 0) -> None:
    """Metric tables of runs that go 0 -> 1 -> 2; odd runs detour through 3 and converge later."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 3, (4, len(METRIC_NAMES)))
    for index in range(n_runs):
        lengths = [int(rng.integers(8, 12)), int(rng.integers(8, 12)),
                   int(rng.integers(8, 12)) if index % 2 else 0, 20]  # fmt: skip
        states = np.repeat([0, 1, 3, 2], lengths)
        values = means[states] + rng.normal(0, 0.3, (len(states), len(METRIC_NAMES)))
        table = pd.DataFrame(values, columns=list(METRIC_NAMES))
        table.insert(0, "step", np.arange(len(states)) * 10)
        converge_at = np.flatnonzero(states == 2)[0]
        table["test_acc"] = np.where(np.arange(len(states)) >= converge_at, 0.95, 0.5)
        path = directory / f"seed{index}" / "metrics.csv"
        path.parent.mkdir(parents=True)
        table.to_csv(path, index=False)


def test_cli_runs_fit_map_regression_and_joint(tmp_path):
    tables = tmp_path / "metrics"
    write_tables(tables)
    groups = tmp_path / "groups.csv"
    pd.DataFrame({"run": [f"seed{i}" for i in range(8)],
                  "group": ["odd" if i % 2 else "even" for i in range(8)]}).to_csv(
        groups, index=False)  # fmt: skip
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "trainmap.dynamics", str(tables), "--out", str(out),
         "--threshold", "0.9", "--k-max", "4", "--restarts", "2", "--groups", str(groups),
         "--bootstrap", "10"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for name in ("hmm.npz", "hmm.json", "selection.csv", "baselines.csv", "states.csv",
                 "state_means.csv", "map.json", "map.png", "map.svg", "detours.json",
                 "coefficients.csv", "selection.png", "states.png", "coefficients.png",
                 "convergence.png", "bootstrap.json", "bootstrap.png", "joint/joint.json",
                 "joint/occupancy.png", "joint/verdicts.csv", "joint/verdicts.png"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name
    detours = json.loads((out / "detours.json").read_text())
    assert detours["n_runs"] == 8 and "r2" in detours
    states = pd.read_csv(out / "states.csv")
    assert sorted(states["run"].unique()) == [f"seed{i}" for i in range(8)]
    joint = json.loads((out / "joint" / "joint.json").read_text())
    assert set(joint["groups"]) == {"even", "odd"}
    assert "K = " in result.stdout and "| pair | quantity |" in result.stdout
    # 4 runs per group: a ladder of one seed count (3 = floor(0.8 x 4)), its sentence on top
    stability = json.loads((out / "joint" / "stability.json").read_text())
    assert stability["measured"] and stability["ladder"] == [3]
    page = (out / "joint" / "verdicts.md").read_text()
    assert page.startswith("**Answer** (start, where the metrics differ, path):")
    assert f"\n\n**Stability:** {stability['line']}.\n" in page
    assert json.loads((out / "stability.json").read_text())["ladder"] == [6]


def test_cli_selects_k_over_folds_when_asked(tmp_path):
    tables = tmp_path / "metrics"
    write_tables(tables)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "trainmap.dynamics", str(tables), "--out", str(out),
         "--threshold", "0.9", "--k-max", "3", "--restarts", "1", "--bootstrap", "0",
         "--stability", "0", "--selection", "folds", "--folds", "4"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    saved = json.loads((out / "hmm.json").read_text())
    assert saved["estimator"]["selection"] == "folds" and saved["estimator"]["folds"] == 4
    assert len(saved["folds"]) == 4  # every run held out once, in one of 4 folds


def test_cli_help_and_bad_input(tmp_path):
    help_text = subprocess.run([sys.executable, "-m", "trainmap.dynamics", "--help"],
                               capture_output=True, text=True).stdout  # fmt: skip
    assert "--threshold" in help_text and "--groups" in help_text
    missing = subprocess.run(
        [sys.executable, "-m", "trainmap.dynamics", str(tmp_path / "nothing"), "--out",
         str(tmp_path / "o"), "--threshold", "0.9"], capture_output=True, text=True,
    )  # fmt: skip
    assert missing.returncode != 0 and "neither a metrics CSV nor a directory" in missing.stderr


def test_cli_stops_at_a_damaged_table_and_names_it(tmp_path):
    """A NaN metric in a run not named by --diverged, or a missing column: the error names the
    file, the column, the step and the fix before anything is fitted."""
    tables = tmp_path / "metrics"
    write_tables(tables, n_runs=3)
    path = tables / "seed1" / "metrics.csv"
    table = pd.read_csv(path)
    table.loc[3, "l2"] = np.nan
    table.to_csv(path, index=False)
    command = [sys.executable, "-m", "trainmap.dynamics", str(tables), "--out",
               str(tmp_path / "out"), "--threshold", "0.9"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().endswith(
        f"error: {path}: column 'l2' is NaN at step 30, but the run did not diverge; "
        f"{REGENERATE}; if the run diverged, name it with --diverged"
    )
    assert not (tmp_path / "out").exists()
    unknown = subprocess.run([*command, "--diverged", "seed7"], capture_output=True, text=True)
    assert unknown.returncode == 1
    assert "error: --diverged names runs without a table: ['seed7']" in unknown.stderr
    table.drop(columns="test_acc").to_csv(path, index=False)  # the CLI's convergence needs it
    missing = subprocess.run([*command, "--diverged", "seed1"], capture_output=True, text=True)
    assert missing.returncode == 1
    assert f"error: {path}: column 'test_acc' is missing; {REGENERATE}" in missing.stderr
