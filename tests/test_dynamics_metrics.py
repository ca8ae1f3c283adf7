"""The 14 per-checkpoint metrics (training-maps paper, appendix B) on hand-made weights."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from trainmap.dynamics.metrics import (
    METRIC_NAMES,
    collect_run_metrics,
    trajectory_metrics,
    weight_matrices,
)
from trainmap.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(2, 2)
        self.norm = nn.LayerNorm(2)  # ignored, as in the paper
        self.second = nn.Linear(2, 1, bias=False)


def stacked(*states: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: torch.stack([s[name] for s in states]) for name in states[0]}


def test_metrics_of_a_hand_made_checkpoint():
    model = TwoLayers()
    first = torch.tensor([[3.0, 0.0], [0.0, -4.0]])  # singular values 4, 3; trace -1
    second = torch.tensor([[1.0, 2.0]])  # singular value sqrt(5); trace 1
    state = {
        "first.weight": first,
        "first.bias": torch.tensor([1.0, 3.0]),
        "norm.weight": torch.tensor([100.0, 100.0]),
        "norm.bias": torch.tensor([50.0, 50.0]),
        "second.weight": second,
    }
    row = trajectory_metrics(stacked(state), model).iloc[0]
    assert row["l1"] == pytest.approx((7 + 3) / 2)
    assert row["l2"] == pytest.approx((5 + math.sqrt(5)) / 2)
    assert row["l1_l2"] == pytest.approx((7 / 5 + 3 / math.sqrt(5)) / 2)
    assert row["trace"] == pytest.approx((-1 + 1) / 2)
    assert row["spectral"] == pytest.approx((4 + math.sqrt(5)) / 2)
    assert row["trace_spectral"] == pytest.approx((-1 / 4 + 1 / math.sqrt(5)) / 2)
    singular = np.array([4.0, 3.0, math.sqrt(5)])
    assert row["sv_mean"] == pytest.approx(singular.mean())
    assert row["sv_var"] == pytest.approx(singular.var())  # no Bessel correction
    weights = np.array([3.0, 0.0, 0.0, -4.0, 1.0, 2.0])
    assert row["w_mean"] == pytest.approx(weights.mean())
    assert row["w_median"] == pytest.approx(0.5)  # the mean of the two middle values
    assert row["w_var"] == pytest.approx(weights.var())
    assert (row["b_mean"], row["b_median"], row["b_var"]) == pytest.approx((2.0, 2.0, 1.0))
    assert row["n_matrices"] == 2 and row["skipped_matrices"] == 0


def test_attention_counts_one_matrix_per_head_for_q_k_v():
    meta = {"input_kind": "tokens", "input_shape": [3], "num_classes": 5, "vocab_size": 6}
    model = build_model("transformer", meta, d_model=8, n_heads=2, d_mlp=16)
    matrices, biases = weight_matrices(model)
    names = [(m.name, m.rows) for m in matrices]
    for projection in ("q", "k", "v"):
        heads = [rows for name, rows in names if name == f"attention.{projection}.weight"]
        assert heads == [slice(0, 4), slice(4, 8)]
    assert ("attention.o.weight", None) in names
    assert not any("embed" in name for name, _ in names)
    assert biases == ["mlp.up.bias", "mlp.down.bias", "readout.bias"]

    # Per-head slices change the spectral norm: q's two heads are scaled differently.
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    q = torch.zeros(8, 8)
    q[:4, :4] = 2 * torch.eye(4)
    q[4:, 4:] = 6 * torch.eye(4)
    for name in ("attention.q.weight", "attention.k.weight", "attention.v.weight"):
        state[name] = q
    row = trajectory_metrics(stacked(state), model).iloc[0]
    by_hand = []
    for matrix in matrices:
        tensor = state[matrix.name]
        tensor = tensor if matrix.rows is None else tensor[matrix.rows]
        by_hand.append(torch.linalg.svdvals(tensor.double())[0].item())
    assert row["spectral"] == pytest.approx(np.mean(by_hand))
    assert 2.0 in [pytest.approx(v) for v in by_hand] and 6.0 in [pytest.approx(v) for v in by_hand]


def test_conv_kernel_is_an_out_by_in_patch_matrix():
    model = nn.Sequential(nn.Conv2d(2, 3, 3))
    kernel = torch.arange(54, dtype=torch.float32).reshape(3, 2, 3, 3) - 20
    row = trajectory_metrics(stacked({"0.weight": kernel, "0.bias": torch.zeros(3)}), model).iloc[0]
    matrix = kernel.reshape(3, 18).double()
    assert row["spectral"] == pytest.approx(torch.linalg.svdvals(matrix)[0].item())
    assert row["trace"] == pytest.approx(torch.diagonal(matrix).sum().item())
    assert row["l1"] == pytest.approx(matrix.abs().sum().item())


def test_non_finite_matrices_are_skipped_and_counted():
    model = TwoLayers()
    good = {"first.weight": torch.eye(2), "first.bias": torch.zeros(2),
            "norm.weight": torch.ones(2), "norm.bias": torch.zeros(2),
            "second.weight": torch.tensor([[2.0, 0.0]])}  # fmt: skip
    bad = dict(good, **{"first.weight": torch.tensor([[math.nan, 0.0], [0.0, 1.0]])})
    frame = trajectory_metrics(stacked(good, bad), model)
    assert list(frame["skipped_matrices"]) == [0, 1]
    assert frame.loc[1, "spectral"] == pytest.approx(2.0)  # only the second matrix counts
    assert frame.loc[0, "spectral"] == pytest.approx((1 + 2) / 2)
    assert frame[list(METRIC_NAMES)].iloc[1].notna().all()


def test_zero_matrix_is_left_out_of_ratios_not_nan():
    model = TwoLayers()
    state = {"first.weight": torch.zeros(2, 2), "first.bias": torch.zeros(2),
             "norm.weight": torch.ones(2), "norm.bias": torch.zeros(2),
             "second.weight": torch.tensor([[3.0, 4.0]])}  # fmt: skip
    row = trajectory_metrics(stacked(state), model).iloc[0]
    assert row["l1_l2"] == pytest.approx(7 / 5)
    assert row["trace_spectral"] == pytest.approx(3 / 5)  # tr([[3, 4]]) = 3
    assert row["l2"] == pytest.approx(5 / 2)


def test_collect_run_metrics_joins_the_history():
    model = TwoLayers()
    states = [{k: v.detach() * (i + 1) for k, v in model.state_dict().items()} for i in range(3)]
    trajectory = {"step": torch.tensor([0, 10, 20]), "state": stacked(*states)}
    history = pd.DataFrame({"step": [0, 10, 20], "train_loss": [1.0, 0.5, 0.2],
                            "train_acc": [0.1, 0.5, 0.9], "test_loss": [1.1, 0.6, 0.3],
                            "test_acc": [0.2, 0.6, 0.95], "lr": [0.1] * 3})  # fmt: skip
    table = collect_run_metrics(trajectory, model, history)
    assert list(table.columns[:15]) == ["step", *METRIC_NAMES]
    assert list(table["test_acc"]) == [0.2, 0.6, 0.95]
    assert table["l2"].iloc[2] == pytest.approx(3 * table["l2"].iloc[0])
    with pytest.raises(ValueError, match="different runs"):
        collect_run_metrics(trajectory, model, history.iloc[:2])
