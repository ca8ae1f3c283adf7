"""The collect_metrics rule: the 14 weight metrics of every checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import torch

from trainmap.grid import Cell, SeedRange
from trainmap.io import (
    load_torch,
    write_atomic,
)
from trainmap.jobs.common import _over_cells, cell_file, seed_dir, write_manifest
from trainmap.tracking import rule_run
from trainmap.training.loop import (
    load_trajectory,
)


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
    form at every checkpoint (``deploy``; trainmap.models.repvgg.deploy_trajectory), the one weight space a
    RepVGG shares with its plain ablation."""
    from trainmap.dynamics.metrics import collect_run_metrics
    from trainmap.models import build_model
    from trainmap.models.repvgg import RepVGG, deploy_trajectory

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
    block: SeedRange | dict, run_manifest: str | Path, manifest: str | Path, config: dict,
    *, convention: str = "paper", repvgg_weights: str = "train", threads: int = 1,
) -> None:  # fmt: skip
    """Rule ``collect_metrics`` for a block: the metric table of every cell's trajectory, in the
    ``analysis.metrics`` convention (RepVGG runs: ``analysis.repvgg_weights``)."""
    block = SeedRange.of(block)

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
