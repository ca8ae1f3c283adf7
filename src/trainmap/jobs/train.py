"""The train rule: one seed range trained as one vectorised model (trainmap.training)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from trainmap.data import load_task_data
from trainmap.gpus import gpu_slot
from trainmap.grid import SeedRange, without_off_keys
from trainmap.io import load_torch
from trainmap.jobs.common import SeedRangeJob, settings_hash
from trainmap.training.loop import TrainConfig, TrainPaths, build_cell_model, train_block


def train_block_job(
    block: SeedRange | dict,
    data_path: str | Path,
    model_options: dict[str, Any],
    train_settings: dict[str, Any],
    manifest: str | Path,
    tracking: Mapping[str, str],
    cell_hashes: Mapping[str, str],
    *,
    init_manifest: str | Path | None = None,
    threads: int = 1,
    progress: bool = True,
    gpu_mem_mb: int = 0,
) -> list[dict[str, Any]]:
    """Rule ``train``: a block of seeds of one (task, arch, method), each seeded by its method (or
    started from the initial model GradInit made, ``init_manifest``), trained as one vectorised
    model; per seed a trajectory, final weights, history and summary, and an MLflow run. On a node
    with several GPUs the block trains on one with room for its planned ``gpu_mem_mb``
    (:func:`trainmap.gpus.gpu_slot`)."""
    job = SeedRangeJob("train", block, manifest, tracking, cell_hashes)
    cells = job.cells
    torch.set_num_threads(threads)
    job.uses(data_path)
    data = load_task_data(data_path)
    cfg = TrainConfig.from_dict(train_settings)
    models = [build_cell_model(c.arch, c.method, c.seed, data.meta, model_options) for c in cells]
    if init_manifest:
        for model, cell in zip(models, cells, strict=True):
            saved = load_torch(job.input_file(init_manifest, cell, "init.pt"))
            model.load_state_dict(saved["state_dict"])
    paths = [TrainPaths.in_directory(job.seed_dir(cell)) for cell in cells]
    params = {"model": model_options, "train": without_off_keys(asdict(cfg)), "threads": threads,
              "seed_block": len(cells)}  # fmt: skip
    infos = [{"arch": c.arch, "method": c.method, "seed": c.seed, "model_options": model_options,
              "meta": data.meta} for c in cells]  # fmt: skip
    with gpu_slot(cfg.device, gpu_mem_mb), job.runs(params) as runs:
        summaries = train_block(
            models, data, cfg, list(job.seed_range.seeds), paths,
            resume_path=job.manifest.with_suffix(".resume.pt"),
            on_checkpoint=lambda index, metrics, step: runs[index].log_metrics(metrics, step),
            progress=progress,
            fingerprint=settings_hash([cell_hashes[cell.id] for cell in cells]),
            description=job.seed_range.id, model_info=infos,
        )  # fmt: skip
        for run, summary, seed_paths in zip(runs, summaries, paths, strict=True):
            # seed_block_trained: 1 when the model could not be vectorised (seeds trained apart)
            run.set_tags({"status": summary["status"],
                          "seed_block_trained": summary["seed_block"]})  # fmt: skip
            run.log_metrics({"steps_per_s": summary["steps_per_s"],
                             "n_params": summary["n_params"]})  # fmt: skip
            run.log_artifact(seed_paths.history)
            run.log_artifact(seed_paths.summary)
    job.write_manifest({"status": s["status"], "diverged_step": s["diverged_step"]}
                       for s in summaries)  # fmt: skip
    return summaries
