"""MLflow over HTTP with PostgreSQL as the server's store (`make mlflow-server BACKEND=postgresql://...`).

A throw-away PostgreSQL cluster in a temp dir listens on a unix socket only; `mlflow server` keeps
its runs there (driver: psycopg2-binary, a dev dependency). Skipped only where no PostgreSQL server
binaries are installed, or where this user cannot run them (root without a `postgres` user).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

import pytest
from conftest import REPO_ROOT, MlflowServer, free_port, workflow_env

from trainmap.grid import Cell
from trainmap.tracking import rule_run

POSTGRES_TOOLS = ("initdb", "pg_ctl", "postgres", "createuser", "createdb")
START_TIMEOUT_S = 180  # a fresh store's schema migration is slow on a loaded machine


def postgres_bin_dir() -> Path | None:
    """The newest PostgreSQL server binaries: Debian's /usr/lib/postgresql/<version>/bin, else PATH."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                      key=lambda bin_dir: int(bin_dir.parent.name) if bin_dir.parent.name.isdigit()
                      else -1, reverse=True)  # fmt: skip
    on_path = shutil.which("pg_ctl")
    candidates = [*versions, *([Path(on_path).parent] if on_path else [])]
    return next((bin_dir for bin_dir in candidates
                 if all((bin_dir / tool).is_file() for tool in POSTGRES_TOOLS)), None)  # fmt: skip


def cannot_run_postgres(bin_dir: Path | None) -> str | None:
    if bin_dir is None:
        return (f"PostgreSQL's server binaries ({', '.join(POSTGRES_TOOLS)}) are neither in "
                "/usr/lib/postgresql/*/bin nor on PATH")  # fmt: skip
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "postgres refuses to run as root, and there is no `postgres` user to run it as"
        if shutil.which("runuser") is None:
            return (
                "postgres refuses to run as root, and `runuser` to run it as `postgres` is missing"
            )
    return None


BIN_DIR = postgres_bin_dir()
#: postgres refuses to run as root: root runs the cluster as `postgres`, anyone else as themselves.
RUN_AS = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        cannot_run_postgres(BIN_DIR) is not None, reason=cannot_run_postgres(BIN_DIR) or ""
    ),  # fmt: skip
]


class PostgresCluster:
    """A PostgreSQL cluster under ``root`` on a unix socket in ``root/sockets`` (no TCP), with a
    role and a database named ``mlflow`` (trust authentication: nothing but this user reaches it)."""

    def __init__(self, root: Path) -> None:
        self.root, self.data, self.sockets = root, root / "data", root / "sockets"
        self.log = root / "postgres.log"
        self.port = free_port()
        self.running = False
        self.sockets.mkdir()
        if RUN_AS:
            for path in (root, self.sockets):
                shutil.chown(path, "postgres")
        self._run("initdb", "-D", self.data, "--auth=trust", "--encoding=UTF8", "--no-locale")
        self._run("pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", START_TIMEOUT_S,
                  "-o", f"-k {self.sockets} -p {self.port} -c listen_addresses=''", "start")  # fmt: skip
        self.running = True
        self._run("createuser", "-h", self.sockets, "-p", self.port, "mlflow")
        self._run("createdb", "-h", self.sockets, "-p", self.port, "--owner=mlflow", "mlflow")

    @property
    def uri(self) -> str:
        """The store's URI as `make mlflow-server BACKEND=...` takes it (unix socket form)."""
        return f"postgresql://mlflow@/mlflow?host={self.sockets}&port={self.port}"

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else "(no postgres log)"

    def _run(self, tool: str, *args: str | int | Path) -> None:
        command = [*RUN_AS, str(BIN_DIR / tool), *map(str, args)]
        try:  # cwd: the postgres user may not enter the test's working directory
            result = subprocess.run(command, cwd=self.root, capture_output=True, text=True,
                                    timeout=START_TIMEOUT_S + 60)  # fmt: skip
            failed = result.returncode != 0
            output = f"exited {result.returncode}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        except subprocess.TimeoutExpired:
            failed, output = True, "timed out"
        if failed:
            self.stop()
            pytest.fail(f"{' '.join(command)} {output}\n--- postgres log\n{self.log_text()[-6000:]}",
                        pytrace=False)  # fmt: skip

    def stop(self) -> None:
        if self.running:
            self.running = False
            subprocess.run([*RUN_AS, str(BIN_DIR / "pg_ctl"), "-D", str(self.data), "-m", "fast",
                            "-w", "stop"], cwd=self.root, capture_output=True, timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def cluster():
    # Not under pytest's basetemp: its folders admit this user only, and postgres may run as another.
    root = Path(tempfile.mkdtemp(prefix="trainmap-pg-"))
    running = None
    try:
        running = PostgresCluster(root)
        yield running
    finally:
        if running is not None:
            running.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def server(cluster):
    """`mlflow server` on 127.0.0.1 keeping its runs in ``cluster``, artifacts in a local dir."""
    try:
        running = MlflowServer(cluster.root / "mlflow", backend=cluster.uri,
                               start_timeout_s=START_TIMEOUT_S)  # fmt: skip
    except pytest.fail.Exception as failure:  # the server's log is in it; add the database's
        pytest.fail(f"{failure.msg}\n--- postgres log\n{cluster.log_text()[-6000:]}", pytrace=False)
    yield running.uri
    running.stop()


def test_a_rule_run_is_stored_in_postgres(server, cluster):
    import psycopg2
    from mlflow import MlflowClient

    tracking = {"uri": server, "experiment": "postgres-test"}
    cell = Cell("parity", "mlp", "kaiming", 0)
    with rule_run(tracking, "train", cell=cell, params={"train": {"lr": 0.1}},
                  config_hash="h1") as run:  # fmt: skip
        for step in range(5):
            run.log_metrics({"train_loss": 1 / (step + 1)}, step)
    client = MlflowClient(tracking_uri=server)
    experiment = client.get_experiment_by_name("postgres-test")
    runs = client.search_runs([experiment.experiment_id], "tags.rule = 'train'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.params["train.lr"] == "0.1"
    history = client.get_metric_history(runs[0].info.run_id, "train_loss")
    assert sorted((m.step, m.value) for m in history) == [(s, 1 / (s + 1)) for s in range(5)]
    connection = psycopg2.connect(host=str(cluster.sockets), port=cluster.port, user="mlflow",
                                  dbname="mlflow")  # fmt: skip
    with closing(connection), connection.cursor() as cursor:  # the run is in PostgreSQL itself
        cursor.execute("SELECT status FROM runs WHERE run_uuid = %s", (runs[0].info.run_id,))
        assert cursor.fetchall() == [("FINISHED",)]


# One workflow job: waits for the go file, opens a cell's training run, waits until the other
# job's run is open too (so the two log at the same time however the scheduler orders them), then
# logs one step per request.
PARALLEL_JOB = """
import sys, time
from pathlib import Path
from trainmap.grid import Cell
from trainmap.tracking import rule_run

uri, seed, go = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
Path(f"{go}.ready{seed}").touch()
while not go.exists():
    time.sleep(0.05)
with rule_run({"uri": uri, "experiment": "postgres-parallel"}, "train",
              cell=Cell("parity", "mlp", "kaiming", seed), config_hash="h2") as run:
    Path(f"{go}.open{seed}").touch()
    deadline = time.monotonic() + 120
    while not all(Path(f"{go}.open{other}").exists() for other in (1, 2)):
        assert time.monotonic() < deadline, "the other job's run did not open within 120 s"
        time.sleep(0.05)
    for step in range(20):
        run.log_metrics({"train_loss": seed + 1 / (step + 1)}, step)
        run.flush()
"""


def test_two_jobs_logging_at_once_both_finish(server, tmp_path):
    """Parallel workflow jobs log to one server at the same time: both runs end FINISHED with
    every step (a fresh experiment, so the two also race to create it)."""
    from mlflow import MlflowClient

    go = tmp_path / "go"
    logs = {seed: tmp_path / f"job{seed}.log" for seed in (1, 2)}

    def start(seed: int) -> subprocess.Popen:
        with logs[seed].open("w") as log:
            return subprocess.Popen([sys.executable, "-c", PARALLEL_JOB, server, str(seed), str(go)],
                                    cwd=REPO_ROOT, env=workflow_env(), stdout=log,
                                    stderr=subprocess.STDOUT)  # fmt: skip

    jobs = {seed: start(seed) for seed in logs}

    def job_failure(seed: int) -> str:
        return f"job {seed} exited {jobs[seed].returncode}:\n{logs[seed].read_text()[-4000:]}"

    try:
        deadline = time.monotonic() + 120
        while not all(Path(f"{go}.ready{seed}").exists() for seed in jobs):
            for seed, job in jobs.items():
                if job.poll() is not None:
                    pytest.fail(job_failure(seed))
            assert time.monotonic() < deadline, "the jobs did not start within 120 s"
            time.sleep(0.1)
        go.touch()
        for seed, job in jobs.items():
            job.wait(timeout=START_TIMEOUT_S)
            assert job.returncode == 0, job_failure(seed)
    finally:
        for job in jobs.values():
            if job.poll() is None:
                job.kill()
                job.wait()

    client = MlflowClient(tracking_uri=server)
    experiment = client.get_experiment_by_name("postgres-parallel")
    runs = client.search_runs([experiment.experiment_id], "tags.rule = 'train'")
    assert sorted(int(run.data.tags["seed"]) for run in runs) == [1, 2]
    for run in runs:
        seed = int(run.data.tags["seed"])
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "train_loss")
        assert sorted((m.step, m.value) for m in history) == [
            (step, seed + 1 / (step + 1)) for step in range(20)
        ]
    assert max(run.info.start_time for run in runs) < min(run.info.end_time for run in runs), (
        "the two jobs' runs did not overlap in time: nothing was logged at once"
    )
