"""The external rules: metrics and a training map of runs trainmap did not train.

``external_metrics`` reads one set's run directories (:mod:`trainmap.dynamics.runs.external`), or the
runs of a checkpoint suite from its resolved ``revisions.json`` (:mod:`trainmap.grid.external_hub`),
and writes, per run, ``runs/<run>/metrics.csv`` (the format of ``collect_metrics``) and
``evaluation.json`` (convergence step and status, as ``evaluate`` writes them for the grid's own
runs, and the convergence criterion, or null without one), so that the analysis reads an external
run as it reads its own. A suite fetched from the Hub (``hub.fetch``) is measured first by
``external_revisions`` jobs, a block of one run's revisions each (:func:`external_revisions_job`),
whose tables ``external_metrics`` joins. ``external_map`` fits the set's map through the
same pipeline steps as a group map (:mod:`trainmap.dynamics.pipeline`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from trainmap.dynamics.maps.outliers import DEFAULT_SHARE, outlier_runs, visit_shares
from trainmap.dynamics.maps.settings import ANALYSIS_DEFAULTS, AnalysisSettings
from trainmap.dynamics.metrics.tables import read_metric_table
from trainmap.dynamics.pipeline import map_runs
from trainmap.dynamics.runs.external import ExternalRun, external_run_metrics, read_external_run
from trainmap.dynamics.runs.heldout import read_tokens, with_heldout_loss
from trainmap.dynamics.runs.hub import Manifest, read_manifest
from trainmap.dynamics.runs.hub_fetch import with_curve
from trainmap.dynamics.runs.layouts import ExternalRunError
from trainmap.dynamics.runs.names import HUB_DEFAULTS
from trainmap.evaluation import convergence_step
from trainmap.grid.external import EXTERNAL_DEFAULTS
from trainmap.grid.external_hub import CURVE_SUFFIX, hub_external_run
from trainmap.io import save_json, write_atomic
from trainmap.jobs.analysis import group_outcomes
from trainmap.jobs.common import settings_hash
from trainmap.tracking import rule_run


def external_metrics_job(
    name: str, runs: Mapping[str, str], out_dir: str | Path, manifest: str | Path,
    tracking: Mapping[str, str], *, threshold: float | None = None, heads: int | None = None,
    evaluation: str = EXTERNAL_DEFAULTS["evaluation"],
    convention: str = ANALYSIS_DEFAULTS["metrics"], arch: dict | None = None,
    accuracy_key: str | None = None, hub: str | Path | None = None,
    curves: Sequence[str | Path] | None = None, curve: str = EXTERNAL_DEFAULTS["curve"],
    direction: str = EXTERNAL_DEFAULTS["direction"], blocks: Sequence[str | Path] | None = None,
    eval_tokens: str | Path | None = None,
    eval_token_budget: int = EXTERNAL_DEFAULTS["eval_token_budget"],
    eval_context: int = EXTERNAL_DEFAULTS["eval_context"],
) -> None:  # fmt: skip
    """Rule ``external_metrics``: every run of external set ``name`` read and checked first, then
    its metric table (``runs/<run>/metrics.csv``) and evaluation record
    (``runs/<run>/evaluation.json``) written; the set's ``manifest`` (``metrics.json``) last.

    ``runs``: run id -> its directory; for a suite in the Hugging Face cache, run id -> its
    ``hf://`` source, and ``hub`` the suite's resolved ``revisions.json``, from which the
    checkpoints are read, with ``curves`` each run's curve file ``<run>.csv`` (None: the runs
    have no curve). ``accuracy_key``: a Hugging Face Trainer run's accuracy key. ``arch``
    (``{"arch", "meta", "options"}``) reads the state dicts through that architecture's model
    instead of by name and shape. ``blocks``: a fetched suite's revision tables
    (``blocks/<run>/<block>.csv``, :func:`external_revisions_job`), joined per run in block order
    with the run's curve instead of measuring. ``eval_tokens``: a hub set's token ids, each
    revision's held-out loss on their first ``eval_token_budget`` (in ``eval_context``-token
    sequences) its ``test_loss`` (:mod:`trainmap.dynamics.runs.heldout`; a fetched suite's, from
    its blocks).

    Convergence: the first checkpoint whose ``curve`` column reaches ``threshold``, ``rising``
    to it or ``falling`` to it (:func:`trainmap.evaluation.convergence_step`); the record then
    names ``curve`` and ``direction``. Without a threshold the set has no convergence criterion:
    ``convergence_step``, ``converged`` and ``curve`` are null."""
    out_dir = Path(out_dir)
    model = _model(arch)
    needed = curve if threshold is not None else None
    params = {"set": name, "runs": len(runs), "threshold": threshold, "heads": heads,
              "metrics": convention, "arch": (arch or {}).get("arch")}  # fmt: skip
    if hub is None:
        read = {run: read_external_run(path, evaluation, accuracy_key, needed)
                for run, path in runs.items()}  # fmt: skip
    else:
        suite = read_manifest(hub)
        read = _suite_runs(suite, runs, curves, needed)
        params["hub"] = suite.source
    if (curve, direction) != (EXTERNAL_DEFAULTS["curve"], EXTERNAL_DEFAULTS["direction"]):
        params |= {"curve": curve, "direction": direction}  # only when set: old hashes hold
    if eval_tokens is not None:  # likewise
        params |= {"eval_tokens": str(eval_tokens), "eval_token_budget": eval_token_budget,
                   "eval_context": eval_context}  # fmt: skip
    with rule_run(tracking, "external_metrics", task=f"external/{name}", params=params,
                  config_hash=settings_hash([name, sorted(runs), params])) as run:  # fmt: skip
        records = {}
        joined = _joined_blocks(blocks) if blocks is not None else {}
        tokens = None
        if eval_tokens is not None and blocks is None:
            tokens = read_tokens(Path(eval_tokens), eval_token_budget, eval_context, "eval_tokens")
        for run_id, external in read.items():
            if blocks is not None:
                table = with_curve(joined[run_id], external.evaluation,
                                   heldout=eval_tokens is not None)  # fmt: skip
            else:
                table = with_heldout_loss(external_run_metrics(external, convention, heads, model),
                                          external.checkpoints, tokens, eval_context)  # fmt: skip
            run_dir = out_dir / "runs" / run_id
            run_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(run_dir / "metrics.csv", lambda tmp, t=table: t.to_csv(tmp, index=False))
            records[run_id] = {
                "run": run_id, "directory": runs[run_id], "checkpoints": len(table),
                "threshold": threshold, **_convergence(table, threshold, curve, direction),
                "status": "diverged" if table["skipped_matrices"].any() else "completed",
            }  # fmt: skip
            save_json(records[run_id], run_dir / "evaluation.json")
        run.log_metrics({"runs": len(records),
                         "converged": sum(r["converged"] is True for r in records.values())})  # fmt: skip
    save_json({"set": name, "runs": records}, manifest)


def external_revisions_job(
    name: str, run: str, steps: Sequence[int], hub: str | Path, rows: str | Path,
    output: str | Path, tracking: Mapping[str, str], *, heads: int | None = None,
    convention: str = ANALYSIS_DEFAULTS["metrics"], arch: dict | None = None,
    keep_weights: bool = bool(HUB_DEFAULTS["keep_weights"]),
    fetch_jobs: int = int(HUB_DEFAULTS["fetch_jobs"]), block: str = "0",
    eval_tokens: str | Path | None = None,
    eval_token_budget: int = EXTERNAL_DEFAULTS["eval_token_budget"],
    eval_context: int = EXTERNAL_DEFAULTS["eval_context"],
) -> None:  # fmt: skip
    """Rule ``external_revisions``: ``steps`` of run ``run`` of fetched suite ``name`` (its
    ``revisions.json``, ``hub``), each fetched, measured and deleted unless ``keep_weights``, its
    row kept under ``rows``/<settings key> as soon as it is measured
    (:func:`~trainmap.dynamics.runs.hub_fetch.suite_run_metrics`; a rerun after a crash measures
    only what has no row); the block's table, without the run's curve, written to ``output``.
    With ``eval_tokens``, each row holds the revision's held-out loss (``test_loss``), scored
    before the revision is deleted."""
    from trainmap.dynamics.runs.hub_fetch import measured_revisions

    suite = read_manifest(hub)
    tokens = None
    if eval_tokens is not None:
        tokens = read_tokens(Path(eval_tokens), eval_token_budget, eval_context, "eval_tokens")
    params = {"set": name, "run": run, "block": block, "revisions": len(steps),
              "first_step": min(steps), "last_step": max(steps), "metrics": convention,
              "hub": suite.source}  # fmt: skip
    with rule_run(tracking, "external_revisions", task=f"external/{name}/{run}/{block}",
                  params=params, config_hash=settings_hash([name, run, list(steps), params])) as tracked:  # fmt: skip
        table = measured_revisions(suite, run, Path(rows), convention=convention, heads=heads,
                                   model=_model(arch), arch=arch, tokens=tokens,
                                   context=eval_context, keep_weights=keep_weights,
                                   fetch_jobs=fetch_jobs, steps=steps)  # fmt: skip
        tracked.log_metrics({"revisions": len(table)})
    write_atomic(Path(output), lambda tmp: table.to_csv(tmp, index=False))


def _joined_blocks(blocks: Sequence[str | Path]) -> dict[str, pd.DataFrame]:
    """Run -> its revision tables (``blocks/<run>/<block>.csv``) joined in block order."""
    by_run: dict[str, list[Path]] = {}
    for path in map(Path, blocks):
        by_run.setdefault(path.parent.name, []).append(path)
    return {run: pd.concat([pd.read_csv(p) for p in sorted(paths, key=lambda p: int(p.stem))],
                           ignore_index=True)
            for run, paths in by_run.items()}  # fmt: skip


def _suite_runs(suite: Manifest, runs: Mapping[str, str], curves: Sequence[str | Path] | None,
                needed: str | None) -> dict[str, ExternalRun]:  # fmt: skip
    """The runs ``runs`` of a resolved ``suite``, each with its curve file from ``curves``
    (named ``<run>.csv``) when given; a run the manifest or the curves lack is an error naming
    it."""
    files = {Path(p).name.removesuffix(CURVE_SUFFIX): Path(p) for p in curves or ()}
    absent = [run for run in runs if curves is not None and run not in files]
    if absent:
        raise ExternalRunError(f"{suite.source}: no curve file for runs {absent[:5]} among the "
                               f"{len(files)} given; write <curves>/<run>{CURVE_SUFFIX} for "
                               "every run")  # fmt: skip
    return {run: hub_external_run(suite, run, files.get(run), needed) for run in runs}


def _convergence(table: pd.DataFrame, threshold: float | None, curve: str, direction: str) -> dict:
    """The evaluation record's convergence entries: the step, whether the run converged and the
    criterion (``curve``, ``direction``); all null without a threshold."""
    if threshold is None:
        return {"convergence_step": None, "converged": None, "curve": None}
    step = convergence_step(table, threshold, direction=direction, curve=curve)
    return {"convergence_step": step, "converged": step is not None, "curve": curve,
            "direction": direction}  # fmt: skip


def _model(arch: dict | None):
    if arch is None:
        return None
    from trainmap.models import build_model

    return build_model(arch["arch"], arch["meta"], **arch["options"])


def external_map_job(
    name: str, run_ids: list[str], metrics_paths: list[str], evaluation_paths: list[str],
    settings: Mapping[str, Any], out_dir: str | Path, tracking: Mapping[str, str], *,
    threads: int = 1, outlier_share: float = DEFAULT_SHARE,
) -> None:  # fmt: skip
    """Rule ``external_map``: the training map of one external set: fit (with its bootstrap),
    detour regression and map, the steps a group map of the grid's own runs takes (``settings``:
    the analysis settings as the rule passes them, :mod:`trainmap.jobs.analysis`); then the set's
    outlier runs on that map (``outliers.json``: :func:`~trainmap.dynamics.maps.outliers.
    outlier_runs` with ``outlier_share``)."""
    out_dir = Path(out_dir)
    analysis = AnalysisSettings.of(settings)
    recorded = analysis.as_dict()
    outcomes = group_outcomes(evaluation_paths, run_ids)
    runs = {run: read_metric_table(path, diverged=outcomes.status[run] == "diverged")
            for run, path in zip(run_ids, metrics_paths, strict=True)}  # fmt: skip
    title = f"external/{name}"
    with rule_run(tracking, "external_map", task=title, params={"analysis": recorded},
                  config_hash=settings_hash([recorded, name, run_ids])) as run:  # fmt: skip
        fit, regression, _ = map_runs(runs, outcomes, analysis, out_dir, title, threads)
        outliers = outlier_runs(fit.states, fit.steps, outlier_share)
        save_json({"outlier_share": outlier_share, "visit_shares": visit_shares(fit.states),
                   "outliers": outliers}, out_dir / "outliers.json")  # fmt: skip
        run.log_metrics({"n_states": fit.hmm.n_states_, "runs": len(runs),
                         "outlier_runs": len(outliers)})  # fmt: skip
        run.set_tags({"external": name, "detour_states": regression.detour_states})
        for artifact in ("hmm.json", "detours.json", "map.json", "map.png", "outliers.json"):
            run.log_artifact(out_dir / artifact)
