"""The sparse_retrain and flip_rates rules: N:M sparse retraining (trainmap.methods.sparse)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from trainmap.data import load_task_data
from trainmap.gpus import gpu_slot
from trainmap.grid import Cell, SeedRange
from trainmap.io import load_torch, write_atomic
from trainmap.jobs.common import SeedRangeJob, settings_hash
from trainmap.methods.sparse import check_settings, plot_flip_rates, run_sparse_block, start_step
from trainmap.tracking import rule_run
from trainmap.training.archive import (
    ARCHIVE_DIRECTORY,
    archived_steps,
    checkpoint_name,
    read_checkpoint,
)
from trainmap.training.checkpoints import model_from_checkpoint
from trainmap.training.config import TrainConfig


def sparse_block_job(
    block: SeedRange | dict,
    teacher_manifest: str | Path,
    data_path: str | Path,
    settings: dict[str, Any],
    options: dict[str, Any],
    manifest: str | Path,
    block_plot: str | Path,
    tracking: Mapping[str, str],
    cell_hashes: Mapping[str, str],
    *,
    threads: int = 1,
    progress: bool = True,
    gpu_mem_mb: int = 0,
) -> list[dict[str, Any]]:
    """Rule ``sparse_retrain``: N:M sparsity for a block of seeds, each from its own dense teacher
    (the kaiming cell of the same seed) by the block's sparse method, retrained as one vectorised
    model; per seed the sparse run's files, its flip-rate figure and an MLflow run. The student
    is pruned from the teacher's final model or, with setting ``start``, from its run's checkpoint
    at that step; the teacher distilled from is always the final model."""
    job = SeedRangeJob("sparse_retrain", block, manifest, tracking, cell_hashes)
    cells = job.cells
    torch.set_num_threads(threads)
    cfg = check_settings(settings)
    saved = [load_torch(job.input_file(teacher_manifest, cell, "model.pt")) for cell in cells]
    teachers = [model_from_checkpoint(checkpoint) for checkpoint in saved]
    step = start_step(cfg["start"])
    starts = None if step is None else [
        dense_checkpoint(checkpoint, job.input_file(teacher_manifest, cell,
                                                    f"{ARCHIVE_DIRECTORY}/{checkpoint_name(step)}"), step)
        for cell, checkpoint in zip(cells, saved, strict=True)
    ]  # fmt: skip
    model_options = saved[0]["model_options"]
    job.uses(data_path)
    data = load_task_data(data_path)
    infos = [{"arch": c.arch, "method": c.method, "seed": c.seed, "model_options": model_options,
              "meta": data.meta} for c in cells]  # fmt: skip
    out_dirs = [job.seed_dir(cell) for cell in cells]
    params = {"sparse": cfg, "method_options": options, "seed_block": len(cells)}
    flips = {}
    device = TrainConfig.from_dict(cfg["train"]).device
    with gpu_slot(device, gpu_mem_mb), job.runs(params) as runs:
        summaries = run_sparse_block(
            teachers, data, options, cfg, list(job.seed_range.seeds), out_dirs,
            resume_path=job.manifest.with_suffix(".resume.pt"),
            log_metrics=lambda index, metrics, step: runs[index].log_metrics(metrics, step),
            progress=progress,
            fingerprint=settings_hash([cell_hashes[cell.id] for cell in cells]),
            description=job.seed_range.id, model_info=infos, starts=starts,
        )  # fmt: skip
        for cell, run, summary, out in zip(cells, runs, summaries, out_dirs, strict=True):
            flips[f"seed{cell.seed}"] = pd.read_csv(out / "flips.csv")
            caption = plot_flip_rates({cell.method: flips[f"seed{cell.seed}"]},
                                      out / "flips.png", title=cell.id)  # fmt: skip
            run.set_tags({"status": summary["status"], "nm_valid": summary["nm_valid"],
                          "caption.flips.png": caption})  # fmt: skip
            for name in ("history.csv", "train.json", "flips.csv"):
                run.log_artifact(out / name)
            run.log_artifact(out / "flips.png", "figures")
    plot_flip_rates(flips, block_plot, title=f"{job.seed_range.id}: mask flips per seed")
    invalid = [cell.id for cell, s in zip(cells, summaries, strict=True) if not s["nm_valid"]]
    if invalid:
        raise RuntimeError(f"{invalid}: the sparse model is not {cfg['n']}:{cfg['m']}")
    job.write_manifest({"status": s["status"], "diverged_step": s["diverged_step"]}
                       for s in summaries)  # fmt: skip
    return summaries


def dense_checkpoint(saved: dict[str, Any], checkpoint_path: str | Path,
                     step: int) -> torch.nn.Module:  # fmt: skip
    """The dense model of ``saved`` (a ``model.pt``) with its run's weights at checkpoint ``step``
    (``checkpoint_path``: that step's file in the run's archive, trainmap.training.archive), in
    eval mode; a clear error when the run's archive does not hold that step."""
    path = Path(checkpoint_path)
    if not path.is_file():
        run_dir = path.parent.parent
        kept = archived_steps(run_dir)
        held = f"steps {kept[0]} to {kept[-1]} ({len(kept)} files)" if kept else "no checkpoint"
        raise ValueError(
            f"sparse setting start.step: {step}: the dense run {run_dir} has no archived "
            f"checkpoint at that step (its archive holds {held}; a run that diverged stops "
            "there); choose a step the dense runs reach and train.<task>.archive.schedule keeps"
        )
    model = model_from_checkpoint(saved)
    state = read_checkpoint(path)
    # integer buffers (num_batches_tracked) are archived as they are; floats in the archive's dtype
    model.load_state_dict({name: value.to(model.state_dict()[name].dtype)
                           for name, value in state.items()})  # fmt: skip
    return model.eval()


def flip_rates_job(
    cells: list[dict], flips_paths: list[str], table_path: str | Path, plot_path: str | Path,
    tracking: Mapping[str, str],
) -> pd.DataFrame:  # fmt: skip
    """Rule ``flip_rates``: every sparse retraining's mask flips in one table, and the mean flip
    rate and initial flip rate per method against step (AST fig. 4: static vs annealed SR-STE)."""
    frames = []
    for cell, path in zip(cells, flips_paths, strict=True):
        flips = pd.read_csv(path)
        if len(flips):
            frames.append(flips.assign(**Cell.of(cell).to_dict()))
    columns = ["task", "arch", "method", "seed", "step", "flip_rate", "initial_flip_rate"]
    table = (
        pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)
    )
    with rule_run(tracking, "flip_rates", params={"runs": len(cells)}, config_hash="grid") as run:
        write_atomic(table_path, lambda tmp: table.to_csv(tmp, index=False))
        means = {
            f"{task}/{arch}/{method}": group.groupby("step", as_index=False)[
                ["flip_rate", "initial_flip_rate"]].mean()
            for (task, arch, method), group in table.groupby(["task", "arch", "method"])
        }  # fmt: skip
        caption = plot_flip_rates(means, plot_path, title="N:M mask flips, mean over seeds")
        run.set_tags({"caption.flip_rates.png": caption})
        run.log_artifact(table_path)
        run.log_artifact(plot_path, "figures")
    return table
