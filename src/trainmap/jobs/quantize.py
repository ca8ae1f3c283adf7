"""The quantize rule: int8 / int4 / AWQ models of the final weights (trainmap.methods.quantize)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trainmap.data import load_task_data
from trainmap.grid import Cell, SeedRange
from trainmap.io import load_json, load_torch, save_json
from trainmap.jobs.common import SeedRangeJob
from trainmap.methods.packing import save_packed
from trainmap.methods.quantize import quantize_model, save_quantized
from trainmap.tracking import RuleRun
from trainmap.training.augment import evaluation_inputs, recipe_of_record
from trainmap.training.checkpoints import model_from_checkpoint


def quantize_block_job(
    block: SeedRange | dict,
    run_manifest: str | Path,
    data_path: str | Path,
    schemes: list[str],
    manifest: str | Path,
    tracking: Mapping[str, str],
    cell_hashes: Mapping[str, str],
    *,
    calibration_batch: int = 256,
    threads: int = 1,
) -> list[dict[str, Any]]:
    """Rule ``quantize``: per cell, every scheme's quantised checkpoint (``<scheme>.pt``) and
    packed file (``<scheme>.packed``) of the run's final model, and ``quantize.json``, which lists
    the forms ``evaluate`` measures (bytes on disk = the packed file)."""
    job = SeedRangeJob("quantize", block, manifest, tracking, cell_hashes)
    torch.set_num_threads(threads)
    job.uses(data_path)
    data = load_task_data(data_path)

    def quantize(cell: Cell, run: RuleRun) -> dict[str, Any]:
        model_path = job.input_file(run_manifest, cell, "model.pt")
        summary = load_json(job.input_file(run_manifest, cell, "train.json"))
        prepare = evaluation_inputs(recipe_of_record(summary.get("augment")), data.x_train.dtype)
        calibration = data.x_train[:calibration_batch]  # as the run's evaluation saw inputs
        calibration = calibration if prepare is None else prepare(calibration)
        source = load_torch(model_path)
        model = model_from_checkpoint(source)
        out_dir = job.seed_dir(cell)
        forms, notes = [], {}
        for scheme in schemes:
            quantized, notes[scheme] = quantize_model(model, scheme, calibration)
            save_quantized(quantized, out_dir / f"{scheme}.pt", scheme, source)
            sizes = save_packed(quantized, out_dir / f"{scheme}.packed")
            forms.append({"form": scheme, "model_path": str(out_dir / f"{scheme}.pt"),
                          "bytes_path": str(out_dir / f"{scheme}.packed")})  # fmt: skip
            notes[scheme] = {"layers": notes[scheme], "packed_bytes": sizes}
            run.log_metrics({f"{scheme}.{key}": value for key, value in sizes.items()})
        listing = out_dir / "quantize.json"
        save_json({"source": str(model_path), "forms": forms, "notes": notes}, listing)
        run.log_artifact(listing)
        return {"forms": forms}

    results = job.for_each_cell(quantize, params={"schemes": schemes})
    job.write_manifest({"schemes": list(schemes)} for _ in results)
    return results
