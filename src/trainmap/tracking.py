"""MLflow tracking: one run per rule invocation, nested under one parent run per grid cell.

* The tracking URI comes from the config (``mlflow.tracking_uri``), else ``$MLFLOW_TRACKING_URI``,
  else ``sqlite:///mlflow.db`` in the working directory. An ``http://host:port`` server works alike.
* :func:`init_tracking` creates the database schema and the experiment once, before parallel jobs
  start: a fresh SQLite database migrated by several processes at once loses runs (measured: 7 of 8
  jobs crashed), so the Snakefile's ``onstart`` handler calls it from the single Snakemake process.
* :func:`rule_run` opens a run tagged ``rule``/``task``/``arch``/``method``/``seed``, the git commit and a
  config hash, and parents it (tag ``mlflow.parentRunId``) under the cell's run so the UI nests a
  cell's rules. Metrics are buffered and sent in batches; a failing job marks its run FAILED and
  re-raises, so Snakemake does not mark its outputs complete and a rerun logs it again.
* The cell's parent run carries the cell's headline metrics (:meth:`RuleRun.log_cell_metrics`,
  :func:`log_cell_metrics`): ``evaluate`` logs final and best test accuracy, convergence step,
  steps to divergence and bytes on disk; the training-map rules log the cell's state occupancy
  and detour visits. Parent runs are tagged with task, arch, method and seed, so the MLflow UI's
  "group by method" over the cell runs compares methods.
* A run that summarises many cells' runs and is no rule's own (a seed group's across-seed means and
  intervals: :mod:`trainmap.seed_groups`) opens with :func:`summary_run`: the caller's tags, the git
  commit, a description, optionally a parent; it ends FINISHED or FAILED like a rule's run.
* Every run a job opens (:func:`rule_run`, :func:`summary_run`) is tagged with who opened it:
  ``job``, the job's key (``$TRAINMAP_JOB``: its log path relative to the working directory, e.g.
  ``logs/train/mnist/mlp/sgd/seeds0-3.log``; only when the job runner sets it), ``host``
  (:func:`socket.gethostname`) and ``pid`` (the job's process). A cell's parent run carries none
  of them: a cell's rules run in different jobs, possibly on different machines. The tags change
  no param, metric or file under ``results/``.
* A job killed by SIGKILL, or whose machine died, cannot end its runs: they stay RUNNING. The job
  runner holds a lock per job for the job's whole life, and before the job function runs it calls
  :func:`end_dead_runs`: every RUNNING run tagged with the same ``job`` then belongs to a holder
  of that lock that is dead, and is marked KILLED. KILLED thus means "a job that died holding its
  lock; marked by the next run of the same job".
* A job rerun with the same settings (same ``config_hash`` tag) logs its runs again. After the job
  function succeeded the runner calls :func:`retire_superseded_runs`: of the job's FINISHED runs
  with the same name and ``config_hash``, the newest stays and the others are soft-deleted (MLflow's
  ``deleted`` lifecycle stage: hidden from the UI and searches, restorable with
  ``mlflow runs restore``, removed for good by ``mlflow gc``). A rerun after a changed setting has
  another ``config_hash``, so its runs stand beside the earlier ones.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainmap.processes import process_alive

if TYPE_CHECKING:  # trainmap.grid imports torch: the workflow's scripts import this module
    from mlflow import MlflowClient

    from trainmap.grid import Cell

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# A server that is down should fail a job in seconds, not after minutes of HTTP retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
SERVER_PROBE_TIMEOUT_S = 5

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
METRICS_PER_BATCH = 1000  # MLflow's log_batch limit
PARAMS_PER_BATCH = 100
PARAM_VALUE_LIMIT = 6000
#: The environment variable that holds the running job's key (its log path relative to the working
#: directory). The job runner (trainmap.worker) sets it under the same name; this module sits below
#: the runner and does not import it.
JOB_ENV = "TRAINMAP_JOB"
#: The tags that name the job and process that opened a run; never on a cell's parent run.
JOB_TAGS = ("job", "host", "pid")
#: Runs per ``search_runs`` page in :func:`end_dead_runs` and :func:`retire_superseded_runs`
#: (MLflow's most; tests lower it to cover paging).
SEARCH_PAGE_SIZE = 1000


def tracking_settings(config: Mapping) -> dict[str, str]:
    """What a job needs to log: ``{"uri", "experiment"}`` (:func:`tracking_uri`,
    :func:`experiment_name`). The workflow's scripts pass it to every job, outside the rules'
    params, so pointing MLflow elsewhere never reruns a job."""
    return {"uri": tracking_uri(config), "experiment": experiment_name(config)}


def tracking_uri(config: Mapping) -> str:
    """The tracking URI: config value, else ``$MLFLOW_TRACKING_URI``, else the project's SQLite file."""
    configured = config.get("mlflow", {}).get("tracking_uri")
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def experiment_name(config: Mapping) -> str:
    """The MLflow experiment every run of this study goes to."""
    return config.get("mlflow", {}).get("experiment", "trainmap")


#: Host names that mean "this machine": a compute node resolves them to itself, not to the node
#: that runs ``make mlflow-server``.
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", ""})


def cluster_tracking_problem(uri: str) -> str | None:
    """Why jobs on other nodes of a cluster cannot log to tracking URI ``uri`` (and the fix), or
    None when they can.

    A job submitted to a cluster (SLURM) runs on a compute node: a store on this machine's
    loopback address (``http://127.0.0.1:5000``, ``postgresql://localhost/...``) is that node's own,
    where nothing listens, and an SQLite file on a shared file system breaks under writers on many
    nodes (its locks do not hold over NFS). The message names ``mlflow.tracking_uri`` and the fix:
    ``make mlflow-server HOST=0.0.0.0`` on the login node and its address in the config.
    """
    from urllib.parse import urlsplit

    fix = ("run `make mlflow-server HOST=0.0.0.0` (docs/running.md: MLflow on a cluster) on the login "
           "node and set mlflow.tracking_uri: http://<login node>:5000")  # fmt: skip
    if uri.startswith("sqlite:"):
        return (f"config key mlflow.tracking_uri: {uri!r} is an SQLite file, which jobs on "
                f"several compute nodes cannot share (no locking over NFS); {fix}")  # fmt: skip
    host = urlsplit(uri).hostname or ""
    if host.lower() in LOOPBACK_HOSTS or host.startswith("127."):
        return (f"config key mlflow.tracking_uri: {uri!r} names this machine's loopback "
                f"address, which on a compute node is the node itself; {fix}, or the database "
                "server's network address for a database URI")  # fmt: skip
    return None


def artifact_root(uri: str) -> str | None:
    """Artifacts of a SQLite-backed store go to ``mlartifacts/`` beside the database file."""
    if not uri.startswith("sqlite:///"):
        return None  # a server decides where artifacts go
    database = Path(uri.removeprefix("sqlite:///"))
    return (database.resolve().parent / "mlartifacts").as_uri()


class TrackingUnavailable(RuntimeError):
    """The tracking server cannot be reached; the job fails so that a rerun logs it."""


def check_reachable(uri: str) -> None:
    """For an ``http(s)://`` tracking URI, fail fast with a clear message when nothing answers."""
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=SERVER_PROBE_TIMEOUT_S):
            return
    except urllib.error.HTTPError:
        return  # something answers (an older server without /health)
    except (urllib.error.URLError, OSError) as error:
        raise TrackingUnavailable(
            f"MLflow tracking server {uri} is unreachable ({error}); start it (make mlflow-server) "
            "or fix mlflow.tracking_uri / $MLFLOW_TRACKING_URI. The job's outputs are not marked "
            "complete, so a rerun logs it."
        ) from None


def init_tracking(uri: str, experiment: str) -> str:
    """Create the tracking database and the experiment if missing; return the experiment id."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    check_reachable(uri)
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(experiment, artifact_location=artifact_root(uri))
    except MlflowException:  # created meanwhile by another process
        return client.get_experiment_by_name(experiment).experiment_id


def runs_table_urls(uri: str, address: str) -> list[str]:
    """``<name>: <address>/#/experiments/<id>/runs`` per experiment with runs in the store at
    ``uri``: MLflow 3's UI opens an experiment on its GenAI overview, and the runs table (what a
    trainmap study compares) is this address. Empty when the store does not exist yet."""
    from mlflow import MlflowClient

    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return []
    client = MlflowClient(tracking_uri=uri)
    return [f"{experiment.name}: {address.rstrip('/')}/#/experiments/{experiment.experiment_id}/runs"
            for experiment in client.search_experiments()
            if client.search_runs([experiment.experiment_id], max_results=1)]  # fmt: skip


def git_commit(directory: Path | None = None) -> str:
    """The checked-out commit of the workflow directory, or ``unknown`` outside git."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=directory or Path.cwd(),
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip()


def flatten_params(params: Mapping, prefix: str = "") -> dict[str, str]:
    """``{"train": {"lr": 0.1}}`` -> ``{"train.lr": "0.1"}`` (MLflow params are flat strings)."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, prefix=f"{name}."))
        else:
            flat[name] = str(value)[:PARAM_VALUE_LIMIT]
    return flat


class RuleRun:
    """The MLflow run of one rule invocation: params, buffered step metrics, tags, artifacts."""

    def __init__(self, client: MlflowClient, run_id: str, parent_run_id: str | None = None) -> None:
        self.client = client
        self.run_id = run_id
        self.parent_run_id = parent_run_id
        self._pending: list[Any] = []

    def log_cell_metrics(self, metrics: Mapping[str, float | None]) -> None:
        """Log headline metrics on the cell's parent run (a cell rule's run only)."""
        if self.parent_run_id is None:
            raise ValueError("log_cell_metrics needs a cell rule's run (it has no parent cell run)")
        _log_now(self.client, self.parent_run_id, metrics)

    def log_params(self, params: Mapping) -> None:
        """Log (nested) parameters, flattened to dotted keys."""
        from mlflow.entities import Param

        items = [Param(key, value) for key, value in flatten_params(params).items()]
        for start in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[start : start + PARAMS_PER_BATCH])

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        """Queue metrics at ``step``; they are sent in batches (see :meth:`flush`)."""
        from mlflow.entities import Metric

        timestamp = int(time.time() * 1000)
        for key, value in metrics.items():
            if value is not None:
                self._pending.append(Metric(key, float(value), timestamp, int(step)))
        while len(self._pending) >= METRICS_PER_BATCH:  # full batches now, the rest at flush
            self._send(METRICS_PER_BATCH)

    def flush(self) -> None:
        """Send every queued metric."""
        while self._pending:
            self._send(METRICS_PER_BATCH)

    def _send(self, count: int) -> None:
        batch, self._pending = self._pending[:count], self._pending[count:]
        self.client.log_batch(self.run_id, metrics=batch)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set run tags (values are stringified)."""
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, str(value))

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Upload one file to the run's artifacts, with its timing sidecar when it has one (the
        measured times the file itself leaves out: ``trainmap.io.timing_path``) in a ``timing``
        folder below it, not beside the file (a figure's folder holds figures only)."""
        from trainmap.io import timing_path  # imports torch: only once a job logs a file

        self.client.log_artifact(self.run_id, str(path), artifact_path)
        sidecar = timing_path(path)
        if sidecar.exists():
            where = f"{artifact_path}/timing" if artifact_path else "timing"
            self.client.log_artifact(self.run_id, str(sidecar), where)


@contextmanager
def rule_run(
    tracking: Mapping[str, str],
    rule: str,
    *,
    cell: Cell | None = None,
    task: str | None = None,
    params: Mapping | None = None,
    config_hash: str | None = None,
    name: str | None = None,
) -> Iterator[RuleRun]:
    """Open the MLflow run of one rule invocation (``tracking``: :func:`tracking_settings`); cell
    rules nest under the cell's parent run at ``config_hash`` (the cell's
    :func:`trainmap.grid.cell_hash`). The run is named ``name``, by default ``<rule> <cell id>``
    (or ``<rule> <task>``): a rule run once per group or comparison of a task names it, so no
    two runs share a name."""
    client, experiment_id = _client(tracking)
    config_hash = config_hash or "none"
    tags = _run_tags(rule, cell, task, config_hash)
    if cell is not None:
        tags["mlflow.parentRunId"] = _cell_parent_run(client, experiment_id, cell, tags)
    name = name or f"{rule} {cell.id if cell else task or 'all'}"
    parent_run_id = tags.get("mlflow.parentRunId")
    try:
        with _open_run(client, experiment_id, name, tags, params) as run:
            yield run
    except BaseException:
        _end_parent(client, parent_run_id, "FAILED")
        raise
    _end_parent(client, parent_run_id, "FINISHED")


@contextmanager
def summary_run(
    tracking: Mapping[str, str],
    name: str,
    tags: Mapping[str, Any],
    *,
    parent_run_id: str | None = None,
    description: str | None = None,
    params: Mapping | None = None,
) -> Iterator[RuleRun]:
    """Open a run that summarises the runs of many cells (a seed group, :mod:`trainmap.seed_groups`):
    tagged ``tags``, the git commit and the job tags (``job``/``host``/``pid``, which ``tags``
    cannot override), nested under ``parent_run_id`` when given, with
    ``description`` as the run's description in the UI. It ends FINISHED, or FAILED and re-raises,
    as a rule's run does."""
    client, experiment_id = _client(tracking)
    # The job tags come last: end_dead_runs and retire_superseded_runs rely on them being the truth.
    all_tags = _commit_tags() | {key: str(value) for key, value in tags.items()} | _job_tags()
    if parent_run_id is not None:
        all_tags["mlflow.parentRunId"] = parent_run_id
    if description is not None:
        all_tags["mlflow.note.content"] = description  # what the UI shows as the description
    with _open_run(client, experiment_id, name, all_tags, params) as run:
        yield run


@contextmanager
def _open_run(
    client: MlflowClient, experiment_id: str, name: str, tags: Mapping[str, str],
    params: Mapping | None,
) -> Iterator[RuleRun]:  # fmt: skip
    """A new run named ``name``: FINISHED after the block, its queued metrics sent; FAILED when the
    block raises (re-raised)."""
    run = RuleRun(client, client.create_run(experiment_id, run_name=name, tags=dict(tags)).info.run_id,
                  tags.get("mlflow.parentRunId"))  # fmt: skip
    try:
        if params:
            run.log_params(params)
        yield run
        run.flush()
    except BaseException:
        _end_failed(client, run)
        raise
    client.set_terminated(run.run_id, "FINISHED")


def _end_parent(client: MlflowClient, parent_run_id: str | None, status: str) -> None:
    """A cell's parent run ends when its latest rule does: created by the cell's first rule, it
    spans the cell's work in the MLflow UI (its status: the latest rule's)."""
    if parent_run_id is not None:
        client.set_terminated(parent_run_id, status)


def _client(tracking: Mapping[str, str]) -> tuple[MlflowClient, str]:
    """A client of the tracking store and the experiment's id (created once, :func:`init_tracking`)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking["uri"])
    return client, init_tracking(tracking["uri"], tracking["experiment"])


def _commit_tags() -> dict[str, str]:
    """The git commit as trainmap's tag and, when known, as MLflow's source commit."""
    commit = git_commit()
    tags = {"git_commit": commit}
    if commit != "unknown":
        tags["mlflow.source.git.commit"] = commit
    return tags


def _job_tags() -> dict[str, str]:
    """Who opens a run: ``job`` (``$TRAINMAP_JOB``, when set and not empty), ``host`` and ``pid``."""
    tags = {"host": socket.gethostname(), "pid": str(os.getpid())}
    job = os.environ.get(JOB_ENV)
    if job:
        tags["job"] = job
    return tags


def _run_tags(rule: str, cell: Cell | None, task: str | None, config_hash: str) -> dict[str, str]:
    tags = {"rule": rule, "config_hash": config_hash} | _commit_tags() | _job_tags()
    if cell is not None:
        tags |= {
            "task": cell.task,
            "arch": cell.arch,
            "method": cell.method,
            "seed": str(cell.seed),
            "cell": cell.id,
        }
    elif task is not None:
        tags["task"] = task
    return tags


def _cell_parent_run(
    client: MlflowClient, experiment_id: str, cell: Cell, child_tags: dict[str, str]
) -> str:
    """The parent run of ``cell`` at this config hash; created by the cell's first rule.

    A cell's rules run one after another (each needs the previous one's output), so two processes
    never create the same parent at once.
    """
    query = (
        f"tags.cell = '{cell.id}' and tags.role = 'cell' "
        f"and tags.config_hash = '{child_tags['config_hash']}'"
    )
    found = client.search_runs([experiment_id], filter_string=query, max_results=1)
    if found:
        return found[0].info.run_id
    # Not the rule, nor who runs it: the parent is shared by the cell's rules, which run in
    # different jobs (end_dead_runs and retire_superseded_runs must never touch it).
    parent_tags = {key: value for key, value in child_tags.items()
                   if key != "rule" and key not in JOB_TAGS}  # fmt: skip
    parent_tags["role"] = "cell"
    parent = client.create_run(experiment_id, run_name=cell.id, tags=parent_tags)
    client.set_terminated(parent.info.run_id, "FINISHED")
    return parent.info.run_id


def log_cell_metrics(
    tracking: Mapping[str, str],
    metrics_by_cell: Mapping[Cell, Mapping[str, float | None]],
    cell_hashes: Mapping[str, str],
) -> None:
    """Log each cell's metrics on its parent run (at its config hash, ``cell_hashes[cell.id]``),
    from a rule that spans many cells (a training map's group or joint comparison): one client and
    one tracking set-up for all of them."""
    client, experiment_id = _client(tracking)
    for cell, metrics in metrics_by_cell.items():
        tags = _run_tags("cell", cell, None, cell_hashes[cell.id])
        _log_now(client, _cell_parent_run(client, experiment_id, cell, tags), metrics)


def _log_now(client: MlflowClient, run_id: str, metrics: Mapping[str, float | None]) -> None:
    from mlflow.entities import Metric

    timestamp = int(time.time() * 1000)
    batch = [Metric(key, float(value), timestamp, 0) for key, value in metrics.items()
             if value is not None]  # fmt: skip
    for start in range(0, len(batch), METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=batch[start : start + METRICS_PER_BATCH])


def _end_failed(client: MlflowClient, run: RuleRun) -> None:
    try:
        run.flush()
    finally:
        client.set_terminated(run.run_id, "FAILED")


def end_dead_runs(tracking: Mapping[str, str], job: str) -> int:
    """Mark KILLED every RUNNING run tagged ``job=<job>`` (nested runs too) in the experiment of
    ``tracking`` (:func:`tracking_settings`); return how many were marked.

    The caller holds the job's exclusive lock and calls this before the job function runs. Runs
    of the same key belong to the same job, and the lock excludes a live second holder, so such a
    run was left by a holder that died (SIGKILL, a machine that went down). The lock is a file on
    the project's file system, which a cluster's nodes share: a run opened on another host is
    marked on the lock's word alone. A run opened on this host is marked only when its ``pid`` tag
    also names no live process (a zombie counts as dead): a live one means something is wrong
    (another process that sets this job's key, or the dead job's pid reused), so the run is left
    RUNNING and a warning goes to stderr (the job's log).

    Nothing happens (0) when ``tracking`` has no URI or the store or experiment does not exist
    yet. ``job`` must not hold a backslash, nor both quote characters (:class:`ValueError`).
    """
    found = _job_runs(tracking, job, "RUNNING")
    if found is None:
        return 0
    client, runs = found
    this_host = socket.gethostname()
    ended = 0
    for run in runs:
        tags = run.data.tags
        if tags.get("host") == this_host and _process_alive(tags.get("pid")):
            print(f"trainmap tracking: run {run.info.run_id} ({run.info.run_name}) of job {job} "
                  f"is RUNNING and its process {tags['pid']} on this host is alive, although "
                  "this job holds the job's lock; left RUNNING", file=sys.stderr)  # fmt: skip
            continue
        client.set_terminated(run.info.run_id, "KILLED")
        ended += 1
    return ended


def retire_superseded_runs(tracking: Mapping[str, str], job: str) -> int:
    """Soft-delete the FINISHED runs of ``job`` that a later run of the same settings replaced;
    return how many.

    Called after the job function succeeded. The FINISHED runs tagged ``job=<job>`` are grouped
    by run name and ``config_hash`` tag; each group keeps its newest run (latest start time, ties
    by the latest end time) and the others are deleted with ``MlflowClient.delete_run``: MLflow
    moves them to the ``deleted`` lifecycle stage (hidden, restorable with
    ``mlflow runs restore``, removed for good by ``mlflow gc``). A run after a changed setting has
    another ``config_hash`` and stays. Never touched: a cell's parent run (tag ``role=cell``,
    shared by the cell's rules across jobs), a run without a ``config_hash`` tag (nothing says
    whether its settings were the same), and runs not FINISHED (RUNNING, FAILED, KILLED).

    Nothing happens (0) when ``tracking`` has no URI or the store or experiment does not exist
    yet. ``job`` must not hold a backslash, nor both quote characters (:class:`ValueError`).
    """
    found = _job_runs(tracking, job, "FINISHED")
    if found is None:
        return 0
    client, runs = found
    groups: dict[tuple[str, str], list[Any]] = {}
    for run in runs:
        tags = run.data.tags
        if tags.get("role") == "cell" or "config_hash" not in tags:
            continue
        groups.setdefault((run.info.run_name, tags["config_hash"]), []).append(run)
    retired = 0
    for group in groups.values():
        group.sort(key=lambda run: (run.info.start_time or 0, run.info.end_time or 0,
                                    run.info.run_id))  # fmt: skip
        for run in group[:-1]:
            client.delete_run(run.info.run_id)
            retired += 1
    return retired


def _job_runs(
    tracking: Mapping[str, str], job: str, status: str
) -> tuple[MlflowClient, list[Any]] | None:
    """The client and every run of ``job`` with ``status`` in the experiment of ``tracking``
    (one query, all its pages), or None where nothing can have such runs: no URI, no job key, a
    SQLite file or an experiment that does not exist (neither is created here: a fresh database
    migrated by parallel jobs loses runs, see :func:`init_tracking`)."""
    uri = tracking.get("uri")
    if not uri or not job:
        return None
    query = f"tags.job = {_filter_literal(job)} and attributes.status = '{status}'"
    if uri.startswith("sqlite:///"):
        database = Path(uri.removeprefix("sqlite:///").partition("?")[0])
        if not database.exists():
            return None
    from mlflow import MlflowClient

    check_reachable(uri)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(tracking["experiment"])
    if experiment is None:
        return None
    # Every page first, then the caller's changes: the SQL store pages by offset, and a run that
    # is ended or deleted leaves the filter's results, which would shift the later pages.
    runs: list[Any] = []
    token = None
    while True:
        page = client.search_runs([experiment.experiment_id], query,
                                  max_results=SEARCH_PAGE_SIZE, page_token=token)  # fmt: skip
        runs.extend(page)
        token = page.token
        if not token:
            return client, runs


def _filter_literal(value: str) -> str:
    """``value`` as a string literal of MLflow's search filter. MLflow strips the quotes and does
    not unescape (``'a''b'`` stays ``a''b``), and a backslash escapes the next character in its
    tokenizer, so a value with ``'`` goes in double quotes and one that cannot be quoted is
    refused."""
    if "\\" in value or ("'" in value and '"' in value):
        raise ValueError(f"job key {value!r}: an MLflow search filter cannot quote a backslash or "
                         "both quote characters in a tag value")  # fmt: skip
    quote = '"' if "'" in value else "'"
    return f"{quote}{value}{quote}"


def _process_alive(pid: str | None) -> bool:
    """Whether ``pid`` (a run's ``pid`` tag) names a live process on this host. A missing or
    malformed tag is no evidence of life (the lock decides)."""
    try:
        return process_alive(int(pid or ""))
    except ValueError:
        return False
