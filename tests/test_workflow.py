"""Integration: the Snakemake workflow end to end on config/smoke.yaml, in a temporary copy."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import copy_workflow, snakemake
from mlflow import MlflowClient

from trainmap.config import expand_grid, load_config

pytestmark = pytest.mark.integration

SMOKE = "config/smoke.yaml"


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    """The smoke grid run once with `snakemake --cores 2`; tests inspect what it left."""
    workdir = copy_workflow(tmp_path_factory.mktemp("smoke"))
    snakemake("--cores", "2", "--configfile", SMOKE, cwd=workdir)
    return workdir


def smoke_cells(workdir: Path):
    config = load_config(workdir / "params.yaml", workdir / "config/config.yaml", workdir / SMOKE,
                         check_paths_from=workdir)  # fmt: skip
    return config, expand_grid(config)


def test_every_cell_has_its_outputs(smoke_run: Path) -> None:
    _, cells = smoke_cells(smoke_run)
    assert len(cells) == 3
    for cell in cells:
        run_dir = smoke_run / "results/train" / cell.id
        for name in ("trajectory.pt", "model.pt", "history.csv", "train.json"):
            assert (run_dir / name).stat().st_size > 0, f"{cell.id}: {name} missing or empty"
        evaluation = json.loads(
            (smoke_run / "results/evaluate" / cell.id / "evaluation.json").read_text()
        )
        assert evaluation["status"] == "completed"
        assert 0.0 <= evaluation["test_acc"] <= 1.0
        assert not (run_dir / "resume.pt").exists(), "resume state must be removed after a run"


def test_summary_table_and_metrics(smoke_run: Path) -> None:
    table = pd.read_csv(smoke_run / "results/summary/evaluation.csv")
    assert len(table) == 3
    assert {"task", "arch", "method", "seed", "test_acc", "convergence_step", "converged",
            "n_params", "bytes_on_disk", "latency_ms"} <= set(table.columns)  # fmt: skip
    assert (table["bytes_on_disk"] > 0).all() and (table["latency_ms"] > 0).all()
    metrics = json.loads((smoke_run / "results/summary/metrics.json").read_text())
    assert metrics["sparse_parity"]["mlp"]["kaiming"]["runs"] == 2
    assert (smoke_run / "results/summary/learning_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_every_rule_invocation_is_an_mlflow_run(smoke_run: Path) -> None:
    config, cells = smoke_cells(smoke_run)
    client = MlflowClient(tracking_uri=f"sqlite:///{smoke_run / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(config["mlflow"]["experiment"])
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    children = [run for run in runs if "rule" in run.data.tags]
    parents = {run.info.run_id: run for run in runs if run.data.tags.get("role") == "cell"}
    rules = pd.Series([run.data.tags["rule"] for run in children]).value_counts().to_dict()
    assert rules == {"data": 2, "train": 3, "evaluate": 3, "summary": 1}
    assert all(run.info.status == "FINISHED" for run in runs)
    assert len(parents) == len(cells)
    for run in children:
        if run.data.tags["rule"] in ("train", "evaluate"):
            parent = parents[run.data.tags["mlflow.parentRunId"]]
            assert parent.data.tags["cell"] == run.data.tags["cell"]
            assert {"task", "arch", "method", "seed", "git_commit", "config_hash"} <= set(
                run.data.tags
            )
    train_run = next(run for run in children if run.data.tags["rule"] == "train")
    history = client.get_metric_history(train_run.info.run_id, "test_acc")
    assert len(history) > 3 and history[0].step == 0


def test_second_run_has_nothing_to_do(smoke_run: Path) -> None:
    result = snakemake("-n", "--cores", "2", "--configfile", SMOKE, cwd=smoke_run)
    assert "Nothing to be done" in result.stdout + result.stderr


def test_changed_threshold_reruns_evaluation_not_training(smoke_run: Path) -> None:
    override = smoke_run / "threshold.yaml"
    override.write_text("evaluate:\n  sparse_parity: {threshold: 0.5}\n")
    result = snakemake("-n", "--cores", "2", "--configfile", SMOKE, str(override), cwd=smoke_run)
    jobs = _dry_run_job_counts(result.stdout)
    assert jobs.get("evaluate") == 2 and jobs.get("summary") == 1
    assert "train" not in jobs and "data" not in jobs


def _dry_run_job_counts(output: str) -> dict[str, int]:
    """Parse Snakemake's 'Job stats' table of a dry run."""
    counts, in_table = {}, False
    for line in output.splitlines():
        if line.startswith("job ") and "count" in line:
            in_table = True
            continue
        if in_table:
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                if parts[0] != "total":
                    counts[parts[0]] = int(parts[1])
            elif parts and not set(line.strip()) <= {"-", " "}:
                break
    return counts


def test_snakemake_lint_is_clean(repo_root: Path) -> None:
    result = snakemake("--lint", "--configfile", SMOKE, cwd=repo_root)
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr


def test_snakefmt_is_clean(repo_root: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "snakefmt", "--check", "Snakefile", "workflow/rules"],
        cwd=repo_root, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
