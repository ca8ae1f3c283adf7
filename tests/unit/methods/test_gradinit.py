"""GradInit (Algorithm 1) and MetaInit: gradients, constraint, floors, BN statistics, variants."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from torch import nn

from trainmap.data import make_task_data
from trainmap.methods.gradinit import (
    ScaleAdam,
    ScaledParameters,
    check_settings,
    gradient_norm,
    gradient_quotient,
    gradinit,
    gradinit_objective,
    layer_diagnostics,
    run_gradinit,
    split_overlapping,
    update_direction,
)
from trainmap.training.loop import build_cell_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def digits():
    return make_task_data("digits", {})


def tiny_model(seed: int = 0) -> nn.Module:
    """Conv + BN + Linear in float64, with one zero-initialised bias (to be skipped)."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
        nn.Linear(3 * 4 * 4, 5),
    ).double()  # fmt: skip
    with torch.no_grad():
        model[4].bias.zero_()
        model[1].weight.uniform_(0.5, 1.5)
    return model


def tiny_batch(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 1, 4, 4, generator=generator, dtype=torch.float64),
            torch.randint(0, 5, (n,), generator=generator))  # fmt: skip


def objective_at(model, scaled, alphas, s, s_tilde, **kwargs):
    value, _, constraint = gradinit_objective(model, scaled, alphas, s, s_tilde, **kwargs)
    return value, constraint


@pytest.mark.parametrize(("gamma", "constraint"), [(1e6, False), (1e-6, True)])
@pytest.mark.parametrize("variant", ["sgd", "adam"])
def test_second_order_scale_gradient_matches_finite_differences(gamma, constraint, variant):
    """second_order: d objective / d alpha_i by autograd (through g) equals central differences of
    the objective itself; the constraint step (d ||g|| / d alpha) is second order in both modes."""
    model = tiny_model()
    scaled = ScaledParameters.of(model, 0.01, 0.0)
    assert set(scaled.skipped) == {"4.bias", "1.bias"}
    s, s_tilde = split_overlapping(tiny_batch(12), batch_size=8, overlap=0.5)
    kwargs = {"variant": variant, "eta": 0.1, "gamma": gamma, "second_order": True}
    alphas = {n: torch.tensor(1.0 + 0.1 * i, dtype=torch.float64, requires_grad=True)
              for i, n in enumerate(scaled.initial)}  # fmt: skip
    value, active = objective_at(model, scaled, alphas, s, s_tilde, **kwargs)
    assert active is constraint
    analytic = torch.autograd.grad(value, list(alphas.values()))
    for name, grad in zip(alphas, analytic, strict=True):
        numeric = central_difference(
            lambda a: objective_at(model, scaled, a, s, s_tilde, **kwargs)[0], alphas, name
        )
        assert float(grad) == pytest.approx(numeric, rel=1e-5, abs=1e-8), name
    if constraint:  # first order changes only the objective step
        first = objective_at(model, scaled, alphas, s, s_tilde, **kwargs | {"second_order": False})
        assert float(first[0].detach()) == float(value.detach())


def central_difference(function, alphas, name, step=1e-6):
    """(f(alpha + h e_name) - f(alpha - h e_name)) / 2h."""
    plus = {n: a.detach().clone() + (step if n == name else 0.0) for n, a in alphas.items()}
    minus = {n: a.detach().clone() - (step if n == name else 0.0) for n, a in alphas.items()}
    return float((function(plus) - function(minus)).detach() / (2 * step))


@pytest.mark.parametrize("variant", ["sgd", "adam"])
def test_first_order_scale_gradient_is_the_detached_step_gradient(variant):
    """First order (the default, the authors' code): d objective / d alpha_i equals the derivative
    of alpha -> L(S~; theta(alpha) - eta A[g]) / eta with A[g] held at its value (finite
    differences, every parameter stepped, the zero-initialised biases included); with the SGD
    variant it differs from the second-order gradient (with Adam's sign(g) they coincide)."""
    from trainmap.methods.gradinit import _forward_loss

    model = tiny_model()
    scaled = ScaledParameters.of(model, 0.01, 0.0)
    s, s_tilde = split_overlapping(tiny_batch(12), batch_size=8, overlap=0.5)
    eta = 0.5
    alphas = {n: torch.tensor(1.0 + 0.05 * i, dtype=torch.float64, requires_grad=True)
              for i, n in enumerate(scaled.initial)}  # fmt: skip
    kwargs = {"variant": variant, "eta": eta, "gamma": 1e6}
    value, _, _ = gradinit_objective(model, scaled, alphas, s, s_tilde, **kwargs)
    first = torch.autograd.grad(value, list(alphas.values()))
    # A[g] at these alphas, over every parameter, as constants.
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    for name in scaled.initial:
        theta[name] = float(alphas[name].detach()) * scaled.initial[name]
    leaves = {n: t.clone().requires_grad_(True) for n, t in theta.items()}
    grads = torch.autograd.grad(_forward_loss(model, leaves, s), list(leaves.values()))
    direction = update_direction(dict(zip(leaves, grads, strict=True)), variant)
    assert set(direction) == {n for n, _ in model.named_parameters()}

    def detached_objective(a):
        stepped = {n: theta[n] - eta * direction[n] for n in theta}
        for name in scaled.initial:
            stepped[name] = a[name] * scaled.initial[name] - eta * direction[name]
        return _forward_loss(model, stepped, s_tilde) / eta

    for name, grad in zip(alphas, first, strict=True):
        numeric = central_difference(detached_objective, alphas, name)
        assert float(grad) == pytest.approx(numeric, rel=1e-6, abs=1e-9), name
    value2, _, _ = gradinit_objective(model, scaled, alphas, s, s_tilde, **kwargs,
                                      second_order=True)  # fmt: skip
    # The same objective value, a different gradient.
    assert float(value2.detach()) == float(value.detach())
    second = torch.autograd.grad(value2, list(alphas.values()))
    differences = [abs(float(a) - float(b)) for a, b in zip(first, second, strict=True)]
    if variant == "sgd":
        assert max(differences) > 1e-6  # the path through g / ||g|| matters
    else:
        assert max(differences) < 1e-12  # sign(g) has derivative 0: both orders agree


def reference_gradinit(model, draws, iterations, *, batch_size, overlap, variant, eta, gamma,
                       tau, min_scale=0.01, min_bias_scale=0.0):  # fmt: skip
    """GradInit written independently on the module's own parameters, the way the paper states it
    and the authors' code computes it: g over model.parameters() (every tensor), BN on batch
    statistics without running-stat updates, the inner step with A[g] detached, the scale gradient
    <dL/dtheta_i, theta_i^0>, Adam per scale (clipped, separate first moments, shared second)."""
    params = dict(model.named_parameters())
    initial = {n: p.detach().clone() for n, p in params.items()}
    names = [n for n in params if float(initial[n].norm()) > 0]
    floors = {n: min_bias_scale if n.endswith("bias") else min_scale for n in names}
    alpha = dict.fromkeys(names, 1.0)
    first = {"constraint": dict.fromkeys(names, 0.0), "objective": dict.fromkeys(names, 0.0)}
    second, counts = dict.fromkeys(names, 0.0), {"constraint": 0, "objective": 0}
    model.train()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d | nn.BatchNorm1d):
            module.track_running_stats = False  # batch statistics, buffers untouched
    norms, shared = [], round(overlap * batch_size)
    for _ in range(iterations):
        x, y = next(draws)
        with torch.no_grad():
            for n in names:
                params[n].copy_(alpha[n] * initial[n])
        loss = nn.functional.cross_entropy(model(x[:batch_size]), y[:batch_size])
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
        if variant == "sgd":
            norm = torch.sqrt(sum((g * g).sum() for g in grads))
            steps = [g / norm for g in grads]
        else:
            norm = sum(g.abs().sum() for g in grads)
            steps = [torch.sign(g) for g in grads]
        norms.append(float(norm.detach()))
        if norms[-1] > gamma:
            kind, value = "constraint", norm
        else:
            kind = "objective"
            moved = {n: p - eta * d.detach() for (n, p), d in zip(params.items(), steps,
                                                                   strict=True)}  # fmt: skip
            x2 = torch.cat([x[:shared], x[batch_size:]])
            y2 = torch.cat([y[:shared], y[batch_size:]])
            logits = torch.func.functional_call(model, moved, (x2,))
            value = nn.functional.cross_entropy(logits, y2) / eta
        scale_grads = torch.autograd.grad(value, [params[n] for n in names])
        counts[kind] += 1
        total = counts["constraint"] + counts["objective"]
        for n, grad in zip(names, scale_grads, strict=True):
            g = min(1.0, max(-1.0, float((grad * initial[n]).sum())))
            first[kind][n] = 0.9 * first[kind][n] + 0.1 * g
            second[n] = 0.999 * second[n] + 0.001 * g * g
            update = (first[kind][n] / (1 - 0.9 ** counts[kind])) / (
                math.sqrt(second[n] / (1 - 0.999**total)) + 1e-8
            )
            alpha[n] = max(alpha[n] - tau * update, floors[n])
    return alpha, norms


@pytest.mark.parametrize("arch", ["vgg_deep", "vgg_bn"])
@pytest.mark.parametrize("variant", ["sgd", "adam"])
def test_gradinit_matches_an_independent_loop_over_every_parameter(digits, arch, variant):
    """A small CNN (no BN / BN) from Kaiming init, zero biases and BN beta included: ||g|| per
    iteration and the learned scales equal the independent computation in float64 (leaving
    the zero-initialised tensors out of g made ||g|| 11-14 % too small)."""
    from trainmap.methods.gradinit import batch_draws

    options = {"widths": [4, 8], "convs_per_stage": [2, 1]}
    models = [build_cell_model(arch, "gradinit", 0, digits.meta, options).double()
              for _ in range(2)]  # fmt: skip
    zero = [n for n, p in models[0].named_parameters() if float(p.detach().norm()) == 0]
    assert zero, "the test needs zero-initialised tensors"
    data = type(digits)(digits.x_train.double(), digits.y_train, digits.x_test.double(),
                        digits.y_test, digits.meta)  # fmt: skip
    settings = {"batch_size": 16, "overlap": 0.5, "variant": variant, "eta": 0.1, "tau": 0.05}
    gamma = {"sgd": 1.5, "adam": 20.0}[variant]
    result = gradinit(models[0], batch_draws(data, 24, torch.Generator().manual_seed(3)),
                      iterations=12, gamma=gamma, **settings)  # fmt: skip
    reference_draws = batch_draws(data, 24, torch.Generator().manual_seed(3))
    alpha, norms = reference_gradinit(models[1], reference_draws, 12, gamma=gamma, **settings)
    assert result.history["grad_norm"].tolist() == pytest.approx(norms, rel=1e-10)
    assert 0 < result.constraint_steps < 12, "the test should exercise both branches"
    assert set(result.scales) == set(alpha) and set(result.skipped) == set(zero)
    for name, scale in result.scales.items():
        assert scale == pytest.approx(alpha[name], abs=1e-10), name


def test_variants_use_their_norm_and_direction():
    gradients = {"a": torch.tensor([3.0, -4.0]), "b": torch.tensor([0.0, 12.0])}
    assert float(gradient_norm(gradients.values(), "sgd")) == pytest.approx(13.0)
    assert float(gradient_norm(gradients.values(), "adam")) == pytest.approx(19.0)
    sgd = update_direction(gradients, "sgd")
    assert torch.allclose(sgd["a"], torch.tensor([3.0, -4.0]) / 13)
    assert torch.allclose(sgd["b"], torch.tensor([0.0, 12.0]) / 13)
    adam = update_direction(gradients, "adam")
    assert torch.equal(adam["a"], torch.tensor([1.0, -1.0]))
    assert torch.equal(adam["b"], torch.tensor([0.0, 1.0]))


def test_one_iteration_of_each_variant_steps_by_its_direction():
    """The objective equals L(S~; theta - eta A[g]) / eta with the variant's A, recomputed by hand."""
    model = tiny_model()
    scaled = ScaledParameters.of(model, 0.01, 0.0)
    s, s_tilde = split_overlapping(tiny_batch(12), batch_size=8, overlap=0.5)
    alphas = {n: torch.tensor(1.0, dtype=torch.float64) for n in scaled.initial}
    from trainmap.methods.gradinit import _forward_loss

    for variant in ("sgd", "adam"):
        value, norm, _ = gradinit_objective(model, scaled, alphas, s, s_tilde, variant=variant,
                                            eta=0.2, gamma=1e6)  # fmt: skip
        theta = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
        loss = _forward_loss(model, theta, s)
        names = list(theta)  # every parameter, the zero-initialised biases included
        grads = dict(zip(names, torch.autograd.grad(loss, [theta[n] for n in names]), strict=True))
        if variant == "sgd":
            total = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
            direction = {n: g / total for n, g in grads.items()}
        else:
            total = sum(float(g.abs().sum()) for g in grads.values())
            direction = {n: torch.sign(g) for n, g in grads.items()}
        stepped = {n: theta[n].detach() - 0.2 * direction[n] for n in names}
        expected = _forward_loss(model, stepped, s_tilde) / 0.2
        assert float(value.detach()) == pytest.approx(float(expected), rel=1e-10)
        assert float(norm) == pytest.approx(total, rel=1e-10)


def test_split_overlapping_shares_the_first_half_batch():
    x = torch.arange(12.0)[:, None]
    y = torch.arange(12)
    (sx, _), (tx, ty) = split_overlapping((x, y), batch_size=8, overlap=0.5)
    assert sx.flatten().tolist() == list(range(8))
    assert tx.flatten().tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    assert ty.tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    with pytest.raises(ValueError, match="needs 12 examples"):
        split_overlapping((x[:10], y[:10]), batch_size=8, overlap=0.5)


def test_scale_adam_clips_and_keeps_separate_first_moments():
    alphas = {"w": torch.tensor(1.0, dtype=torch.float64)}
    optimiser = ScaleAdam(["w"], lr=0.1)
    optimiser.step(alphas, {"w": 50.0}, "objective", {"w": 0.01})  # clipped to 1
    assert optimiser.first["objective"]["w"] == pytest.approx(0.1)
    assert optimiser.second["w"] == pytest.approx(0.001)
    assert float(alphas["w"]) == pytest.approx(1.0 - 0.1 * 1.0 / (1.0 + 1e-8 / 1), rel=1e-6)
    optimiser.step(alphas, {"w": -0.5}, "constraint", {"w": 0.01})
    assert optimiser.first["objective"]["w"] == pytest.approx(0.1)  # untouched by a constraint step
    assert optimiser.first["constraint"]["w"] == pytest.approx(-0.05)
    assert optimiser.second["w"] == pytest.approx(0.999 * 0.001 + 0.001 * 0.25)


def test_small_gamma_bounds_the_gradient_norm_or_keeps_the_constraint_active(digits):
    """After GradInit with gamma = 0.5 the gradient norm on fresh batches is at most gamma (with a
    10 % tolerance for batch noise), or every step where it is not ran the constraint branch."""
    model = build_cell_model("resnet_deep", "gradinit", 0, digits.meta,
                             {"widths": [8, 8], "blocks_per_stage": [2, 2]})  # fmt: skip
    gamma = 0.5
    result = run_gradinit(model, digits, {"iterations": 60, "batch_size": 64, "gamma": gamma,
                                          "tau": 0.05}, seed=0)  # fmt: skip
    history = result.history
    assert history["grad_norm"].iloc[0] > gamma  # it starts above the bound
    above = history[history["grad_norm"] > gamma]
    assert above["constraint"].all(), "a step above gamma did not run the constraint branch"
    # Fresh batches, the rescaled model, batch statistics.
    scaled = ScaledParameters.of(model, 0.01, 0.0)
    alphas = dict(scaled.alphas)
    norms = []
    for seed in range(5):
        generator = torch.Generator().manual_seed(100 + seed)
        index = torch.randperm(len(digits.x_train), generator=generator)[:96]
        s, s_tilde = split_overlapping((digits.x_train[index], digits.y_train[index]), 64, 0.5)
        _, norm, _ = gradinit_objective(model, scaled, alphas, s, s_tilde, variant="sgd",
                                        eta=0.1, gamma=gamma)  # fmt: skip
        norms.append(float(norm.detach()))
    final_active = bool(history["constraint"].iloc[-5:].all())
    assert max(norms) <= 1.1 * gamma or final_active, (norms, history.tail())


def test_scales_respect_floors_and_skip_zero_tensors_and_bn_stats_stay(digits):
    model = build_cell_model("vgg_bn", "gradinit", 3, digits.meta,
                             {"widths": [8, 8], "convs_per_stage": [1, 1]})  # fmt: skip
    with torch.no_grad():
        model.stage1.bn1.running_mean.uniform_(-1, 1)
        model.stage1.bn1.running_var.uniform_(0.5, 2)
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    zero_names = [n for n, p in model.named_parameters() if float(p.detach().norm()) == 0]
    zero_values = {n: p.detach().clone() for n, p in model.named_parameters() if n in zero_names}
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    # A huge tau pushes scales hard; the floors must hold.
    result = run_gradinit(model, digits, {"iterations": 25, "batch_size": 32, "tau": 2.0,
                                          "min_scale": 0.6}, seed=0)  # fmt: skip
    assert set(result.skipped) == set(zero_names) and zero_names
    for name, value in zero_values.items():
        assert torch.equal(dict(model.named_parameters())[name], value)
    for name, scale in result.scales.items():
        floor = 0.0 if name.endswith("bias") else 0.6
        assert scale >= floor - 1e-12, (name, scale)
        current = dict(model.named_parameters())[name].detach()
        assert torch.allclose(current, scale * initial[name], rtol=1e-6, atol=1e-7)
    assert any(s == pytest.approx(0.6) for s in result.scales.values()), "no floor was reached"
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, buffers[name]), f"GradInit changed the BN buffer {name}"


def test_metainit_gradient_quotient_by_hand():
    """A linear model with a quadratic loss: g and Hg in closed form."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2, bias=False)).double()
    scaled = ScaledParameters.of(model, 0.01, 0.0)
    x, y = tiny_batch(6)
    x = x.reshape(6, -1)[:, :3]
    alphas = {n: torch.tensor(1.0, dtype=torch.float64) for n in scaled.initial}
    gq, _ = gradient_quotient(model, scaled, alphas, (x, y % 2), eps=1e-5)
    # By hand: cross-entropy gradient and Hessian-vector product with autograd on the raw weight.
    weight = model[0].weight.detach().clone().requires_grad_(True)
    loss = nn.functional.cross_entropy(x @ weight.T, y % 2)
    (g,) = torch.autograd.grad(loss, weight, create_graph=True)
    (hg,) = torch.autograd.grad(0.5 * (g * g).sum(), weight)
    g = g.detach()
    sign = torch.where(g >= 0, 1.0, -1.0).double()
    expected = ((g - hg) / (g + 1e-5 * sign) - 1).abs().mean()
    assert float(gq.detach()) == pytest.approx(float(expected), rel=1e-10)


def test_metainit_gradient_quotient_runs_over_every_parameter():
    """GQ's g, Hg and mean include the zero-initialised tensors (the reference's params list holds
    every weight and bias): equal to the quotient computed on all of model.parameters()."""
    model = tiny_model()
    scaled = ScaledParameters.of(model, 0.01, 0.0)
    assert scaled.skipped
    batch = tiny_batch(8)
    alphas = {n: torch.tensor(1.0, dtype=torch.float64) for n in scaled.initial}
    gq, norm = gradient_quotient(model, scaled, alphas, batch, eps=1e-5)
    model.train()
    model[1].track_running_stats = False  # batch statistics, as in the quotient
    params = list(model.parameters())
    loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
    grads = torch.autograd.grad(loss, params, create_graph=True)
    hgs = torch.autograd.grad(0.5 * sum((g * g).sum() for g in grads), params)
    g = torch.cat([x.detach().reshape(-1) for x in grads])
    hg = torch.cat([x.reshape(-1) for x in hgs])
    sign = torch.where(g >= 0, 1.0, -1.0).double()
    expected = ((g - hg) / (g + 1e-5 * sign) - 1).abs().mean()
    assert g.numel() == sum(p.numel() for p in params)
    assert float(gq.detach()) == pytest.approx(float(expected), rel=1e-10)
    assert float(norm) == pytest.approx(float(g.norm()), rel=1e-12)


def test_metainit_scale_gradient_matches_finite_differences():
    model = tiny_model()
    scaled = ScaledParameters.of(model, 0.01, 0.0)
    batch = tiny_batch(8)
    alphas = {n: torch.tensor(1.0, dtype=torch.float64, requires_grad=True) for n in scaled.initial}
    gq, _ = gradient_quotient(model, scaled, alphas, batch)
    analytic = torch.autograd.grad(gq, list(alphas.values()))
    for name, grad in zip(alphas, analytic, strict=True):
        numeric = central_difference(
            lambda a: gradient_quotient(model, scaled, a, batch)[0], alphas, name
        )
        assert float(grad) == pytest.approx(numeric, rel=1e-4, abs=1e-7), name


def test_metainit_reduces_the_gradient_quotient(digits):
    model = build_cell_model("vgg_deep", "metainit", 0, digits.meta,
                             {"widths": [8, 8], "convs_per_stage": [3, 3]})  # fmt: skip
    result = run_gradinit(model, digits, {"iterations": 40, "batch_size": 64, "tau": 0.05},
                          seed=0, objective="metainit")  # fmt: skip
    assert result.history["finite"].all()
    first, last = (
        result.history["objective"].iloc[:5].mean(),
        result.history["objective"].iloc[-5:].mean(),
    )
    assert last < first


def test_gradinit_is_deterministic(digits):
    runs = []
    for _ in range(2):
        model = build_cell_model("vgg_deep", "gradinit", 5, digits.meta,
                                 {"widths": [8], "convs_per_stage": [3]})  # fmt: skip
        result = run_gradinit(model, digits, {"iterations": 10, "batch_size": 32}, seed=5)
        runs.append((result.scales, model.state_dict()))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])


def test_layer_diagnostics_leave_the_model_unchanged(digits):
    from trainmap.methods.gradinit import draws_for

    model = build_cell_model("vgg_bn", "kaiming", 0, digits.meta,
                             {"widths": [8, 16], "convs_per_stage": [1, 1]})  # fmt: skip
    model.eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    table = layer_diagnostics(model, draws_for(digits, 32, 0)(), n_batches=4)
    assert not model.training
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert list(table["kind"]) == ["linear", "norm", "linear", "norm", "linear"]
    first = dict(model.named_parameters())["stage1.conv1.weight"].detach()
    assert table.loc[0, "weight_magnitude"] == pytest.approx(float(first.norm() / first.numel()))
    assert (table["grad_std"] > 0).all()
    assert isinstance(table, pd.DataFrame)


def test_settings_are_checked():
    """Against the schema: the message names the key, the value and what is allowed."""
    with pytest.raises(ValueError, match=r"unknown GradInit settings \['itrations'\]"):
        check_settings({"itrations": 5})
    with pytest.raises(
        ValueError,
        match=r"variant: 'rmsprop' is not allowed; allowed: one of sgd, adam \(schema: workflow/",
    ):
        check_settings({"variant": "rmsprop"})
    with pytest.raises(ValueError, match="overlap: 1.5 is not allowed; allowed: a number >= 0 and"):
        check_settings({"overlap": 1.5})
    with pytest.raises(
        ValueError, match="second_order: 'yes' is not allowed; allowed: true or false"
    ):
        check_settings({"second_order": "yes"})
    with pytest.raises(
        ValueError, match="iterations: 2.0 is not allowed; allowed: an integer >= 1"
    ):
        check_settings({"iterations": 2.0})
    with pytest.raises(ValueError, match="eta: 0 is not allowed; allowed: a number > 0"):
        check_settings({"eta": 0})
    assert check_settings({})["eta"] == 0.1
    assert check_settings({})["second_order"] is False  # the authors' first-order step


def test_python_api_without_snakemake(digits):
    """gradinit(model, batches, ...) with a hand-made batch stream."""
    model = build_cell_model("mlp", "gradinit", 0, digits.meta, {"hidden": [16]})

    def draws():
        generator = torch.Generator().manual_seed(0)
        while True:
            index = torch.randperm(len(digits.x_train), generator=generator)[:48]
            yield digits.x_train[index], digits.y_train[index]

    result = gradinit(model, draws(), iterations=5, batch_size=32, overlap=0.5)
    assert len(result.history) == 5 and set(result.scales) == {"layers.1.weight",
                                                               "layers.3.weight"}  # fmt: skip
