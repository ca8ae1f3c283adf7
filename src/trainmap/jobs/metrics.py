"""The collect_metrics rule: the 14 weight metrics of every checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import torch

from trainmap.dynamics.metrics.streamed import (
    STREAMED_FILE,
    metrics_table,
    read_streamed,
    stale_definitions,
    variant_rows,
)
from trainmap.dynamics.metrics.weights import collect_run_metrics
from trainmap.dynamics.runs.external import CHUNK, ExternalRun, stacked_states
from trainmap.dynamics.runs.layouts import checkpoint_shapes
from trainmap.grid import Cell, SeedRange
from trainmap.io import load_torch, write_atomic
from trainmap.jobs.common import SeedRangeJob
from trainmap.models import build_model
from trainmap.models.repvgg import RepVGG, deploy_trajectory
from trainmap.schema import section_defaults
from trainmap.tracking import RuleRun
from trainmap.training.archive import (
    ARCHIVE_DIRECTORY,
    archive_directory,
    archived_steps,
    checkpoint_file,
    checkpoint_name,
)

#: The analysis settings' defaults (the schema's): the convention and RepVGG weights.
ANALYSIS_DEFAULTS = section_defaults("analysis")


def collect_metrics_block_job(
    block: SeedRange | dict,
    run_manifest: str | Path,
    manifest: str | Path,
    tracking: Mapping[str, str],
    cell_hashes: Mapping[str, str],
    *,
    convention: str = ANALYSIS_DEFAULTS["metrics"],
    repvgg_weights: str = ANALYSIS_DEFAULTS["repvgg_weights"],
    threads: int = 1,
) -> list[pd.DataFrame]:
    """Rule ``collect_metrics``: per cell, the 14 weight metrics of every checkpoint of its run
    (``metrics.csv``), in the ``analysis.metrics`` convention (``paper``, ``paper_shortcuts`` or ``extended``;
    trainmap.dynamics.metrics.weights).

    The training job streamed them (``checkpoint_metrics.csv``, every convention;
    trainmap.dynamics.metrics.streamed): this job takes the convention's rows while they were computed by
    the current metric definitions. After a metric is redefined it recomputes them from the run's
    checkpoint archive when that holds every checkpoint (:func:`recompute_from_archive`), and
    otherwise stops, naming the runs that must retrain.

    ``repvgg_weights`` (``analysis.repvgg_weights``): a RepVGG run's metrics come from its
    training-time branches (``train``, what the authors' metric loop would see) or from its deploy
    form at every checkpoint (``deploy``; trainmap.models.repvgg.deploy_trajectory), the one weight
    space a RepVGG shares with its plain ablation."""
    job = SeedRangeJob("collect_metrics", block, manifest, tracking, cell_hashes)
    torch.set_num_threads(threads)

    def collect(cell: Cell, run: RuleRun) -> pd.DataFrame:
        saved = load_torch(job.input_file(run_manifest, cell, "model.pt"))
        structure = build_model(saved["arch"], saved["meta"], **saved["model_options"])
        fused = repvgg_weights == "deploy" and isinstance(structure, RepVGG)
        weights = "deploy" if fused else "train"
        history = pd.read_csv(job.input_file(run_manifest, cell, "history.csv"))
        streamed = read_streamed(job.input_file(run_manifest, cell, STREAMED_FILE))
        rows = variant_rows(streamed, convention, weights)
        source = "streamed"
        if rows.empty or stale_definitions(rows):
            table, source = recompute_from_archive(job, run_manifest, cell, structure, history,
                                                   convention, fused), "archive"  # fmt: skip
        else:
            table = metrics_table(rows, history)
        run.log_params({"metrics": convention, "weights": weights, "source": source})
        output = job.seed_dir(cell) / "metrics.csv"
        write_atomic(output, lambda tmp: table.to_csv(tmp, index=False))
        run.log_metrics({"checkpoints": len(table),
                         "skipped_matrices": int(table["skipped_matrices"].sum())})  # fmt: skip
        run.log_artifact(output)
        return table

    tables = job.for_each_cell(collect, description=f"metrics {job.seed_range.id}")
    job.write_manifest({"checkpoints": len(table)} for table in tables)
    return tables


class ArchiveTooSparseError(ValueError):
    """Metrics that must be recomputed from checkpoints the run's archive does not hold."""


def recompute_from_archive(
    job: SeedRangeJob, run_manifest: str | Path, cell: Cell, structure: torch.nn.Module,
    history: pd.DataFrame, convention: str, fused: bool,
) -> pd.DataFrame:  # fmt: skip
    """A run's metric table computed again from its archived checkpoints, read as an external run
    (trainmap.dynamics.runs.external), :data:`~trainmap.dynamics.runs.external.CHUNK` checkpoints at a time.
    The archive must hold every checkpoint of the run's history; else
    :class:`ArchiveTooSparseError` names the run, what its archive holds and the command that
    retrains it."""
    run_dir = Path(job.input_file(run_manifest, cell, "history.csv")).parent
    steps = history["step"].tolist()
    kept = archived_steps(run_dir)
    missing = sorted(set(steps) - set(kept))
    if missing:
        raise ArchiveTooSparseError(
            f"{cell.id}: its streamed metrics were computed by other metric definitions (or lack "
            f"convention {convention!r}), and its archive ({archive_directory(run_dir)}) holds "
            f"{len(kept)} of its {len(steps)} checkpoints (none at steps {missing[:5]}), so they "
            "cannot be recomputed; retrain it: snakemake --cores all --forcerun "
            f"{run_manifest} (or keep every checkpoint: train.<task>.archive.schedule: all)"
        )
    for step in steps:  # each archived file checked against the run's manifest
        job.input_file(run_manifest, cell, f"{ARCHIVE_DIRECTORY}/{checkpoint_name(step)}")
    run = ExternalRun(archive_directory(run_dir),
                      {step: checkpoint_file(run_dir, step) for step in steps}, history)  # fmt: skip
    reference = checkpoint_shapes(run.checkpoints[steps[0]])
    tables = []
    for start in range(0, len(steps), CHUNK):
        chunk = steps[start : start + CHUNK]
        state = stacked_states(run, chunk, reference)
        model = structure
        if fused:  # integer buffers (num_batches_tracked) are not archived as floats: the fusion needs none
            for name, value in structure.state_dict().items():
                state.setdefault(name, value.expand(len(chunk), *value.shape))
            state, model = deploy_trajectory(state, structure)
        trajectory = {"step": torch.tensor(chunk), "state": state}
        tables.append(collect_run_metrics(trajectory, model, history, convention))
    return pd.concat(tables, ignore_index=True)
