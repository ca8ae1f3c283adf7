"""AST sparse retraining (trainmap.methods.sparse): N:M masks, STE, SR-STE, distillation, SLoRB, resume."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn

from trainmap.data import make_task_data
from trainmap.methods import METHODS
from trainmap.methods.nm import from_nm_groups, nm_groups
from trainmap.methods.sparse import (
    SparseHooks,
    check_settings,
    distillation_loss,
    run_sparse_block,
    run_sparse_method,
    srste_lambda,
)
from trainmap.methods.sparse_layers import (
    SparseLinear,
    check_nm,
    nm_mask,
    nm_mask_from_scores,
    sparse_layers,
    sparsify,
    wanda_scores,
)
from trainmap.training.archive import read_archive
from trainmap.training.checkpoints import load_model
from trainmap.training.loop import (
    TrainConfig,
    TrainPaths,
    build_cell_model,
    train_model,
)
from trainmap.training.seed_block import SeedBlock

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def parity():
    return make_task_data("sparse_parity", {"n_bits": 12, "k": 2, "n_train": 128, "n_test": 64})


@pytest.fixture(scope="module")
def teacher(parity, tmp_path_factory):
    """A small MLP trained briefly: the dense model every sparse method starts from."""
    model = build_cell_model("mlp", "kaiming", 0, parity.meta, {"hidden": [32, 32]})
    out = tmp_path_factory.mktemp("teacher")
    train_model(model, parity, TrainConfig(lr=0.1, momentum=0.9, steps=150, checkpoint_every=50),
                0, TrainPaths.in_directory(out), progress=False)  # fmt: skip
    return model.eval()


@pytest.mark.parametrize(("n", "m"), [(1, 2), (2, 4), (4, 8), (2, 8)])
@pytest.mark.parametrize("layout", ["input_channels", "flattened"])
def test_every_group_keeps_exactly_n(n, m, layout):
    torch.manual_seed(n * 10 + m)
    for weight in (torch.randn(6, 16), torch.randn(4, 8, 2, 2)):  # linear and conv
        mask = nm_mask(weight, n, m, layout)
        groups = nm_groups(mask, m, layout)
        assert (groups.sum(-1) == n).all()
        magnitude = weight.abs()
        kept = nm_groups(torch.where(mask > 0, magnitude, torch.inf), m, layout)
        dropped = nm_groups(torch.where(mask > 0, -torch.inf, magnitude), m, layout)
        assert (kept.min(-1).values >= dropped.max(-1).values).all()  # the largest are kept


@pytest.mark.parametrize(("n", "m"), [(2, 4), (1, 4), (4, 8)])
def test_conv_masks_group_input_channels_at_every_kernel_position(n, m):
    """The default conv layout (SR-STE's sparse conv, N:M tensor cores): for every (out, kh, kw),
    each run of M consecutive input channels keeps exactly N, the N largest |w|."""
    torch.manual_seed(n + m)
    weight = torch.randn(5, 16, 3, 3)
    mask = nm_mask(weight, n, m)  # the default layout
    for out in range(5):
        for kh in range(3):
            for kw in range(3):
                for start in range(0, 16, m):
                    column = mask[out, start : start + m, kh, kw]
                    assert int(column.sum()) == n
                    values = weight[out, start : start + m, kh, kw].abs()
                    kept = values[column > 0]
                    assert kept.min() >= values[column == 0].max()
    flattened = nm_mask(weight, n, m, "flattened")
    assert not torch.equal(mask, flattened)  # the old layout is a different mask
    groups = flattened.reshape(5, -1, m).sum(-1)
    assert (groups == n).all()
    with pytest.raises(ValueError, match=r"grouped input size \(6, layout 'input_channels'\)"):
        nm_mask(torch.randn(2, 6, 3, 3), 2, 4)  # 6 input channels: not in groups of 4
    assert nm_mask(torch.randn(2, 6, 2, 2), 2, 4, "flattened").shape == (2, 6, 2, 2)


def test_nm_group_view_round_trips():
    tensor = torch.arange(2 * 8 * 3 * 3).reshape(2, 8, 3, 3)
    for layout in ("input_channels", "flattened"):
        groups = nm_groups(tensor, 4, layout)
        assert groups.shape == (2, 18, 4)
        assert torch.equal(from_nm_groups(groups, tensor.shape, layout), tensor)
    # input_channels: a group is 4 consecutive channels at one kernel position
    assert nm_groups(tensor, 4, "input_channels")[0, 0].tolist() == [0, 9, 18, 27]
    assert nm_groups(tensor, 4, "flattened")[0, 0].tolist() == [0, 1, 2, 3]


def test_ties_are_broken_deterministically_lowest_index_first():
    mask = nm_mask(torch.ones(2, 8), 2, 4)
    assert mask.tolist() == [[1, 1, 0, 0, 1, 1, 0, 0]] * 2
    scores = torch.tensor([[3.0, 1.0, 3.0, 3.0]])
    assert nm_mask_from_scores(scores, 2, 4).tolist() == [[1, 0, 1, 0]]
    with pytest.raises(ValueError, match="divisible by m=4"):
        nm_mask(torch.ones(2, 6), 2, 4)


def test_straight_through_gradient_reaches_pruned_weights():
    torch.manual_seed(0)
    layer = sparsify(nn.Sequential(nn.Linear(8, 3)), 2, 4, layers=["0"])[0]
    inputs = torch.randn(5, 8)
    layer(inputs).sum().backward()
    # d/dW of sum(x @ (W*m)^T) w.r.t. the masked weight is sum_b x_b, for every entry (STE).
    expected = inputs.sum(0).expand(3, 8)
    assert torch.allclose(layer.weight.grad, expected)
    assert (layer.weight.grad * (1 - layer.weight_mask)).abs().sum() > 0


def sparse_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return sparsify(nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)), 2, 4,
                    layers=["0", "2"])  # fmt: skip


def attached(hooks: SparseHooks, model: nn.Module) -> SparseHooks:
    """The hooks attached to a block of one seed (``model`` itself), as the training loop does."""
    hooks.attach(SeedBlock([model]))
    return hooks


def test_srste_decays_pruned_weights_and_leaves_kept_updates_alone():
    """With no task gradient, one SGD step with SR-STE moves only pruned weights, toward zero."""
    model = sparse_mlp()
    settings = check_settings({"srste_lambda": 0.5})
    hooks = attached(SparseHooks(None, settings, {"decay": "static", "distill": False}, 100), model)
    before = {name: layer.weight.detach().clone() for name, layer in sparse_layers(model).items()}
    for layer in sparse_layers(model).values():
        layer.weight.grad = torch.zeros_like(layer.weight)
    hooks.after_backward(step=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.step()
    for name, layer in sparse_layers(model).items():
        mask, old, new = layer.weight_mask, before[name], layer.weight.detach()
        assert torch.equal(new[mask == 1], old[mask == 1])
        pruned_old, pruned_new = old[mask == 0], new[mask == 0]
        assert torch.allclose(pruned_new, pruned_old * (1 - 0.1 * 0.5))
        assert (pruned_new.abs() <= pruned_old.abs()).all()


def test_srste_uses_one_minus_mask_not_a_bitwise_not():
    """The authors' ~mask on an int mask gives -2/-1, decaying kept weights with a flipped sign."""
    model = sparse_mlp()
    hooks = attached(SparseHooks(None, check_settings({"srste_lambda": 1.0}),
                                 {"decay": "static", "distill": False}, 10), model)  # fmt: skip
    for layer in sparse_layers(model).values():
        layer.weight.grad = torch.zeros_like(layer.weight)
    hooks.after_backward(step=0)
    for layer in sparse_layers(model).values():
        grad, mask, weight = layer.weight.grad, layer.weight_mask, layer.weight.detach()
        assert torch.equal(grad[mask == 1], torch.zeros_like(grad[mask == 1]))
        assert torch.allclose(grad[mask == 0], weight[mask == 0])


def test_srste_schedule():
    assert srste_lambda(0, 0.2, 100, "annealed") == 0.0
    assert srste_lambda(50, 0.2, 100, "annealed") == pytest.approx(0.1)
    assert srste_lambda(100, 0.2, 100, "annealed") == pytest.approx(0.2)
    assert srste_lambda(200, 0.2, 100, "annealed") == pytest.approx(0.2)
    assert [srste_lambda(t, 0.2, 100, "static") for t in (0, 50, 100, 200)] == [0.2] * 4
    assert srste_lambda(50, 0.2, 100, "none") == 0.0


def test_kl_is_zero_for_identical_logits_and_positive_otherwise():
    logits = torch.randn(6, 5)
    assert float(distillation_loss(logits, logits, 2.0)) == pytest.approx(0.0, abs=1e-7)
    assert float(distillation_loss(logits, logits + torch.randn(6, 5), 2.0)) > 0
    # T^2 * KL: the scale grows with T^2 for small differences.
    other = logits + 0.01 * torch.randn(6, 5)
    assert float(distillation_loss(logits, other, 4.0)) > 0


def test_distillation_on_sequence_logits_averages_per_token():
    """(batch, sequence, vocab) logits: the loss equals the 2-D loss on the flattened tokens (per
    token, as the paper and the authors' code), not S times it."""
    torch.manual_seed(0)
    student, teacher = torch.randn(3, 7, 11), torch.randn(3, 7, 11)
    per_token = distillation_loss(student.reshape(21, 11), teacher.reshape(21, 11), 2.0)
    assert float(distillation_loss(student, teacher, 2.0)) == pytest.approx(float(per_token))
    by_hand = 0.0
    for b in range(3):
        for t in range(7):
            p = torch.softmax(teacher[b, t] / 2, -1)
            q = torch.log_softmax(student[b, t] / 2, -1)
            by_hand += float((p * (p.log() - q)).sum())
    assert float(per_token) == pytest.approx(4 * by_hand / 21, rel=1e-5)


def test_slorb_init_restores_each_group_mean():
    torch.manual_seed(3)
    dense = nn.Sequential(nn.Linear(32, 6))
    model = sparsify(dense, 2, 4, slorb_k=8, layers=["0"])
    layer = model[0]
    weight = dense[0].weight.detach()
    masked = (layer.weight * layer.weight_mask).detach()
    for group in range(32 // 8):
        columns = slice(group * 8, (group + 1) * 8)
        restored = masked[:, columns].mean(1) + layer.slorb_weight[:, group].detach()
        assert torch.allclose(restored, weight[:, columns].mean(1), atol=1e-6)
    inputs = torch.randn(4, 32)
    expected = inputs @ layer.effective_weight().detach().T + layer.bias.detach()
    assert torch.allclose(layer(inputs), expected, atol=1e-6)


def test_slorb_partial_last_group_is_the_mean_of_its_own_inputs():
    """d = 40, k = 16: groups of 16, 16 and 8 inputs; S of the last is the mean of its 8 pruned
    weights (a divisor of k = 16 halved it: measured, the mean was off by 0.07)."""
    torch.manual_seed(5)
    dense = nn.Sequential(nn.Linear(40, 6))
    with torch.no_grad():
        dense[0].weight.add_(0.3)  # a non-zero mean, so a wrong divisor shows
    layer = sparsify(dense, 2, 4, slorb_k=16, layers=["0"])[0]
    pruned = (dense[0].weight * (1 - layer.weight_mask)).detach()
    for group, columns in enumerate((slice(0, 16), slice(16, 32), slice(32, 40))):
        expected = pruned[:, columns].mean(1)
        assert torch.allclose(layer.slorb_weight[:, group].detach(), expected, atol=1e-7)
    restored = (layer.effective_weight().detach()[:, 32:40]).mean(1)
    assert torch.allclose(restored, dense[0].weight.detach()[:, 32:40].mean(1), atol=1e-6)


def test_flip_rates_of_hand_made_masks():
    model = sparse_mlp()
    hooks = attached(SparseHooks(None, check_settings({"mask_every": 1}),
                                 {"decay": "none", "distill": False}, 10), model)  # fmt: skip
    layers = list(sparse_layers(model).values())
    total = sum(layer.weight_mask.numel() for layer in layers)
    first = layers[0].weight_mask.clone()
    with torch.no_grad():  # in the first group of row 0, make the pruned weights the large ones
        group = first[0, :4]
        layers[0].weight[0, :4] = torch.where(group == 0, 10.0, 0.1)
    hooks.after_step(0)
    changed = float((layers[0].weight_mask - first).abs().sum())
    assert changed == 4  # two kept weights dropped, two pruned ones kept
    assert hooks.flips[0][-1]["flip_rate"] == pytest.approx(changed / total)
    assert hooks.flips[0][-1]["initial_flip_rate"] == pytest.approx(changed / total)
    hooks.after_step(1)  # nothing changed since
    assert hooks.flips[0][-1]["flip_rate"] == 0.0
    assert hooks.flips[0][-1]["initial_flip_rate"] == pytest.approx(changed / total)


def test_wanda_scores_and_mask_differ_from_magnitude_with_skewed_inputs():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(4, 2))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]]))
    inputs = torch.zeros(10, 4)
    inputs[:, 0] = 100.0  # a dominant first feature
    inputs[:, 3] = 0.01
    scores = wanda_scores(model, ["0"], inputs)["0"]
    norms = inputs.norm(dim=0)
    assert torch.allclose(scores, model[0].weight.abs() * norms[None, :])
    assert not torch.equal(nm_mask_from_scores(scores, 2, 4), nm_mask(model[0].weight, 2, 4))


def test_methods_registry_options_are_the_ones_run_sparse_method_reads():
    for name in ("ast", "ast_slorb", "ast_static", "oneshot", "oneshot_ft", "wanda"):
        options = METHODS[name].options
        assert set(options) == {"mask", "retrain", "frozen_mask", "decay", "distill", "slorb"}


SETTINGS = {"n": 2, "m": 4, "mask_every": 5, "srste_lambda": 0.1, "dense_layers": "none",
            "train": {"lr": 0.05, "momentum": 0.9, "batch_size": 32, "steps": 60,
                      "checkpoint_every": 10, "resume_every": 25}}  # fmt: skip
INFO = {"arch": "mlp", "model_options": {"hidden": [32, 32]}, "method": "ast", "seed": 0}


class Crash(Exception):
    pass


def test_retraining_resumes_bit_identically_and_stays_nm(teacher, parity, tmp_path):
    options = METHODS["ast"].options
    info = INFO | {"meta": parity.meta}
    reference = run_sparse_method(teacher, parity, options, SETTINGS, 0, tmp_path / "a",
                                  fingerprint="x", model_info=info)  # fmt: skip

    def crash(metrics, step):
        if step == 40:
            raise Crash

    with pytest.raises(Crash):
        run_sparse_method(teacher, parity, options, SETTINGS, 0, tmp_path / "b", log_metrics=crash,
                          fingerprint="x", model_info=info)  # fmt: skip
    resumed = run_sparse_method(teacher, parity, options, SETTINGS, 0, tmp_path / "b",
                                fingerprint="x", model_info=info)  # fmt: skip
    assert resumed["resumed_from_step"] == 25 and reference["nm_valid"] and resumed["nm_valid"]
    a, b = (torch.load(tmp_path / d / "model.pt", weights_only=True) for d in "ab")
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "a" / "flips.csv"),
                                  pd.read_csv(tmp_path / "b" / "flips.csv"))  # fmt: skip
    trajectory = read_archive(tmp_path / "a")
    assert set(trajectory["state"]) == set(teacher.state_dict())
    model = load_model(tmp_path / "a" / "model.pt")
    assert check_nm(model)
    # The trajectory's last weights are what the model computes with.
    for name, layer in sparse_layers(model).items():
        assert torch.allclose(trajectory["state"][f"{name}.weight"][-1], layer.effective_weight())
    flips = pd.read_csv(tmp_path / "a" / "flips.csv")
    assert list(flips["step"]) == list(range(5, 61, 5))


def test_oneshot_and_frozen_mask_methods(teacher, parity, tmp_path):
    info = INFO | {"meta": parity.meta}
    oneshot = run_sparse_method(teacher, parity, METHODS["oneshot"].options, SETTINGS, 0,
                                tmp_path / "oneshot", model_info=info)  # fmt: skip
    assert oneshot["steps_done"] == 0 and oneshot["nm_valid"]
    assert len(pd.read_csv(tmp_path / "oneshot" / "history.csv")) == 1
    pruned = load_model(tmp_path / "oneshot" / "model.pt")
    expected = sparsify(teacher, 2, 4, layers=list(sparse_layers(pruned)))
    inputs = parity.x_test[:8]
    assert torch.allclose(pruned(inputs), expected.eval()(inputs))

    run_sparse_method(teacher, parity, METHODS["oneshot_ft"].options, SETTINGS, 0,
                      tmp_path / "ft", model_info=info)  # fmt: skip
    tuned = load_model(tmp_path / "ft" / "model.pt")
    for name, layer in sparse_layers(tuned).items():
        assert torch.equal(layer.weight_mask, sparse_layers(pruned)[name].weight_mask)
    assert pd.read_csv(tmp_path / "ft" / "flips.csv").empty


def test_sparse_checkpoint_round_trip(teacher, parity, tmp_path):
    info = INFO | {"meta": parity.meta}
    run_sparse_method(teacher, parity, METHODS["ast_slorb"].options, SETTINGS, 0, tmp_path,
                      model_info=info)  # fmt: skip
    saved = torch.load(tmp_path / "model.pt", weights_only=True)
    assert saved["format"] == "sparse" and saved["sparse"]["slorb_k"] == 16
    model = load_model(tmp_path / "model.pt")
    assert isinstance(model.layers[1], SparseLinear)
    again = load_model(tmp_path / "model.pt")
    inputs = parity.x_test[:16]
    assert torch.equal(model(inputs), again(inputs))


@pytest.mark.parametrize("layout", ["input_channels", "flattened"])
def test_conv_sparse_checkpoint_keeps_its_group_layout(tmp_path, layout):
    """A sparse CNN saved and rebuilt keeps its conv group layout; a checkpoint written before the
    layout was recorded is read as the flattened layout it was made with."""
    from trainmap.methods.sparse_layers import model_from_sparse, save_sparse

    meta = {"input_kind": "image", "input_shape": [1, 8, 8], "num_classes": 10}
    options = {"widths": [8, 16], "convs_per_stage": [2, 2]}
    dense = build_cell_model("vgg_bn", "kaiming", 0, meta, options).eval()
    model = sparsify(dense, 2, 4, layout=layout).eval()
    assert {layer.group_layout for layer in sparse_layers(model).values()} == {layout}
    assert check_nm(model)
    info = {"arch": "vgg_bn", "model_options": options, "meta": meta, "method": "ast", "seed": 0}
    save_sparse(model, tmp_path / "sparse.pt", **info)
    saved = torch.load(tmp_path / "sparse.pt", weights_only=True)
    assert saved["sparse"]["group_layout"] == layout
    rebuilt = model_from_sparse(saved).eval()
    assert all(layer.group_layout == layout for layer in sparse_layers(rebuilt).values())
    assert check_nm(rebuilt)
    inputs = torch.rand(4, 1, 8, 8)
    assert torch.equal(rebuilt(inputs), model(inputs))
    del saved["sparse"]["group_layout"]
    legacy = model_from_sparse(saved)
    assert {layer.group_layout for layer in sparse_layers(legacy).values()} == {"flattened"}
    assert check_nm(legacy) == (layout == "flattened")


def test_settings_are_checked():
    """Against the schema (key, value and what is allowed), then n < m and the start."""
    with pytest.raises(ValueError, match=r"unknown sparse settings \['lamda'\]"):
        check_settings({"lamda": 1})
    with pytest.raises(ValueError, match=r"n: 4 is not below m: 4; allowed: 1 <= n < m"):
        check_settings({"n": 4, "m": 4})
    with pytest.raises(ValueError, match=r"train.epochs: unknown key 'epochs'; allowed: archive"):
        check_settings({"train": {"epochs": 3}})
    with pytest.raises(
        ValueError,
        match=r"conv_groups: 'channels' is not allowed; allowed: one of input_channels, flattened",
    ):
        check_settings({"conv_groups": "channels"})
    with pytest.raises(ValueError, match=r"mask_every: 0 is not allowed; allowed: an integer >= 1"):
        check_settings({"mask_every": 0})
    with pytest.raises(ValueError, match=r"temperature: nan is not allowed; allowed: a finite"):
        check_settings({"temperature": float("nan")})
    with pytest.raises(ValueError, match=r"train.lr: -0.1 is not allowed; allowed: a number > 0"):
        check_settings({"train": {"lr": -0.1}})
    assert check_settings({})["conv_groups"] == "input_channels"
    assert check_settings({})["start"] == "final"
    with pytest.raises(ValueError, match=r"start: 'middle' is not a start; allowed: final, init"):
        check_settings({"start": "middle"})
    with pytest.raises(ValueError, match=r"start.step: -50 is not a step"):
        check_settings({"start": {"step": -50}})


def test_start_prunes_the_dense_runs_checkpoint_and_distils_from_the_final_model(
    parity, tmp_path, monkeypatch
):
    """Setting start {step: 50}: the sparse_retrain job prunes each seed's dense checkpoint at step
    50 (read from the teacher run's trajectory), so the sparse run's step 0 is that checkpoint's
    weights, N:M masked; the teacher it distils from is the run's final model."""
    from trainmap.data import save_task_data
    from trainmap.grid import SeedRange
    from trainmap.io import load_torch
    from trainmap.jobs import sparse as sparse_job

    train_dir = tmp_path / "train" / "sparse_parity" / "mlp" / "kaiming"
    teacher_manifest = train_dir / "seeds0-0.json"  # its block's files: train_dir / "seed0"
    dense = build_cell_model("mlp", "kaiming", 0, parity.meta, {"hidden": [32, 32]})
    train_model(dense, parity, TrainConfig(lr=0.1, momentum=0.9, steps=100, checkpoint_every=50),
                0, TrainPaths.in_directory(train_dir / "seed0"), progress=False,
                model_info=INFO | {"meta": parity.meta, "method": "kaiming"})  # fmt: skip
    save_task_data(parity, tmp_path / "dataset.pt")
    handed = {}

    def recording(teachers, *args, **kwargs):
        handed.update(teachers=teachers, starts=kwargs["starts"])
        return run_sparse_block(teachers, *args, **kwargs)

    monkeypatch.setattr(sparse_job, "run_sparse_block", recording)
    block = SeedRange("sparse_parity", "mlp", "ast", 0, 0, (0,))
    manifest = tmp_path / "sparse" / "sparse_parity" / "mlp" / "ast" / "seeds0-0.json"
    sparse_job.sparse_block_job(
        block, teacher_manifest, tmp_path / "dataset.pt", SETTINGS | {"start": {"step": 50}},
        METHODS["ast"].options, manifest, tmp_path / "block.png",
        {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "start"},
        {cell.id: "h" for cell in block.cells}, progress=False,
    )  # fmt: skip
    dense_run = read_archive(train_dir / "seed0")
    at_50 = {name: value[dense_run["step"].tolist().index(50)]
             for name, value in dense_run["state"].items()}  # fmt: skip
    final = load_torch(train_dir / "seed0" / "model.pt")["state_dict"]
    assert not any(torch.equal(at_50[name], final[name]) for name in final)
    (start,), (teacher,) = handed["starts"], handed["teachers"]
    assert all(torch.equal(value, at_50[name]) for name, value in start.state_dict().items())
    assert all(torch.equal(value, final[name]) for name, value in teacher.state_dict().items())
    retrained = read_archive(manifest.parent / "seed0")
    assert int(retrained["step"][0]) == 0
    for name, value in at_50.items():
        expected = value * nm_mask(value, 2, 4) if name.endswith("weight") else value
        assert torch.equal(retrained["state"][name][0], expected), name


def test_start_at_a_step_the_dense_run_did_not_record_is_a_clear_error(teacher, parity, tmp_path):
    """A dense run that stopped recording before the start step (it diverged) names the setting,
    the file and the steps it has."""
    from trainmap.io import load_torch
    from trainmap.jobs.sparse import dense_checkpoint
    from trainmap.training.archive import checkpoint_file, write_checkpoint
    from trainmap.training.checkpoints import save_dense

    for step in (0, 50):
        write_checkpoint(checkpoint_file(tmp_path, step), teacher.state_dict(), torch.float32)
    save_dense(teacher, tmp_path / "model.pt", **INFO, meta=parity.meta)
    with pytest.raises(ValueError, match=r"start.step: 100: .* no archived checkpoint .* 0 to 50"):
        dense_checkpoint(load_torch(tmp_path / "model.pt"), checkpoint_file(tmp_path, 100), 100)


@pytest.mark.parametrize("method", ["ast", "ast_slorb"])
def test_sparse_retraining_in_a_block_equals_each_seed_alone(tmp_path, method):
    """A block of three seeds of a BatchNorm CNN (each distilled from its own teacher, its own masks
    refreshed every 5 steps, SR-STE, SLoRB): every seed's trajectory, masks and flip rates equal
    its retraining alone (float64, 1e-10)."""
    from trainmap.methods.sparse import run_sparse_block

    data = make_task_data("digits", {})
    data = type(data)(data.x_train.double(), data.y_train, data.x_test.double(), data.y_test,
                      data.meta)  # fmt: skip
    options_model = {"widths": [8, 8], "convs_per_stage": [1, 1]}
    seeds = [0, 1, 2]

    def teachers():
        return [build_cell_model("vgg_bn", "kaiming", s, data.meta, options_model).double()
                for s in seeds]  # fmt: skip

    settings = SETTINGS | {"dense_layers": "first_last", "slorb_k": 4,
                           "train": SETTINGS["train"] | {"steps": 30, "batch_size": 16}}  # fmt: skip
    options = METHODS[method].options
    block_dirs = [tmp_path / "block" / f"seed{s}" for s in seeds]
    run_sparse_block(teachers(), data, options, settings, seeds, block_dirs,
                     resume_path=tmp_path / "block" / "resume.pt")  # fmt: skip
    for seed, teacher_model, block_dir in zip(seeds, teachers(), block_dirs, strict=True):
        alone = tmp_path / f"alone{seed}"
        run_sparse_method(teacher_model, data, options, settings, seed, alone)
        left = read_archive(block_dir)["state"]
        right = read_archive(alone)["state"]
        for name in right:
            scale = (
                right[name].abs().max().clamp(min=1e-12) if right[name].is_floating_point() else 1
            )
            assert float((left[name] - right[name]).abs().max() / scale) < 1e-10, name
        a = torch.load(block_dir / "model.pt", weights_only=True)["state_dict"]
        b = torch.load(alone / "model.pt", weights_only=True)["state_dict"]
        masks = [k for k in a if k.endswith("weight_mask")]
        assert masks and all(torch.equal(a[k], b[k]) for k in masks)
        pd.testing.assert_frame_equal(pd.read_csv(block_dir / "flips.csv"),
                                      pd.read_csv(alone / "flips.csv"), atol=1e-12)  # fmt: skip


def test_a_network_with_nothing_to_sparsify_is_a_clear_error(teacher, parity, tmp_path):
    """A one-hidden-layer MLP has only a first and a last layer: dense_layers first_last would
    leave nothing sparse; the error names the setting and the fix."""
    one_hidden = build_cell_model("mlp", "kaiming", 0, parity.meta, {"hidden": [8]})
    with pytest.raises(ValueError, match=r"dense_layers: 'first_last' leaves no layer .* none"):
        run_sparse_method(one_hidden, parity, METHODS["ast"].options,
                          SETTINGS | {"dense_layers": "first_last"}, 0, tmp_path)  # fmt: skip
