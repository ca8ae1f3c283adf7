"""The collect_metrics rule: the 14 weight metrics of every checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import torch

from trainmap.dynamics.metrics import collect_run_metrics
from trainmap.grid import Cell, SeedRange
from trainmap.io import load_torch, write_atomic
from trainmap.jobs.common import SeedRangeJob
from trainmap.models import build_model
from trainmap.models.repvgg import RepVGG, deploy_trajectory
from trainmap.tracking import RuleRun
from trainmap.training.loop import load_trajectory


def collect_metrics_block_job(
    block: SeedRange | dict,
    run_manifest: str | Path,
    manifest: str | Path,
    tracking: Mapping[str, str],
    cell_hashes: Mapping[str, str],
    *,
    convention: str = "paper",
    repvgg_weights: str = "train",
    threads: int = 1,
) -> list[pd.DataFrame]:
    """Rule ``collect_metrics``: per cell, the 14 weight metrics of every checkpoint of its run
    (``metrics.csv``), in the ``analysis.metrics`` convention (``paper``, ``paper_shortcuts`` or ``extended``;
    trainmap.dynamics.metrics).

    ``repvgg_weights`` (``analysis.repvgg_weights``): a RepVGG run's metrics come from its
    training-time branches (``train``, what the authors' metric loop would see) or from its deploy
    form at every checkpoint (``deploy``; trainmap.models.repvgg.deploy_trajectory), the one weight
    space a RepVGG shares with its plain ablation."""
    job = SeedRangeJob("collect_metrics", block, manifest, tracking, cell_hashes)
    torch.set_num_threads(threads)

    def collect(cell: Cell, run: RuleRun) -> pd.DataFrame:
        saved = load_torch(job.input_file(run_manifest, cell, "model.pt"))
        structure = build_model(saved["arch"], saved["meta"], **saved["model_options"])
        trajectory = load_trajectory(job.input_file(run_manifest, cell, "trajectory.pt"))
        fused = repvgg_weights == "deploy" and isinstance(structure, RepVGG)
        run.log_params({"metrics": convention, "weights": "deploy" if fused else "train"})
        if fused:
            state, structure = deploy_trajectory(trajectory["state"], structure)
            trajectory = {"step": trajectory["step"], "state": state}
        history = pd.read_csv(job.input_file(run_manifest, cell, "history.csv"))
        table = collect_run_metrics(trajectory, structure, history, convention)
        output = job.seed_dir(cell) / "metrics.csv"
        write_atomic(output, lambda tmp: table.to_csv(tmp, index=False))
        run.log_metrics({"checkpoints": len(table),
                         "skipped_matrices": int(table["skipped_matrices"].sum())})  # fmt: skip
        run.log_artifact(output)
        return table

    tables = job.for_each_cell(collect, description=f"metrics {job.seed_range.id}")
    job.write_manifest({"checkpoints": len(table)} for table in tables)
    return tables
