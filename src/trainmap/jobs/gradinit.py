"""The gradinit rule: GradInit / MetaInit initial scales (trainmap.methods.gradinit)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trainmap.data import load_task_data
from trainmap.grid import Cell, SeedRange
from trainmap.io import save_json, write_atomic
from trainmap.jobs.common import SeedRangeJob
from trainmap.methods.gradinit import check_settings
from trainmap.methods.gradinit_report import (
    GradInitReport,
    plot_block,
    plot_diagnostics,
    plot_history,
    rescale_with_diagnostics,
)
from trainmap.tracking import RuleRun
from trainmap.training.augment import augmentation
from trainmap.training.checkpoints import save_dense
from trainmap.training.loop import build_cell_model

#: The numbers of a cell's run that its MLflow run and the block's manifest carry.
HEADLINE = ("constraint_steps", "initial_grad_norm", "final_grad_norm")


def gradinit_block_job(
    block: SeedRange | dict,
    data_path: str | Path,
    model_options: dict[str, Any],
    settings: dict[str, Any],
    options: dict[str, Any],
    manifest: str | Path,
    block_plot: str | Path,
    tracking: Mapping[str, str],
    cell_hashes: Mapping[str, str],
    *,
    threads: int = 1,
) -> list[dict[str, Any]]:
    """Rule ``gradinit``: rescale each cell's Kaiming-initialised model by GradInit or MetaInit
    (one seed at a time), and draw one figure of the block's learned scales and gradient norms.

    Per cell: ``init.pt`` (where ``train`` starts), ``scales.json`` (the run's summary),
    ``history.csv``, ``diagnostics.csv`` and the figures ``diagnostics.png``, ``history.png``.
    """
    job = SeedRangeJob("gradinit", block, manifest, tracking, cell_hashes)
    torch.set_num_threads(threads)
    settings = dict(settings)
    recipe = augmentation(settings.pop("augment", None), "train.<task>.augment")  # training's
    cfg = check_settings(settings)
    objective = options["objective"]
    job.uses(data_path)
    data = load_task_data(data_path)

    def rescale(cell: Cell, run: RuleRun) -> GradInitReport:
        model = build_cell_model(cell.arch, cell.method, cell.seed, data.meta, model_options)
        report = rescale_with_diagnostics(model, data, cfg, cell.seed, objective, recipe=recipe)
        out = job.seed_dir(cell)
        save_dense(model, out / "init.pt", arch=cell.arch, method=cell.method, seed=cell.seed,
                   model_options=model_options, meta=data.meta)  # fmt: skip
        summary = report.summary
        save_json(summary, out / "scales.json")
        write_atomic(out / "history.csv", lambda tmp: report.history.to_csv(tmp, index=False))
        write_atomic(out / "diagnostics.csv",
                     lambda tmp: report.diagnostics.to_csv(tmp, index=False))  # fmt: skip
        title = f"{objective}: {cell.id}"
        captions = {
            "diagnostics.png": plot_diagnostics(report.diagnostics, out / "diagnostics.png",
                                                title=title),
            "history.png": plot_history(report.history, cfg["gamma"], out / "history.png",
                                        title=title),
        }  # fmt: skip
        for row in report.history.itertuples():
            run.log_metrics({"grad_norm": row.grad_norm, "objective": row.objective}, row.iteration)
        run.log_metrics({key: summary[key] for key in HEADLINE})
        for name, caption in captions.items():
            run.log_artifact(out / name, "figures")
            run.set_tags({f"caption.{name}": caption})
        for name in ("scales.json", "history.csv", "diagnostics.csv"):
            run.log_artifact(out / name)
        return report

    reports = job.for_each_cell(rescale, params={"gradinit": cfg, "objective": objective},
                                description=f"{objective} {job.seed_range.id}")  # fmt: skip
    summaries = [report.summary for report in reports]
    histories = {f"seed{cell.seed}": report.history
                 for cell, report in zip(job.cells, reports, strict=True)}  # fmt: skip
    plot_block(
        summaries, histories, cfg["gamma"], block_plot, title=f"{objective}: {job.seed_range.id}"
    )
    job.write_manifest({key: summary[key] for key in HEADLINE} for summary in summaries)
    return summaries
