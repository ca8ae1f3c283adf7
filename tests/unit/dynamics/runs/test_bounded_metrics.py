"""A large checkpoint measured entry by entry (trainmap.dynamics.runs.bounded) gives the numbers of the
trajectory path that holds every counted matrix in float64: the per-matrix statistics and the
pooled median the same, the pooled mean and variance within 1e-12, in float16, bfloat16 and
float32, from safetensors, sharded safetensors and torch files, with a non-finite matrix left out
the same way."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from trainmap.dynamics.metrics.columns import METRIC_NAMES
from trainmap.dynamics.runs import external
from trainmap.dynamics.runs.external import ExternalRun, external_run_metrics, read_external_run

SHAPES = {
    "embed.weight": (50, 16),
    "blocks.0.attn.in_proj_weight": (48, 16),
    "blocks.0.attn.in_proj_bias": (48,),
    "blocks.0.attn.out_proj.weight": (16, 16),
    "blocks.0.mlp.fc1.weight": (64, 16),
    "blocks.0.mlp.fc1.bias": (64,),
    "blocks.0.mlp.fc2.weight": (16, 64),
    "stem.conv.weight": (8, 3, 3, 3),
    "head.weight": (5, 16),
}


def write_run(directory: Path, dtype: torch.dtype, form: str, nan_at: int | None = None) -> Path:
    """Three checkpoints of ``dtype`` weights in ``form`` (safetensors, sharded, pt), the second
    with a NaN in fc1 when ``nan_at`` is 10, and the run's evaluation curve."""
    directory.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    for step in (0, 10, 20):
        state = {name: (0.3 * torch.randn(shape, generator=generator)).to(dtype)
                 for name, shape in SHAPES.items()}  # fmt: skip
        if step == nan_at:
            state["blocks.0.mlp.fc1.weight"][3, 2] = float("nan")
        if form == "safetensors":
            save_file(state, directory / f"step{step}.safetensors")
        elif form == "pt":
            torch.save(state, directory / f"step{step}.pt")
        else:  # sharded: two shards beside their index, in a folder per step
            folder = directory / f"checkpoint-{step}"
            folder.mkdir()
            names = sorted(state)
            halves = {"model-1.safetensors": names[:4], "model-2.safetensors": names[4:]}
            for shard, held in halves.items():
                save_file({name: state[name] for name in held}, folder / shard)
            weight_map = {name: shard for shard, held in halves.items() for name in held}
            (folder / "model.safetensors.index.json").write_text(
                json.dumps({"weight_map": weight_map})
            )
    (directory / "evaluation.csv").write_text("step,test_acc\n0,0.1\n10,0.5\n20,0.9\n")
    return directory


def both_paths(run_dir: Path, convention: str, heads: int | None) -> tuple[pd.DataFrame, ...]:
    if (run_dir / "checkpoint-0").is_dir():  # sharded, as a Hub suite's revisions are read
        index = "model.safetensors.index.json"
        curve = pd.DataFrame({"step": [0, 10, 20], "test_acc": [0.1, 0.5, 0.9]})
        run = ExternalRun(run_dir, {s: run_dir / f"checkpoint-{s}" / index for s in (0, 10, 20)},
                          curve)  # fmt: skip
    else:
        run = read_external_run(run_dir)
    return (external_run_metrics(run, convention, heads, bounded=False),
            external_run_metrics(run, convention, heads, bounded=True))  # fmt: skip


@pytest.mark.parametrize(
    ("dtype", "form", "convention", "heads"),
    [(torch.float16, "safetensors", "paper", 4), (torch.bfloat16, "safetensors", "extended", None),
     (torch.float32, "pt", "paper", None), (torch.float16, "sharded", "extended", 4)],
)  # fmt: skip
def test_entry_by_entry_gives_the_trajectory_paths_numbers(
    tmp_path: Path, dtype: torch.dtype, form: str, convention: str, heads: int | None
) -> None:
    whole, bounded = both_paths(write_run(tmp_path / "run", dtype, form), convention, heads)
    assert list(bounded.columns) == list(whole.columns)
    assert bounded["step"].tolist() == [0, 10, 20]
    pd.testing.assert_frame_equal(bounded, whole, check_exact=False, rtol=1e-12, atol=0)
    for column in ("w_median", "b_median", "l1", "l2", "trace"):  # exact: order statistics, sums
        np.testing.assert_array_equal(bounded[column], whole[column])  # of the same matrices
    assert (bounded["n_matrices"] == whole["n_matrices"]).all()


def test_a_non_finite_matrix_is_left_out_of_the_pooled_statistics_alike(tmp_path: Path) -> None:
    whole, bounded = both_paths(write_run(tmp_path / "run", torch.float16, "safetensors", 10),
                                "paper", 4)  # fmt: skip
    assert bounded["skipped_matrices"].tolist() == whole["skipped_matrices"].tolist() == [0, 1, 0]
    pd.testing.assert_frame_equal(bounded, whole, check_exact=False, rtol=1e-12, atol=0)


def test_a_checkpoint_larger_than_the_chunk_budget_is_measured_entry_by_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path follows the counted entries' float64 size against CHUNK_BYTES."""
    run = read_external_run(write_run(tmp_path / "run", torch.float16, "safetensors"))
    calls = []
    original = external._bounded_run_metrics
    monkeypatch.setattr(external, "_bounded_run_metrics",
                        lambda *args: calls.append(1) or original(*args))  # fmt: skip
    external_run_metrics(run)
    assert not calls
    monkeypatch.setattr(external, "CHUNK_BYTES", 1000)
    table = external_run_metrics(run)
    assert calls and set(METRIC_NAMES) <= set(table.columns)
