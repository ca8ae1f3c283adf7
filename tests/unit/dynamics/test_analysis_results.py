"""Analysis results are objects: each step of trainmap.dynamics.pipeline returns one
result (fit, states, regression, detours, bootstrap, verdicts, captions) that the command line
passes on and the jobs log from. A later step gives the same files whether it gets the fit in memory
(the command line) or reads what the fit rule wrote (the workflow), and the jobs log what the result
says without reading back the files they just wrote."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from trainmap.dynamics.maps.settings import AnalysisSettings
from trainmap.dynamics.metrics.tables import read_metric_table
from trainmap.dynamics.pipeline import (
    FittedMap,
    GroupFit,
    GroupMap,
    GroupRegression,
    JointResult,
    Outcomes,
    convergence_from_tables,
    fit_group,
    joint_group,
    map_group,
    regress_group,
)
from trainmap.dynamics.verdicts.certainty import BootstrapResult
from trainmap.grid import Cell

from .test_cli import write_tables

SETTINGS = {"k_max": 4, "restarts": 2, "bootstrap": 4, "covariance_type": "diag",
            "permutations": 50}  # fmt: skip
#: The steps take the typed settings; a job builds them from the plain mapping Snakemake passes.
ANALYSIS = AnalysisSettings.of(SETTINGS)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> Path:
    """Eight runs 0 -> 1 -> 2; the odd ones detour through a fourth state and converge later."""
    root = tmp_path_factory.mktemp("tables")
    write_tables(root, n_runs=8, seed=3)
    return root


def read_runs(tables: Path) -> tuple[dict, Outcomes]:
    runs = {f"seed{i}": read_metric_table(tables / f"seed{i}" / "metrics.csv") for i in range(8)}
    return runs, Outcomes(convergence_from_tables(runs, 0.9), dict.fromkeys(runs, "completed"))


@pytest.mark.slow  # in-process, seconds
def test_steps_return_results_and_in_memory_equals_from_files(tables, tmp_path):
    runs, outcomes = read_runs(tables)
    memory, files = tmp_path / "memory", tmp_path / "files"
    memory.mkdir()
    files.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = fit_group(runs, outcomes, ANALYSIS, memory, title="g")
    assert isinstance(fit, GroupFit)
    assert set(fit.captions) == {"selection.png", "states.png", "bootstrap.png", "stability.png"}
    assert fit.bootstrap.n_resamples == 4 and fit.states.keys() == runs.keys()
    assert fit.regression.detour_states == fit.bootstrap.detour_states
    # In memory (the command line): the fit's own regression and bootstrap.
    regression = regress_group(fit, outcomes, ANALYSIS, regression=fit.regression,
                               bootstrap=fit.bootstrap, out_dir=memory, title="g")  # fmt: skip
    training_map = map_group(fit, runs, outcomes, regression.detour_states, memory, title="g")
    assert isinstance(regression, GroupRegression) and isinstance(training_map, GroupMap)
    assert regression.summary["n_states"] == fit.hmm.n_states_
    assert set(regression.captions) == {"coefficients.png", "convergence.png"}
    assert set(training_map.captions) == {"map.png"}
    # From files (the workflow's later rules): the same bytes.
    for name in ("hmm.npz", "hmm.json", "states.csv", "bootstrap.json", "bootstrap.timing.json"):
        (files / name).write_bytes((memory / name).read_bytes())
    loaded = FittedMap.load(files)
    np.testing.assert_array_equal(loaded.states["seed1"], fit.states["seed1"])
    bootstrap = BootstrapResult.load(files / "bootstrap.json")
    assert bootstrap.to_dict() == json.loads(json.dumps(fit.bootstrap.to_dict()))
    again = regress_group(loaded, outcomes, ANALYSIS, bootstrap=bootstrap, out_dir=files,
                          title="g")  # fmt: skip
    map_group(loaded, runs, outcomes, again.detour_states, files, title="g")
    for name in ("detours.json", "coefficients.csv", "coefficients.png", "convergence.png",
                 "map.json", "map.png", "map.svg"):  # fmt: skip
        assert digest(memory / name) == digest(files / name), name
    assert again.captions == regression.captions


@pytest.mark.slow  # in-process, seconds
def test_joint_result(tables, tmp_path):
    runs, outcomes = read_runs(tables)
    groups = {run: "odd" if int(run[-1]) % 2 else "even" for run in runs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joint = joint_group(runs, groups, outcomes, ANALYSIS, tmp_path, title="j")
    assert isinstance(joint, JointResult)
    assert set(joint.captions) == {
        "verdicts.png",
        "paths.png",
        "occupancy.png",
        "convergence.png",
        "map.png",
        "stability.png",
    }
    written = json.loads((tmp_path / "joint.json").read_text())
    assert written["n_states"] == joint.hmm.n_states_ == joint.comparison.summary()["n_states"]
    assert written["detour_states"] == joint.detour_states
    assert written["bootstrap"]["k_counts"] == joint.bootstrap.to_dict()["k_counts"]
    assert (tmp_path / "verdicts.md").read_text() == joint.verdict_markdown()


@pytest.mark.slow  # in-process, seconds
def test_jobs_log_from_the_results(tables, tmp_path):
    """The four analysis jobs on one group (and a joint comparison of it with itself): MLflow gets
    the result's K, detours, captions and every cell's occupancy at its cell hash."""
    from mlflow import MlflowClient

    from trainmap.jobs.analysis import (
        fit_hmm_job,
        joint_comparison_job,
        regress_detours_job,
        training_map_job,
    )
    from trainmap.jobs.common import settings_hash
    from trainmap.tracking import flatten_params

    runs, outcomes = read_runs(tables)
    cells = [Cell("t", "a", "m", i).to_dict() for i in range(8)]
    metrics = [str(tables / f"seed{i}" / "metrics.csv") for i in range(8)]
    evaluations = []
    for i in range(8):
        path = tmp_path / "evaluate" / f"seed{i}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"convergence_step": outcomes.convergence[f"seed{i}"],
                                    "status": "completed"}))  # fmt: skip
        evaluations.append(str(path))
    tracking = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "analysis"}
    hashes = {Cell.of(cell).id: "h1" for cell in cells}
    out = tmp_path / "hmm"
    out.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_hmm_job("t/a/m", cells, metrics, evaluations, SETTINGS, out, tracking)
        regress_detours_job("t/a/m", cells, evaluations, out, tracking, hashes, SETTINGS)
        training_map_job("t/a/m", cells, metrics, evaluations, out, tracking)
        joint = tmp_path / "joint"
        joint.mkdir()
        joint_comparison_job("self", cells + cells, ["x"] * 8 + ["y"] * 8, metrics + metrics,
                             evaluations + evaluations, SETTINGS, joint, tracking,
                             hashes)  # fmt: skip
    client = MlflowClient(tracking_uri=tracking["uri"])
    experiment = client.get_experiment_by_name("analysis").experiment_id
    by_rule = {run.data.tags.get("rule"): run for run in client.search_runs([experiment])}
    hmm = json.loads((out / "hmm.json").read_text())
    detours = json.loads((out / "detours.json").read_text())
    assert by_rule["fit_hmm"].data.metrics["n_states"] == hmm["n_states"]
    assert by_rule["fit_hmm"].data.tags["caption.states.png"]
    assert by_rule["regress_detours"].data.tags["detour_states"] == str(detours["detour_states"])
    assert "caption.map.png" in by_rule["training_map"].data.tags
    assert by_rule["joint_comparison"].data.tags["joint"] == "self"
    # What the jobs record is the settings as the rule passed them (AnalysisSettings.as_dict).
    assert by_rule["fit_hmm"].data.params == flatten_params({"analysis": SETTINGS,
                                                              "group": "t/a/m"})  # fmt: skip
    assert by_rule["fit_hmm"].data.tags["config_hash"] == settings_hash([SETTINGS, "t/a/m"])
    assert by_rule["regress_detours"].data.tags["config_hash"] == settings_hash([SETTINGS,
                                                                                 "t/a/m"])  # fmt: skip
    names = {rule: run.data.tags["mlflow.runName"] for rule, run in by_rule.items() if rule}
    assert names == {"fit_hmm": "fit_hmm t/a/m", "regress_detours": "regress_detours t/a/m",
                     "training_map": "training_map t/a/m", "joint_comparison": "joint self"}  # fmt: skip
    verdict_tags = {k: v for k, v in by_rule["joint_comparison"].data.tags.items()
                    if k.startswith("verdict/")}  # fmt: skip
    assert verdict_tags and all(v for v in verdict_tags.values())
    joint_run = by_rule["joint_comparison"].info.run_id
    figures = {a.path for a in client.list_artifacts(joint_run, "figures")}
    assert "figures/stability.png" in figures and "figures/timing" in figures
    assert {p for p in figures if not p.endswith(".png")} == {"figures/timing"}  # figures only
    assert "figures/timing/stability.timing.json" in {
        a.path for a in client.list_artifacts(joint_run, "figures/timing")}  # fmt: skip
    parent = client.search_runs([experiment], "tags.cell = 't/a/m/seed1' and tags.role = 'cell'")
    assert len(parent) == 1 and parent[0].data.tags["config_hash"] == "h1"
    metrics_logged = parent[0].data.metrics
    assert metrics_logged["map.n_states"] == hmm["n_states"]
    assert "joint.self.detour_share" in metrics_logged
