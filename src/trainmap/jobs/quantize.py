"""The quantize rule: int8 / int4 / AWQ models of the final weights (trainmap.methods.quantize)."""

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
from trainmap.tracking import rule_run
from trainmap.training.checkpoints import model_from_checkpoint


def quantize_job(
    cell: Cell | dict,
    model_path: str | Path,
    data_path: str | Path | TaskData,
    schemes: list[str],
    manifest_path: str | Path,
    config: dict,
    *,
    calibration_batch: int = 256,
    threads: int = 1,
) -> dict[str, Any]:
    """Rule ``quantize``: every scheme's quantised checkpoint and packed file of the cell's final
    model; the manifest lists the forms ``evaluate`` measures (bytes on disk = the packed file)."""
    from trainmap.methods.quantize import quantize_model, save_packed, save_quantized

    cell = Cell.of(cell)
    torch.set_num_threads(threads)
    source = load_torch(model_path)
    model = model_from_checkpoint(source)
    data = _task_data(data_path)
    calibration = data.x_train[:calibration_batch]
    out_dir = Path(manifest_path).parent
    forms, notes = [], {}
    with rule_run(config, "quantize", cell=cell, params={"schemes": schemes}) as run:
        for scheme in schemes:
            quantized, notes[scheme] = quantize_model(model, scheme, calibration)
            save_quantized(quantized, out_dir / f"{scheme}.pt", scheme, source)
            sizes = save_packed(quantized, out_dir / f"{scheme}.packed")
            forms.append({"form": scheme, "model_path": str(out_dir / f"{scheme}.pt"),
                          "bytes_path": str(out_dir / f"{scheme}.packed")})  # fmt: skip
            notes[scheme] = {"layers": notes[scheme], "packed_bytes": sizes}
            run.log_metrics({f"{scheme}.{key}": value for key, value in sizes.items()})
        save_json({"source": str(model_path), "forms": forms, "notes": notes}, manifest_path)
        run.log_artifact(manifest_path)
    return {"forms": forms}


def quantize_block_job(
    block: SeedRange | dict, run_manifest: str | Path, data_path: str | Path, schemes: list[str],
    manifest: str | Path, config: dict, *, threads: int = 1,
) -> None:  # fmt: skip
    """Rule ``quantize`` for a block: :func:`quantize_job` of every cell."""
    block = SeedRange.of(block)
    data = load_task_data(data_path)  # once for every cell

    def quantize(cell: Cell) -> dict[str, Any]:
        quantize_job(cell, cell_file(run_manifest, cell, "model.pt"), data, schemes,
                     seed_dir(manifest, cell) / "quantize.json", config, threads=threads)  # fmt: skip
        return {"schemes": list(schemes)}

    write_manifest(manifest, "quantize", block,
                   _over_cells(block, f"quantize {block.id}", quantize))  # fmt: skip
