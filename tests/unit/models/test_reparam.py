"""RepVGG (trainmap.models.repvgg): exact fusion, identity placement with groups, deploy structure."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainmap.models import build_model, count_parameters
from trainmap.models.repvgg import (
    RepVGGBlock,
    check_equivalence,
    identity_kernel,
    save_deploy,
    to_deploy,
)
from trainmap.training.checkpoints import load_model

IMAGENET = {"input_kind": "image", "input_shape": [3, 224, 224], "num_classes": 1000}
DIGITS = {"input_kind": "image", "input_shape": [1, 8, 8], "num_classes": 10}
# Deploy parameters (millions) of Table 4 / Table 5 at 1000 classes.
PAPER_PARAMS = {"repvgg_a0": 8.30, "repvgg_a1": 12.78, "repvgg_a2": 25.49, "repvgg_b0": 14.33,
                "repvgg_b1": 51.82, "repvgg_b1g2": 41.36, "repvgg_b1g4": 36.12,
                "repvgg_b2": 80.31, "repvgg_b2g4": 55.77, "repvgg_b3": 110.96,
                "repvgg_b3g4": 75.62}  # fmt: skip
PLAIN_LAYERS = (nn.Conv2d, nn.ReLU, nn.AdaptiveAvgPool2d, nn.Flatten, nn.Linear)


pytestmark = pytest.mark.usefixtures("one_thread")


def randomise_bn(model: nn.Module, seed: int = 0) -> None:
    """Random running mean/var, gamma and beta in every BN (as the authors' equivalence check)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                n = module.num_features
                module.running_mean.copy_(torch.randn(n, generator=generator) * 0.5)
                module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
                module.weight.copy_(torch.rand(n, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(n, generator=generator) * 0.3)


def relative_error(reference: torch.Tensor, other: torch.Tensor) -> float:
    return float((reference - other).detach().norm() / reference.detach().norm())


@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_block_fusion_is_exact_in_eval_mode(groups, stride, dtype, tolerance):
    torch.manual_seed(groups * 10 + stride)
    block = RepVGGBlock(8, 8 if stride == 1 else 16, stride=stride, groups=groups).to(dtype)
    randomise_bn(block, seed=groups + stride)
    block.eval()
    deploy = block.to_deploy().eval()
    inputs = torch.randn(3, 8, 11, 9, dtype=dtype)  # odd input sizes
    reference = block(inputs)
    assert relative_error(reference, deploy(inputs)) <= tolerance
    assert (block.identity is not None) == (stride == 1)


def test_training_mode_output_is_not_expected_to_match():
    """In training mode BN normalises with the batch's statistics, while the fused kernel bakes in
    the running statistics, so the two forms differ: the equivalence holds in eval mode only."""
    torch.manual_seed(0)
    block = RepVGGBlock(4, 4).double()
    randomise_bn(block)
    deploy = block.to_deploy()
    inputs = torch.randn(6, 4, 7, 7, dtype=torch.float64)
    block.train()
    assert relative_error(block(inputs), deploy(inputs)) > 1e-3


def test_identity_with_groups_puts_the_one_at_i_mod_channels_per_group():
    kernel = identity_kernel(8, 4, torch.zeros(1))
    assert kernel.shape == (8, 2, 3, 3)
    for i in range(8):
        expected = torch.zeros(2, 3, 3)
        expected[i % 2, 1, 1] = 1.0
        assert torch.equal(kernel[i], expected)
    # The grouped kernel really is the identity map.
    inputs = torch.randn(2, 8, 5, 5)
    assert torch.allclose(nn.functional.conv2d(inputs, kernel, padding=1, groups=4), inputs)


@pytest.mark.parametrize("arch", sorted(PAPER_PARAMS))
def test_deploy_families_match_the_paper_parameter_counts(arch):
    model = build_model(arch, IMAGENET)
    deploy = to_deploy(model)
    assert all(isinstance(m, PLAIN_LAYERS) for m in deploy)
    assert count_parameters(deploy) / 1e6 == pytest.approx(PAPER_PARAMS[arch], abs=0.011)


@pytest.mark.parametrize("arch", ["repvgg", "repvgg_idonly", "repvgg_1x1only", "repvgg_plain"])
def test_small_variants_fuse_exactly_and_have_the_branches_they_claim(arch):
    torch.manual_seed(1)
    model = build_model(arch, DIGITS).double()
    randomise_bn(model, seed=2)
    model.eval()
    blocks = list(model.blocks)
    has_1x1 = arch in ("repvgg", "repvgg_1x1only")
    has_identity = arch in ("repvgg", "repvgg_idonly")
    assert all((b.conv1x1 is not None) == has_1x1 for b in blocks)
    assert any(b.identity is not None for b in blocks) == has_identity
    if arch == "repvgg_plain":
        convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
        norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
        assert len(convs) == len(norms) == len(blocks)
        assert all(c.kernel_size == (3, 3) for c in convs)
    deploy = to_deploy(model)
    inputs = torch.randn(5, 1, 8, 8, dtype=torch.float64)
    assert relative_error(model(inputs), deploy(inputs)) <= 1e-12
    # Every ablation has the same deploy structure.
    reference = to_deploy(build_model("repvgg", DIGITS))
    assert [type(m) for m in deploy] == [type(m) for m in reference]
    assert count_parameters(deploy) == count_parameters(reference)


def test_small_input_keeps_a_sensible_final_map():
    model = build_model("repvgg", DIGITS)
    features = model.blocks(torch.randn(1, 1, 8, 8))
    assert features.shape[-2:] == (2, 2)
    assert build_model("repvgg", {**DIGITS, "input_shape": [3, 32, 32]}).blocks(
        torch.randn(1, 3, 32, 32)).shape[-2:] == (4, 4)  # fmt: skip


def test_groupwise_layers_are_the_even_ones():
    model = build_model("repvgg_b1g4", IMAGENET)
    groups = [block.groups for block in model.blocks]
    assert [i for i, g in enumerate(groups) if g == 4] == list(range(2, 27, 2))
    assert all(b.conv1x1.conv.groups == b.groups for b in model.blocks)


def test_to_deploy_leaves_the_model_untouched_and_round_trips(tmp_path):
    torch.manual_seed(3)
    model = build_model("repvgg", DIGITS)
    randomise_bn(model)
    model.eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    deploy = to_deploy(model)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert isinstance(model.blocks[0], RepVGGBlock), "to_deploy must not convert in place"
    save_deploy(deploy, tmp_path / "deploy.pt", arch="repvgg", meta=DIGITS, model_options={})
    loaded = load_model(tmp_path / "deploy.pt")
    assert all(isinstance(m, PLAIN_LAYERS) for m in loaded.modules() if m is not loaded)
    inputs = torch.randn(4, 1, 8, 8)
    assert torch.equal(loaded(inputs), deploy(inputs))
    check = check_equivalence(model, loaded, inputs)
    assert check["predictions_identical"] and check["max_abs_logit_diff"] < 1e-4


def test_deploy_trajectory_fuses_every_checkpoint_into_one_weight_space_for_both_archs():
    """analysis.repvgg_weights: deploy. Each fused checkpoint computes its training-time checkpoint
    exactly (eq. 3), and a RepVGG and its plain ablation get metric tables over the same matrices."""
    from trainmap.dynamics.metrics.weights import trajectory_metrics
    from trainmap.models.repvgg import deploy_trajectory

    inputs = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    tables = {}
    for arch in ("repvgg", "repvgg_plain"):
        torch.manual_seed(4)
        model = build_model(arch, DIGITS)
        checkpoints = []
        for seed in range(3):  # three "checkpoints" with different BN statistics and weights
            randomise_bn(model, seed=seed)
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(0.01 * torch.randn_like(parameter))
            checkpoints.append({k: v.clone() for k, v in model.state_dict().items()})
        state = {name: torch.stack([c[name] for c in checkpoints]) for name in checkpoints[0]}
        fused, deploy = deploy_trajectory(state, model)
        assert all(value.shape[0] == 3 for value in fused.values())
        for index, checkpoint in enumerate(checkpoints):
            reference = build_model(arch, DIGITS).double().eval()
            reference.load_state_dict({k: v.double() if v.is_floating_point() else v
                                       for k, v in checkpoint.items()})  # fmt: skip
            deploy.load_state_dict({name: value[index] for name, value in fused.items()})
            assert relative_error(reference(inputs), deploy(inputs)) <= 1e-12
        tables[arch] = trajectory_metrics(fused, deploy)
        deploy_layers = [m for m in deploy.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
        assert (tables[arch]["n_matrices"] == len(deploy_layers)).all()
    assert (tables["repvgg"]["n_matrices"] == tables["repvgg_plain"]["n_matrices"]).all()
    # Unfused, a RepVGG's metrics also see its 1x1 branches: more matrices than its deploy form.
    model = build_model("repvgg", DIGITS)
    unfused = trajectory_metrics({k: v.unsqueeze(0) for k, v in model.state_dict().items()}, model)
    assert unfused["n_matrices"].iloc[0] > tables["repvgg"]["n_matrices"].iloc[0]
    with pytest.raises(TypeError, match="RepVGG"):
        deploy_trajectory(state, nn.Linear(2, 2))
