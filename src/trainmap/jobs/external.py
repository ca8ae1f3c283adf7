"""The external rules: metrics and a training map of runs trainmap did not train.

``external_metrics`` reads one set's run directories (:mod:`trainmap.dynamics.external`) and writes,
per run, ``runs/<run>/metrics.csv`` (the format of ``collect_metrics``) and ``evaluation.json``
(convergence step and status, as ``evaluate`` writes them for the grid's own runs), so that the
analysis reads an external run as it reads its own. ``external_map`` fits the set's map through the
same pipeline steps as a group map (:mod:`trainmap.dynamics.pipeline`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from trainmap.dynamics.external import external_run_metrics, read_external_run
from trainmap.dynamics.pipeline import map_runs
from trainmap.dynamics.tables import read_metric_table
from trainmap.evaluation import convergence_step
from trainmap.io import save_json, write_atomic
from trainmap.jobs.analysis import group_outcomes
from trainmap.jobs.common import settings_hash
from trainmap.tracking import rule_run


def external_metrics_job(
    name: str, runs: Mapping[str, str], out_dir: str | Path, manifest: str | Path,
    tracking: Mapping[str, str], *, threshold: float, heads: int | None = None,
    evaluation: str = "evaluation.csv", convention: str = "paper", arch: dict | None = None,
    accuracy_key: str | None = None,
) -> None:  # fmt: skip
    """Rule ``external_metrics``: every run of external set ``name`` (``runs``: run id -> its
    directory) read and checked first, then its metric table and evaluation record written; the
    manifest last. ``accuracy_key``: a Hugging Face Trainer run's accuracy key. ``arch``
    (``{"arch", "meta", "options"}``) reads the state dicts through that architecture's model
    instead of by name and shape."""
    out_dir = Path(out_dir)
    model = _model(arch)
    read = {run: read_external_run(path, evaluation, accuracy_key) for run, path in runs.items()}
    params = {"set": name, "runs": len(runs), "threshold": threshold, "heads": heads,
              "metrics": convention, "arch": (arch or {}).get("arch")}  # fmt: skip
    with rule_run(tracking, "external_metrics", task=f"external/{name}", params=params,
                  config_hash=settings_hash([name, sorted(runs), params])) as run:  # fmt: skip
        records = {}
        for run_id, external in read.items():
            table = external_run_metrics(external, convention, heads, model)
            run_dir = out_dir / "runs" / run_id
            run_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(run_dir / "metrics.csv", lambda tmp, t=table: t.to_csv(tmp, index=False))
            step = convergence_step(table, threshold)
            records[run_id] = {
                "run": run_id, "directory": runs[run_id], "checkpoints": len(table),
                "convergence_step": step, "converged": step is not None, "threshold": threshold,
                "status": "diverged" if table["skipped_matrices"].any() else "completed",
            }  # fmt: skip
            save_json(records[run_id], run_dir / "evaluation.json")
        run.log_metrics({"runs": len(records),
                         "converged": sum(r["converged"] for r in records.values())})  # fmt: skip
    save_json({"set": name, "runs": records}, manifest)


def _model(arch: dict | None):
    if arch is None:
        return None
    from trainmap.models import build_model

    return build_model(arch["arch"], arch["meta"], **arch["options"])


def external_map_job(
    name: str, run_ids: list[str], metrics_paths: list[str], evaluation_paths: list[str],
    settings: dict, out_dir: str | Path, tracking: Mapping[str, str], *, threads: int = 1,
) -> None:  # fmt: skip
    """Rule ``external_map``: the training map of one external set: fit (with its bootstrap),
    detour regression and map, the steps a group map of the grid's own runs takes."""
    out_dir = Path(out_dir)
    outcomes = group_outcomes(evaluation_paths, run_ids)
    runs = {run: read_metric_table(path, diverged=outcomes.status[run] == "diverged")
            for run, path in zip(run_ids, metrics_paths, strict=True)}  # fmt: skip
    title = f"external/{name}"
    with rule_run(tracking, "external_map", task=title, params={"analysis": settings},
                  config_hash=settings_hash([settings, name, run_ids])) as run:  # fmt: skip
        fit, regression, _ = map_runs(runs, outcomes, settings, out_dir, title, threads)
        run.log_metrics({"n_states": fit.hmm.n_states_, "runs": len(runs)})
        run.set_tags({"external": name, "detour_states": regression.detour_states})
        for artifact in ("hmm.json", "detours.json", "map.json", "map.png"):
            run.log_artifact(out_dir / artifact)
