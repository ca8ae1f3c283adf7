"""The data rule: generate or read a task's data set."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainmap.data import make_task_data, save_task_data
from trainmap.jobs.common import settings_hash
from trainmap.tracking import rule_run


def data_job(
    task: str, settings: dict[str, Any], output: str | Path, tracking: Mapping[str, str]
) -> None:
    """Rule ``data``: generate (or read) the task's data set and save it."""
    options = {key: value for key, value in settings.items() if key != "kind"}
    with rule_run(
        tracking, "data", task=task, params={"data": settings}, config_hash=settings_hash(settings)
    ) as run:
        data = make_task_data(settings["kind"], options)
        save_task_data(data, output)
        run.log_metrics({"n_train": len(data.x_train), "n_test": len(data.x_test)})
