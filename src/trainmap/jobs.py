"""One function per workflow rule: read inputs, call the library, write outputs, log to MLflow.

The Snakemake scripts in ``workflow/scripts/`` only unpack ``snakemake.input/params/output`` and call
one of these, so every rule can also run from Python without Snakemake.

Per-seed rules run a **block** of seeds per job (``trainmap.config.Block``): ``train`` and
``sparse_retrain`` train the block as one vectorised model, the others loop over its cells. Every
seed still gets its own files in its own directory (``results/<rule>/<task>/<arch>/<method>/seed<n>/``)
and its own MLflow run under its cell's parent run; the job's declared output is the block's
**manifest** beside them (``.../seeds<first>-<last>.json``), which lists the cells and their files.
Snakemake tracks manifests, so a 40,000-seed grid is a DAG of a few thousand jobs.
"""

from __future__ import annotations

import hashlib
import json
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, redirect_stderr, redirect_stdout
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from trainmap.checkpoints import load_model, model_from_checkpoint
from trainmap.config import Block, Cell, cell_hash, is_sparse
from trainmap.data import TaskData, load_task_data, make_task_data, save_task_data
from trainmap.evaluate import compression_table, evaluate_run, group_metrics, summarise
from trainmap.io import (
    block_manifest_of,
    load_json,
    load_torch,
    save_json,
    save_table,
    write_atomic,
)
from trainmap.models import count_parameters
from trainmap.plots import plot_compression, plot_learning_curves
from trainmap.tracking import rule_run
from trainmap.train import TrainConfig, TrainPaths, build_cell_model, load_trajectory, train_block

FORM_METRICS = ("test_acc", "bytes_on_disk", "latency_ms", "nonzero_weights")


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


# --- blocks and their manifests -------------------------------------------------------------------


def seed_dir(manifest: str | Path, cell: Cell) -> Path:
    """A cell's directory beside its block's manifest (``.../seeds0-31.json`` -> ``.../seed3``)."""
    return Path(manifest).parent / f"seed{cell.seed}"


def cell_file(manifest: str | Path, cell: Cell, name: str) -> Path:
    """A file of ``cell`` that the block of ``manifest`` wrote; a clear error when it is gone."""
    path = seed_dir(manifest, cell) / name
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing, though its block's manifest {manifest} says it was written; "
            f"delete {manifest} (or rerun with --forcerun) so that Snakemake remakes the block"
        )
    return path


def write_manifest(path: str | Path, rule: str, block: Block, files: list[dict[str, Any]],
                   **extra: Any) -> None:  # fmt: skip
    """The block's declared output: its cells and, per cell, the files it wrote (and a status)."""
    cells = [{"cell": cell.id, **entry} for cell, entry in zip(block.cells, files, strict=True)]
    save_json({"rule": rule, "block": block.to_dict(), "cells": cells, **extra}, path)


def _over_cells(block: Block, description: str, work: Callable[[Cell], dict]) -> list[dict]:
    """``work(cell)`` for every cell of the block, with a progress bar in the job's log."""
    from tqdm.auto import tqdm

    return [work(cell) for cell in tqdm(block.cells, desc=description, mininterval=5)]


def _task_data(data: str | Path | TaskData) -> TaskData:
    """The dataset: as given when a block job loaded it once for all its cells, else read (and
    verified) from its path."""
    return data if isinstance(data, TaskData) else load_task_data(data)


def train_block_job(
    block: Block | dict,
    data_path: str | Path,
    model_options: dict[str, Any],
    train_settings: dict[str, Any],
    manifest: str | Path,
    config: dict,
    *,
    init_manifest: str | Path | None = None,
    threads: int = 1,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Rule ``train``: a block of seeds of one (task, arch, method), each seeded by its method (or
    started from the initial model GradInit made, ``init_manifest``), trained as one vectorised
    model; per seed a trajectory, final weights, history and summary, and an MLflow run."""
    block = Block.of(block)
    cells = block.cells
    torch.set_num_threads(threads)
    data = load_task_data(data_path)
    cfg = TrainConfig.from_dict(train_settings)
    models = [build_cell_model(c.arch, c.method, c.seed, data.meta, model_options) for c in cells]
    if init_manifest:
        for model, cell in zip(models, cells, strict=True):
            saved = load_torch(cell_file(init_manifest, cell, "init.pt"))
            model.load_state_dict(saved["state_dict"])
    paths = [TrainPaths.in_directory(seed_dir(manifest, cell)) for cell in cells]
    params = {"model": model_options, "train": asdict(cfg), "threads": threads,
              "seed_block": len(cells)}  # fmt: skip
    infos = [{"arch": c.arch, "method": c.method, "seed": c.seed, "model_options": model_options,
              "meta": data.meta} for c in cells]  # fmt: skip
    with ExitStack() as stack:
        runs = [
            stack.enter_context(rule_run(config, "train", cell=c, params=params)) for c in cells
        ]
        summaries = train_block(
            models, data, cfg, list(block.seeds), paths,
            resume_path=Path(manifest).with_suffix(".resume.pt"),
            on_checkpoint=lambda index, metrics, step: runs[index].log_metrics(metrics, step),
            progress=progress,
            fingerprint=settings_hash([cell_hash(config, cell) for cell in cells]),
            description=block.id, model_info=infos,
        )  # fmt: skip
        for run, summary, seed_paths in zip(runs, summaries, paths, strict=True):
            run.set_tags({"status": summary["status"]})
            run.log_metrics({"steps_per_s": summary["steps_per_s"],
                             "n_params": summary["n_params"]})  # fmt: skip
            run.log_artifact(seed_paths.history)
            run.log_artifact(seed_paths.summary)
    write_manifest(manifest, "train", block,
                   [{"status": s["status"], "diverged_step": s["diverged_step"]}
                    for s in summaries])  # fmt: skip
    return summaries


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
    block: Block | dict,
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
    block = Block.of(block)
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


def collect_metrics_job(
    cell: Cell | dict,
    trajectory_path: str | Path,
    model_path: str | Path,
    history_path: str | Path,
    output: str | Path,
    config: dict,
    *,
    convention: str = "paper",
    repvgg_weights: str = "train",
    threads: int = 1,
) -> pd.DataFrame:
    """Rule ``collect_metrics``: the 14 weight metrics of every checkpoint of one run, in the
    ``analysis.metrics`` convention (``paper`` or ``extended``; trainmap.dynamics.metrics).

    ``repvgg_weights`` (``analysis.repvgg_weights``): a RepVGG run's metrics come from its
    training-time branches (``train``, what the authors' metric loop would see) or from its deploy
    form at every checkpoint (``deploy``; trainmap.reparam.deploy_trajectory), the one weight space a
    RepVGG shares with its plain ablation."""
    from trainmap.dynamics.metrics import collect_run_metrics
    from trainmap.models import build_model
    from trainmap.reparam import RepVGG, deploy_trajectory

    cell = Cell.of(cell)
    torch.set_num_threads(threads)
    saved = load_torch(model_path)
    structure = build_model(saved["arch"], saved["meta"], **saved["model_options"])
    trajectory = load_trajectory(trajectory_path)
    fused = repvgg_weights == "deploy" and isinstance(structure, RepVGG)
    if fused:
        state, structure = deploy_trajectory(trajectory["state"], structure)
        trajectory = {"step": trajectory["step"], "state": state}
    params = {"metrics": convention, "weights": "deploy" if fused else "train"}
    with rule_run(config, "collect_metrics", cell=cell, params=params) as run:
        table = collect_run_metrics(trajectory, structure, pd.read_csv(history_path), convention)
        write_atomic(output, lambda tmp: table.to_csv(tmp, index=False))
        run.log_metrics({"checkpoints": len(table),
                         "skipped_matrices": int(table["skipped_matrices"].sum())})  # fmt: skip
        run.log_artifact(output)
    return table


def collect_metrics_block_job(
    block: Block | dict, run_manifest: str | Path, manifest: str | Path, config: dict,
    *, convention: str = "paper", repvgg_weights: str = "train", threads: int = 1,
) -> None:  # fmt: skip
    """Rule ``collect_metrics`` for a block: the metric table of every cell's trajectory, in the
    ``analysis.metrics`` convention (RepVGG runs: ``analysis.repvgg_weights``)."""
    block = Block.of(block)

    def collect(cell: Cell) -> dict[str, Any]:
        table = collect_metrics_job(
            cell, cell_file(run_manifest, cell, "trajectory.pt"),
            cell_file(run_manifest, cell, "model.pt"), cell_file(run_manifest, cell, "history.csv"),
            seed_dir(manifest, cell) / "metrics.csv", config, convention=convention,
            repvgg_weights=repvgg_weights, threads=threads,
        )  # fmt: skip
        return {"checkpoints": len(table)}

    write_manifest(manifest, "collect_metrics", block,
                   _over_cells(block, f"metrics {block.id}", collect))  # fmt: skip


# --- training maps -----------------------------------------------------------------------------


def _group_inputs(
    cells: list[dict], metrics_paths: list[str], evaluation_paths: list[str], labels: list[str]
) -> tuple[dict[str, pd.DataFrame], Any]:
    """Metric tables and outcomes (convergence step, status) keyed by run label. Tables are read
    strictly (trainmap.dynamics.tables): NaN or Inf metrics only in a run whose evaluation says it
    diverged; a damaged table stops the job naming the file, column, step and the block manifest
    to delete."""
    from trainmap.dynamics.tables import read_metric_table

    outcomes = _group_outcomes(evaluation_paths, labels)

    def rerun_collect_metrics(path: str) -> str:
        manifest = block_manifest_of(path) or Path(path).parent
        return (f"rerun collect_metrics for this block: delete its manifest {manifest} and run "
                "the workflow again")  # fmt: skip

    runs = {
        label: read_metric_table(path, diverged=outcomes.status[label] == "diverged",
                                 fix=rerun_collect_metrics(path))
        for label, path in zip(labels, metrics_paths, strict=True)
    }  # fmt: skip
    return runs, outcomes


def _group_outcomes(evaluation_paths: list[str], labels: list[str]) -> Any:
    """Outcomes (convergence step, status) keyed by run label, from the runs' evaluations."""
    from trainmap.dynamics.pipeline import Outcomes

    evaluations = [load_json(path) for path in evaluation_paths]
    return Outcomes(
        convergence={label: e["convergence_step"] for label, e in zip(labels, evaluations,
                                                                      strict=True)},
        status={label: e["status"] for label, e in zip(labels, evaluations, strict=True)},
    )  # fmt: skip


def _seed_labels(cells: list[dict]) -> list[str]:
    return [f"seed{Cell.of(cell).seed}" for cell in cells]


def _log_figures(run: Any, captions: dict[str, str], out_dir: Path) -> None:
    for name, caption in captions.items():
        run.log_artifact(out_dir / name, "figures")
        run.set_tags({f"caption.{name}": caption})


def fit_hmm_job(
    group: str, cells: list[dict], metrics_paths: list[str], evaluation_paths: list[str],
    settings: dict, out_dir: str | Path, config: dict, *, threads: int = 1,
) -> None:  # fmt: skip
    """Rule ``fit_hmm``: the training-map HMM of one group (task/arch/method) of runs, its
    baselines and its bootstrap over runs (``threads`` parallel processes)."""
    from trainmap.dynamics.pipeline import fit_group

    out_dir = Path(out_dir)
    runs, outcomes = _group_inputs(cells, metrics_paths, evaluation_paths, _seed_labels(cells))
    task = Cell.of(cells[0]).task
    with rule_run(config, "fit_hmm", task=task, params={"analysis": settings, "group": group},
                  config_hash=settings_hash([settings, group])) as run:  # fmt: skip
        captions = fit_group(runs, outcomes, settings, out_dir, title=group, n_jobs=threads)
        meta = load_json(out_dir / "hmm.json")
        bootstrap = load_json(out_dir / "bootstrap.json")
        if meta["selection_at_ceiling"]:
            print(f"warning: {group}: {meta['selection_note']}")
        run.set_tags({"group": group, "n_states": meta["n_states"],
                      "selection_at_ceiling": meta["selection_at_ceiling"]})  # fmt: skip
        run.log_metrics({"n_states": meta["n_states"], "runs": len(runs),
                         "bootstrap_k_same": bootstrap["k_same"]})  # fmt: skip
        _log_figures(run, captions, out_dir)
        for name in ("selection.csv", "baselines.csv", "hmm.json", "bootstrap.json"):
            run.log_artifact(out_dir / name)


def regress_detours_job(
    group: str, cells: list[dict], evaluation_paths: list[str], out_dir: str | Path, config: dict,
    settings: dict | None = None,
) -> None:  # fmt: skip
    """Rule ``regress_detours``: detour states and trajectory dissimilarity of one group (from the
    fitted HMM's states and the runs' convergence steps; the metric tables are not needed). Each
    cell's parent MLflow run gets its state occupancy and detour visits."""
    from trainmap.dynamics.pipeline import regress_group

    out_dir = Path(out_dir)
    outcomes = _group_outcomes(evaluation_paths, _seed_labels(cells))
    with rule_run(config, "regress_detours", task=Cell.of(cells[0]).task, params={"group": group},
                  config_hash=settings_hash([settings, group])) as run:  # fmt: skip
        captions = regress_group(outcomes, out_dir, out_dir, title=group, settings=settings)
        detours = load_json(out_dir / "detours.json")
        run.set_tags({"group": group, "detour_states": detours["detour_states"],
                      "regression": "fitted" if detours["fitted"] else detours["not_fitted"]})  # fmt: skip
        run.log_metrics({key: detours[key] for key in ("r2", "r2_adjusted", "f_pvalue",
                         "dissimilarity") if detours[key] is not None})  # fmt: skip
        _log_figures(run, captions, out_dir)
        run.log_artifact(out_dir / "detours.json")
        run.log_artifact(out_dir / "coefficients.csv")
    from trainmap.dynamics.pipeline import read_states

    states = read_states(out_dir / "states.csv")
    _log_occupancy(config, cells, _seed_labels(cells), states, detours["n_states"],
                   detours["detour_states"], prefix="map")  # fmt: skip


def _log_occupancy(
    config: dict, cells: list[dict], labels: list[str], states: dict, n_states: int,
    detour_states: list[int], prefix: str,
) -> None:  # fmt: skip
    """Each cell's state occupancy and detour visits, on its MLflow parent run."""
    import numpy as np

    from trainmap.tracking import log_cell_metrics

    metrics_by_cell = {}
    for cell, label in zip(cells, labels, strict=True):
        sequence = states[label]
        occupancy = np.bincount(sequence, minlength=n_states) / len(sequence)
        in_detours = np.isin(sequence, detour_states)
        metrics = {f"{prefix}.occupancy.state{k}": occupancy[k] for k in range(n_states)}
        metrics |= {f"{prefix}.detour_share": float(in_detours.mean()),
                    f"{prefix}.detour_visited": float(in_detours.any()),
                    f"{prefix}.n_states": float(n_states)}  # fmt: skip
        metrics_by_cell[Cell.of(cell)] = metrics
    log_cell_metrics(config, metrics_by_cell)


def training_map_job(
    group: str, cells: list[dict], metrics_paths: list[str], evaluation_paths: list[str],
    out_dir: str | Path, config: dict,
) -> None:  # fmt: skip
    """Rule ``training_map``: the map of one fitted group, detour states highlighted."""
    from trainmap.dynamics.pipeline import map_group

    out_dir = Path(out_dir)
    runs, outcomes = _group_inputs(cells, metrics_paths, evaluation_paths, _seed_labels(cells))
    detours = load_json(out_dir / "detours.json")["detour_states"]
    with rule_run(config, "training_map", task=Cell.of(cells[0]).task, params={"group": group},
                  config_hash=settings_hash(group)) as run:  # fmt: skip
        captions = map_group(runs, outcomes, out_dir, out_dir, title=group, detour_states=detours)
        run.set_tags({"group": group})
        _log_figures(run, captions, out_dir)
        run.log_artifact(out_dir / "map.svg", "figures")
        run.log_artifact(out_dir / "map.json")


def joint_comparison_job(
    name: str, cells: list[dict], labels: list[str], metrics_paths: list[str],
    evaluation_paths: list[str], settings: dict, out_dir: str | Path, config: dict, *,
    threads: int = 1,
) -> None:  # fmt: skip
    """Rule ``joint_comparison``: one shared map for the runs of several methods/archs, and the
    verdict table; each cell's parent MLflow run gets its occupancy of the shared states."""
    from trainmap.dynamics.pipeline import joint_group

    out_dir = Path(out_dir)
    run_ids = [f"{label}/seed{Cell.of(cell).seed}" for label, cell in zip(labels, cells,
                                                                          strict=True)]  # fmt: skip
    runs, outcomes = _group_inputs(cells, metrics_paths, evaluation_paths, run_ids)
    groups = dict(zip(run_ids, labels, strict=True))
    with rule_run(config, "joint_comparison", task=Cell.of(cells[0]).task,
                  params={"analysis": settings, "joint": name},
                  config_hash=settings_hash([settings, name, run_ids])) as run:  # fmt: skip
        captions = joint_group(runs, groups, outcomes, settings, out_dir, title=name,
                               n_jobs=threads)  # fmt: skip
        summary = load_json(out_dir / "joint.json")
        run.set_tags({"joint": name, "detour_states": summary["detour_states"]})
        for group, entry in summary["groups"].items():
            run.log_metrics({f"{group}.detour_visit_rate": entry["detour_visit_rate"]})
        _log_figures(run, captions, out_dir)
        for artifact in ("joint.json", "regression.csv", "verdicts.csv", "verdicts.md"):
            run.log_artifact(out_dir / artifact)
    from trainmap.dynamics.pipeline import read_states

    _log_occupancy(config, cells, run_ids, read_states(out_dir / "states.csv"),
                   summary["n_states"], summary["detour_states"], prefix=f"joint.{name}")  # fmt: skip


# --- method stages -----------------------------------------------------------------------------


def gradinit_job(
    cell: Cell | dict,
    data_path: str | Path | TaskData,
    model_options: dict[str, Any],
    settings: dict[str, Any],
    options: dict[str, Any],
    outputs: dict[str, str],
    config: dict,
    *,
    threads: int = 1,
    progress: bool = True,
) -> dict[str, Any]:
    """Rule ``gradinit``: rescale the cell's Kaiming-initialised model by GradInit or MetaInit.

    ``outputs`` names the files: model, scales, history, diagnostics, diagnostics_plot,
    history_plot. ``train`` then starts from ``outputs["model"]``.
    """
    from trainmap.checkpoints import save_dense
    from trainmap.gradinit import (
        check_settings,
        diagnostics_table,
        draws_for,
        layer_diagnostics,
        plot_diagnostics,
        plot_history,
        run_gradinit,
    )
    from trainmap.train import derive_seed

    cell = Cell.of(cell)
    torch.set_num_threads(threads)
    cfg = check_settings(settings)
    data = _task_data(data_path)
    model = build_cell_model(cell.arch, cell.method, cell.seed, data.meta, model_options)
    objective = options["objective"]
    diagnostic_seed = derive_seed(cell.seed, "gradinit-diagnostics")
    probe = draws_for(data, cfg["batch_size"], diagnostic_seed)
    with rule_run(
        config, "gradinit", cell=cell, params={"gradinit": cfg, "objective": objective}
    ) as run:
        before = layer_diagnostics(model, probe(), cfg["diagnostic_batches"])
        result = run_gradinit(model, data, cfg, derive_seed(cell.seed, "gradinit"), objective,
                              progress=progress)  # fmt: skip
        after = layer_diagnostics(model, probe(), cfg["diagnostic_batches"])
        save_dense(model, outputs["model"], arch=cell.arch, method=cell.method, seed=cell.seed,
                   model_options=model_options, meta=data.meta)  # fmt: skip
        history = result.history
        summary = {
            "objective": objective,
            "scales": result.scales,
            "skipped": result.skipped,
            "iterations": len(history),
            "constraint_steps": result.constraint_steps,
            "non_finite_steps": int((~history["finite"]).sum()),
            "initial_grad_norm": float(history["grad_norm"].iloc[0]),
            "final_grad_norm": float(history["grad_norm"].iloc[-1]),
        }
        save_json(summary, outputs["scales"])
        write_atomic(outputs["history"], lambda tmp: history.to_csv(tmp, index=False))
        table = diagnostics_table(before, after, result.scales)
        write_atomic(outputs["diagnostics"], lambda tmp: table.to_csv(tmp, index=False))
        captions = {
            outputs["diagnostics_plot"]: plot_diagnostics(table, outputs["diagnostics_plot"],
                                                          title=f"{objective}: {cell.id}"),
            outputs["history_plot"]: plot_history(history, cfg["gamma"], outputs["history_plot"],
                                                  title=f"{objective}: {cell.id}"),
        }  # fmt: skip
        for row in history.itertuples():
            run.log_metrics({"grad_norm": row.grad_norm, "objective": row.objective}, row.iteration)
        run.log_metrics({key: summary[key] for key in ("constraint_steps", "initial_grad_norm",
                                                       "final_grad_norm")})  # fmt: skip
        for path, caption in captions.items():
            run.log_artifact(path, "figures")
            run.set_tags({f"caption.{Path(path).name}": caption})
        for name in ("scales", "history", "diagnostics"):
            run.log_artifact(outputs[name])
    return summary


GRADINIT_FILES = {"model": "init.pt", "scales": "scales.json", "history": "history.csv",
                  "diagnostics": "diagnostics.csv", "diagnostics_plot": "diagnostics.png",
                  "history_plot": "history.png"}  # fmt: skip


def gradinit_block_job(
    block: Block | dict,
    data_path: str | Path,
    model_options: dict[str, Any],
    settings: dict[str, Any],
    options: dict[str, Any],
    manifest: str | Path,
    block_plot: str | Path,
    config: dict,
    *,
    threads: int = 1,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Rule ``gradinit`` for a block: :func:`gradinit_job` of every cell (one seed at a time), and
    one figure of the block's learned scales and gradient norms (the report's)."""
    from trainmap.gradinit import check_settings, plot_block

    block = Block.of(block)
    data = load_task_data(data_path)  # once for every cell

    def rescale(cell: Cell) -> dict[str, Any]:
        outputs = {
            key: str(seed_dir(manifest, cell) / name) for key, name in GRADINIT_FILES.items()
        }
        return gradinit_job(cell, data, model_options, settings, options, outputs, config,
                            threads=threads, progress=False)  # fmt: skip

    summaries = _over_cells(block, f"{options['objective']} {block.id}", rescale)
    histories = {f"seed{cell.seed}": pd.read_csv(seed_dir(manifest, cell) / "history.csv")
                 for cell in block.cells}  # fmt: skip
    plot_block(summaries, histories, check_settings(settings)["gamma"], block_plot,
               title=f"{options['objective']}: {block.id}")  # fmt: skip
    write_manifest(manifest, "gradinit", block,
                   [{key: s[key] for key in ("constraint_steps", "initial_grad_norm",
                                             "final_grad_norm")} for s in summaries])  # fmt: skip
    return summaries


def reparam_job(
    cell: Cell | dict,
    model_path: str | Path,
    data_path: str | Path | TaskData,
    deploy_path: str | Path,
    check_path: str | Path,
    config: dict,
    *,
    threads: int = 1,
) -> dict[str, Any]:
    """Rule ``reparam``: fuse a trained RepVGG into its deploy form and check it on the test set."""
    from trainmap.reparam import check_equivalence, save_deploy, to_deploy

    cell = Cell.of(cell)
    torch.set_num_threads(threads)
    saved = load_torch(model_path)
    trained = model_from_checkpoint(saved)
    info = {key: saved[key] for key in ("arch", "model_options", "meta", "method", "seed")}
    with rule_run(config, "reparam", cell=cell) as run:
        deploy = to_deploy(trained)
        save_deploy(deploy, deploy_path, **info)
        data = _task_data(data_path)
        check = check_equivalence(trained, load_model(deploy_path), data.x_test)
        check |= {
            "train_params": count_parameters(trained),
            "deploy_params": count_parameters(deploy),
        }
        save_json(check, check_path)
        run.log_metrics({key: float(check[key]) for key in ("max_abs_logit_diff",
                         "predictions_identical", "train_params", "deploy_params")})  # fmt: skip
        run.log_artifact(check_path)
    if not check["predictions_identical"]:
        print(f"warning: deploy predictions differ on {cell.id}: {check}")
    return check


def reparam_block_job(
    block: Block | dict, train_manifest: str | Path, data_path: str | Path,
    manifest: str | Path, config: dict, *, threads: int = 1,
) -> None:  # fmt: skip
    """Rule ``reparam`` for a block: :func:`reparam_job` of every cell."""
    block = Block.of(block)
    data = load_task_data(data_path)  # once for every cell

    def fuse(cell: Cell) -> dict[str, Any]:
        out = seed_dir(manifest, cell)
        check = reparam_job(cell, cell_file(train_manifest, cell, "model.pt"), data,
                            out / "deploy.pt", out / "equivalence.json", config, threads=threads)  # fmt: skip
        return {"predictions_identical": bool(check["predictions_identical"])}

    write_manifest(manifest, "reparam", block, _over_cells(block, f"reparam {block.id}", fuse))


def sparse_block_job(
    block: Block | dict,
    teacher_manifest: str | Path,
    data_path: str | Path,
    settings: dict[str, Any],
    options: dict[str, Any],
    manifest: str | Path,
    block_plot: str | Path,
    config: dict,
    *,
    threads: int = 1,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Rule ``sparse_retrain``: N:M sparsity for a block of seeds, each from its own dense teacher
    (the kaiming cell of the same seed) by the block's sparse method, retrained as one vectorised
    model; per seed the sparse run's files, its flip-rate figure and an MLflow run."""
    from trainmap.sparse import check_settings, plot_flip_rates, run_sparse_block

    block = Block.of(block)
    cells = block.cells
    torch.set_num_threads(threads)
    cfg = check_settings(settings)
    teacher_paths = [cell_file(teacher_manifest, cell, "model.pt") for cell in cells]
    saved = [load_torch(path) for path in teacher_paths]
    teachers = [model_from_checkpoint(checkpoint) for checkpoint in saved]
    model_options = saved[0]["model_options"]
    data = load_task_data(data_path)
    infos = [{"arch": c.arch, "method": c.method, "seed": c.seed, "model_options": model_options,
              "meta": data.meta} for c in cells]  # fmt: skip
    out_dirs = [seed_dir(manifest, cell) for cell in cells]
    params = {"sparse": cfg, "method_options": options, "seed_block": len(cells)}
    with ExitStack() as stack:
        runs = [stack.enter_context(rule_run(config, "sparse_retrain", cell=c, params=params))
                for c in cells]  # fmt: skip
        summaries = run_sparse_block(
            teachers, data, options, cfg, list(block.seeds), out_dirs,
            resume_path=Path(manifest).with_suffix(".resume.pt"),
            log_metrics=lambda index, metrics, step: runs[index].log_metrics(metrics, step),
            progress=progress,
            fingerprint=settings_hash([cell_hash(config, cell) for cell in cells]),
            description=block.id, model_info=infos,
        )  # fmt: skip
        flips = {}
        for cell, run, summary, out in zip(cells, runs, summaries, out_dirs, strict=True):
            flips[f"seed{cell.seed}"] = pd.read_csv(out / "flips.csv")
            caption = plot_flip_rates({cell.method: flips[f"seed{cell.seed}"]},
                                      out / "flips.png", title=cell.id)  # fmt: skip
            run.set_tags({"status": summary["status"], "nm_valid": summary["nm_valid"],
                          "caption.flips.png": caption})  # fmt: skip
            for name in ("history.csv", "train.json", "flips.csv"):
                run.log_artifact(out / name)
            run.log_artifact(out / "flips.png", "figures")
    plot_flip_rates(flips, block_plot, title=f"{block.id}: mask flips per seed")
    invalid = [cell.id for cell, s in zip(cells, summaries, strict=True) if not s["nm_valid"]]
    if invalid:
        raise RuntimeError(f"{invalid}: the sparse model is not {cfg['n']}:{cfg['m']}")
    write_manifest(manifest, "sparse_retrain", block,
                   [{"status": s["status"], "diverged_step": s["diverged_step"]}
                    for s in summaries])  # fmt: skip
    return summaries


def quantize_job(
    cell: Cell | dict,
    model_path: str | Path,
    data_path: str | Path | TaskData,
    schemes: list[str],
    manifest_path: str | Path,
    config: dict,
    *,
    calibration_batch: int = 256,
    threads: int = 1,
) -> dict[str, Any]:
    """Rule ``quantize``: every scheme's quantised checkpoint and packed file of the cell's final
    model; the manifest lists the forms ``evaluate`` measures (bytes on disk = the packed file)."""
    from trainmap.quantize import quantize_model, save_packed, save_quantized

    cell = Cell.of(cell)
    torch.set_num_threads(threads)
    source = load_torch(model_path)
    model = model_from_checkpoint(source)
    data = _task_data(data_path)
    calibration = data.x_train[:calibration_batch]
    out_dir = Path(manifest_path).parent
    forms, notes = [], {}
    with rule_run(config, "quantize", cell=cell, params={"schemes": schemes}) as run:
        for scheme in schemes:
            quantized, notes[scheme] = quantize_model(model, scheme, calibration)
            save_quantized(quantized, out_dir / f"{scheme}.pt", scheme, source)
            sizes = save_packed(quantized, out_dir / f"{scheme}.packed")
            forms.append({"form": scheme, "model_path": str(out_dir / f"{scheme}.pt"),
                          "bytes_path": str(out_dir / f"{scheme}.packed")})  # fmt: skip
            notes[scheme] = {"layers": notes[scheme], "packed_bytes": sizes}
            run.log_metrics({f"{scheme}.{key}": value for key, value in sizes.items()})
        save_json({"source": str(model_path), "forms": forms, "notes": notes}, manifest_path)
        run.log_artifact(manifest_path)
    return {"forms": forms}


def quantize_block_job(
    block: Block | dict, run_manifest: str | Path, data_path: str | Path, schemes: list[str],
    manifest: str | Path, config: dict, *, threads: int = 1,
) -> None:  # fmt: skip
    """Rule ``quantize`` for a block: :func:`quantize_job` of every cell."""
    block = Block.of(block)
    data = load_task_data(data_path)  # once for every cell

    def quantize(cell: Cell) -> dict[str, Any]:
        quantize_job(cell, cell_file(run_manifest, cell, "model.pt"), data, schemes,
                     seed_dir(manifest, cell) / "quantize.json", config, threads=threads)  # fmt: skip
        return {"schemes": list(schemes)}

    write_manifest(manifest, "quantize", block,
                   _over_cells(block, f"quantize {block.id}", quantize))  # fmt: skip


def flip_rates_job(
    cells: list[dict], flips_paths: list[str], table_path: str | Path, plot_path: str | Path,
    config: dict,
) -> pd.DataFrame:  # fmt: skip
    """Rule ``flip_rates``: every sparse retraining's mask flips in one table, and the mean flip
    rate and initial flip rate per method against step (AST fig. 4: static vs annealed SR-STE)."""
    from trainmap.sparse import plot_flip_rates

    frames = []
    for cell, path in zip(cells, flips_paths, strict=True):
        flips = pd.read_csv(path)
        if len(flips):
            frames.append(flips.assign(**Cell.of(cell).to_dict()))
    columns = ["task", "arch", "method", "seed", "step", "flip_rate", "initial_flip_rate"]
    table = (
        pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)
    )
    with rule_run(config, "flip_rates", params={"runs": len(cells)}, config_hash="grid") as run:
        write_atomic(table_path, lambda tmp: table.to_csv(tmp, index=False))
        means = {
            f"{task}/{arch}/{method}": group.groupby("step", as_index=False)[
                ["flip_rate", "initial_flip_rate"]].mean()
            for (task, arch, method), group in table.groupby(["task", "arch", "method"])
        }  # fmt: skip
        caption = plot_flip_rates(means, plot_path, title="N:M mask flips, mean over seeds")
        run.set_tags({"caption.flip_rates.png": caption})
        run.log_artifact(table_path)
        run.log_artifact(plot_path, "figures")
    return table
