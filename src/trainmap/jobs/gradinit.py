"""The gradinit rule: GradInit / MetaInit initial scales (trainmap.methods.gradinit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import torch

from trainmap.data import TaskData, load_task_data
from trainmap.grid import Cell, SeedRange
from trainmap.io import (
    save_json,
    write_atomic,
)
from trainmap.jobs.common import _over_cells, _task_data, seed_dir, write_manifest
from trainmap.tracking import rule_run
from trainmap.training.loop import (
    build_cell_model,
)


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
    from trainmap.methods.gradinit import (
        check_settings,
        diagnostics_table,
        draws_for,
        layer_diagnostics,
        plot_diagnostics,
        plot_history,
        run_gradinit,
    )
    from trainmap.training.checkpoints import save_dense
    from trainmap.training.loop import derive_seed

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
    block: SeedRange | dict,
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
    from trainmap.methods.gradinit import check_settings, plot_block

    block = SeedRange.of(block)
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
