"""The evaluate and summary rules: every form of every run, one table of all runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import torch

from trainmap.data import TaskData, load_task_data
from trainmap.evaluation import compression_table, evaluate_run, group_metrics, summarise
from trainmap.evaluation.plots import plot_compression, plot_learning_curves
from trainmap.grid import Cell, SeedRange, is_sparse
from trainmap.io import (
    load_json,
    save_json,
    save_table,
)
from trainmap.jobs.common import (
    _over_cells,
    _task_data,
    cell_file,
    seed_dir,
    write_manifest,
)
from trainmap.tracking import rule_run

FORM_METRICS = ("test_acc", "bytes_on_disk", "latency_ms", "nonzero_weights")


def evaluate_job(
    cell: Cell | dict,
    model_path: str | Path,
    history_path: str | Path,
    train_summary_path: str | Path,
    data_path: str | Path | TaskData,
    settings: dict[str, Any],
    output: str | Path,
    config: dict,
    *,
    deploy_path: str | Path | None = None,
    quantized_manifest: str | Path | None = None,
    threads: int = 1,
) -> dict[str, Any]:
    """Rule ``evaluate``: one JSON with accuracy, convergence, size and latency of a run's final
    model, and of its deploy (RepVGG) and quantised forms when the cell has them."""
    cell = Cell.of(cell)
    torch.set_num_threads(threads)
    other_forms = []
    if deploy_path:
        other_forms.append({"form": "deploy", "model_path": deploy_path})
    if quantized_manifest:
        other_forms += load_json(quantized_manifest)["forms"]
    with rule_run(config, "evaluate", cell=cell, params={"evaluate": settings}) as run:
        record = evaluate_run(
            model_path,
            pd.read_csv(history_path),
            load_json(train_summary_path),
            _task_data(data_path),
            threshold=settings["threshold"],
            latency_batch=settings.get("latency_batch", 256),
            latency_repeats=settings.get("latency_repeats", 20),
            form="sparse" if is_sparse(cell) else "trained",
            other_forms=other_forms,
        )
        record = {"task": cell.task, "arch": cell.arch, "method": cell.method,
                  "seed": cell.seed} | record  # fmt: skip
        save_json(record, output)
        numeric = {k: v for k, v in record.items() if isinstance(v, int | float) and k != "seed"}
        run.log_metrics(numeric)
        for form in record["forms"][1:]:
            run.log_metrics({f"{form['form']}.{key}": form[key] for key in FORM_METRICS})
        run.set_tags({"status": record["status"], "converged": record["converged"]})
        run.log_cell_metrics(headline_metrics(record))
        run.log_artifact(output)
    return record


def evaluate_block_job(
    block: SeedRange | dict,
    run_manifest: str | Path,
    data_path: str | Path,
    settings: dict[str, Any],
    manifest: str | Path,
    config: dict,
    *,
    deploy_manifest: str | Path | None = None,
    quantize_manifest: str | Path | None = None,
    threads: int = 1,
) -> list[dict[str, Any]]:
    """Rule ``evaluate`` for a block: :func:`evaluate_job` of every cell (its run's final model and
    its deploy and quantised forms when it has them)."""
    block = SeedRange.of(block)
    data = load_task_data(data_path)  # once for every cell

    def evaluate_cell(cell: Cell) -> dict[str, Any]:
        return evaluate_job(
            cell, cell_file(run_manifest, cell, "model.pt"),
            cell_file(run_manifest, cell, "history.csv"),
            cell_file(run_manifest, cell, "train.json"), data, settings,
            seed_dir(manifest, cell) / "evaluation.json", config,
            deploy_path=deploy_manifest and cell_file(deploy_manifest, cell, "deploy.pt"),
            quantized_manifest=quantize_manifest
            and cell_file(quantize_manifest, cell, "quantize.json"),
            threads=threads,
        )  # fmt: skip

    records = _over_cells(block, f"evaluate {block.id}", evaluate_cell)
    write_manifest(manifest, "evaluate", block,
                   [{"status": r["status"], "converged": r["converged"]} for r in records])  # fmt: skip
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
    config: dict,
) -> pd.DataFrame:
    """Rule ``summary``: the grid-wide evaluation table, the compression view (every form of every
    run), DVC metrics, learning curves and accuracy against bytes."""
    records = [load_json(path) for path in evaluation_paths]
    frame = summarise(records)
    forms = compression_table(records)
    with rule_run(config, "summary", params={"runs": len(frame)}, config_hash="grid") as run:
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
