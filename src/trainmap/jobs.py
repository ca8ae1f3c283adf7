"""One function per workflow rule: read inputs, call the library, write outputs, log to MLflow.

The Snakemake scripts in ``workflow/scripts/`` only unpack ``snakemake.input/params/output`` and call
one of these, so every rule can also run from Python without Snakemake.
"""

from __future__ import annotations

import hashlib
import json
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from trainmap.config import Cell, cell_hash
from trainmap.data import load_task_data, make_task_data, save_task_data
from trainmap.evaluate import evaluate_run, group_metrics, summarise
from trainmap.io import load_json, save_json, write_atomic
from trainmap.plots import plot_learning_curves
from trainmap.tracking import rule_run
from trainmap.train import TrainConfig, TrainPaths, build_cell_model, train_model


def settings_hash(settings: Any) -> str:
    """A short, stable hash of a settings mapping."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def data_job(task: str, settings: dict[str, Any], output: str | Path, config: dict) -> None:
    """Rule ``data``: generate (or read) the task's data set and save it."""
    options = {key: value for key, value in settings.items() if key != "kind"}
    with rule_run(
        config, "data", task=task, params={"data": settings}, config_hash=settings_hash(settings)
    ) as run:
        data = make_task_data(settings["kind"], options)
        save_task_data(data, output)
        run.log_metrics({"n_train": len(data.x_train), "n_test": len(data.x_test)})


def train_job(
    cell: Cell,
    data_path: str | Path,
    model_options: dict[str, Any],
    train_settings: dict[str, Any],
    out_dir: str | Path,
    config: dict,
    *,
    threads: int = 1,
    progress: bool = True,
) -> dict[str, Any]:
    """Rule ``train``: seeded init by the cell's method, training, trajectory and final weights."""
    torch.set_num_threads(threads)
    data = load_task_data(data_path)
    cfg = TrainConfig.from_dict(train_settings)
    paths = TrainPaths.in_directory(out_dir)
    model = build_cell_model(cell.arch, cell.method, cell.seed, data.meta, model_options)
    params = {"model": model_options, "train": asdict(cfg), "threads": threads}
    with rule_run(config, "train", cell=cell, params=params) as run:
        summary = train_model(
            model,
            data,
            cfg,
            cell.seed,
            paths,
            on_checkpoint=run.log_metrics,
            progress=progress,
            fingerprint=cell_hash(config, cell),
            description=cell.id,
            model_info={
                "arch": cell.arch,
                "method": cell.method,
                "seed": cell.seed,
                "model_options": model_options,
                "meta": data.meta,
            },
        )
        run.set_tags({"status": summary["status"]})
        run.log_metrics({"steps_per_s": summary["steps_per_s"], "n_params": summary["n_params"]})
        run.log_artifact(paths.history)
        run.log_artifact(paths.summary)
    return summary


def evaluate_job(
    cell: Cell,
    model_path: str | Path,
    history_path: str | Path,
    train_summary_path: str | Path,
    data_path: str | Path,
    settings: dict[str, Any],
    output: str | Path,
    config: dict,
    *,
    threads: int = 1,
) -> dict[str, Any]:
    """Rule ``evaluate``: one JSON with accuracy, convergence, size and latency of a trained run."""
    torch.set_num_threads(threads)
    with rule_run(config, "evaluate", cell=cell, params={"evaluate": settings}) as run:
        record = evaluate_run(
            model_path,
            pd.read_csv(history_path),
            load_json(train_summary_path),
            load_task_data(data_path),
            threshold=settings["threshold"],
            latency_batch=settings.get("latency_batch", 256),
            latency_repeats=settings.get("latency_repeats", 20),
        )
        record = {"task": cell.task, "arch": cell.arch, "method": cell.method,
                  "seed": cell.seed} | record  # fmt: skip
        save_json(record, output)
        numeric = {k: v for k, v in record.items() if isinstance(v, int | float) and k != "seed"}
        run.log_metrics(numeric)
        run.set_tags({"status": record["status"], "converged": record["converged"]})
        run.log_artifact(output)
    return record


def summary_job(
    evaluation_paths: list[str | Path],
    history_paths: list[str | Path],
    table_path: str | Path,
    metrics_path: str | Path,
    curves_path: str | Path,
    config: dict,
) -> pd.DataFrame:
    """Rule ``summary``: the grid-wide evaluation table, DVC metrics and learning-curve figure."""
    records = [load_json(path) for path in evaluation_paths]
    frame = summarise(records)
    with rule_run(config, "summary", params={"runs": len(frame)}, config_hash="grid") as run:
        write_atomic(table_path, lambda tmp: frame.to_csv(tmp, index=False))
        save_json(group_metrics(frame), metrics_path)
        histories = {
            tuple(record[key] for key in ("task", "arch", "method", "seed")): pd.read_csv(path)
            for record, path in zip(records, history_paths, strict=True)
        }
        plot_learning_curves(histories, curves_path)
        for path in (table_path, metrics_path, curves_path):
            run.log_artifact(path)
    return frame


@contextmanager
def logged_to(path: str | Path) -> Iterator[None]:
    """Send the job's stdout, stderr (progress bars, warnings, tracebacks) to its Snakemake log."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", buffering=1) as log, redirect_stdout(log), redirect_stderr(log):
        try:
            yield
        except BaseException:
            traceback.print_exc(file=log)
            raise
