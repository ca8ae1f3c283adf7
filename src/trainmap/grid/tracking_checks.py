"""The checks of where a study's results are recorded: the MLflow tracking URI (its scheme and
database driver) and, under DVC, the results root dvc.yaml versions and ``dvc.configfile``."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from trainmap.errors import ConfigError
from trainmap.grid.effective import under_dvc
from trainmap.grid.study import results_root

#: Tracking URI schemes MLflow serves (mlflow's tracking-store registry; a test compares them),
#: and the Python module each database scheme's default SQLAlchemy driver needs. MLflow 3 refuses
#: its file store (plain paths, ``file:``): it is in maintenance mode.
TRACKING_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks")
DATABASE_DRIVERS = {"postgresql": "psycopg2", "mysql": "MySQLdb", "mssql": "pyodbc"}


def tracking_uri_problem(uri: str) -> str | None:
    """Why MLflow cannot serve tracking URI ``uri`` (and the fix), or None when it can."""
    from urllib.parse import urlsplit

    scheme = urlsplit(uri).scheme if "://" in uri else ""
    dialect, _, driver = scheme.partition("+")
    example = "e.g. sqlite:///mlflow.db or http://127.0.0.1:5000"
    if not scheme:
        return (f"{uri!r} is not a URI (no scheme://); MLflow 3 no longer serves plain "
                f"directories: write a tracking URI, {example}")  # fmt: skip
    if dialect not in TRACKING_SCHEMES:
        return (f"MLflow cannot serve scheme {scheme!r} ({uri!r}); allowed schemes: "
                f"{', '.join(TRACKING_SCHEMES)}, {example}")  # fmt: skip
    if dialect == "sqlite" and not uri.startswith("sqlite:///"):
        return (f"{uri!r} is not an SQLite URI MLflow reads: write sqlite:///relative/path.db "
                "or sqlite:////absolute/path.db (three or four slashes)")  # fmt: skip
    module = driver or DATABASE_DRIVERS.get(dialect)
    if module and importlib.util.find_spec(module) is None:
        return (f"{uri!r} needs the database driver module {module!r}, which is not installed in "
                "this environment; install it (add it to pyproject.toml) or use another URI")  # fmt: skip
    return None


def tracking_uri_of(config: dict) -> tuple[str | None, str]:
    """The tracking URI the jobs will use and where it comes from, as an error's first words:
    ``mlflow.tracking_uri``, or ``$MLFLOW_TRACKING_URI`` where the config leaves it null (None
    when neither is set: MLflow's default, ``sqlite:///mlflow.db`` in the project)."""
    configured = config.get("mlflow", {}).get("tracking_uri")
    if not configured and os.environ.get("MLFLOW_TRACKING_URI"):
        return (os.environ["MLFLOW_TRACKING_URI"],
                "environment variable MLFLOW_TRACKING_URI (config key mlflow.tracking_uri is null)")  # fmt: skip
    return configured, "config key mlflow.tracking_uri"


def check_tracking_uri(config: dict) -> None:
    """``mlflow.tracking_uri`` (or ``$MLFLOW_TRACKING_URI`` where it is null) names a store MLflow
    can serve: checked here, not inside the first job's MLflow exception."""
    uri, where = tracking_uri_of(config)
    problem = tracking_uri_problem(uri) if uri else None
    if problem:
        raise ConfigError(f"{where}: {problem}")


#: The root dvc.yaml's stages version (results/train, results/summary/settings.json, ...).
DVC_RESULTS_ROOT = "results"


def check_dvc(config: dict, base_dir: Path) -> None:
    """``dvc.configfile`` names an existing file (dvc.yaml runs Snakemake with it), and under DVC the
    config writes where dvc.yaml's outs are: a stage whose Snakemake wrote elsewhere would version
    empty directories and record nothing of the run."""
    root = results_root(config)
    if under_dvc() and root != DVC_RESULTS_ROOT:
        raise ConfigError(
            f"config key results: {root!r} under DVC, but dvc.yaml versions "
            f"{DVC_RESULTS_ROOT}/ (its stages' outs); run this config with snakemake or make, or "
            f"set results: {DVC_RESULTS_ROOT} in the config that params.yaml's dvc.configfile names"
        )
    path = config.get("dvc", {}).get("configfile")
    if path is not None and not (base_dir / path).is_file():
        raise ConfigError(
            f"config key dvc.configfile: file {path!r} does not exist (looked in "
            f"{base_dir / path}); allowed: a config file of this project, e.g. config/config.yaml"
        )
