"""The effective_settings rule: the settings the grid's jobs read, where DVC reads metrics."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from trainmap.grid import save_effective_settings
from trainmap.jobs.common import settings_hash
from trainmap.tracking import rule_run


def effective_settings_job(settings: dict, output: str | Path, tracking: Mapping[str, str]) -> None:
    """Rule ``effective_settings``: write the settings the jobs read (``dvc exp show`` shows them)
    and log the file to its MLflow run."""
    with rule_run(tracking, "effective_settings", params={"sections": sorted(settings)},
                  config_hash=settings_hash(settings)) as run:  # fmt: skip
        save_effective_settings(settings, output)
        run.log_artifact(output)
