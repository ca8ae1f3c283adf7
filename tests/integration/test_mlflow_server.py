"""MLflow over HTTP: jobs log to an `mlflow server` the same way; a dead server fails a job fast."""

from __future__ import annotations

import time

import pytest
from conftest import MlflowServer, free_port

from trainmap.grid import Cell
from trainmap.tracking import TrackingUnavailable, rule_run, tracking_settings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`mlflow server` on 127.0.0.1 with a SQLite backend and served artifacts in a temp dir."""
    running = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    yield running.uri
    running.stop()


def test_a_rule_run_logs_over_http(server, tmp_path):
    from mlflow import MlflowClient

    config = {"mlflow": {"tracking_uri": server, "experiment": "http-test"},
              "data": {}, "model": {}, "train": {}}  # fmt: skip
    cell = Cell("parity", "mlp", "kaiming", 0)
    artifact = tmp_path / "note.txt"
    artifact.write_text("hello")
    with rule_run(tracking_settings(config), "evaluate", cell=cell, config_hash="h1") as run:
        run.log_params({"evaluate": {"threshold": 0.9}})
        for step in range(5):
            run.log_metrics({"test_acc": step / 10}, step)
        run.log_artifact(artifact)
    client = MlflowClient(tracking_uri=server)
    experiment = client.get_experiment_by_name("http-test")
    runs = client.search_runs([experiment.experiment_id], "tags.rule = 'evaluate'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.params["evaluate.threshold"] == "0.9"
    assert len(client.get_metric_history(runs[0].info.run_id, "test_acc")) == 5
    assert [a.path for a in client.list_artifacts(runs[0].info.run_id)] == ["note.txt"]


def test_an_unreachable_server_fails_fast_with_a_clear_message():
    port = free_port()  # nothing listens here
    config = {"mlflow": {"tracking_uri": f"http://127.0.0.1:{port}", "experiment": "x"},
              "data": {}, "model": {}, "train": {}}  # fmt: skip
    started = time.monotonic()
    with pytest.raises(TrackingUnavailable, match=rf"127\.0\.0\.1:{port} is unreachable"):
        with rule_run(tracking_settings(config), "train", task="parity", config_hash="h"):
            pytest.fail("the job body must not run without tracking")
    assert time.monotonic() - started < 15


def test_workflow_jobs_log_to_a_server(server, tmp_path):
    """The smoke grid's data jobs, run by Snakemake, log to the server named in the config."""
    from conftest import copy_workflow, snakemake
    from mlflow import MlflowClient

    workdir = copy_workflow(tmp_path / "wf")
    override = workdir / "server.yaml"
    override.write_text(f"mlflow:\n  tracking_uri: {server}\n  experiment: http-workflow\n")
    snakemake("all_data", "--cores", "2", "--configfile", "config/smoke.yaml", str(override),
              cwd=workdir)  # fmt: skip
    client = MlflowClient(tracking_uri=server)
    experiment = client.get_experiment_by_name("http-workflow")
    runs = client.search_runs([experiment.experiment_id], "tags.rule = 'data'")
    assert len(runs) == 2
    assert not (workdir / "mlflow.db").exists(), "nothing may fall back to a local SQLite file"
