"""The reparam rule: RepVGG runs fused into their deploy form (trainmap.models.repvgg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainmap.data import TaskData, load_task_data
from trainmap.grid import Cell, SeedRange
from trainmap.io import (
    load_torch,
    save_json,
)
from trainmap.jobs.common import _over_cells, _task_data, cell_file, seed_dir, write_manifest
from trainmap.models import count_parameters
from trainmap.tracking import rule_run
from trainmap.training.checkpoints import load_model, model_from_checkpoint


def reparam_job(
    cell: Cell | dict,
    model_path: str | Path,
    data_path: str | Path | TaskData,
    deploy_path: str | Path,
    check_path: str | Path,
    config: dict,
    *,
    threads: int = 1,
) -> dict[str, Any]:
    """Rule ``reparam``: fuse a trained RepVGG into its deploy form and check it on the test set."""
    from trainmap.models.repvgg import check_equivalence, save_deploy, to_deploy

    cell = Cell.of(cell)
    torch.set_num_threads(threads)
    saved = load_torch(model_path)
    trained = model_from_checkpoint(saved)
    info = {key: saved[key] for key in ("arch", "model_options", "meta", "method", "seed")}
    with rule_run(config, "reparam", cell=cell) as run:
        deploy = to_deploy(trained)
        save_deploy(deploy, deploy_path, **info)
        data = _task_data(data_path)
        check = check_equivalence(trained, load_model(deploy_path), data.x_test)
        check |= {
            "train_params": count_parameters(trained),
            "deploy_params": count_parameters(deploy),
        }
        save_json(check, check_path)
        run.log_metrics({key: float(check[key]) for key in ("max_abs_logit_diff",
                         "predictions_identical", "train_params", "deploy_params")})  # fmt: skip
        run.log_artifact(check_path)
    if not check["predictions_identical"]:
        print(f"warning: deploy predictions differ on {cell.id}: {check}")
    return check


def reparam_block_job(
    block: SeedRange | dict, train_manifest: str | Path, data_path: str | Path,
    manifest: str | Path, config: dict, *, threads: int = 1,
) -> None:  # fmt: skip
    """Rule ``reparam`` for a block: :func:`reparam_job` of every cell."""
    block = SeedRange.of(block)
    data = load_task_data(data_path)  # once for every cell

    def fuse(cell: Cell) -> dict[str, Any]:
        out = seed_dir(manifest, cell)
        check = reparam_job(cell, cell_file(train_manifest, cell, "model.pt"), data,
                            out / "deploy.pt", out / "equivalence.json", config, threads=threads)  # fmt: skip
        return {"predictions_identical": bool(check["predictions_identical"])}

    write_manifest(manifest, "reparam", block, _over_cells(block, f"reparam {block.id}", fuse))
