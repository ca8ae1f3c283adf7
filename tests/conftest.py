"""Shared fixtures: the repository root and throw-away copies of the workflow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainmap.io import copy_workflow as copy_tree_of_workflow

REPO_ROOT = Path(__file__).resolve().parents[1]


#: The modules whose tests read the shared smoke study (``smoke_run``, a session fixture: built once
#: per pytest-xdist worker, so its readers run on one worker); pytest_collection_modifyitems checks
#: the list against the tests.
SMOKE_READERS = frozenset({
    "tests/integration/test_browser.py", "tests/integration/test_portable_workflow.py",
    "tests/integration/test_rerun_probe.py", "tests/integration/test_workflow.py",
    "tests/unit/dynamics/metrics/test_streamed_metrics.py",
})  # fmt: skip
#: The longest scopes of `make test`, started first (longest first: the suite's wall time is then
#: close to its work / workers), from `--durations` on 2 cores (docs/benchmarks.md); every other
#: scope follows in collection order.
LONGEST_FIRST = (
    "tests/integration/test_slurm.py", "smoke", "tests/integration/test_dvc.py",
    "tests/unit/test_portable.py", "tests/unit/dynamics/verdicts/test_adaptive.py",
    "tests/integration/test_mlflow_postgres.py", "tests/integration/test_example.py",
    "tests/integration/test_dvc_settings.py", "tests/unit/dynamics/runs/test_external_runs.py",
    "tests/unit/grid/test_config.py",
)  # fmt: skip


def xdist_scope(nodeid: str) -> str:
    """The pytest-xdist scope of a test: its module, or ``smoke`` for the smoke study's readers.
    A scope runs on one worker: its module-scoped fixtures are built once, a stateful module's
    tests run in file order, one local SLURM cluster runs at a time."""
    module = nodeid.split("::", 1)[0]
    return "smoke" if module in SMOKE_READERS else module


def pytest_xdist_make_scheduler(config, log):
    """`make test`'s scheduling (``-n N --dist loadscope``): whole scopes (:func:`xdist_scope`) to
    a worker, in the order the workers collected them (:func:`pytest_collection_modifyitems`)."""
    from xdist.scheduler import LoadScopeScheduling

    class ScopeScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    config.option.loadscopereorder = False
    return ScopeScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A reader of the smoke study runs Snakemake (once per worker): the integration tier, and
    listed in :data:`SMOKE_READERS`. The longest scopes go first (:data:`LONGEST_FIRST`; a stable
    sort, the same in every worker)."""
    for item in items:
        if "smoke_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)
            module = item.nodeid.split("::", 1)[0]
            if module not in SMOKE_READERS:
                raise pytest.UsageError(
                    f"{item.nodeid} reads smoke_run: add {module} to SMOKE_READERS in "
                    "tests/conftest.py, so its tests share the study on one worker"
                )
    rank = {scope: index for index, scope in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(xdist_scope(item.nodeid), len(rank)))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--durations-file", metavar="PATH", default=None,
        help="write each test's seconds, the outcome counts and the wall time to PATH (JSON; "
        "make test and make test-fast: .test-durations/, which make test-record copies into "
        "bench/results/test_tiers.json)",
    )  # fmt: skip


class DurationsFile:
    """``--durations-file``: what the session's tests took, written when it ends (by the
    controller under pytest-xdist, which receives every worker's reports)."""

    def __init__(self, config: pytest.Config, path: str) -> None:
        import time

        self.config, self.path = config, path
        self.started = time.monotonic()
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    @pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        import time

        from trainmap.records import durations_file

        stats = self.config.pluginmanager.get_plugin("terminalreporter").stats
        counts = {name: len(reports) for name, reports in stats.items() if name}
        durations_file(
            self.path, self.seconds, counts, time.monotonic() - self.started,
            workers=int(getattr(self.config.option, "numprocesses", None) or 1),
            markexpr=self.config.option.markexpr,
            whole_suite=self.config.args_source == pytest.Config.ArgsSource.TESTPATHS,
            exitstatus=int(exitstatus),
        )  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("durations_file")
    if path and not hasattr(config, "workerinput"):  # a pytest-xdist worker writes none
        config.pluginmanager.register(DurationsFile(config, path), "durations-file")


#: Programs a test outside the ``integration`` tier may start: cheap lookups, never a workflow,
#: a server, a browser or another Python process.
#: (lscpu: joblib counts the physical cores; ldconfig: a first import of torch finds libraries;
#: uname: platform.processor(), which MLflow's telemetry asks at its first import in a process.)
FAST_TIER_PROGRAMS = frozenset({"git", "lscpu", "ldconfig", "uname"})


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_program(request, monkeypatch):
    """The tiers' contract, checked: a test without the ``integration`` mark (the set `make
    test-fast` runs) that starts Snakemake, DVC, a server, a browser or a Python subprocess fails,
    naming the program and the mark to add."""
    if request.node.get_closest_marker("integration") is not None:
        return
    original = subprocess.Popen

    class Guarded(original):  # type: ignore[misc, valid-type]
        def __init__(self, args, *rest, **kwargs):
            program = args if isinstance(args, str | os.PathLike) else args[0]
            name = Path(str(program).split()[0]).name
            if name not in FAST_TIER_PROGRAMS:
                pytest.fail(
                    f"{request.node.nodeid} starts {name!r} ({str(args)[:120]}): a test that "
                    "starts a program belongs to the integration tier; mark it "
                    "@pytest.mark.integration (or move it to tests/integration/)",
                    pytrace=False,
                )
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Guarded)


@pytest.fixture()
def stop_handler():
    """A job process's SIGTERM handler (trainmap.stopping) in this process, for the test's
    duration."""
    import signal

    from trainmap import stopping

    previous = signal.getsignal(signal.SIGTERM)
    stopping.clear_stop_request()
    stopping.install_stop_handler()
    yield
    signal.signal(signal.SIGTERM, previous)
    stopping.clear_stop_request()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="module")
def base_config(repo_root: Path) -> dict:
    """params.yaml extended by config/config.yaml, validated (the default study); one per test
    module, which copies it before changing it."""
    from trainmap.grid import load_config

    return load_config(repo_root / "params.yaml", repo_root / "config/config.yaml",
                       check_paths_from=repo_root)  # fmt: skip


def copy_workflow(destination: Path) -> Path:
    """A copy of the workflow's sources in ``destination`` (no results, no tracking store)."""
    return copy_tree_of_workflow(REPO_ROOT, destination)


def workflow_env(**extra: str) -> dict[str, str]:
    """The environment for workflow commands: this venv first on PATH, no ambient MLflow URI."""
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    env.update(extra)
    return env


def run_command(
    args: list[str], cwd: Path, timeout: int = 600, check: bool = True, **env: str
) -> subprocess.CompletedProcess:
    """Run a command in ``cwd``; on an unexpected exit status show its output in the failure."""
    result = subprocess.run(
        args, cwd=cwd, env=workflow_env(**env), capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        pytest.fail(
            f"{' '.join(args)} exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
            f"\n--- stderr\n{result.stderr[-6000:]}"
        )
    return result


def snakemake(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    """``snakemake ARGS`` with this environment's interpreter."""
    return run_command([sys.executable, "-m", "snakemake", *args], cwd=cwd, **kwargs)


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class MlflowServer:
    """`mlflow server` on 127.0.0.1 with served artifacts under ``root`` and ``backend`` as its
    store (default: a SQLite file under ``root``); it must answer within ``start_timeout_s``."""

    def __init__(
        self, root: Path, backend: str | None = None, start_timeout_s: float = 120
    ) -> None:
        import time
        import urllib.request

        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = open(root / "server.log", "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server",
             "--backend-store-uri", backend or f"sqlite:///{root / 'mlflow.db'}",
             "--artifacts-destination", str(root / "artifacts"), "--serve-artifacts",
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            stdout=self.log, stderr=subprocess.STDOUT, env=workflow_env(),
        )  # fmt: skip
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=2)
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(
                        f"mlflow server did not start:\n{(root / 'server.log').read_text()}"
                    )
                time.sleep(0.5)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


@pytest.fixture
def one_thread():
    """One intra-op thread: fast on a small machine and the same arithmetic in every process."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "trainmap-test",
    "GIT_AUTHOR_EMAIL": "test@trainmap.invalid",
    "GIT_COMMITTER_NAME": "trainmap-test",
    "GIT_COMMITTER_EMAIL": "test@trainmap.invalid",
}


def dvc(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    """``dvc ARGS`` from this environment, with a git identity for the commits DVC makes."""
    return run_command([str(Path(sys.executable).parent / "dvc"), *args], cwd=cwd, **GIT_IDENTITY,
                       **kwargs)  # fmt: skip


def git(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_command(["git", *args], cwd=cwd, **GIT_IDENTITY)


def dvc_smoke_project(destination: Path) -> Path:
    """A git + DVC copy of the workflow whose params.yaml points `dvc repro` at the smoke grid,
    committed, not yet reproduced."""
    import shutil

    import yaml

    workdir = copy_workflow(destination)
    (workdir / ".dvc").mkdir()
    for name in ("config", ".gitignore"):
        shutil.copy2(REPO_ROOT / ".dvc" / name, workdir / ".dvc" / name)
    shutil.copy2(REPO_ROOT / ".gitignore", workdir / ".gitignore")
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["dvc"]["configfile"] = "config/smoke.yaml"
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    git("init", "-q", "-b", "main", cwd=workdir)
    git("add", "-A", cwd=workdir)
    git("commit", "-qm", "workflow", cwd=workdir)
    return workdir


SMOKE = "config/smoke.yaml"


def dry_run_job_counts(output: str) -> dict[str, int]:
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


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> Path:
    """The smoke grid run once with `snakemake --cores 2` in a copy of the workflow; tests inspect
    what it left (test_workflow, test_rerun_probe) and must leave it as they found it. The dry
    run's job counts (taken first) are kept in ``planned_jobs.json``."""
    import json

    workdir = copy_workflow(tmp_path_factory.mktemp("smoke"))
    planned = snakemake("-n", "--cores", "2", "--configfile", SMOKE, cwd=workdir)
    (workdir / "planned_jobs.json").write_text(json.dumps(dry_run_job_counts(planned.stdout)))
    snakemake("--cores", "2", "--configfile", SMOKE, cwd=workdir)
    return workdir
