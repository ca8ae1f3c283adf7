"""Parameter groups (trainmap.training.param_groups, ``train.<task>.param_groups``): the GradInit
authors' groups by structure equal their rule by names on trainmap's architectures, train as
declared (no decay for BatchNorm, a tenth of the learning rate for no-BN biases and scales, under
the schedule too), keep each seed of a block as alone, and ``single`` is the plain optimiser."""

from __future__ import annotations

import io
from dataclasses import replace

import pandas as pd
import pytest
import torch

from trainmap.data import make_task_data
from trainmap.models import build_model
from trainmap.schema import section_choices
from trainmap.training import loop
from trainmap.training.loop import TrainConfig, TrainHooks, TrainPaths, build_cell_model, lr_factor
from trainmap.training.param_groups import PARAM_GROUP_RULES, parameter_groups
from trainmap.training.seed_block import SeedBlock
from trainmap.training.step import make_block_optimizer, make_optimizer

pytestmark = pytest.mark.usefixtures("one_thread")

#: trainmap's counterparts of the authors' architectures; True: the authors' no-BN rule
#: (``'nobn' in arch or 'fixup' in arch or no_bn and 'resnet' in arch``), False: their BN rule.
AUTHORS_NO_BN = {"vgg_deep": True, "resnet_deep": True, "fixup_resnet": True,
                 "vgg_bn": False, "resnet_bn": False}  # fmt: skip
SMALL = {"vgg_bn": {"widths": [4], "convs_per_stage": [1]},
         "vgg_deep": {"widths": [4, 4], "convs_per_stage": [1, 1]},
         "fixup_resnet": {"widths": [4, 4], "blocks_per_stage": [1, 1]}}  # fmt: skip


@pytest.fixture(scope="module")
def meta() -> dict:
    return make_task_data("digits", {}).meta


def authors_groups(names: list[str], no_bn: bool) -> dict[str, tuple[list[str], float, float]]:
    """zhuchen03/gradinit train_cifar.py's groups of ``names``: (names, lr factor, weight decay
    factor) by label, empty groups left out."""
    if no_bn:
        bias = [n for n in names if "bias" in n]
        scale = [n for n in names if "scale" in n]
        others = [n for n in names if not ("bias" in n or "scale" in n or "autoinit" in n)]
        groups = {"bias": (bias, 0.1, 1.0), "scale": (scale, 0.1, 1.0),
                  "others": (others, 1.0, 1.0)}  # fmt: skip
    else:
        bn = [n for n in names if any(k in n for k in ["norm", "bn"])]
        others = [n for n in names if n not in bn]
        groups = {"batch_norm": (bn, 1.0, 0.0), "others": (others, 1.0, 1.0)}
    return {label: group for label, group in groups.items() if group[0]}


@pytest.mark.parametrize("arch", list(AUTHORS_NO_BN))
def test_gradinit_groups_are_the_authors_on_their_architectures(meta, arch):
    """By structure (BatchNorm modules, a parameter's own name) the groups are those the authors'
    name rule gives: the same names in the same order, the same factors, every parameter once."""
    model = build_model(arch, meta)
    names = [name for name, _ in model.named_parameters()]
    groups = parameter_groups(model, "gradinit")
    ours = {g.label: (list(g.names), g.lr_factor, g.weight_decay_factor) for g in groups}
    assert ours == authors_groups(names, AUTHORS_NO_BN[arch])
    assert sorted(n for g in groups for n in g.names) == sorted(names)
    if arch == "fixup_resnet":  # FixUp's scalar biases and its scales train at a tenth
        assert {"stem_bias", "head_bias", "blocks.0.bias1a", "blocks.0.bias2b"} <= set(
            ours["bias"][0]
        )
        assert ours["scale"][0] == [n for n in names if n.endswith(".scale")]


def test_single_is_every_parameter_at_the_configured_settings(meta):
    model = build_model("vgg_bn", meta, **SMALL["vgg_bn"])
    (group,) = parameter_groups(model, "single")
    assert list(group.names) == [name for name, _ in model.named_parameters()]
    assert (group.lr_factor, group.weight_decay_factor) == (1.0, 1.0)


def test_the_rules_are_the_schemas_choices(meta):
    assert section_choices("train")["param_groups"] == tuple(PARAM_GROUP_RULES)
    with pytest.raises(ValueError, match="unknown param_groups 'bn'; allowed: single, gradinit"):
        parameter_groups(build_model("vgg", meta, widths=[4], convs_per_stage=[1]), "bn")


def test_gradinit_leaves_batch_norm_undecayed(meta):
    """One SGD step with zero gradient and weight decay: BatchNorm's parameters stay, the conv and
    classifier weights shrink by (1 - lr wd)."""
    model = build_model("vgg_bn", meta, **SMALL["vgg_bn"])
    cfg = TrainConfig(lr=0.1, momentum=0.9, weight_decay=0.1, param_groups="gradinit")
    optimizer = make_optimizer(model, cfg)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    for name, parameter in model.named_parameters():
        if ".bn" in name:
            assert torch.equal(parameter, before[name]), name
        else:
            torch.testing.assert_close(parameter.detach(), before[name] * (1 - 0.1 * 0.1))
            assert not torch.equal(parameter, before[name]), name


@pytest.mark.parametrize("arch", ["vgg_deep", "fixup_resnet"])
def test_gradinit_moves_no_bn_biases_and_scales_at_a_tenth(meta, arch):
    """One SGD step against the manual update p - lr (g + wd p), the authors' base_lr / 10 for
    biases (FixUp's scalars included) and scales, lr for the rest."""
    model = build_model(arch, meta, **SMALL[arch]).double()
    lr, wd = 0.3, 0.01
    optimizer = make_optimizer(model, TrainConfig(lr=lr, weight_decay=wd, param_groups="gradinit"))
    generator = torch.Generator().manual_seed(0)
    expected = {}
    for name, parameter in model.named_parameters():
        with torch.no_grad():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
        parameter.grad = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
        own = name.rsplit(".", 1)[-1]
        rate = lr / 10.0 if "bias" in own or "scale" in own else lr
        expected[name] = parameter.detach() - rate * (parameter.grad + wd * parameter.detach())
    optimizer.step()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.detach(), expected[name], rtol=1e-14, atol=1e-15)


def test_single_is_todays_plain_optimiser(meta):
    """``single``: one param group of every parameter in order and no key of its own, so the
    optimiser and its saved state are torch's plain optimiser's, byte for byte; a per-seed block's
    group per run holds every parameter's rows with the run's own numbers."""
    model = build_model("vgg_bn", meta, **SMALL["vgg_bn"])
    cfg = TrainConfig(lr=0.05, momentum=0.9, weight_decay=1e-3)
    ours = make_optimizer(model, cfg)
    plain = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    assert len(ours.param_groups) == 1
    assert all(
        a is b for a, b in zip(ours.param_groups[0]["params"], model.parameters(), strict=True)
    )
    assert saved_bytes(ours) == saved_bytes(plain)

    models = [build_model("vgg_bn", meta, **SMALL["vgg_bn"]) for _ in range(3)]
    block = SeedBlock(models)
    sweep = replace(cfg, lr=(0.05, 0.05, 0.01))
    runs = make_block_optimizer(block, [sweep.for_seed(seed) for seed in range(3)])
    stacked = list(block.parameters.values())
    reference = torch.optim.SGD(
        [{"params": [p.detach()[start:stop] for p in stacked], "lr": lr, "momentum": 0.9,
          "weight_decay": 1e-3} for start, stop, lr in [(0, 2, 0.05), (2, 3, 0.01)]],
        lr=0.05, momentum=0.9, weight_decay=1e-3,
    )  # fmt: skip
    assert saved_bytes(runs) == saved_bytes(reference)


def saved_bytes(optimizer) -> bytes:
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("arch", ["fixup_resnet", "vgg_bn"])
def test_a_gradinit_sweep_in_a_block_trains_each_seed_as_alone(tmp_path, meta, arch):
    """A block of 2 with ``gradinit`` and per-seed learning rate and weight decay (a param group
    per seed run and parameter class), warm-up and cosine: each seed's final weights are those it
    trains to alone (float64, 1e-10)."""
    data = make_task_data("digits", {})
    data = type(data)(data.x_train.double(), data.y_train, data.x_test.double(), data.y_test,
                      data.meta)  # fmt: skip
    cfg = TrainConfig(lr=(0.05, 0.02), momentum=0.9, weight_decay=(5e-4, 1e-2), batch_size=16,
                      steps=30, schedule="cosine", warmup_steps=5, checkpoint_every=15,
                      resume_every=10**6, param_groups="gradinit")  # fmt: skip
    seeds = [0, 1]

    def models():
        return [build_cell_model(arch, "kaiming", seed, meta, SMALL[arch]).double()
                for seed in seeds]  # fmt: skip

    in_block = models()
    paths = [TrainPaths.in_directory(tmp_path / f"block{seed}") for seed in seeds]
    loop.train_block(in_block, data, cfg, seeds, paths, resume_path=tmp_path / "resume.pt",
                     progress=False)  # fmt: skip
    for seed, model, alone in zip(seeds, in_block, models(), strict=True):
        loop.train_model(alone, data, cfg, seed, TrainPaths.in_directory(tmp_path / f"{seed}"),
                         progress=False)  # fmt: skip
        for name, value in alone.state_dict().items():
            got = model.state_dict()[name]
            if not value.is_floating_point():
                assert torch.equal(got, value), name
                continue
            scale = value.abs().max().clamp(min=1e-12)
            assert float((got - value).abs().max() / scale) < 1e-10, (seed, name)


class LearningRates(TrainHooks):
    """Each step's learning rate of every param group, read after the loop set them."""

    def __init__(self, captured: list) -> None:
        self.captured, self.seen = captured, []

    def after_backward(self, step: int) -> None:
        self.seen.append([group["lr"] for group in self.captured[0].param_groups])


def test_a_tenth_keeps_its_tenth_under_the_schedule(tmp_path, meta, monkeypatch):
    """The loop scales each group's own learning rate: with warm-up and cosine, a bias or scale
    group of each seed runs at a tenth of that seed's rate at every step, and the history's ``lr``
    is the seed's own rate."""
    captured = []

    def capture(*args, **kwargs):
        captured.append(make_block_optimizer(*args, **kwargs))
        return captured[-1]

    monkeypatch.setattr(loop, "make_block_optimizer", capture)
    data = make_task_data("digits", {})
    cfg = TrainConfig(lr=(0.05, 0.02), batch_size=16, steps=6, schedule="cosine", warmup_steps=2,
                      checkpoint_every=3, resume_every=10**6, param_groups="gradinit")  # fmt: skip
    hooks = LearningRates(captured)
    seeds = [0, 1]
    models = [build_cell_model("fixup_resnet", "kaiming", s, meta, SMALL["fixup_resnet"])
              for s in seeds]  # fmt: skip
    paths = [TrainPaths.in_directory(tmp_path / f"seed{seed}") for seed in seeds]
    loop.train_block(models, data, cfg, seeds, paths, resume_path=tmp_path / "resume.pt",
                     progress=False, hooks=hooks)  # fmt: skip
    labels = [g.label for g in parameter_groups(models[0], "gradinit")] * len(seeds)
    assert labels == ["bias", "scale", "others", "bias", "scale", "others"]
    seed_lrs = [cfg.lr[0]] * 3 + [cfg.lr[1]] * 3
    for step, rates in enumerate(hooks.seen):
        expected = [lr * (0.1 if label != "others" else 1.0) * lr_factor(step, cfg)
                    for lr, label in zip(seed_lrs, labels, strict=True)]  # fmt: skip
        assert rates == pytest.approx(expected, rel=1e-15)
    assert len(hooks.seen) == cfg.steps
    for seed, path in zip(seeds, paths, strict=True):
        history = pd.read_csv(path.history)
        assert list(history["lr"]) == [cfg.lr[seed] * lr_factor(step, cfg)
                                       for step in history["step"]]  # fmt: skip


def test_repvgg_groups_decay_only_conv_and_linear_kernels():
    """The RepVGG paper (sec. 4.1): weight decay on the kernels of conv and fully-connected
    layers; BatchNorm parameters and biases without it."""
    from trainmap.models import build_model

    model = build_model("repvgg", {"input_kind": "image", "input_shape": [3, 16, 16],
                                   "num_classes": 10}, depths=[1, 1], widths=[8, 16])  # fmt: skip
    groups = {group.label: group for group in parameter_groups(model, "repvgg")}
    assert groups["no_decay"].weight_decay_factor == 0.0
    kernels = set(groups["kernels"].names)
    for name, parameter in model.named_parameters():
        assert (name in kernels) == (parameter.dim() > 1), name
