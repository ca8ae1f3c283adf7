"""The evaluate and summary rules: every form of every run, one table of all runs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from trainmap.data import load_task_data
from trainmap.evaluation import (
    compression_table,
    evaluate_run,
    group_metrics,
    latency_probe,
    summarise,
)
from trainmap.evaluation.plots import plot_compression, plot_learning_curves
from trainmap.gpus import gpu_slot
from trainmap.grid import Cell, SeedRange, is_sparse, latency_device
from trainmap.io import load_json, save_json, save_table
from trainmap.jobs.common import SeedRangeJob
from trainmap.lineage import check_files
from trainmap.tracking import RuleRun, rule_run
from trainmap.training.setup import on_device, resolve_device

FORM_METRICS = ("test_acc", "bytes_on_disk", "latency_ms", "nonzero_weights")


def evaluate_block_job(
    block: SeedRange | dict,
    run_manifest: str | Path,
    data_path: str | Path,
    settings: dict[str, Any],
    manifest: str | Path,
    tracking: Mapping[str, str],
    cell_hashes: Mapping[str, str],
    *,
    deploy_manifest: str | Path | None = None,
    quantize_manifest: str | Path | None = None,
    threads: int = 1,
    device: str = "cpu",
    gpu_mem_mb: int = 0,
) -> list[dict[str, Any]]:
    """Rule ``evaluate``: per cell one JSON (``evaluation.json``) with accuracy, convergence, size
    and latency of its run's final model, and of its deploy (RepVGG) and quantised forms when it
    has them (``deploy_manifest``, ``quantize_manifest``). Accuracy on the task's training
    ``device`` (on a node with several GPUs, one with room for ``gpu_mem_mb``:
    :func:`trainmap.gpus.gpu_slot`); latency where ``settings["latency"]`` says (the schema's
    default: the CPU)."""
    job = SeedRangeJob("evaluate", block, manifest, tracking, cell_hashes)
    torch.set_num_threads(threads)
    job.uses(data_path)
    latency = latency_device(settings)
    latency_batch, latency_repeats = latency_probe(settings)

    def evaluate(cell: Cell, run: RuleRun) -> dict[str, Any]:
        other_forms = []
        if deploy_manifest:
            other_forms.append(
                {"form": "deploy", "model_path": job.input_file(deploy_manifest, cell, "deploy.pt")}
            )
        if quantize_manifest:
            forms = load_json(job.input_file(quantize_manifest, cell, "quantize.json"))["forms"]
            for form in forms:  # the quantised models and packed bytes the block wrote
                for key in ("model_path", "bytes_path"):
                    if key in form:
                        job.input_file(quantize_manifest, cell, Path(form[key]).name)
            other_forms += forms
        record = evaluate_run(
            job.input_file(run_manifest, cell, "model.pt"),
            pd.read_csv(job.input_file(run_manifest, cell, "history.csv")),
            load_json(job.input_file(run_manifest, cell, "train.json")),
            data,
            threshold=settings["threshold"],
            latency_batch=latency_batch,
            latency_repeats=latency_repeats,
            form="sparse" if is_sparse(cell) else "trained",
            other_forms=other_forms,
            latency=latency,
        )
        record = {"task": cell.task, "arch": cell.arch, "method": cell.method,
                  "seed": cell.seed} | record  # fmt: skip
        output = job.seed_dir(cell) / "evaluation.json"
        save_json(record, output)
        numeric = {k: v for k, v in record.items() if isinstance(v, int | float) and k != "seed"}
        run.log_metrics(numeric)
        for form in record["forms"][1:]:
            run.log_metrics({f"{form['form']}.{key}": form[key] for key in FORM_METRICS
                             if form[key] is not None})  # fmt: skip
        run.set_tags({"status": record["status"], "converged": record["converged"]})
        run.log_cell_metrics(headline_metrics(record))
        run.log_artifact(output)
        return record

    with gpu_slot(device, gpu_mem_mb):  # the data on the device before the first cell
        data = on_device(load_task_data(data_path), resolve_device(device))
        records = job.for_each_cell(evaluate, params={"evaluate": settings})
    job.write_manifest({"status": r["status"], "converged": r["converged"]} for r in records)
    return records


def headline_metrics(record: dict[str, Any]) -> dict[str, float | None]:
    """A cell's headline numbers for its MLflow parent run (comparable across methods)."""
    diverged = record["status"] == "diverged"
    return {
        "final_test_acc": record["test_acc"],
        "best_test_acc": record["best_test_acc"],
        "convergence_step": record["convergence_step"],
        "converged": float(record["converged"]),
        "steps_to_divergence": record["diverged_step"] if diverged else None,
        "bytes_on_disk": record["bytes_on_disk"],
    }


def summary_job(
    evaluation_paths: list[str | Path],
    history_paths: list[str | Path],
    table_path: str | Path,
    forms_path: str | Path,
    metrics_path: str | Path,
    curves_path: str | Path,
    compression_path: str | Path,
    tracking: Mapping[str, str],
) -> pd.DataFrame:
    """Rule ``summary``: the grid-wide evaluation table, the compression view (every form of every
    run), DVC metrics, learning curves and accuracy against bytes. The evaluations and histories
    must be those their blocks' manifests record (trainmap.lineage)."""
    check_files([*evaluation_paths, *history_paths])
    records = [load_json(path) for path in evaluation_paths]
    frame = summarise(records)
    forms = compression_table(records)
    with rule_run(tracking, "summary", params={"runs": len(frame)}, config_hash="grid") as run:
        # Latency and wall time go to evaluation.timing.csv / compression.timing.csv beside them.
        save_table(frame, table_path, keys=("task", "arch", "method", "seed"))
        save_table(forms, forms_path, keys=("task", "arch", "method", "seed", "form"))
        save_json(group_metrics(frame), metrics_path)
        histories = {
            tuple(record[key] for key in ("task", "arch", "method", "seed")): pd.read_csv(path)
            for record, path in zip(records, history_paths, strict=True)
        }
        plot_learning_curves(histories, curves_path)
        plot_compression(forms, compression_path)
        for path in (table_path, forms_path, metrics_path, curves_path, compression_path):
            run.log_artifact(path)
    return frame
