"""The 14 per-checkpoint metrics (training-maps paper, appendix B): hand-made weights, and the
conventions checked against direct computations on an MLP, the transformer and CNNs, and the
residual blocks' shortcut convs left out under ``paper`` as the authors' ResNet walker does."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from trainmap.dynamics.metrics.columns import CONVENTIONS, PAPER_CONVENTIONS
from trainmap.dynamics.metrics.reference import checkpoint_metrics, trajectory_metrics_reference
from trainmap.dynamics.metrics.weights import (
    METRIC_NAMES,
    check_convention,
    collect_run_metrics,
    is_shortcut_conv,
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
    row = trajectory_metrics(stacked(state), model, "extended").iloc[0]
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
    # The paper's convention (a): singular-value statistics per matrix, then averaged.
    paper = trajectory_metrics(stacked(state), model).iloc[0]
    assert paper["sv_mean"] == pytest.approx((3.5 + math.sqrt(5)) / 2)
    assert paper["sv_var"] == pytest.approx((0.25 + 0.0) / 2)  # var(4, 3) = 0.25, no Bessel
    for key in ("l1", "l2", "l1_l2", "trace", "spectral", "trace_spectral", "w_mean", "w_median",
                "w_var", "b_mean", "b_median", "b_var"):  # fmt: skip
        assert paper[key] == pytest.approx(row[key]), key


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
    # Convention (c): the paper ignores the unembedding (readout) with the embeddings.
    assert ("readout.weight", None) not in names and biases == ["mlp.up.bias", "mlp.down.bias"]
    extended, extended_biases = weight_matrices(model, "extended")
    assert extended[-1].name == "readout.weight" and extended_biases[-1] == "readout.bias"

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


def test_conv_kernel_conventions():
    """extended: the (out, in * kh * kw) patch matrix; paper (b): mean slice norms, and no
    trace/spectral/singular-value metric from convolutions."""
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten(), nn.Linear(3, 2, bias=False))
    kernel = torch.arange(54, dtype=torch.float32).reshape(3, 2, 3, 3) - 20
    readout = torch.tensor([[3.0, 0.0, 0.0], [0.0, 4.0, 0.0]])
    state = stacked({"0.weight": kernel, "0.bias": torch.zeros(3), "2.weight": readout})
    row = trajectory_metrics(state, model, "extended").iloc[0]
    matrix = kernel.reshape(3, 18).double()
    assert row["spectral"] == pytest.approx((torch.linalg.svdvals(matrix)[0].item() + 4) / 2)
    assert row["trace"] == pytest.approx((torch.diagonal(matrix).sum().item() + 7) / 2)
    assert row["l1"] == pytest.approx((matrix.abs().sum().item() + 7) / 2)
    paper = trajectory_metrics(state, model).iloc[0]
    slices = kernel.double().reshape(6, 9)
    slice_l1, slice_l2 = slices.abs().sum(dim=1), slices.norm(dim=1)
    assert paper["l1"] == pytest.approx((slice_l1.mean().item() + 7) / 2)
    assert paper["l2"] == pytest.approx((slice_l2.mean().item() + 5) / 2)
    assert paper["l1_l2"] == pytest.approx(((slice_l1 / slice_l2).mean().item() + 7 / 5) / 2)
    assert (paper["trace"], paper["spectral"], paper["sv_mean"]) == pytest.approx((7, 4, 3.5))
    assert paper["w_mean"] == pytest.approx(torch.cat([kernel.flatten(), readout.flatten()])
                                            .double().mean().item())  # fmt: skip


MODELS = {
    "mlp": ("mlp", {"input_kind": "vector", "input_shape": [12], "num_classes": 2},
            {"hidden": [16, 8]}),
    "transformer": ("transformer", {"input_kind": "tokens", "input_shape": [3], "num_classes": 7,
                                    "vocab_size": 8}, {"d_model": 8, "n_heads": 2, "d_mlp": 16}),
    "vgg_bn": ("vgg_bn", {"input_kind": "image", "input_shape": [1, 8, 8], "num_classes": 10},
               {"widths": [4, 8], "convs_per_stage": [1, 1]}),
    "resnet_bn": ("resnet_bn", {"input_kind": "image", "input_shape": [1, 8, 8],
                                "num_classes": 10}, {"widths": [4, 8], "blocks_per_stage": [1, 1]}),
    "resnet": ("resnet", {"input_kind": "image", "input_shape": [1, 8, 8], "num_classes": 10},
               {"widths": [4, 8], "blocks_per_stage": [1, 1]}),
}  # fmt: skip
#: Residual networks with 1x1 shortcut convs (resnet: with a bias, no BN; fixup: not nested).
RESIDUAL = {
    **{name: MODELS[name] for name in ("resnet_bn", "resnet")},
    "fixup_resnet": ("fixup_resnet", MODELS["resnet"][1], {"widths": [4, 8],
                                                            "blocks_per_stage": [1, 1]}),
}  # fmt: skip


def drifting_trajectory(model: nn.Module, checkpoints: int = 4) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    states = []
    for index in range(checkpoints):
        states.append({k: v.detach() + 0.05 * index * torch.randn(v.shape, generator=generator)
                       if v.is_floating_point() else v
                       for k, v in model.state_dict().items()})  # fmt: skip
    return stacked(*states)


def direct_paper_metrics(
    model: nn.Module, state: dict[str, torch.Tensor], shortcuts: bool = False
) -> dict[str, float]:
    """The stated ``paper`` convention computed directly in numpy, module by module; a residual
    block's shortcut conv (a module under ``shortcut``) counts only with ``shortcuts``
    (``paper_shortcuts``)."""
    from trainmap.models import MultiHeadAttention

    linears, kernels, weights, biases = [], [], [], []
    modules = dict(model.named_modules())
    has_embedding = any(isinstance(m, nn.Embedding) for m in modules.values())
    last_linear = [n for n, m in modules.items() if isinstance(m, nn.Linear)][-1]
    heads = {f"{n}.{p}" if n else p: m for n, m in modules.items()
             if isinstance(m, MultiHeadAttention) for p in "qkv"}  # fmt: skip
    for name, module in modules.items():
        if has_embedding and name == last_linear:
            continue  # (c): the unembedding
        if not shortcuts and "shortcut" in name.split("."):
            continue  # (f): the authors' get_metrics_resnet18 never reads a block's downsample
        if name in heads:
            w = state[f"{name}.weight"].double().numpy()
            d_head = heads[name].d_head
            linears += [w[h * d_head : (h + 1) * d_head] for h in range(heads[name].n_heads)]
            weights.append(w.ravel())
        elif isinstance(module, nn.Linear):
            linears.append(state[f"{name}.weight"].double().numpy())
            weights.append(linears[-1].ravel())
        elif isinstance(module, nn.Conv2d):
            kernels.append(state[f"{name}.weight"].double().numpy())
            weights.append(kernels[-1].ravel())
        else:
            continue
        if getattr(module, "bias", None) is not None:
            biases.append(state[f"{name}.bias"].double().numpy().ravel())

    def per_matrix(w):  # noqa: E306
        s = np.linalg.svd(w, compute_uv=False)
        s[s < 1e-5] = 0
        l1, l2, tr = np.abs(w).sum(), np.sqrt((w**2).sum()), np.trace(w)
        return {"l1": l1, "l2": l2, "l1_l2": l1 / l2, "trace": tr, "spectral": s[0],
                "trace_spectral": tr / s[0], "sv_mean": s.mean(), "sv_var": s.var()}  # fmt: skip

    def per_kernel(k):  # noqa: E306
        out = [(np.abs(k[o, i]).sum(), np.sqrt((k[o, i] ** 2).sum()))
               for o in range(k.shape[0]) for i in range(k.shape[1])]  # fmt: skip
        return {"l1": np.mean([a for a, _ in out]), "l2": np.mean([b for _, b in out]),
                "l1_l2": np.mean([a / b for a, b in out])}  # fmt: skip

    layers = [per_matrix(w) for w in linears] + [per_kernel(k) for k in kernels]
    row = {key: np.mean([layer[key] for layer in layers if key in layer])
           for key in ("l1", "l2", "l1_l2", "trace", "spectral", "trace_spectral", "sv_mean",
                       "sv_var")}  # fmt: skip
    w, b = np.concatenate(weights), np.concatenate(biases)
    row |= {"w_mean": w.mean(), "w_median": np.median(w), "w_var": w.var(),
            "b_mean": b.mean(), "b_median": np.median(b), "b_var": b.var()}  # fmt: skip
    return row


@pytest.mark.parametrize("convention", PAPER_CONVENTIONS)
@pytest.mark.parametrize("name", list(MODELS))
def test_paper_convention_equals_a_direct_computation(name, convention):
    arch, meta, options = MODELS[name]
    torch.manual_seed(0)
    model = build_model(arch, meta, **options)
    trajectory = drifting_trajectory(model)
    shortcuts = convention == "paper_shortcuts"
    fast = trajectory_metrics(trajectory, model, convention)
    reference = trajectory_metrics_reference(trajectory, model, shortcuts=shortcuts)
    for t in range(len(fast)):
        state = {k: v[t] for k, v in trajectory.items()}
        direct = direct_paper_metrics(model, state, shortcuts)
        for key in METRIC_NAMES:
            assert fast.loc[t, key] == pytest.approx(direct[key], rel=1e-10, abs=1e-12), (t, key)
            assert reference.loc[t, key] == pytest.approx(direct[key], rel=1e-10, abs=1e-12)


def shortcut_entries(model: nn.Module) -> set[str]:
    """The state entries of the 1x1 shortcut convs, found from the modules (resnet.py's
    ``BasicBlock.shortcut``: a Sequential holding ``conv`` (+ ``bn``); FixUp's: the Conv2d)."""
    names = set()
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d) and "shortcut" in name.split("."):
            assert module.kernel_size == (1, 1)
            names |= {f"{name}.{p}" for p, _ in module.named_parameters()}
    return names


@pytest.mark.parametrize("name", list(RESIDUAL))
def test_paper_leaves_out_the_shortcut_convs_and_paper_shortcuts_counts_them(name):
    """Convention (f): under ``paper`` the shortcut convs' weights and biases change nothing;
    ``paper_shortcuts`` counts them, as ``extended`` does."""
    arch, meta, options = RESIDUAL[name]
    torch.manual_seed(0)
    model = build_model(arch, meta, **options)
    entries = shortcut_entries(model)
    assert entries, "the model has no shortcut conv to test"
    counted = {}
    for convention in CONVENTIONS:
        matrices, biases = weight_matrices(model, convention)
        counted[convention] = {m.name for m in matrices} | set(biases)
    assert not counted["paper"] & entries
    assert entries <= counted["paper_shortcuts"] and entries <= counted["extended"]
    assert counted["paper_shortcuts"] - counted["paper"] == entries

    trajectory = drifting_trajectory(model)
    changed = {k: 7 * v + 3 if k in entries else v for k, v in trajectory.items()}
    pd.testing.assert_frame_equal(trajectory_metrics(trajectory, model),
                                  trajectory_metrics(changed, model), check_exact=True)  # fmt: skip
    before = trajectory_metrics(trajectory, model, "paper_shortcuts")
    after = trajectory_metrics(changed, model, "paper_shortcuts")
    moved = {"l1", "l2", "w_mean", "w_var"} | ({"b_mean"} if any("bias" in e for e in entries)
                                                 else set())  # fmt: skip
    for key in moved:
        assert not np.allclose(before[key], after[key], rtol=1e-3), key


@pytest.mark.parametrize("name", ["resnet_bn", "resnet"])
def test_the_authors_loop_agrees_with_both_paper_conventions_on_resnets(name):
    """The re-implemented authors' loop, which finds the shortcut convs by structure, equals
    ``paper`` (shortcuts skipped, as get_metrics_resnet18) and, told to count them,
    ``paper_shortcuts``, to round-off; the two conventions are far apart."""
    arch, meta, options = RESIDUAL[name]
    torch.manual_seed(0)
    model = build_model(arch, meta, **options)
    trajectory = drifting_trajectory(model)
    columns = list(METRIC_NAMES)
    results = {}
    for convention, shortcuts in (("paper", False), ("paper_shortcuts", True)):
        fast = trajectory_metrics(trajectory, model, convention)[columns].to_numpy()
        reference = trajectory_metrics_reference(trajectory, model, shortcuts=shortcuts)
        np.testing.assert_allclose(fast, reference[columns].to_numpy(), rtol=1e-12, atol=1e-15)
        results[convention] = fast
    gap = np.abs(results["paper"] - results["paper_shortcuts"]) / np.abs(results["paper"])
    by_metric = dict(zip(columns, gap.max(axis=0), strict=True))
    assert min(by_metric[key] for key in ("l1", "l2", "l1_l2", "w_mean", "w_var")) > 0.05


def test_a_network_without_shortcut_convs_is_the_same_under_both_paper_conventions():
    """resnet_plain (no shortcuts) and a VGG: ``paper_shortcuts`` is ``paper``."""
    meta = MODELS["resnet"][1]
    for arch in ("resnet_plain", "vgg_bn"):
        model = build_model(arch, meta)
        assert weight_matrices(model, "paper") == weight_matrices(model, "paper_shortcuts")


def test_a_shortcut_conv_is_a_1x1_conv_under_shortcut_or_downsample():
    assert is_shortcut_conv("stage2.0.shortcut.conv", (1, 1))  # trainmap's resnet
    assert is_shortcut_conv("blocks.3.shortcut", (1, 1))  # trainmap's fixup_resnet
    assert is_shortcut_conv("layer2.0.downsample.0", (1, 1))  # torchvision's ResNet
    assert not is_shortcut_conv("down.1.downsample.conv", (3, 3))  # a main-path strided conv
    assert not is_shortcut_conv("stage2.0.conv1x1.conv", (1, 1))  # RepVGG's 1x1 branch
    assert not is_shortcut_conv("stage2.0.shortcuts_seen", (1, 1))  # whole name parts only


def test_the_config_accepts_every_convention(base_config):
    """``analysis.metrics``: the schema's enum is :data:`CONVENTIONS`, and a typo is refused."""
    import copy

    import yaml

    from trainmap.grid import ConfigError, validate_schema
    from trainmap.schema import SCHEMA_PATH

    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    analysis = schema["properties"]["analysis"]["properties"]
    assert analysis["metrics"]["enum"] == list(CONVENTIONS)
    config = copy.deepcopy(base_config)
    for convention in CONVENTIONS:
        check_convention(convention)
        config["analysis"]["metrics"] = convention
        validate_schema(config)
    config["analysis"]["metrics"] = "paper_shortcut"
    with pytest.raises(ConfigError, match="paper_shortcut"):
        validate_schema(config)
    with pytest.raises(ValueError, match="paper_shortcuts"):
        check_convention("paper_shortcut")


def test_authors_switches_change_only_variances_and_medians():
    """The authors' exact numbers differ from the paper convention only by Bessel's correction
    (d) and torch's lower median (e)."""
    arch, meta, options = MODELS["mlp"]
    torch.manual_seed(0)
    model = build_model(arch, meta, **options)
    state = {k: v[2] for k, v in drifting_trajectory(model).items()}
    ours = checkpoint_metrics(state, model)
    authors = checkpoint_metrics(state, model, bessel=True, lower_median=True)
    changed = {key for key in METRIC_NAMES if ours[key] != pytest.approx(authors[key], rel=1e-12)}
    assert changed == {"sv_var", "w_var", "b_var", "w_median", "b_median"}
    n_biases = 16 + 8 + 2
    assert authors["b_var"] == pytest.approx(ours["b_var"] * n_biases / (n_biases - 1))


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
