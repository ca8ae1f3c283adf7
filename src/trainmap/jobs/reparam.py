"""The reparam rule: RepVGG runs fused into their deploy form (trainmap.models.repvgg)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trainmap.data import load_task_data
from trainmap.grid import Cell, SeedRange
from trainmap.io import load_json, load_torch, save_json
from trainmap.jobs.common import SeedRangeJob
from trainmap.models import count_parameters
from trainmap.models.repvgg import check_equivalence, save_deploy, to_deploy
from trainmap.tracking import RuleRun
from trainmap.training.augment import evaluation_inputs, recipe_of_record
from trainmap.training.checkpoints import load_model, model_from_checkpoint


def reparam_block_job(
    block: SeedRange | dict,
    train_manifest: str | Path,
    data_path: str | Path,
    manifest: str | Path,
    tracking: Mapping[str, str],
    cell_hashes: Mapping[str, str],
    *,
    threads: int = 1,
) -> list[dict[str, Any]]:
    """Rule ``reparam``: fuse each cell's trained RepVGG into its deploy form (``deploy.pt``) and
    check it against the trained model on the test set (``equivalence.json``)."""
    job = SeedRangeJob("reparam", block, manifest, tracking, cell_hashes)
    torch.set_num_threads(threads)
    job.uses(data_path)
    data = load_task_data(data_path)

    def fuse(cell: Cell, run: RuleRun) -> dict[str, Any]:
        saved = load_torch(job.input_file(train_manifest, cell, "model.pt"))
        trained = model_from_checkpoint(saved)
        info = {key: saved[key] for key in ("arch", "model_options", "meta", "method", "seed")}
        out = job.seed_dir(cell)
        deploy = to_deploy(trained)
        save_deploy(deploy, out / "deploy.pt", **info)
        summary = load_json(job.input_file(train_manifest, cell, "train.json"))
        prepare = evaluation_inputs(recipe_of_record(summary.get("augment")), data.x_test.dtype)
        check = check_equivalence(trained, load_model(out / "deploy.pt"), data.x_test,
                                  prepare=prepare)  # fmt: skip
        check |= {
            "train_params": count_parameters(trained),
            "deploy_params": count_parameters(deploy),
        }
        save_json(check, out / "equivalence.json")
        run.log_metrics({key: float(check[key]) for key in ("max_abs_logit_diff",
                         "predictions_identical", "train_params", "deploy_params")})  # fmt: skip
        run.log_artifact(out / "equivalence.json")
        if not check["predictions_identical"]:
            print(f"warning: deploy predictions differ on {cell.id}: {check}")
        return check

    checks = job.for_each_cell(fuse)
    job.write_manifest(
        {"predictions_identical": bool(check["predictions_identical"])} for check in checks
    )
    return checks
