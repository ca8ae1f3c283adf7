"""GradInit and MetaInit: learn one scale per parameter tensor of an initialised network.

Zhu et al., "GradInit: Learning to Initialize Neural Networks for Stable and Efficient Training"
(NeurIPS 2021), Algorithm 1 and the appendix:

* Every parameter tensor theta_i (Conv, Linear and normalisation weights and biases) gets a scale
  alpha_i, initialised to 1; the network computes with theta_i = alpha_i * theta_i^0. Tensors whose
  initial norm is 0 (zero-initialised biases, BN beta) cannot be rescaled: they get no scale (in
  effect a scale fixed at 1 whose gradient is exactly 0), but they still belong to g.
* One iteration draws S and S~ that share a fraction r of their examples (r = 0.5: three
  half-batches A, B, C with S = [A; B], S~ = [A; C]); g = grad_theta L(S; theta) over **all**
  trainable parameters, the unscaled zero-norm tensors included: they count in ||g||, in the
  direction A[g], and they move in the inner step, as in the paper ("the gradient over all
  parameters") and the authors' code (``get_ordered_params`` lists every weight and bias; why:
  docs/decisions/gradinit.md).
* Constraint step, when ||g|| > gamma: minimise ||g|| itself. Objective step otherwise: minimise
  L(S~; theta - eta * A[g]) / eta, with A[g] = g / ||g||_2 and the L2 norm for the SGD variant, or
  A[g] = sign(g) and the L1 norm for the Adam variant.
* First- or second-order objective step (setting ``second_order``). The authors' code takes the
  inner step with the step detached (``weight - gstep.data``), so d objective / d alpha_i only sees
  the direct path theta_i -> theta_i' (first order, the default, which produced the paper's
  numbers). ``second_order: true`` keeps A[g] differentiable, so the gradient also flows through g
  (a Hessian-vector product): the exact derivative of the objective as the paper writes it. The
  constraint step differentiates ||g|| and is second order either way.
* BN uses batch statistics and never updates its running statistics; dropout is off.
* The scales are optimised by Adam on the scalar gradients d objective / d alpha_i, each clipped to
  [-1, 1], betas (0.9, 0.999), eps 1e-8, learning rate tau, with separate first moments for
  constraint and objective steps and a shared second moment; after each step alpha is clamped to
  its floor (0.01 for weights, BN gamma included; 0 for biases).

Where trainmap deliberately differs from the authors' code (the paper is on its side):

* A bias scale that reaches its floor 0 keeps being optimised: its gradient <dL/dtheta_i,
  theta_i^0> is still defined, so it can grow again. The reference computes the scale gradient as
  <dL/dtheta_i, theta_i> ||theta_i^0|| / ||theta_i||, which is undefined at theta_i = 0, and skips
  that tensor for the rest of the run.
* MetaInit runs BN on batch statistics, as GradInit does. The reference's ``metainit()`` calls
  ``net.eval()`` after setting the BN modes, so its BN layers normalise with the (initial) running
  statistics instead.

MetaInit (Dauphin & Schoenholz 2019; GradInit appendix D, "real + Adam"): the same scales and the same
optimiser minimise the gradient quotient GQ = mean_j |(g_j - (Hg)_j) / (g_j + eps * sign(g_j)) - 1|,
eps = 1e-5, Hg = grad of 0.5 * ||g||^2 (a Hessian-vector product), on real minibatches; g and the
mean run over all trainable parameters, as in the reference's ``gradient_quotient``.

An iteration whose objective or scale gradient is not finite leaves the scales unchanged and is
marked ``finite: False`` in the history, instead of writing NaN into the network.

:func:`layer_diagnostics` gives the appendix's figures 4-8 per layer: the averaged per-dimension
weight magnitude ||W_i|| / d_i and the standard deviation of the gradient over minibatches. The
gradinit rule's report (one model rescaled and measured before and after) and its figures are
:mod:`trainmap.methods.gradinit_report`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn
from torch.func import functional_call

from trainmap.data import TaskData
from trainmap.schema import check_section, section_defaults
from trainmap.training.augment import Augmentation, to_unit, without_mixup

#: Defaults of the ``gradinit.<task>`` settings: the schema's (``$defs/gradinit_settings``), where
#: each setting's type, allowed values and default are declared once; the paper's CIFAR-10 setting
#: (SGD variant, eta 0.1, gamma 1, batch 128, r = 0.5, T = one epoch of iterations at batch 128).
DEFAULT_SETTINGS: dict[str, Any] = section_defaults("gradinit")
OBJECTIVES = ("gradinit", "metainit")
#: The variants :func:`gradinit` takes (:func:`update_direction`, :func:`gradient_norm`); the
#: schema's ``variant`` lists the same (a test compares them).
VARIANTS = ("sgd", "adam")
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def check_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings completed with :data:`DEFAULT_SETTINGS`. An unknown key or a value the schema
    refuses raises ValueError naming the key, the value and what is allowed
    (:func:`trainmap.schema.check_section`); no two settings constrain each other."""
    check_section("gradinit", settings, what="GradInit")
    return {**DEFAULT_SETTINGS, **settings}


# --- the scaled network -----------------------------------------------------------------------


@dataclass
class ScaledParameters:
    """theta_i = alpha_i * theta_i^0 for every rescalable tensor (Algorithm 1's parametrisation).

    ``initial`` holds the rescalable tensors' theta_i^0; ``skipped`` names the trainable tensors of
    initial norm 0, which get no scale (their values stay fixed) but are part of g: :attr:`in_g`
    lists every tensor g is taken over.
    """

    initial: dict[str, torch.Tensor]
    floors: dict[str, float]
    alphas: dict[str, torch.Tensor] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    in_g: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, model: nn.Module, min_scale: float, min_bias_scale: float) -> ScaledParameters:
        """Scales for every trainable parameter of ``model``; zero-norm tensors get none."""
        initial, floors, skipped, in_g = {}, {}, [], []
        for name, parameter in model.named_parameters():
            if not parameter.requires_grad:
                continue
            in_g.append(name)
            if float(parameter.detach().norm()) == 0.0:
                skipped.append(name)
                continue
            initial[name] = parameter.detach().clone()
            floors[name] = min_bias_scale if _is_bias(name, parameter) else min_scale
        scaled = cls(initial, floors, skipped=skipped, in_g=in_g)
        scaled.alphas = {name: torch.ones((), dtype=torch.float64) for name in initial}
        return scaled

    def parameters(self, model: nn.Module, alphas: Mapping[str, torch.Tensor]) -> dict:
        """The network's parameters at scales ``alphas``. Every tensor of g requires grad: the
        scaled ones through the alphas (when those require grad), the skipped ones as leaves of
        their own (fixed values, so g can be taken with respect to them)."""
        values = {name: p.detach() for name, p in model.named_parameters()}
        for name in self.skipped:
            values[name] = values[name].clone().requires_grad_(True)
        for name, theta0 in self.initial.items():
            scaled = alphas[name].to(theta0.dtype) * theta0
            values[name] = scaled if scaled.requires_grad else scaled.requires_grad_(True)
        return values

    def write_back(self, model: nn.Module) -> None:
        """theta_i <- alpha_i * theta_i^0 in the model itself (skipped tensors are unchanged)."""
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name in self.initial:
                    parameter.copy_(self.alphas[name].to(parameter.dtype) * self.initial[name])


def _is_bias(name: str, parameter: torch.Tensor) -> bool:
    """Biases (of Linear/Conv/norm layers, FixUp's scalar biases) get the floor 0."""
    leaf = name.rsplit(".", 1)[-1]
    return leaf == "bias" or leaf.startswith("bias")


def _forward_loss(
    model: nn.Module, parameters: dict, batch: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """Cross-entropy in batch-statistics mode; BN running statistics are passed as copies, so the
    model's own buffers never change."""
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    inputs, targets = batch
    logits = functional_call(model, {**parameters, **buffers}, (inputs,))
    return nn.functional.cross_entropy(logits, targets)


# --- Algorithm 1 ------------------------------------------------------------------------------


def gradient_norm(gradients: Iterable[torch.Tensor], variant: str) -> torch.Tensor:
    """||g||_2 (SGD variant) or ||g||_1 (Adam variant) over all parameter gradients."""
    gradients = list(gradients)
    if variant == "sgd":
        return torch.sqrt(sum((g * g).sum() for g in gradients))
    return sum(g.abs().sum() for g in gradients)


def update_direction(
    gradients: Mapping[str, torch.Tensor], variant: str
) -> dict[str, torch.Tensor]:
    """A[g]: g / ||g||_2 (SGD variant, "normalize grad") or sign(g) (Adam variant)."""
    if variant == "sgd":
        norm = gradient_norm(gradients.values(), "sgd")
        return {name: g / norm for name, g in gradients.items()}
    return {name: torch.sign(g) for name, g in gradients.items()}


def split_overlapping(
    batch: tuple[torch.Tensor, torch.Tensor], batch_size: int, overlap: float
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """S and S~ from one draw of B + (1 - r) B examples: S = first B, S~ = first r B + the rest.

    With r = 0.5 these are the paper's half-batches: S = [A; B], S~ = [A; C].
    """
    x, y = batch
    shared = round(overlap * batch_size)
    if len(x) != batch_size + (batch_size - shared):
        raise ValueError(f"a GradInit draw needs {2 * batch_size - shared} examples "
                         f"(B = {batch_size}, r = {overlap}), got {len(x)}")  # fmt: skip
    s = (x[:batch_size], y[:batch_size])
    s_tilde = (torch.cat([x[:shared], x[batch_size:]]), torch.cat([y[:shared], y[batch_size:]]))
    return s, s_tilde


def gradinit_objective(
    model: nn.Module,
    scaled: ScaledParameters,
    alphas: Mapping[str, torch.Tensor],
    s: tuple[torch.Tensor, torch.Tensor],
    s_tilde: tuple[torch.Tensor, torch.Tensor],
    *,
    variant: str,
    eta: float,
    gamma: float,
    second_order: bool = DEFAULT_SETTINGS["second_order"],
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(value, ||g||, constraint_active)`` of one GradInit iteration, differentiable in alphas.

    g is the gradient of L(S; theta) over every trainable parameter (:attr:`ScaledParameters.in_g`).
    ||g|| > gamma: the value is ||g|| (constraint step); else L(S~; theta - eta A[g]) / eta, with
    A[g] detached (first order, the authors' code) unless ``second_order``.
    """
    theta = scaled.parameters(model, alphas)
    names = scaled.in_g
    loss = _forward_loss(model, theta, s)
    grads = torch.autograd.grad(loss, [theta[n] for n in names], create_graph=True)
    gradients = dict(zip(names, grads, strict=True))
    norm = gradient_norm(gradients.values(), variant)
    if norm.item() > gamma:
        return norm, norm.detach(), True
    step = update_direction(gradients, variant)
    stepped = dict(theta)
    for name in names:
        direction = step[name] if second_order else step[name].detach()
        stepped[name] = theta[name] - eta * direction
    return _forward_loss(model, stepped, s_tilde) / eta, norm.detach(), False


def _decomposed_batch_norm(
    module: nn.modules.batchnorm._BatchNorm, x: torch.Tensor
) -> torch.Tensor:
    """Batch normalisation with batch statistics from elementary ops (differentiable to any order)."""
    dims = [0] + list(range(2, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    variance = x.var(dim=dims, unbiased=False, keepdim=True)
    shape = [1, -1] + [1] * (x.dim() - 2)
    normalised = (x - mean) / torch.sqrt(variance + module.eps)
    if module.affine:
        normalised = normalised * module.weight.reshape(shape) + module.bias.reshape(shape)
    return normalised


@contextmanager
def higher_order_batch_norm(model: nn.Module) -> Iterator[None]:
    """Swap BN's fused kernel (no 3rd-order derivative) for elementary ops while inside the block.

    MetaInit differentiates Hg, a second derivative, with respect to the scales: a third-order
    derivative through every BN layer. Running statistics are not touched (batch statistics only).
    """
    patched = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for module in patched:
        module.forward = functools.partial(_decomposed_batch_norm, module)
    try:
        yield
    finally:
        for module in patched:
            del module.forward


def gradient_quotient(
    model: nn.Module,
    scaled: ScaledParameters,
    alphas: Mapping[str, torch.Tensor],
    batch: tuple[torch.Tensor, torch.Tensor],
    eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MetaInit's GQ = mean |(g - Hg) / (g + eps sign(g)) - 1| and ||g||_2, differentiable; g and
    the mean run over every trainable parameter (:attr:`ScaledParameters.in_g`)."""
    theta = scaled.parameters(model, alphas)
    names = scaled.in_g
    tensors = [theta[n] for n in names]
    with higher_order_batch_norm(model):
        loss = _forward_loss(model, theta, batch)
    grads = torch.autograd.grad(loss, tensors, create_graph=True)
    half_norm = 0.5 * sum((g * g).sum() for g in grads)
    hessian_grads = torch.autograd.grad(half_norm, tensors, create_graph=True)
    flat_g = torch.cat([g.reshape(-1) for g in grads])
    flat_hg = torch.cat([h.reshape(-1) for h in hessian_grads])
    # sign(0) counts as +1, as in MetaInit's code: an exactly-zero gradient (a dead ReLU's weights)
    # must not turn the quotient into 0/0.
    sign = torch.where(flat_g >= 0, 1.0, -1.0).to(flat_g.dtype)
    quotient = (flat_g - flat_hg) / (flat_g + eps * sign) - 1
    return quotient.abs().mean(), torch.sqrt((flat_g.detach() ** 2).sum())


class ScaleAdam:
    """Adam on the scalar scale gradients with per-scalar clipping to [-1, 1] (Algorithm 1).

    Constraint and objective steps keep separate first moments and share the second moment.
    """

    def __init__(self, names: Iterable[str], lr: float) -> None:
        self.lr = lr
        names = list(names)
        self.first = {
            "constraint": dict.fromkeys(names, 0.0),
            "objective": dict.fromkeys(names, 0.0),
        }
        self.second = dict.fromkeys(names, 0.0)
        self.steps = {"constraint": 0, "objective": 0, "second": 0}

    def step(self, alphas: dict[str, torch.Tensor], gradients: Mapping[str, float], kind: str,
             floors: Mapping[str, float]) -> None:  # fmt: skip
        """One update of every scale from its (clipped) gradient; then clamp to the floors."""
        beta1, beta2 = ADAM_BETAS
        self.steps[kind] += 1
        self.steps["second"] += 1
        first = self.first[kind]
        for name, raw in gradients.items():
            grad = min(1.0, max(-1.0, raw))
            first[name] = beta1 * first[name] + (1 - beta1) * grad
            self.second[name] = beta2 * self.second[name] + (1 - beta2) * grad * grad
            m_hat = first[name] / (1 - beta1 ** self.steps[kind])
            v_hat = self.second[name] / (1 - beta2 ** self.steps["second"])
            value = float(alphas[name]) - self.lr * m_hat / (math.sqrt(v_hat) + ADAM_EPS)
            alphas[name] = torch.tensor(max(value, floors[name]), dtype=torch.float64)


@dataclass
class GradInitResult:
    """The learned scales and the per-iteration history."""

    scales: dict[str, float]
    skipped: list[str]
    history: pd.DataFrame  # iteration, grad_norm, objective, constraint, finite

    @property
    def constraint_steps(self) -> int:
        """How many iterations ran the constraint branch."""
        return int(self.history["constraint"].sum())


def gradinit(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    objective: str = "gradinit",
    variant: str = DEFAULT_SETTINGS["variant"],
    eta: float = DEFAULT_SETTINGS["eta"],
    gamma: float = DEFAULT_SETTINGS["gamma"],
    tau: float = DEFAULT_SETTINGS["tau"],
    iterations: int = DEFAULT_SETTINGS["iterations"],
    batch_size: int = DEFAULT_SETTINGS["batch_size"],
    overlap: float = DEFAULT_SETTINGS["overlap"],
    min_scale: float = DEFAULT_SETTINGS["min_scale"],
    min_bias_scale: float = DEFAULT_SETTINGS["min_bias_scale"],
    metainit_eps: float = DEFAULT_SETTINGS["metainit_eps"],
    second_order: bool = DEFAULT_SETTINGS["second_order"],
    progress: bool = False,
) -> GradInitResult:
    """Rescale ``model`` in place by GradInit (Algorithm 1) or MetaInit; return scales and history.

    ``batches`` yields one (inputs, targets) draw per iteration: ``2B - rB`` examples for GradInit
    (split by :func:`split_overlapping` into S and S~), ``B`` examples for MetaInit.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {OBJECTIVES}")
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} is not one of {VARIANTS}")
    from tqdm.auto import tqdm

    scaled = ScaledParameters.of(model, min_scale, min_bias_scale)
    optimiser = ScaleAdam(scaled.initial, tau)
    was_training = model.training
    _batch_statistics_mode(model)
    rows = []
    draws = iter(batches)
    for iteration in tqdm(range(iterations), desc=objective, disable=not progress):
        alphas = {n: a.clone().requires_grad_(True) for n, a in scaled.alphas.items()}
        batch = next(draws)
        if objective == "gradinit":
            s, s_tilde = split_overlapping(batch, batch_size, overlap)
            value, norm, constraint = gradinit_objective(model, scaled, alphas, s, s_tilde,
                                                         variant=variant, eta=eta, gamma=gamma,
                                                         second_order=second_order)  # fmt: skip
        else:
            value, norm = gradient_quotient(model, scaled, alphas, batch, metainit_eps)
            constraint = False
        names = list(alphas)
        grads = torch.autograd.grad(value, [alphas[n] for n in names], allow_unused=True)
        gradients = {n: 0.0 if g is None else float(g) for n, g in zip(names, grads, strict=True)}
        finite = math.isfinite(float(value.detach())) and all(
            map(math.isfinite, gradients.values())
        )
        if finite:
            optimiser.step(scaled.alphas, gradients, "constraint" if constraint else "objective",
                           scaled.floors)  # fmt: skip
        rows.append({"iteration": iteration, "grad_norm": float(norm),
                     "objective": float(value.detach()), "constraint": constraint,
                     "finite": finite})  # fmt: skip
    scaled.write_back(model)
    model.train(was_training)
    return GradInitResult(
        scales={name: float(alpha) for name, alpha in scaled.alphas.items()},
        skipped=scaled.skipped,
        history=pd.DataFrame(
            rows, columns=["iteration", "grad_norm", "objective", "constraint", "finite"]
        ),
    )


def _batch_statistics_mode(model: nn.Module) -> None:
    """Training mode (BN on batch statistics) with every dropout layer off."""
    model.train()
    for module in model.modules():
        if isinstance(module, nn.Dropout | nn.Dropout1d | nn.Dropout2d | nn.AlphaDropout):
            module.eval()


# --- data and the convenience entry point -------------------------------------------------------


def batch_draws(
    data: TaskData,
    draw_size: int,
    generator: torch.Generator,
    recipe: Augmentation | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless seeded draws of ``draw_size`` training examples (an epoch-wise permutation), each
    augmented by ``recipe`` (``train.<task>.augment``; its per-example draws made from the same
    generator after each epoch's order; MixUp, if any, is not applied here: the authors'
    ``gradinit_utils`` draws plain batches of the augmented training set). uint8 pixels come in
    ``[0, 1]``."""
    n = len(data.x_train)
    if draw_size > n:
        raise ValueError(f"a draw of {draw_size} examples needs a larger training set than {n}")
    recipe = without_mixup(recipe)
    shape = tuple(data.x_train.shape[1:])
    while True:
        order = torch.randperm(n, generator=generator)
        draws = None if recipe is None else recipe.draw_epoch(n, draw_size, shape, generator)
        for start in range(0, n - draw_size + 1, draw_size):
            index = order[start : start + draw_size]
            inputs, targets = data.x_train[index], data.y_train[index]
            if draws is not None:
                inputs = recipe.apply(inputs, targets, draws[start : start + draw_size])[0]
            yield to_unit(inputs), targets


def run_gradinit(
    model: nn.Module,
    data: TaskData,
    settings: Mapping[str, Any],
    seed: int,
    objective: str = "gradinit",
    progress: bool = False,
    recipe: Augmentation | None = None,
) -> GradInitResult:
    """:func:`gradinit` on a task's training set with seeded draws (settings: ``gradinit.<task>``),
    augmented as training augments them (``recipe``: :func:`batch_draws`)."""
    cfg = check_settings(settings)
    batch = min(cfg["batch_size"], len(data.x_train) // 2)  # a small data set caps B
    size = batch if objective == "metainit" else 2 * batch - round(cfg["overlap"] * batch)
    generator = torch.Generator().manual_seed(seed)
    return gradinit(
        model,
        batch_draws(data, size, generator, recipe),
        objective=objective,
        variant=cfg["variant"],
        eta=cfg["eta"],
        gamma=cfg["gamma"],
        tau=cfg["tau"],
        iterations=cfg["iterations"],
        batch_size=batch,
        overlap=cfg["overlap"],
        min_scale=cfg["min_scale"],
        min_bias_scale=cfg["min_bias_scale"],
        metainit_eps=cfg["metainit_eps"],
        second_order=cfg["second_order"],
        progress=progress,
    )


# --- diagnostics (appendix, figures 4-8) --------------------------------------------------------


def diagnostic_layers(model: nn.Module) -> list[tuple[str, str]]:
    """``(parameter name, kind)`` of every Linear/Conv weight and norm-layer weight, shallow to deep."""
    layers = []
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, nn.Linear | nn.Conv1d | nn.Conv2d):
            layers.append((f"{prefix}weight", "linear"))
        elif isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d | nn.LayerNorm | nn.GroupNorm):
            if getattr(module, "weight", None) is not None:
                layers.append((f"{prefix}weight", "norm"))
    return layers


def layer_diagnostics(
    model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], n_batches: int
) -> pd.DataFrame:
    """Per layer: ||W_i|| / d_i (d_i = entries of W_i) and sigma(g_i), the standard deviation of its
    gradient over ``n_batches`` minibatches (per entry, then averaged), BN in training mode.

    The model (parameters, buffers and mode) is left exactly as it was.
    """
    layers = diagnostic_layers(model)
    parameters = dict(model.named_parameters())
    was_training = model.training
    _batch_statistics_mode(model)
    samples: dict[str, list[torch.Tensor]] = {name: [] for name, _ in layers}
    draws = iter(batches)
    values = {name: p.detach() for name, p in parameters.items()}
    for _ in range(n_batches):
        wanted = {name: values[name].clone().requires_grad_(True) for name, _ in layers}
        loss = _forward_loss(model, {**values, **wanted}, next(draws))
        grads = torch.autograd.grad(loss, list(wanted.values()))
        for (name, _), grad in zip(layers, grads, strict=True):
            samples[name].append(grad.detach())
    model.train(was_training)
    rows = []
    for index, (name, kind) in enumerate(layers):
        weight = parameters[name].detach()
        stacked = torch.stack(samples[name])
        rows.append({
            "layer": index,
            "name": name,
            "kind": kind,
            "weight_magnitude": float(weight.norm() / weight.numel()),
            "grad_std": float(stacked.std(dim=0, unbiased=n_batches > 1).mean()),
        })  # fmt: skip
    return pd.DataFrame(rows)


def draws_for(
    data: TaskData, batch_size: int, seed: int, recipe: Augmentation | None = None
) -> Callable[[], Iterator]:
    """A factory of identical seeded minibatch streams (for before/after diagnostics), augmented
    by ``recipe`` as :func:`batch_draws` does."""
    size = min(batch_size, len(data.x_train))
    return lambda: batch_draws(data, size, torch.Generator().manual_seed(seed), recipe)
