"""The analysis rules: training maps, detour regressions and joint comparisons (trainmap.dynamics)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from trainmap.grid import Cell
from trainmap.io import (
    block_manifest_of,
    load_json,
)
from trainmap.jobs.common import settings_hash
from trainmap.tracking import rule_run

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
