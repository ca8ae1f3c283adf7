"""The analysis rules: training maps, detour regressions and joint comparisons (trainmap.dynamics).

Each job reads its inputs, runs one step of :mod:`trainmap.dynamics.pipeline`, which writes its
result, and logs to MLflow from that result object (never from the files the step just wrote). A
rule after ``fit_hmm`` reads what ``fit_hmm`` wrote (its input files). ``tracking`` is
:func:`trainmap.tracking.tracking_settings` of the workflow's config; ``cell_hashes`` (``{cell id:
cell hash}``, a rule param) names the parent run of each cell whose metrics a job logs.
``settings`` is the analysis settings as the rule passes them (plain data, so that Snakemake
compares them as text): a job builds its
:class:`~trainmap.dynamics.maps.settings.AnalysisSettings` from them once, and records what they
say (:meth:`~trainmap.dynamics.maps.settings.AnalysisSettings.as_dict`) in MLflow and in its
settings hash.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainmap.dynamics.maps.settings import AnalysisSettings
from trainmap.dynamics.metrics.tables import read_metric_table
from trainmap.dynamics.pipeline import (
    FittedMap,
    Outcomes,
    analysis_runs,
    fit_group,
    joint_group,
    map_group,
    regress_group,
)
from trainmap.dynamics.verdicts.adaptive import (
    adaptive_trace,
    map_changes,
    present_final_round,
    round_decision,
)
from trainmap.dynamics.verdicts.certainty import BootstrapResult
from trainmap.dynamics.verdicts.compare import answer_lines, verdict_text
from trainmap.dynamics.verdicts.stability_results import MapStability
from trainmap.dynamics.verdicts.timecourse import architecture_note
from trainmap.faults import fault_point
from trainmap.grid import Cell
from trainmap.io import block_manifest_of, load_json, save_json
from trainmap.jobs.common import settings_hash
from trainmap.lineage import check_files
from trainmap.seed_groups import log_group, log_joint
from trainmap.tracking import RuleRun, log_cell_metrics, rule_run


def read_group_runs(
    metrics_paths: list[str], evaluation_paths: list[str], labels: list[str]
) -> tuple[dict[str, pd.DataFrame], Outcomes]:
    """Metric tables and outcomes (convergence step, status) keyed by run label. Tables are read
    strictly (trainmap.dynamics.metrics.tables): NaN or Inf metrics only in a run whose evaluation says it
    diverged; a damaged table stops the job naming the file, column, step and the block manifest
    to delete. Each table must be the one its block's manifest records, made from the runs that
    sit upstream now (trainmap.lineage), or the job stops before fitting anything."""
    check_files(metrics_paths)
    outcomes = group_outcomes(evaluation_paths, labels)

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


def rows_of_fit(
    runs: dict[str, pd.DataFrame], outcomes: Outcomes, states_csv: str | Path
) -> tuple[dict[str, pd.DataFrame], Outcomes]:
    """The runs and checkpoints a fitted map was made from (its ``states.csv``: run, step), so a
    later rule sees what the fit saw (:func:`trainmap.dynamics.pipeline.analysis_runs`)."""
    states = pd.read_csv(states_csv, usecols=["run", "step"], dtype={"run": str})
    steps = {run: group["step"].to_numpy() for run, group in states.groupby("run", sort=False)}
    cut = {run: table if len(table) == len(steps[run]) else
           table[table["step"].isin(steps[run])].reset_index(drop=True)
           for run, table in runs.items() if run in steps}  # fmt: skip
    return cut, Outcomes(
        {run: outcomes.convergence[run] for run in cut}, {run: outcomes.status[run] for run in cut}
    )


def joint_run_ids(labels: list[str], cells: list[dict]) -> list[str]:
    """A joint comparison's run ids: ``<label>/seed<seed>`` per cell (labels:
    :func:`trainmap.grid.joint_labels`)."""
    return [f"{label}/seed{Cell.of(cell).seed}" for label, cell in zip(labels, cells, strict=True)]


def group_outcomes(evaluation_paths: list[str], labels: list[str]) -> Outcomes:
    """Outcomes (convergence step, status) keyed by run label, from the runs' evaluations (each
    checked against its block's manifest: trainmap.lineage). A run whose record says ``"curve":
    null`` (an external set without a curve or threshold) has no convergence criterion, and
    then no run of the map has one (``no_curve`` names them)."""
    check_files(evaluation_paths)
    evaluations = [load_json(path) for path in evaluation_paths]
    without = [label for label, e in zip(labels, evaluations, strict=True)
               if "curve" in e and e["curve"] is None]  # fmt: skip
    shown = ", ".join(without[:3]) + (", ..." if len(without) > 3 else "")
    return Outcomes(
        convergence={label: e["convergence_step"] for label, e in zip(labels, evaluations,
                                                                      strict=True)},
        status={label: e["status"] for label, e in zip(labels, evaluations, strict=True)},
        no_curve=(f"{len(without)} of {len(labels)} runs have no convergence criterion (a curve "
                  f"and a threshold): {shown}" if without else ""),
    )  # fmt: skip


def seed_labels(cells: list[dict]) -> list[str]:
    """A group's run labels, ``seed<seed>`` per cell (one arch and method: the seed names a run)."""
    return [f"seed{Cell.of(cell).seed}" for cell in cells]


def _log_figures(run: RuleRun, captions: Mapping[str, str], out_dir: Path) -> None:
    for name, caption in captions.items():
        run.log_artifact(out_dir / name, "figures")
        run.set_tags({f"caption.{name}": caption})


def _log_stability(run: RuleRun, stability: MapStability) -> None:
    """The stability line as a tag, the seed count it calls sufficient as a metric (when any)."""
    run.set_tags({"stability": stability.line})
    sufficient = stability.curve.sufficient_n if stability.curve is not None else None
    if sufficient is not None:
        run.log_metrics({"stability_sufficient_n": sufficient})


def verdict_tags(verdicts: pd.DataFrame) -> dict[str, str]:
    """Each verdict's words (:func:`~trainmap.dynamics.verdicts.compare.verdict_text`, as in
    ``verdicts.md``) as an MLflow tag, ``verdict/<second> vs <first>/<quantity>`` (the characters
    MLflow refuses in a key replaced by '_'); findings start with 'finding: '."""
    tags = {}
    for row in verdicts.to_dict(orient="records"):
        key = re.sub(r"[^\w\-. :/]", "_", f"verdict/{row['second']} vs {row['first']}/"
                                             f"{row['quantity']}")  # fmt: skip
        tags[key] = verdict_text(row)
    return tags


def _log_occupancy(
    tracking: Mapping[str, str], cell_hashes: Mapping[str, str], cells: list[dict],
    labels: list[str], states: Mapping[str, np.ndarray], n_states: int, detour_states: list[int],
    prefix: str,
) -> None:  # fmt: skip
    """Each cell's state occupancy and detour visits, on its MLflow parent run."""
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
    log_cell_metrics(tracking, metrics_by_cell, cell_hashes)


def fit_hmm_job(
    group: str, cells: list[dict], metrics_paths: list[str], evaluation_paths: list[str],
    settings: Mapping[str, Any], out_dir: str | Path, tracking: Mapping[str, str], *,
    threads: int = 1,
) -> None:  # fmt: skip
    """Rule ``fit_hmm``: the training-map HMM of one group (task/arch/method) of runs, its
    baselines and its bootstrap over runs (``threads`` parallel processes)."""
    out_dir = Path(out_dir)
    analysis = AnalysisSettings.of(settings)
    recorded = analysis.as_dict()
    runs, outcomes = read_group_runs(metrics_paths, evaluation_paths, seed_labels(cells))
    runs, outcomes = analysis_runs(runs, outcomes, analysis)
    task = Cell.of(cells[0]).task
    with rule_run(tracking, "fit_hmm", task=task, params={"analysis": recorded, "group": group},
                  config_hash=settings_hash([recorded, group]), name=f"fit_hmm {group}") as run:  # fmt: skip
        fit = fit_group(runs, outcomes, analysis, out_dir, title=group, n_jobs=threads)
        fault_point("analysis")  # the fault tier's kill point: the map written, the run open
        hmm = fit.hmm
        if hmm.at_ceiling_:
            print(f"warning: {group}: {hmm.ceiling_message()}")
        run.set_tags({"group": group, "n_states": hmm.n_states_,
                      "selection_at_ceiling": hmm.at_ceiling_})  # fmt: skip
        run.log_metrics({"n_states": hmm.n_states_, "runs": len(runs),
                         "bootstrap_k_same": fit.bootstrap.k_same})  # fmt: skip
        _log_stability(run, fit.stability)
        _log_figures(run, fit.captions, out_dir)
        seeds = log_group(tracking, group, runs, outcomes.status,
                          stability_figure=out_dir / "stability.png",
                          config_hash=settings_hash([recorded, group]))  # fmt: skip
        run.set_tags({"seed_group_run": seeds})
        for name in ("selection.csv", "baselines.csv", "hmm.json", "bootstrap.json",
                     "stability.json"):  # fmt: skip
            run.log_artifact(out_dir / name)


def regress_detours_job(
    group: str, cells: list[dict], evaluation_paths: list[str], out_dir: str | Path,
    tracking: Mapping[str, str], cell_hashes: Mapping[str, str], settings: Mapping[str, Any],
) -> None:  # fmt: skip
    """Rule ``regress_detours``: detour states and trajectory dissimilarity of one group, from the
    fit ``fit_hmm`` wrote (its model, decoded states and bootstrap) and the runs' convergence steps
    (the metric tables are not needed). Each cell's parent MLflow run gets its state occupancy and
    detour visits."""
    out_dir = Path(out_dir)
    analysis = AnalysisSettings.of(settings)
    labels = seed_labels(cells)
    outcomes = group_outcomes(evaluation_paths, labels)
    fit = FittedMap.load(out_dir)
    bootstrap = BootstrapResult.load(out_dir / "bootstrap.json")
    with rule_run(tracking, "regress_detours", task=Cell.of(cells[0]).task,
                  params={"group": group}, config_hash=settings_hash([analysis.as_dict(), group]),
                  name=f"regress_detours {group}") as run:  # fmt: skip
        result = regress_group(fit, outcomes, analysis, bootstrap=bootstrap, out_dir=out_dir,
                               title=group)  # fmt: skip
        regression = result.regression
        run.set_tags({"group": group, "detour_states": result.detour_states,
                      "regression": "fitted" if regression.fitted else regression.not_fitted})  # fmt: skip
        run.log_metrics({key: result.summary[key] for key in ("r2", "r2_adjusted", "f_pvalue",
                         "dissimilarity") if result.summary[key] is not None})  # fmt: skip
        _log_figures(run, result.captions, out_dir)
        run.log_artifact(out_dir / "detours.json")
        run.log_artifact(out_dir / "coefficients.csv")
    _log_occupancy(tracking, cell_hashes, cells, labels, fit.states, fit.hmm.n_states_,
                   result.detour_states, prefix="map")  # fmt: skip


def training_map_job(
    group: str, cells: list[dict], metrics_paths: list[str], evaluation_paths: list[str],
    out_dir: str | Path, tracking: Mapping[str, str],
) -> None:  # fmt: skip
    """Rule ``training_map``: the map of one fitted group, its detour states (``detours.json`` of
    rule ``regress_detours``) highlighted."""
    out_dir = Path(out_dir)
    runs, outcomes = read_group_runs(metrics_paths, evaluation_paths, seed_labels(cells))
    fit = FittedMap.load(out_dir)
    runs, outcomes = rows_of_fit(runs, outcomes, out_dir / "states.csv")
    detours = load_json(out_dir / "detours.json")["detour_states"]
    with rule_run(tracking, "training_map", task=Cell.of(cells[0]).task, params={"group": group},
                  config_hash=settings_hash(group), name=f"training_map {group}") as run:  # fmt: skip
        result = map_group(fit, runs, outcomes, detour_states=detours, out_dir=out_dir,
                           title=group)  # fmt: skip
        run.set_tags({"group": group})
        _log_figures(run, result.captions, out_dir)
        run.log_artifact(out_dir / "map.svg", "figures")
        run.log_artifact(out_dir / "map.json")


def joint_comparison_job(
    name: str, cells: list[dict], labels: list[str], metrics_paths: list[str],
    evaluation_paths: list[str], settings: Mapping[str, Any], out_dir: str | Path,
    tracking: Mapping[str, str], cell_hashes: Mapping[str, str], *, threads: int = 1,
    external: list[dict] | None = None, adaptive_round: Mapping[str, Any] | None = None,
) -> None:  # fmt: skip
    """Rule ``joint_comparison``: one shared map for the runs of several methods/archs, and the
    verdict table; each cell's parent MLflow run gets its occupancy of the shared states.
    ``external``: runs of external sets pooled beside the cells (``{"set", "run", "metrics",
    "evaluation"}`` each; rule ``external_metrics`` wrote their tables), grouped by set.
    ``adaptive_round`` (checkpoint ``joint_round``): this is one round of an adaptive comparison;
    its decision goes to ``round.json`` (:func:`trainmap.dynamics.verdicts.adaptive.round_decision`)."""
    out_dir = Path(out_dir)
    analysis = AnalysisSettings.of(settings)
    recorded = analysis.as_dict()
    external = external or []
    run_ids = joint_run_ids(labels, cells)
    own_ids = list(run_ids)
    run_ids += [f"{run['set']}/{run['run']}" for run in external]
    labels = [*labels, *(run["set"] for run in external)]
    metrics_paths = [*metrics_paths, *(run["metrics"] for run in external)]
    evaluation_paths = [*evaluation_paths, *(run["evaluation"] for run in external)]
    runs, outcomes = read_group_runs(metrics_paths, evaluation_paths, run_ids)
    runs, outcomes = analysis_runs(runs, outcomes, analysis)
    groups = {run: label for run, label in zip(run_ids, labels, strict=True) if run in runs}
    task = Cell.of(cells[0]).task if cells else "external"
    with rule_run(tracking, "joint_comparison", task=task,
                  params={"analysis": recorded, "joint": name},
                  config_hash=settings_hash([recorded, name, run_ids]),
                  name=f"joint {name}" + (f" round {adaptive_round['round']}"
                                          if adaptive_round is not None else "")) as run:  # fmt: skip
        architectures = [Cell.of(cell).arch for cell in cells]
        note = architecture_note(architectures, analysis.repvgg_weights)
        result = joint_group(runs, groups, outcomes, analysis, out_dir, title=name,
                             n_jobs=threads, notes=[note])  # fmt: skip
        run.set_tags({"joint": name, "detour_states": result.detour_states})
        _log_stability(run, result.stability)
        run.set_tags(verdict_tags(result.comparison.verdicts))
        # the run page shows its description first: the answer in words, start before path
        run.set_tags({"mlflow.note.content": "\n\n".join(
            [f"# {name}", *answer_lines(result.comparison.verdicts),
             "Every verdict with its interval and label: the artifact verdicts.md."])})  # fmt: skip
        for group, rate in result.comparison.visit_rates.items():
            run.log_metrics({f"{group}.detour_visit_rate": rate})
        _log_figures(run, result.captions, out_dir)
        seeds = log_joint(tracking, name, runs, groups, outcomes.status, task=task,
                          stability_figure=out_dir / "stability.png",
                          config_hash=settings_hash([recorded, name, run_ids]),
                          extra_tags=adaptive_round and {"adaptive_round": adaptive_round["round"]},
                          comparison_run_id=run.run_id)  # fmt: skip
        run.set_tags({"seed_group_run": seeds})
        for artifact in ("joint.json", "regression.csv", "verdicts.csv", "verdicts.md",
                         "verdicts.html", "stability.json"):  # fmt: skip
            run.log_artifact(out_dir / artifact)
        if adaptive_round is not None:
            decision = round_decision(result.stability, adaptive_round)
            save_json(decision, out_dir / "round.json")
            run.set_tags({"adaptive_round": decision["round"], "adaptive_stop": decision["stop"],
                          "adaptive_reason": decision["reason"]})  # fmt: skip
            run.log_artifact(out_dir / "round.json")
    _log_occupancy(tracking, cell_hashes, cells, own_ids, result.states, result.hmm.n_states_,
                   result.detour_states, prefix=f"joint.{name}")  # fmt: skip


def adaptive_rounds_job(decisions: list[str], trace_path: str | Path) -> None:
    """Rule ``adaptive_rounds``: the trace of an adaptive comparison's rounds (``adaptive.json``:
    :func:`trainmap.dynamics.verdicts.adaptive.adaptive_trace` and the rounds' decision files)."""
    trace = adaptive_trace([load_json(path) for path in decisions])
    changes = map_changes([Path(path).parent for path in decisions])
    for entry, change in zip(trace["rounds"], changes, strict=True):
        entry |= change
    save_json(trace | {"decisions": [str(path) for path in decisions]}, trace_path)


def adaptive_joint_job(
    name: str, trace_path: str, out_dir: str | Path, tracking: Mapping[str, str]
) -> None:
    """Rule ``joint_comparison`` of an adaptive comparison: its last round's files with the trace
    of its rounds (:func:`trainmap.dynamics.verdicts.adaptive.present_final_round`); an MLflow run with the
    final seed count and why it stopped."""
    out_dir = Path(out_dir)
    trace = load_json(trace_path)
    with rule_run(tracking, "joint_comparison", task=trace["task"],
                  params={"joint": name, "adaptive": {k: trace[k] for k in ("step", "max")}},
                  config_hash=settings_hash([name, trace["decisions"]]),
                  name=f"joint {name}") as run:  # fmt: skip
        present_final_round(trace, out_dir)
        run.set_tags({"joint": name, "adaptive_rounds": trace["final_round"],
                      "adaptive_stopped_because": trace["stopped_because"],
                      "stability": trace["rounds"][-1]["line"]})  # fmt: skip
        run.log_metrics({"seeds_per_method": trace["seeds_per_method"],
                         "adaptive_rounds": trace["final_round"]})  # fmt: skip
        for artifact in ("joint.json", "verdicts.md", "verdicts.html", "stability.json",
                         "stability.png"):  # fmt: skip
            run.log_artifact(out_dir / artifact)
