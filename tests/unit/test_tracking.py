"""MLflow tracking: rule runs nested under cell runs, batched metrics, failures, URIs, artifacts.

The parallel test reproduces the set-up the Snakefile relies on: the database and experiment
are created once (as the ``onstart`` handler does), then 16 independent processes log their runs
against the same fresh SQLite file at once; every one of them must land, nested under its cell.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from trainmap.grid import Cell, cell_hash, load_config
from trainmap.tracking import (
    DEFAULT_TRACKING_URI,
    JOB_ENV,
    METRICS_PER_BATCH,
    PARAMS_PER_BATCH,
    RuleRun,
    artifact_root,
    cluster_tracking_problem,
    end_dead_runs,
    experiment_name,
    flatten_params,
    init_tracking,
    retire_superseded_runs,
    rule_run,
    summary_run,
    tracking_settings,
    tracking_uri,
)

N_PARALLEL = 16
PARALLEL_STEPS = 50


@pytest.fixture(scope="module")
def study_config(repo_root: Path) -> dict:
    """The default study's merged config (data/model/train sections feed cell_hash)."""
    return load_config(
        repo_root / "params.yaml", repo_root / "config/config.yaml", check_paths_from=repo_root
    )


@pytest.fixture(scope="module")
def shared_uri(tmp_path_factory) -> str:
    """One SQLite store for the in-process tests (each uses its own experiment); migrated once."""
    database = tmp_path_factory.mktemp("tracking") / "mlflow.db"
    uri = f"sqlite:///{database}"
    init_tracking(uri, "warm-up")
    return uri


def make_config(study_config: dict, uri: str, experiment: str) -> dict:
    config = copy.deepcopy(study_config)
    config["mlflow"] = {"tracking_uri": uri, "experiment": experiment}
    return config


def runs_of(client: MlflowClient, experiment: str) -> list:
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"experiment {experiment!r} was not created"
    return client.search_runs([found.experiment_id], max_results=1000)


# --------------------------------------------------------------------------------------------------
# Parallel jobs against one fresh SQLite store

# One launcher process (a fresh interpreter) imports what a rule job's tracking needs, then forks the
# 16 jobs: separate processes, each opening its own SQLite connection, as Snakemake's jobs do; only
# the imports (about 4 s of CPU per interpreter, over a minute for 16 on 2 cores) are paid once. No
# MLflow client or database connection exists before the fork. trainmap.grid imports the data and
# model registries (and torch); cell_hash and rule_run do not use them, so they are stubbed out. The
# forked jobs block on a pipe until every one exists, then all open the database at the same moment.
LAUNCHER = textwrap.dedent(
    """
    import json, os, sys, traceback
    from pathlib import Path
    from trainmap.grid import Cell, cell_hash
    from trainmap.tracking import rule_run, tracking_settings
    import mlflow.store.tracking.sqlalchemy_store  # imports only: no engine, no connection

    workdir, n_jobs, steps = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    config = json.loads((workdir / "config.json").read_text())

    def job(seed):
        cell = Cell("digits", "vgg_bn", "kaiming", seed)
        params = {"train": config["train"]["digits"]}
        with rule_run(tracking_settings(config), "train", cell=cell, params=params,
                      config_hash=cell_hash(config, cell)) as run:
            for step in range(steps):
                run.log_metrics({"loss": 1.0 / (step + 1), "seed": float(seed)}, step=step)

    start_read, start_write = os.pipe()
    pids = {}
    for seed in range(n_jobs):
        pid = os.fork()
        if pid == 0:
            os.close(start_write)
            os.read(start_read, 1)  # returns (EOF) when the launcher closes its end: start
            code = 0
            try:
                job(seed)
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        pids[pid] = seed
    os.close(start_write)  # every job starts now
    status = {}
    for pid, seed in pids.items():
        status[seed] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    print("STATUS " + json.dumps(status))
    sys.exit(1 if any(status.values()) else 0)
    """
)


@pytest.mark.integration  # starts a program (a subprocess)
def test_parallel_jobs_all_log_after_init(study_config: dict, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = "parallel"
    config = make_config(study_config, uri, experiment)
    (tmp_path / "config.json").write_text(json.dumps(config))
    init_tracking(uri, experiment)  # what the Snakefile's onstart does, once

    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true")
    env.pop("MLFLOW_TRACKING_URI", None)
    result = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(tmp_path), str(N_PARALLEL), str(PARALLEL_STEPS)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = result.stdout + result.stderr
    status_lines = [line for line in result.stdout.splitlines() if line.startswith("STATUS ")]
    assert status_lines, f"launcher exited {result.returncode} before its jobs ended:\n{output}"
    status = {int(seed): code for seed, code in json.loads(status_lines[-1][7:]).items()}
    failed = sorted(seed for seed, code in status.items() if code != 0)
    assert status.keys() == set(range(N_PARALLEL))
    assert not failed, (
        f"{len(failed)} of {N_PARALLEL} jobs failed (seeds {failed}):\n{output[-6000:]}"
    )
    assert result.returncode == 0, output[-6000:]

    client = MlflowClient(tracking_uri=uri)
    runs = runs_of(client, experiment)
    children = [run for run in runs if run.data.tags.get("rule") == "train"]
    parents = {run.info.run_id: run for run in runs if run.data.tags.get("role") == "cell"}
    assert len(children) == N_PARALLEL
    assert len(parents) == N_PARALLEL
    assert len(runs) == 2 * N_PARALLEL
    assert all(run.info.status == "FINISHED" for run in runs)
    assert {run.data.tags["cell"] for run in children} == {
        f"digits/vgg_bn/kaiming/seed{seed}" for seed in range(N_PARALLEL)
    }
    for child in children:
        parent = parents[child.data.tags["mlflow.parentRunId"]]
        assert parent.data.tags["cell"] == child.data.tags["cell"]
        assert parent.data.tags["config_hash"] == child.data.tags["config_hash"]
        assert "rule" not in parent.data.tags
        history = client.get_metric_history(child.info.run_id, "loss")
        assert sorted(m.step for m in history) == list(range(PARALLEL_STEPS))
        assert child.data.metrics["seed"] == float(child.data.tags["seed"])
        assert child.data.params["train.lr"] == str(config["train"]["digits"]["lr"])


# --------------------------------------------------------------------------------------------------
# One rule run: tags, params, metrics


def test_rule_run_tags_params_and_metric_history(
    study_config: dict, shared_uri: str, repo_root: Path, monkeypatch
) -> None:
    monkeypatch.chdir(repo_root)  # git_commit() reads the working directory's checkout
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo_root, capture_output=True, text=True, check=True
    ).stdout.strip()
    config = make_config(study_config, shared_uri, "tags")
    cell = Cell("sparse_parity", "mlp", "kaiming", 3)
    extra = {f"p{i:03d}": i for i in range(PARAMS_PER_BATCH + 20)}  # more than one params batch
    params = {"train": config["train"]["sparse_parity"], "model": {"hidden": [128]}, "extra": extra}
    n_steps = 450  # 3 metrics x 450 steps = 1350 points: more than one batch of METRICS_PER_BATCH
    assert 3 * n_steps > METRICS_PER_BATCH
    with rule_run(tracking_settings(config), "train", cell=cell, params=params,
                  config_hash=cell_hash(config, cell)) as run:  # fmt: skip
        run_id = run.run_id
        for step in range(n_steps):
            run.log_metrics(
                {"loss": 1.0 / (step + 1), "acc": step / n_steps, "skipped": None}, step=step
            )
            run.log_metrics({"lr": 0.1 * 0.99**step}, step=step)
        run.set_tags({"device": "cpu", "threads": 2})

    client = MlflowClient(tracking_uri=shared_uri)
    logged = client.get_run(run_id)
    assert logged.info.status == "FINISHED"
    tags = logged.data.tags
    assert {key: tags[key] for key in ("rule", "task", "arch", "method", "seed", "cell")} == {
        "rule": "train",
        "task": "sparse_parity",
        "arch": "mlp",
        "method": "kaiming",
        "seed": "3",
        "cell": "sparse_parity/mlp/kaiming/seed3",
    }
    assert tags["config_hash"] == cell_hash(config, cell)
    assert tags["git_commit"] == head and tags["mlflow.source.git.commit"] == head
    assert tags["device"] == "cpu" and tags["threads"] == "2"
    assert tags["mlflow.runName"] == "train sparse_parity/mlp/kaiming/seed3"
    parent = client.get_run(tags["mlflow.parentRunId"])
    assert parent.data.tags["role"] == "cell" and parent.data.tags["cell"] == tags["cell"]

    logged_params = logged.data.params
    assert logged_params["train.lr"] == "0.1"
    assert logged_params["train.steps"] == str(config["train"]["sparse_parity"]["steps"])
    assert logged_params["model.hidden"] == "[128]"
    assert {key for key in logged_params if key.startswith("extra.")} == {
        f"extra.{key}" for key in extra
    }
    assert "train" not in logged_params and "extra" not in logged_params

    expected = {
        "loss": lambda step: 1.0 / (step + 1),
        "acc": lambda step: step / n_steps,
        "lr": lambda step: 0.1 * 0.99**step,
    }
    for key, value_at in expected.items():
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == list(range(n_steps)), key
        assert [m.value for m in history] == pytest.approx([value_at(s) for s in range(n_steps)])
    assert client.get_metric_history(run_id, "skipped") == []


def test_git_commit_is_unknown_outside_a_checkout(
    study_config: dict, shared_uri: str, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    config = make_config(study_config, shared_uri, "no-git")
    with rule_run(tracking_settings(config), "summary", task="digits", config_hash="grid") as run:
        run_id = run.run_id
    tags = MlflowClient(tracking_uri=shared_uri).get_run(run_id).data.tags
    assert tags["git_commit"] == "unknown"
    assert "mlflow.source.git.commit" not in tags
    # A rule without a cell is a top-level run: no parent, no cell tags.
    assert "mlflow.parentRunId" not in tags and "cell" not in tags
    assert tags["task"] == "digits" and tags["config_hash"] == "grid" and tags["rule"] == "summary"


def test_flatten_params() -> None:
    flat = flatten_params({"train": {"lr": 0.1, "betas": [0.9, 0.98]}, "a": {"b": {"c": None}}})
    assert flat == {"train.lr": "0.1", "train.betas": "[0.9, 0.98]", "a.b.c": "None"}
    assert len(flatten_params({"long": "x" * 10_000})["long"]) == 6000


# --------------------------------------------------------------------------------------------------
# Parent runs per cell


def test_rules_of_a_cell_share_a_parent_until_its_config_changes(
    study_config: dict, shared_uri: str
) -> None:
    config = make_config(study_config, shared_uri, "parents")
    cell = Cell("digits", "resnet_bn", "kaiming", 1)
    ids = {}
    tracking = tracking_settings(config)
    with rule_run(tracking, "train", cell=cell, config_hash=cell_hash(config, cell)) as run:
        ids["train"] = run.run_id
    with rule_run(tracking, "evaluate", cell=cell, params={"evaluate": {"threshold": 0.9}},
                  config_hash=cell_hash(config, cell)) as run:  # fmt: skip
        ids["evaluate"] = run.run_id
    other_cell = Cell("digits", "resnet_bn", "kaiming", 2)
    with rule_run(tracking, "train", cell=other_cell,
                  config_hash=cell_hash(config, other_cell)) as run:  # fmt: skip
        ids["other"] = run.run_id
    changed = copy.deepcopy(config)
    changed["train"]["digits"]["lr"] = config["train"]["digits"]["lr"] / 2
    assert cell_hash(changed, cell) != cell_hash(config, cell)
    with rule_run(tracking, "train", cell=cell, config_hash=cell_hash(changed, cell)) as run:
        ids["retrain"] = run.run_id
    with rule_run(tracking, "evaluate", cell=cell, config_hash=cell_hash(changed, cell)) as run:
        ids["reevaluate"] = run.run_id

    client = MlflowClient(tracking_uri=shared_uri)
    tags = {name: client.get_run(run_id).data.tags for name, run_id in ids.items()}
    parent_of = {name: tag["mlflow.parentRunId"] for name, tag in tags.items()}
    assert parent_of["train"] == parent_of["evaluate"]
    assert parent_of["other"] != parent_of["train"]
    assert parent_of["retrain"] == parent_of["reevaluate"]
    assert parent_of["retrain"] != parent_of["train"]
    assert tags["retrain"]["config_hash"] == cell_hash(changed, cell)
    assert tags["train"]["config_hash"] == cell_hash(config, cell)

    runs = runs_of(client, "parents")
    parents = [run for run in runs if run.data.tags.get("role") == "cell"]
    assert len(parents) == 3 and len(runs) == 3 + len(ids)
    for parent in parents:
        assert parent.info.status == "FINISHED"
        assert parent.info.run_id in parent_of.values()
    # A parent spans its cell's work: from its first rule's start to its latest rule's end.
    parent = client.get_run(parent_of["train"]).info
    train, evaluate = (client.get_run(ids[name]).info for name in ("train", "evaluate"))
    assert parent.start_time <= train.start_time
    assert parent.end_time >= evaluate.end_time > train.start_time


# --------------------------------------------------------------------------------------------------
# Failing jobs


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()], ids=type)
def test_failing_block_reraises_and_marks_run_failed(
    study_config: dict, shared_uri: str, error: BaseException
) -> None:
    experiment = f"failing-{type(error).__name__}"
    config = make_config(study_config, shared_uri, experiment)
    cell = Cell("digits", "vgg_bn", "kaiming", 5)
    n_steps = 1200  # more than one batch: some were sent during the block, the rest at the failure
    with pytest.raises(type(error)):
        with rule_run(tracking_settings(config), "train", cell=cell, params={"train": {"lr": 0.05}},
                      config_hash=cell_hash(config, cell)) as run:  # fmt: skip
            run_id = run.run_id
            for step in range(n_steps):
                run.log_metrics({"loss": float(step)}, step=step)
            raise error

    client = MlflowClient(tracking_uri=shared_uri)
    failed = client.get_run(run_id)
    assert failed.info.status == "FAILED"
    assert failed.info.end_time is not None
    assert failed.data.params == {"train.lr": "0.05"}
    history = sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(s, float(s)) for s in range(n_steps)]
    assert client.get_run(failed.data.tags["mlflow.parentRunId"]).info.status == "FAILED"
    # A rerun after the failure logs a new FINISHED run under the same cell parent.
    with rule_run(tracking_settings(config), "train", cell=cell,
                  config_hash=cell_hash(config, cell)) as rerun:  # fmt: skip
        rerun_id = rerun.run_id
    rerun_tags = client.get_run(rerun_id).data.tags
    assert client.get_run(rerun_id).info.status == "FINISHED"
    assert rerun_tags["mlflow.parentRunId"] == failed.data.tags["mlflow.parentRunId"]
    assert client.get_run(rerun_tags["mlflow.parentRunId"]).info.status == "FINISHED"


def test_metrics_go_in_full_batches_then_the_rest_at_the_end() -> None:
    """Queued metrics leave in batches of METRICS_PER_BATCH while the block runs; the remainder
    once, when the run ends (not a small batch each time the queue passes the limit)."""

    class Client:
        def __init__(self) -> None:
            self.batches: list[int] = []

        def log_batch(self, run_id: str, metrics: list) -> None:
            self.batches.append(len(metrics))

    client = Client()
    run = RuleRun(client, "run")  # type: ignore[arg-type]
    n_steps = 700  # 2100 metrics: two full batches, then 100
    assert 2 * METRICS_PER_BATCH < 3 * n_steps < 3 * METRICS_PER_BATCH
    for step in range(n_steps):
        run.log_metrics({"a": 1.0, "b": 2.0, "c": 3.0}, step=step)
    assert client.batches == [METRICS_PER_BATCH, METRICS_PER_BATCH]
    run.flush()
    assert client.batches == [
        METRICS_PER_BATCH,
        METRICS_PER_BATCH,
        3 * n_steps - 2 * METRICS_PER_BATCH,
    ]


def test_summary_run_tags_description_parent_and_failure(shared_uri: str) -> None:
    tracking = {"uri": shared_uri, "experiment": "summaries"}
    with summary_run(tracking, "seeds cmp", {"role": "seed_joint", "n": 3},
                     description="what it holds") as parent:  # fmt: skip
        parent.log_metrics({"n_seeds": 4.0}, step=10)
    with pytest.raises(KeyError):
        with summary_run(tracking, "seeds cmp: x", {"role": "seed_group"},
                         parent_run_id=parent.run_id) as child:  # fmt: skip
            child.log_metrics({"seed_mean/test_acc": 0.5}, step=10)
            raise KeyError("boom")

    client = MlflowClient(tracking_uri=shared_uri)
    logged = client.get_run(parent.run_id)
    assert logged.info.status == "FINISHED"
    tags = logged.data.tags
    assert (tags["role"], tags["n"], tags["mlflow.runName"]) == ("seed_joint", "3", "seeds cmp")
    assert tags["mlflow.note.content"] == "what it holds" and "git_commit" in tags
    assert [(m.step, m.value) for m in client.get_metric_history(parent.run_id, "n_seeds")] == [
        (10, 4.0)
    ]
    failed = client.get_run(child.run_id)
    assert failed.info.status == "FAILED"
    assert failed.data.tags["mlflow.parentRunId"] == parent.run_id
    assert failed.data.metrics == {"seed_mean/test_acc": 0.5}  # queued metrics still sent


# --------------------------------------------------------------------------------------------------
# Tracking URI and artifacts


def test_tracking_uri_precedence(monkeypatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri({}) == DEFAULT_TRACKING_URI == "sqlite:///mlflow.db"
    assert (
        tracking_uri({"mlflow": {"tracking_uri": None, "experiment": "x"}}) == DEFAULT_TRACKING_URI
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert tracking_uri({}) == "http://tracking.example:5000"
    assert tracking_uri({"mlflow": {"tracking_uri": None}}) == "http://tracking.example:5000"
    configured = {"mlflow": {"tracking_uri": "sqlite:////srv/study.db"}}
    assert tracking_uri(configured) == "sqlite:////srv/study.db"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking_uri(configured) == "sqlite:////srv/study.db"
    assert experiment_name({}) == "trainmap"
    assert experiment_name({"mlflow": {"experiment": "mine"}}) == "mine"


def test_rule_run_follows_env_uri_when_config_has_none(
    study_config: dict, tmp_path: Path, monkeypatch
) -> None:
    """rule_run itself honours the precedence: no config URI -> $MLFLOW_TRACKING_URI."""
    database = tmp_path / "from-env.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{database}")
    monkeypatch.chdir(tmp_path)
    config = make_config(study_config, None, "env-uri")
    with rule_run(tracking_settings(config), "data", task="digits") as run:
        run_id = run.run_id
    assert database.exists() and not (tmp_path / "mlflow.db").exists()
    client = MlflowClient(tracking_uri=f"sqlite:///{database}")
    assert client.get_run(run_id).data.tags["rule"] == "data"


def test_sqlite_artifacts_land_beside_the_database(
    study_config: dict, tmp_path: Path, monkeypatch
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # artifacts must follow the database, not the working directory
    uri = f"sqlite:///{store / 'mlflow.db'}"
    assert artifact_root(uri) == (store / "mlartifacts").as_uri()
    assert artifact_root("http://localhost:5000") is None
    config = make_config(study_config, uri, "artifacts")
    source = tmp_path / "report.json"
    source.write_text('{"ok": true}')
    cell = Cell("digits", "vgg_bn", "kaiming", 0)
    with rule_run(tracking_settings(config), "evaluate", cell=cell,
                  config_hash=cell_hash(config, cell)) as run:  # fmt: skip
        run.log_artifact(source)
        run.log_artifact(source, artifact_path="nested")
        run_id = run.run_id

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("artifacts")
    assert init_tracking(uri, "artifacts") == experiment.experiment_id  # idempotent
    assert experiment.artifact_location == (store / "mlartifacts").as_uri()
    copies = sorted((store / "mlartifacts").rglob("report.json"))
    assert len(copies) == 2, copies
    assert all(copy.read_text() == '{"ok": true}' for copy in copies)
    assert all(run_id in copy.parts for copy in copies)
    assert {item.path for item in client.list_artifacts(run_id)} == {"report.json", "nested"}
    assert not any(elsewhere.iterdir()), f"nothing may land in the cwd: {list(elsewhere.iterdir())}"


def test_relative_sqlite_uri_puts_artifacts_beside_it(
    study_config: dict, tmp_path: Path, monkeypatch, request
) -> None:
    """The default `sqlite:///mlflow.db` is relative to the working directory, as are artifacts."""
    # MLflow caches one store per URI string in the process: drop a `sqlite:///mlflow.db` store
    # that another test may have opened in another working directory (and ours afterwards).
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    clear = getattr(_tracking_store_registry._get_store_with_resolved_uri, "cache_clear", None)
    if clear is not None:
        clear()
        request.addfinalizer(clear)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = make_config(study_config, None, "relative")
    source = tmp_path / "note.txt"
    source.write_text("hello")
    with rule_run(tracking_settings(config), "summary", config_hash="grid") as run:
        run.log_artifact(source)
    assert (tmp_path / "mlflow.db").is_file()
    assert [path.read_text() for path in (tmp_path / "mlartifacts").rglob("note.txt")] == ["hello"]
    assert not (tmp_path / "mlruns").exists()


def test_cell_parent_runs_carry_headline_metrics_comparable_by_method(
    study_config: dict, shared_uri: str
) -> None:
    """evaluate's headline numbers and the training map's occupancy land on each cell's parent
    run, whose method tag lets the MLflow UI group cells by method."""
    from trainmap.jobs.evaluate import headline_metrics
    from trainmap.tracking import log_cell_metrics

    config = make_config(study_config, shared_uri, "headline")
    records = {
        Cell("sparse_parity", "mlp", "kaiming", 0): {"status": "completed", "test_acc": 0.95,
            "best_test_acc": 0.97, "convergence_step": 4000, "converged": True,
            "diverged_step": None, "bytes_on_disk": 23000},
        Cell("sparse_parity", "mlp", "gradinit", 0): {"status": "diverged", "test_acc": 0.5,
            "best_test_acc": 0.6, "convergence_step": None, "converged": False,
            "diverged_step": 1200, "bytes_on_disk": 23000},
    }  # fmt: skip
    tracking = tracking_settings(config)
    for cell, record in records.items():
        hashes = {cell.id: cell_hash(config, cell)}
        with rule_run(tracking, "evaluate", cell=cell, config_hash=hashes[cell.id]) as run:
            run.log_cell_metrics(headline_metrics(record))
        log_cell_metrics(tracking, {cell: {"map.occupancy.state0": 0.25, "map.detour_visited": 1.0}},
                         hashes)  # fmt: skip

    client = MlflowClient(tracking_uri=shared_uri)
    experiment = client.get_experiment_by_name("headline").experiment_id
    parents = client.search_runs([experiment], filter_string="tags.role = 'cell'")
    by_method = {run.data.tags["method"]: run.data.metrics for run in parents}
    assert set(by_method) == {"kaiming", "gradinit"}  # one parent per cell, tagged by method
    assert by_method["kaiming"] == {"final_test_acc": 0.95, "best_test_acc": 0.97,
                                    "convergence_step": 4000.0, "converged": 1.0,
                                    "bytes_on_disk": 23000.0, "map.occupancy.state0": 0.25,
                                    "map.detour_visited": 1.0}  # fmt: skip
    assert by_method["gradinit"]["steps_to_divergence"] == 1200.0
    assert "convergence_step" not in by_method["gradinit"]
    found = client.search_runs([experiment], filter_string="metrics.final_test_acc > 0.9")
    assert [run.data.tags["method"] for run in found] == ["kaiming"]


def test_runs_table_urls_name_each_experiment_with_runs(tmp_path) -> None:
    """`make mlflow-ui` prints the runs table's address per experiment (MLflow 3 opens an
    experiment on its GenAI overview); experiments without runs and a missing store give none."""
    from mlflow import MlflowClient

    from trainmap.tracking import runs_table_urls

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert runs_table_urls(uri, "http://127.0.0.1:5000") == []
    client = MlflowClient(tracking_uri=uri)
    used = client.create_experiment("study")
    client.create_experiment("empty")
    client.create_run(used)
    assert runs_table_urls(uri, "http://127.0.0.1:5000/") == [
        f"study: http://127.0.0.1:5000/#/experiments/{used}/runs"
    ]


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("sqlite:///mlflow.db", "SQLite file"),
        ("sqlite:////shared/mlflow.db", "SQLite file"),
        ("http://127.0.0.1:5000", "loopback"),
        ("http://localhost:5000", "loopback"),
        ("http://[::1]:5000", "loopback"),
        ("postgresql://mlflow:secret@localhost/mlflow", "loopback"),
        ("postgresql://mlflow@/mlflow?host=/var/run/postgresql", "loopback"),
    ],
)
def test_a_store_compute_nodes_cannot_reach_is_named_with_its_fix(uri: str, reason: str) -> None:
    """Cluster jobs run on other nodes: the warning before any job names the key, the value and
    the fix (a server on the login node's address)."""
    problem = cluster_tracking_problem(uri)
    assert problem is not None
    assert problem.startswith(f"config key mlflow.tracking_uri: {uri!r}"), problem
    assert reason in problem and "HOST=0.0.0.0" in problem, problem


@pytest.mark.parametrize(
    "uri", ["http://login01:5000", "https://mlflow.lab.example", "postgresql://m@db.lab:5432/m"]
)
def test_a_store_on_the_network_passes_for_cluster_jobs(uri: str) -> None:
    assert cluster_tracking_problem(uri) is None


# --------------------------------------------------------------------------------------------------
# Runs of a job: who opened them, runs of dead jobs, runs that a rerun superseded

JOB = "logs/train/mnist/mlp/sgd/seeds0-3.log"


def test_a_jobs_runs_carry_job_host_and_pid_but_not_its_cells_parent(
    study_config: dict, shared_uri: str, monkeypatch
) -> None:
    config = make_config(study_config, shared_uri, "job-tags")
    tracking = tracking_settings(config)
    cell = Cell("digits", "vgg_bn", "kaiming", 7)
    params = {"train": {"lr": 0.05}}
    monkeypatch.setenv(JOB_ENV, JOB)
    with rule_run(tracking, "train", cell=cell, params=params,
                  config_hash=cell_hash(config, cell)) as run:  # fmt: skip
        run.log_metrics({"loss": 0.5}, step=1)
        rule_id = run.run_id
    with summary_run(tracking, "seeds x", {"role": "seed_group", "job": "not mine"}) as run:
        summary_id = run.run_id
    monkeypatch.delenv(JOB_ENV)
    with rule_run(tracking, "summary", task="digits", config_hash="grid") as run:
        unset_id = run.run_id

    client = MlflowClient(tracking_uri=shared_uri)
    mine = {"job": JOB, "host": socket.gethostname(), "pid": str(os.getpid())}
    for run_id in (rule_id, summary_id):
        tags = client.get_run(run_id).data.tags
        assert {key: tags.get(key) for key in mine} == mine, run_id
    logged = client.get_run(rule_id)
    assert logged.data.params == {"train.lr": "0.05"}  # the tags add no param, no metric
    assert logged.data.metrics == {"loss": 0.5}
    parent = client.get_run(logged.data.tags["mlflow.parentRunId"]).data.tags
    assert parent["role"] == "cell" and parent["cell"] == cell.id
    assert not {"job", "host", "pid"} & parent.keys(), parent
    unset = client.get_run(unset_id).data.tags
    assert "job" not in unset and unset["pid"] == str(os.getpid())


def make_run(
    client: MlflowClient, experiment_id: str, name: str, *, status: str = "RUNNING",
    start: int | None = None, end: int | None = None, **tags: str,
) -> str:  # fmt: skip
    """A run named ``name`` with ``tags``, started at ``start`` (ms), left ``status``."""
    run_id = client.create_run(
        experiment_id, start_time=start, tags=tags, run_name=name
    ).info.run_id
    if status != "RUNNING":
        client.set_terminated(run_id, status, end_time=end)
    return run_id


def exited_child() -> int:
    """The pid of a forked child that exited at once, not yet reaped: a zombie. (A fork, not a
    program: the fast tier starts none.)"""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    return pid


@pytest.fixture
def dead_pid() -> str:
    """The pid of a process that exited and was reaped: no process has it (barring reuse)."""
    pid = exited_child()
    os.waitpid(pid, 0)
    return str(pid)


def test_end_dead_runs_marks_the_jobs_orphans_killed(
    shared_uri: str, dead_pid: str, monkeypatch, capsys
) -> None:
    """Every RUNNING run of the job, nested ones and those of another host included, becomes
    KILLED; a run whose process lives on this host, other jobs' runs and ended runs stay."""
    monkeypatch.setattr("trainmap.tracking.SEARCH_PAGE_SIZE", 2)  # 4 matching runs: 2 pages
    tracking = {"uri": shared_uri, "experiment": "dead-runs"}
    client = MlflowClient(tracking_uri=shared_uri)
    experiment = init_tracking(shared_uri, "dead-runs")
    here, alive = socket.gethostname(), str(os.getpid())
    dead = make_run(client, experiment, "train c", job=JOB, host=here, pid=dead_pid)
    ids = {
        "dead": dead,
        "nested": make_run(
            client,
            experiment,
            "seeds c: a",
            job=JOB,
            host=here,
            pid=dead_pid,
            **{"mlflow.parentRunId": dead},
        ),
        "elsewhere": make_run(client, experiment, "evaluate c", job=JOB, host="node-17", pid=alive),
        "no pid": make_run(client, experiment, "plot c", job=JOB, host=here),
        "alive": make_run(client, experiment, "fit c", job=JOB, host=here, pid=alive),
        "other job": make_run(
            client, experiment, "train d", job=JOB.replace(".", "x"), host=here, pid=dead_pid
        ),
        "longer key": make_run(
            client, experiment, "train e", job=JOB + ".old", host=here, pid=dead_pid
        ),
        "untagged": make_run(client, experiment, "train f", host=here, pid=dead_pid),
        "finished": make_run(
            client,
            experiment,
            "train g",
            status="FINISHED",
            end=1234,
            job=JOB,
            host=here,
            pid=dead_pid,
        ),
        "failed": make_run(
            client,
            experiment,
            "train h",
            status="FAILED",
            end=1234,
            job=JOB,
            host=here,
            pid=dead_pid,
        ),
    }

    assert end_dead_runs(tracking, JOB) == 4
    status = {name: client.get_run(run_id).info.status for name, run_id in ids.items()}
    assert status == {"dead": "KILLED", "nested": "KILLED", "elsewhere": "KILLED",
                      "no pid": "KILLED", "alive": "RUNNING", "other job": "RUNNING",
                      "longer key": "RUNNING", "untagged": "RUNNING", "finished": "FINISHED",
                      "failed": "FAILED"}  # fmt: skip
    assert client.get_run(ids["dead"]).info.end_time is not None
    assert client.get_run(ids["finished"]).info.end_time == 1234
    warning = capsys.readouterr().err
    assert ids["alive"] in warning and f"process {alive}" in warning and "left RUNNING" in warning
    assert ids["dead"] not in warning
    assert end_dead_runs(tracking, JOB) == 0  # the live one only, again left


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads a zombie's state in /proc")
def test_end_dead_runs_takes_a_zombie_for_dead(shared_uri: str) -> None:
    """A job killed but not yet reaped by its parent is a zombie: its pid answers os.kill, yet no
    process runs it."""
    tracking = {"uri": shared_uri, "experiment": "zombie"}
    client = MlflowClient(tracking_uri=shared_uri)
    experiment = init_tracking(shared_uri, "zombie")
    pid = exited_child()
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        os.kill(pid, 0)  # the zombie's pid still answers
        run_id = make_run(client, experiment, "train c", job=JOB, host=socket.gethostname(),
                          pid=str(pid))  # fmt: skip
        assert end_dead_runs(tracking, JOB) == 1
    finally:
        os.waitpid(pid, 0)
    assert client.get_run(run_id).info.status == "KILLED"


def test_job_keys_with_a_quote_are_matched_exactly_or_refused(
    shared_uri: str, dead_pid: str
) -> None:
    tracking = {"uri": shared_uri, "experiment": "quoted-keys"}
    client = MlflowClient(tracking_uri=shared_uri)
    experiment = init_tracking(shared_uri, "quoted-keys")
    quoted = "logs/train/o'brien/seeds0-3.log"
    ids = [make_run(client, experiment, "train c", job=job, host="node-1", pid=dead_pid)
           for job in (quoted, 'logs/train/say "hi"/seeds0-3.log', "logs/train/o")]  # fmt: skip
    assert end_dead_runs(tracking, quoted) == 1
    assert end_dead_runs(tracking, 'logs/train/say "hi"/seeds0-3.log') == 1
    assert [client.get_run(run_id).info.status for run_id in ids] == ["KILLED", "KILLED", "RUNNING"]
    for refused in ("logs/'a\"/x.log", "logs\\a.log", "logs/a\\"):
        with pytest.raises(ValueError, match="cannot quote"):
            end_dead_runs(tracking, refused)
        with pytest.raises(ValueError, match="cannot quote"):
            retire_superseded_runs(tracking, refused)
    assert client.get_run(ids[2]).info.status == "RUNNING"


def test_without_a_store_nothing_happens(tmp_path: Path) -> None:
    """No URI, or a store or experiment that does not exist yet: 0, and nothing is created (a fresh
    database migrated by parallel jobs loses runs)."""
    database = tmp_path / "absent.db"
    for function in (end_dead_runs, retire_superseded_runs):
        assert function({}, JOB) == 0
        assert function({"uri": "", "experiment": "x"}, JOB) == 0
        assert function({"uri": f"sqlite:///{database}", "experiment": "x"}, JOB) == 0
        assert not database.exists()
    uri = f"sqlite:///{tmp_path / 'empty.db'}"
    init_tracking(uri, "present")
    for function in (end_dead_runs, retire_superseded_runs):
        assert function({"uri": uri, "experiment": "absent"}, JOB) == 0
    assert MlflowClient(tracking_uri=uri).get_experiment_by_name("absent") is None


def test_retire_superseded_runs_keeps_the_newest_of_each_name_and_config(
    shared_uri: str, monkeypatch
) -> None:
    monkeypatch.setattr("trainmap.tracking.SEARCH_PAGE_SIZE", 2)  # 14 FINISHED runs: 7 pages
    tracking = {"uri": shared_uri, "experiment": "superseded"}
    client = MlflowClient(tracking_uri=shared_uri)
    experiment = init_tracking(shared_uri, "superseded")

    def finished(name: str, start: int, end: int | None = None, **tags: str | None) -> str:
        tags = {key: value for key, value in ({"job": JOB, "config_hash": "h1"} | tags).items()
                if value is not None}  # fmt: skip
        return make_run(client, experiment, name, status="FINISHED", start=start,
                        end=end or start + 100, **tags)  # fmt: skip

    ids = {
        "oldest": finished("train c", 1000),
        "older": finished("train c", 2000),
        "newest": finished("train c", 3000),
        "changed setting": finished("train c", 500, config_hash="h2"),
        "tie, ended first": finished("evaluate c", 5000, end=6000),
        "tie, ended last": finished("evaluate c", 5000, end=7000),
        "other name": finished("evaluate d", 100),
        "other job": finished("train c", 100, job=JOB + ".old"),
        "cell parent": finished("c", 100, role="cell"),
        "cell parent again": finished("c", 200, role="cell"),
        "no hash": finished("plot c", 100, config_hash=None),
        "no hash again": finished("plot c", 200, config_hash=None),
        "failed": make_run(
            client,
            experiment,
            "train c",
            status="FAILED",
            start=4000,
            end=4100,
            job=JOB,
            config_hash="h1",
        ),
        "killed": make_run(
            client,
            experiment,
            "train c",
            status="KILLED",
            start=500,
            end=600,
            job=JOB,
            config_hash="h1",
        ),
        "running": make_run(client, experiment, "train c", start=100, job=JOB, config_hash="h1"),
    }
    assert "config_hash" not in client.get_run(ids["no hash"]).data.tags

    assert retire_superseded_runs(tracking, JOB) == 3
    stage = {name: client.get_run(run_id).info.lifecycle_stage for name, run_id in ids.items()}
    deleted = {name for name, lifecycle in stage.items() if lifecycle == "deleted"}
    assert deleted == {"oldest", "older", "tie, ended first"}
    assert set(stage.values()) == {"active", "deleted"}
    status = {name: client.get_run(run_id).info.status for name, run_id in ids.items()}
    assert [status[name] for name in ("failed", "killed", "running")] == [
        "FAILED", "KILLED", "RUNNING"]  # fmt: skip
    # Deleted runs leave searches (and the UI) but stay restorable until `mlflow gc`.
    active = {run.info.run_id for run in client.search_runs([experiment], max_results=1000)}
    assert active == {run_id for name, run_id in ids.items() if name not in deleted}
    client.restore_run(ids["older"])
    assert client.get_run(ids["older"]).info.lifecycle_stage == "active"
    # Restored, it is superseded again on the job's next success; nothing else is.
    assert retire_superseded_runs(tracking, JOB) == 1
    assert retire_superseded_runs(tracking, JOB) == 0
