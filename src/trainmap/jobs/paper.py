"""The paper rules: each paper setting's map under each analysis pass, and the side-by-side table
(:mod:`trainmap.dynamics.paper`).

``paper_map_job`` runs the one analysis path of a group (:func:`~trainmap.dynamics.pipeline.map_runs`:
fit, baselines, bootstrap, stability curve, detour regression, map) with the pass's settings and
writes its files to ``results/paper/<setting>/<analysis>/``; ``paper_table_job`` reads them all
into ``table.md``, ``table.csv``, ``claims.csv`` and the figure. Both log to MLflow like every rule.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from trainmap.dynamics import plots
from trainmap.dynamics.maps.settings import AnalysisSettings
from trainmap.dynamics.paper import (
    PAPER,
    analysis_settings,
    claims,
    paper_row,
    table_markdown,
)
from trainmap.dynamics.pipeline import Outcomes, analysis_runs, map_runs
from trainmap.io import write_atomic
from trainmap.jobs.analysis import read_group_runs, seed_labels
from trainmap.jobs.common import settings_hash
from trainmap.tracking import rule_run


def setting_runs(
    setting: str, analysis: str, cells: list[dict], metrics_paths: list[str],
    evaluation_paths: list[str], settings: AnalysisSettings,
) -> tuple[dict[str, pd.DataFrame], Outcomes, AnalysisSettings]:  # fmt: skip
    """One paper setting's runs and outcomes as analysis pass ``analysis`` sees them (its
    checkpoints per run, its NaN rule), with the pass's settings over the config's
    (``settings``): what rule ``paper_map`` maps."""
    runs, outcomes = read_group_runs(metrics_paths, evaluation_paths, seed_labels(cells))
    shortest = min(len(table) for table in runs.values())
    settings = analysis_settings(settings, analysis, setting, shortest)
    runs, outcomes = analysis_runs(runs, outcomes, settings)
    return runs, outcomes, settings


def paper_map_job(
    setting: str, analysis: str, cells: list[dict], metrics_paths: list[str],
    evaluation_paths: list[str], settings: Mapping[str, Any], out_dir: str | Path,
    tracking: Mapping[str, str], *, threads: int = 1,
) -> None:  # fmt: skip
    """Rule ``paper_map``: the map of one paper setting under one analysis pass (``authors`` or
    ``trainmap``), written to ``out_dir`` (``settings``: the config's analysis settings as the
    rule passes them, :mod:`trainmap.jobs.analysis`)."""
    out_dir = Path(out_dir)
    base = AnalysisSettings.of(settings)
    runs, outcomes, passed = setting_runs(setting, analysis, cells, metrics_paths,
                                          evaluation_paths, base)  # fmt: skip
    recorded = passed.as_dict()
    params = {"analysis": recorded, "setting": setting, "pass": analysis}
    with rule_run(tracking, "paper_map", task=setting, params=params,
                  config_hash=settings_hash([recorded, setting, analysis])) as run:  # fmt: skip
        fit, regression, _ = map_runs(runs, outcomes, passed, out_dir,
                                      title=f"{setting} ({analysis} analysis)", n_jobs=threads)  # fmt: skip
        run.set_tags({"setting": setting, "pass": analysis, "stability": fit.stability.line})
        run.log_metrics({"n_states": fit.hmm.n_states_, "runs": len(runs),
                         "bootstrap_k_same": fit.bootstrap.k_same})  # fmt: skip
        for name in ("detours.json", "baselines.csv", "hmm.json", "bootstrap.json"):
            run.log_artifact(out_dir / name)
        if regression.regression.fitted:
            run.log_metrics({"r2": regression.regression.r2})


def paper_table_job(
    settings_run: list[str], analyses: list[str], map_dirs: list[str], confidence: float,
    table_md: str | Path, table_csv: str | Path, claims_csv: str | Path, figure: str | Path,
    tracking: Mapping[str, str],
) -> None:  # fmt: skip
    """Rule ``paper_table``: every map of the paper's settings the grid runs, beside the paper's
    numbers (``map_dirs`` in the order of ``settings_run`` x ``analyses``)."""
    pairs = [(s, a) for s in settings_run for a in analyses]
    rows = [paper_row(directory, s, a) for (s, a), directory in zip(pairs, map_dirs, strict=True)]
    claim_rows = claims(rows, confidence)
    not_run = [setting for setting in PAPER if setting not in settings_run]
    figure = Path(figure)
    with rule_run(tracking, "paper_table", params={"settings": settings_run},
                  config_hash=settings_hash([settings_run, analyses])) as run:  # fmt: skip
        caption = plots.plot_paper(rows, figure, confidence)
        markdown = table_markdown(rows, claim_rows, not_run, confidence, figure=figure.name)
        write_atomic(Path(table_md), lambda tmp: Path(tmp).write_text(markdown))
        flat = pd.DataFrame([{k: json.dumps(v) if isinstance(v, list | dict) else v
                              for k, v in row.items() if not k.startswith("bootstrap_")}
                             for row in rows])  # fmt: skip
        write_atomic(Path(table_csv), lambda tmp: flat.to_csv(tmp, index=False))
        claim_frame = pd.DataFrame(claim_rows)
        write_atomic(Path(claims_csv), lambda tmp: claim_frame.to_csv(tmp, index=False))
        run.set_tags({"caption.table.png": caption})
        for path in (table_md, table_csv, claims_csv, figure):
            run.log_artifact(Path(path))
