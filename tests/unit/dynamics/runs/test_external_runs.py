"""External runs: checkpoints written by a plain PyTorch loop, with no trainmap code,
give the metrics trainmap computes for the same weights through its own path (to 1e-12 in
float64), a map with verdicts comes out, and bad run directories are refused naming the file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from trainmap.data import model_meta
from trainmap.dynamics.metrics.columns import CONVENTIONS
from trainmap.dynamics.metrics.weights import (
    METRIC_NAMES,
    collect_run_metrics,
    layout_of_model,
    state_dict_layout,
    trajectory_metrics,
)
from trainmap.dynamics.runs.external import (
    ExternalRunError,
    external_run_metrics,
    read_external_run,
)
from trainmap.models import build_model

STEPS = range(0, 60, 10)


# --- a user's own training code: plain PyTorch, nothing from trainmap --------------------------


class PlainMLP(nn.Module):
    """Named like trainmap's mlp (layers.1, layers.3), so trainmap's model can hold its weights."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(40, width), nn.ReLU(),
                                    nn.Linear(width, 2))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class PlainCNN(nn.Module):
    """Conv kernels (4-D), a BatchNorm (1-D weight and running statistics) and a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, padding=1)
        self.norm = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 8, 3, padding=1, bias=False)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.norm(self.conv(x.view(-1, 1, 5, 8))))
        return self.head(torch.relu(self.conv2(hidden)).mean(dim=(2, 3)))


class PlainAttention(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False)
                                          for _ in range(4))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.heads, -1).transpose(1, 2)

        mixed = torch.softmax(split(self.q(x)) @ split(self.k(x)).transpose(-2, -1), -1)
        return self.o((mixed @ split(self.v(x))).transpose(1, 2).reshape(batch, length, width))


class PlainTransformer(nn.Module):
    """Named like trainmap's one-layer transformer (embed, attention.q/k/v/o, mlp, readout)."""

    def __init__(self, vocab: int = 8, d_model: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab + 1, d_model)
        self.pos_embed = nn.Embedding(3, d_model)
        self.attention = PlainAttention(d_model, heads)
        self.mlp = nn.Sequential()
        self.mlp.add_module("up", nn.Linear(d_model, 32))
        self.mlp.add_module("down", nn.Linear(32, d_model))
        self.readout = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        stream = self.embed(tokens) + self.pos_embed.weight
        stream = stream + self.attention(stream)
        stream = stream + self.mlp.down(torch.relu(self.mlp.up(stream)))
        return self.readout(stream[:, -1])


def plain_training_run(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
                       directory: Path, seed: int, lr: float, safetensors: bool) -> None:  # fmt: skip
    """A user's own loop: SGD, a state dict per checkpoint named by step, and evaluation.csv."""
    torch.manual_seed(seed)
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    optimiser = torch.optim.SGD(model.parameters(), lr=lr)
    directory.mkdir(parents=True)
    rows = []
    for step in range(max(STEPS) + 1):
        if step in STEPS:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if safetensors:
                save_file(state, str(directory / f"checkpoint-{step}.safetensors"))
            else:
                torch.save(state, directory / f"step_{step}.pt")
            with torch.no_grad():
                accuracy = (model(inputs).argmax(-1) == labels).float().mean().item()
            rows.append({"step": step, "test_acc": accuracy})
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    pd.DataFrame(rows).to_csv(directory / "evaluation.csv", index=False)


def parity_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, 2, (256, 40), generator=generator).float() * 2 - 1
    return inputs, (inputs[:, :3].prod(dim=1) > 0).long()


def token_data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 8, (128, 3), generator=generator)
    tokens[:, 2] = 8
    return tokens, (tokens[:, 0] + tokens[:, 1]) % 8


# --- the tests ---------------------------------------------------------------------------------


def trainmap_path(run_dir: Path, model: nn.Module, convention: str = "paper") -> pd.DataFrame:
    """trainmap's own path: the model tells the layout (weight_matrices), for the same weights
    (read here with torch / safetensors directly, not through trainmap.dynamics.runs.external)."""
    files = sorted(run_dir.glob("*.pt")) + sorted(run_dir.glob("*.safetensors"))
    by_step = {int("".join(filter(str.isdigit, f.stem))): f for f in files}
    states = [load_file(f) if f.suffix == ".safetensors" else torch.load(f, weights_only=True)
              for _, f in sorted(by_step.items())]  # fmt: skip
    stacked = {key: torch.stack([s[key] for s in states]) for key in states[0]
               if states[0][key].is_floating_point()}  # fmt: skip
    trajectory = {"step": torch.tensor(sorted(by_step)), "state": stacked}
    return collect_run_metrics(trajectory, model, pd.read_csv(run_dir / "evaluation.csv"),
                               convention)  # fmt: skip


def assert_same_metrics(external: pd.DataFrame, own: pd.DataFrame) -> float:
    columns = [*METRIC_NAMES, "n_matrices", "step", "test_acc"]
    gap = np.nanmax(np.abs(external[columns].to_numpy(float) - own[columns].to_numpy(float)))
    assert np.array_equal(np.isnan(external[columns].to_numpy(float)),
                          np.isnan(own[columns].to_numpy(float)))  # fmt: skip
    assert gap <= 1e-12, gap
    return float(gap)


@pytest.mark.parametrize("convention", ["paper", "extended"])
def test_plain_mlp_runs_give_trainmaps_metrics(tmp_path: Path, convention: str) -> None:
    inputs, labels = parity_data()
    for seed in range(3):
        run_dir = tmp_path / f"seed{seed}"
        plain_training_run(PlainMLP(), inputs, labels, run_dir, seed, 0.1, safetensors=seed == 2)
        external = external_run_metrics(read_external_run(run_dir), convention)
        # trainmap's own mlp, holding the same weights (same state-dict names by construction).
        own_model = build_model("mlp", model_meta("sparse_parity", {"n_bits": 40}), hidden=[32])
        assert_same_metrics(external, trainmap_path(run_dir, own_model, convention))
        assert external["n_matrices"].iloc[0] == 2 and len(external) == len(STEPS)


def test_plain_cnn_and_transformer_runs_give_trainmaps_metrics(tmp_path: Path) -> None:
    inputs, labels = parity_data()
    plain_training_run(PlainCNN(), inputs, labels, tmp_path / "cnn", 0, 0.05, safetensors=False)
    external = external_run_metrics(read_external_run(tmp_path / "cnn"))
    own = trainmap_path(tmp_path / "cnn", PlainCNN())
    assert_same_metrics(external, own)
    assert external["n_matrices"].iloc[0] == 3  # two conv kernels and the head; BN left out

    tokens, targets = token_data()
    plain_training_run(PlainTransformer(), tokens, targets, tmp_path / "tf", 0, 0.5,
                       safetensors=True)  # fmt: skip
    meta = {"input_kind": "tokens", "input_shape": [3], "num_classes": 8, "vocab_size": 9}
    own_model = build_model("transformer", meta, d_model=16, n_heads=2, d_mlp=32)
    external = external_run_metrics(read_external_run(tmp_path / "tf"), heads=2)
    assert_same_metrics(external, trainmap_path(tmp_path / "tf", own_model))
    # 2 heads x (q, k, v) + o + up + down; embeddings and the readout (unembedding) left out
    assert external["n_matrices"].iloc[0] == 9


def test_fused_attention_projection_is_split_like_separate_ones() -> None:
    """nn.MultiheadAttention's fused in_proj_weight (3 d, d) counts the same per-head matrices as
    separate q, k, v projections holding its three blocks."""
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(12, 3)
    fused = {k: v.unsqueeze(0) for k, v in attention.state_dict().items()}
    q, k, v = attention.in_proj_weight.detach().chunk(3)
    separate = {"attn.q.weight": q, "attn.k.weight": k, "attn.v.weight": v,
                "attn.out_proj.weight": attention.out_proj.weight.detach(),
                "attn.out_proj.bias": attention.out_proj.bias.detach()}  # fmt: skip
    separate = {key: value.unsqueeze(0) for key, value in separate.items()}
    from trainmap.dynamics.metrics.weights import trajectory_metrics

    def metrics(state: dict) -> pd.DataFrame:
        layout = state_dict_layout({k: tuple(t.shape[1:]) for k, t in state.items()}, heads=3)
        return trajectory_metrics(state, layout)

    a, b = metrics(fused), metrics(separate)
    assert a["n_matrices"].iloc[0] == b["n_matrices"].iloc[0] == 10
    np.testing.assert_allclose(a[list(METRIC_NAMES)].to_numpy(), b[list(METRIC_NAMES)].to_numpy(),
                               rtol=0, atol=1e-12)  # fmt: skip


def test_every_trainmap_architecture_reads_the_same_by_name_and_shape() -> None:
    """The state-dict rules give each shipped architecture the layout its model gives."""
    from trainmap.models import arch_names

    # RGB images: every image architecture takes 3 channels, not every one 1 (resnet18, resnet50).
    tasks = {"tokens": ("modular_addition", {}), "image": ("cifar10", {}),
             "vector": ("sparse_parity", {"n_bits": 40})}  # fmt: skip
    from trainmap.models import ARCHITECTURES

    for arch in arch_names():
        kind = sorted(ARCHITECTURES[arch].input_kinds)[0]
        model = build_model(arch, model_meta(*tasks[kind]))
        heads = getattr(getattr(model, "attention", None), "n_heads", None)
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()
                  if v.is_floating_point()}  # fmt: skip
        for convention in CONVENTIONS:
            expected = layout_of_model(model, convention)
            found = state_dict_layout(shapes, convention, heads)
            assert (found.matrices, found.biases) == (expected.matrices, expected.biases), arch


@pytest.mark.parametrize("arch", ["resnet_bn", "resnet", "fixup_resnet"])
def test_shortcut_convs_are_found_by_name_and_shape(arch: str) -> None:
    """Convention (f) from a state dict alone: ``paper`` leaves the 1x1 ``shortcut`` convs (and
    their biases) out, as the model's layout does, and the metrics agree with it; the other
    conventions count them."""
    model = build_model(arch, model_meta("digits", {}))
    state = {k: v.unsqueeze(0) for k, v in model.state_dict().items() if v.is_floating_point()}
    shapes = {k: tuple(v.shape[1:]) for k, v in state.items()}
    shortcuts = {k for k, shape in shapes.items() if ".shortcut." in f".{k}" and len(shape) == 4}
    assert shortcuts
    for convention in CONVENTIONS:
        found = state_dict_layout(shapes, convention)
        expected = layout_of_model(model, convention)
        assert (found.matrices, found.biases) == (expected.matrices, expected.biases)
        named = {m.name for m in found.matrices}
        assert (named & shortcuts == set()) == (convention == "paper"), convention
        by_name = trajectory_metrics(state, found, convention)
        pd.testing.assert_frame_equal(by_name, trajectory_metrics(state, model, convention))
    paper, counting = (
        state_dict_layout(shapes, "paper"),
        state_dict_layout(shapes, "paper_shortcuts"),
    )
    assert {k for k, why in paper.ignored.items() if "shortcut" in why} == shortcuts
    shortcut_biases = {k.removesuffix("weight") + "bias" for k in shortcuts} & set(shapes)
    assert set(counting.biases) - set(paper.biases) == shortcut_biases
    assert bool(shortcut_biases) == (arch == "resnet")  # resnet: shortcut convs with a bias


def test_torchvision_style_downsample_convs_are_shortcuts() -> None:
    """A torchvision ResNet's ``layerN.M.downsample.0`` (1x1 conv) + ``.1`` (BN) is a shortcut
    under ``paper``; a 3x3 conv a model calls ``downsample`` is a main-path conv and counts."""
    shapes = {"conv1.weight": (8, 3, 7, 7), "bn1.weight": (8,), "bn1.bias": (8,),
              "layer2.0.conv1.weight": (16, 8, 3, 3), "layer2.0.conv2.weight": (16, 16, 3, 3),
              "layer2.0.downsample.0.weight": (16, 8, 1, 1), "layer2.0.downsample.1.weight": (16,),
              "layer2.0.downsample.1.bias": (16,), "down.downsample.conv.weight": (16, 16, 3, 3),
              "down.downsample.conv.bias": (16,), "fc.weight": (10, 16),
              "fc.bias": (10,)}  # fmt: skip
    paper = state_dict_layout(shapes, "paper")
    counted = [m.name for m in paper.matrices]
    assert counted == ["conv1.weight", "layer2.0.conv1.weight", "layer2.0.conv2.weight",
                       "down.downsample.conv.weight", "fc.weight"]  # fmt: skip
    assert paper.biases == ("down.downsample.conv.bias", "fc.bias")
    assert "layer2.0.downsample.0.weight" in paper.ignored
    with_shortcuts = [m.name for m in state_dict_layout(shapes, "paper_shortcuts").matrices]
    assert with_shortcuts == [*counted[:3], "layer2.0.downsample.0.weight", *counted[3:]]


@pytest.mark.integration  # starts a program (a subprocess)
def test_a_map_with_verdicts_comes_out_of_external_runs(tmp_path: Path) -> None:
    inputs, labels = parity_data()
    groups = []
    for group, lr in (("slow", 0.02), ("fast", 0.3)):
        for seed in range(4):
            plain_training_run(PlainMLP(8), inputs, labels, tmp_path / "runs" / f"{group}{seed}",
                               seed, lr, safetensors=seed % 2 == 1)  # fmt: skip
            groups.append({"run": f"{group}{seed}", "group": group})
    pd.DataFrame(groups).to_csv(tmp_path / "groups.csv", index=False)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "trainmap.dynamics", str(tmp_path / "runs"), "--out", str(out),
         "--threshold", "0.6", "--k-max", "3", "--restarts", "1", "--bootstrap", "5",
         "--groups", str(tmp_path / "groups.csv")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "8 external run(s)" in result.stdout
    assert sorted(p.parent.name for p in (out / "metrics").glob("*/metrics.csv")) == \
        sorted(g["run"] for g in groups)  # fmt: skip
    joint = json.loads((out / "joint" / "joint.json").read_text())
    assert set(joint["groups"]) == {"slow", "fast"}
    verdicts = (out / "joint" / "verdicts.md").read_text()
    assert "slow" in verdicts and "fast" in verdicts
    assert (out / "map.png").stat().st_size > 0


# --- bad input: each refused naming the file and the fix, nothing written ----------------------


@pytest.fixture
def good_run(tmp_path: Path) -> Path:
    inputs, labels = parity_data()
    plain_training_run(PlainMLP(8), inputs, labels, tmp_path / "run", 0, 0.1, safetensors=False)
    return tmp_path / "run"


def test_no_checkpoints_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExternalRunError, match=r"empty: no checkpoints .*step_100\.pt"):
        read_external_run(tmp_path / "empty")


def test_a_step_that_is_not_an_integer_is_refused(good_run: Path) -> None:
    (good_run / "step_final.pt").write_bytes((good_run / "step_0.pt").read_bytes())
    with pytest.raises(ExternalRunError, match=r"step_final\.pt: the file name holds no integer"):
        read_external_run(good_run)


def test_mixed_shapes_across_steps_are_refused(good_run: Path) -> None:
    state = torch.load(good_run / "step_20.pt", weights_only=True)
    state["layers.1.weight"] = torch.zeros(9, 40)
    torch.save(state, good_run / "step_20.pt")
    run = read_external_run(good_run)
    with pytest.raises(ExternalRunError,
                       match=r"step_20\.pt: entry layers\.1\.weight has shape \(9, 40\) at step 20 "
                       r"but \(8, 40\) at step 0"):  # fmt: skip
        external_run_metrics(run)


@pytest.mark.parametrize("damage", ["truncated", "text", "pickled_object"])
def test_a_damaged_checkpoint_is_refused(good_run: Path, damage: str) -> None:
    path = good_run / "step_30.pt"
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "text":
        path.write_text("not a checkpoint")
    else:  # arbitrary objects are never unpickled (weights_only=True)
        torch.save({"weights": PlainMLP(8)}, path)
    with pytest.raises(ExternalRunError, match=r"step_30\.pt: damaged or not a state dict"):
        external_run_metrics(read_external_run(good_run))


def test_an_evaluation_without_test_acc_is_refused(good_run: Path) -> None:
    table = pd.read_csv(good_run / "evaluation.csv").rename(columns={"test_acc": "accuracy"})
    table.to_csv(good_run / "evaluation.csv", index=False)
    with pytest.raises(ExternalRunError, match=r"evaluation\.csv: no column test_acc"):
        read_external_run(good_run)


def test_an_evaluation_missing_a_checkpoint_step_is_refused(good_run: Path) -> None:
    table = pd.read_csv(good_run / "evaluation.csv")
    table[table["step"] != 40].to_csv(good_run / "evaluation.csv", index=False)
    with pytest.raises(ExternalRunError, match=r"no row for checkpoint step\(s\) \[40\]"):
        read_external_run(good_run)


@pytest.mark.integration  # starts a program (a subprocess)
def test_the_cli_refuses_a_bad_run_before_writing_any_table(tmp_path: Path, good_run: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "step_0.pt").write_text("damaged")
    (other / "evaluation.csv").write_text("step,test_acc\n0,0.5\n")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "trainmap.dynamics", str(good_run), str(other), "--out", str(out),
         "--threshold", "0.9"], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    assert "other/step_0.pt: damaged or not a state dict" in result.stderr
    assert not list(out.glob("metrics/*/metrics.csv"))


def test_a_state_dict_that_does_not_fit_the_given_architecture_is_refused(good_run: Path) -> None:
    model = build_model("mlp", model_meta("sparse_parity", {"n_bits": 40}), hidden=[16])
    with pytest.raises(ExternalRunError, match=r"does not fit the given architecture"):
        external_run_metrics(read_external_run(good_run), model=model)


# --- the config section: external sets in the Snakemake DAG, beside the grid's own runs --------

EXTERNAL_GRID = """
grid:
  - {task: sparse_parity, archs: [mlp], methods: [kaiming], seeds: [0, 1, 2]}
model:
  sparse_parity:
    mlp: {hidden: [8]}
train:
  sparse_parity: {steps: 60, checkpoint_every: 10, resume_every: 30, seed_block: 3}
external:
  - {name: plain_slow, runs: ["plain/slow*"], threshold: 0.6}
  - {name: plain_fast, runs: ["plain/fast*"], threshold: 0.6}
analysis:
  group_maps: none
  k_max: 3
  restarts: 1
  bootstrap: 5
  permutations: 50
  joint:
    - {name: own_vs_plain, task: sparse_parity, archs: [mlp], methods: [kaiming],
       external: [plain_fast]}
    - {name: plain_lr, external: [plain_slow, plain_fast]}
mlflow: {experiment: external-test}
"""


def write_plain_runs(root: Path) -> None:
    inputs, labels = parity_data()
    for group, lr in (("slow", 0.02), ("fast", 0.3)):
        for seed in range(3):
            plain_training_run(PlainMLP(8), inputs, labels, root / f"{group}{seed}", seed, lr,
                               safetensors=seed == 1)  # fmt: skip


@pytest.mark.integration
def test_external_sets_in_the_workflow(tmp_path: Path) -> None:
    """snakemake maps external sets on their own, jointly with the grid's runs and with each
    other; MLflow gets their rules; a damaged run stops the config check before any job."""
    from conftest import copy_workflow, snakemake

    workdir = copy_workflow(tmp_path / "workflow")
    write_plain_runs(workdir / "plain")
    (workdir / "external.yaml").write_text(EXTERNAL_GRID)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    snakemake("--cores", "2", "--configfile", "external.yaml", cwd=workdir,
              MLFLOW_TRACKING_URI=uri, timeout=900)  # fmt: skip
    results = workdir / "results"
    for name in ("plain_slow", "plain_fast"):
        manifest = json.loads((results / "external" / name / "metrics.json").read_text())
        assert len(manifest["runs"]) == 3
        assert (results / "external" / name / "map" / "map.png").stat().st_size > 0
        found = json.loads((results / "external" / name / "map" / "outliers.json").read_text())
        assert found["outlier_share"] == 0.2 and abs(sum(found["visit_shares"].values())) >= 1
        assert all(found["visit_shares"][str(o["state"])] < 0.2 for o in found["outliers"].values())
    own_vs_plain = json.loads((results / "joint/own_vs_plain/joint.json").read_text())
    assert set(own_vs_plain["groups"]) == {"kaiming", "plain_fast"}
    plain_lr = json.loads((results / "joint/plain_lr/joint.json").read_text())
    assert set(plain_lr["groups"]) == {"plain_slow", "plain_fast"}
    assert "plain_slow" in (results / "joint/plain_lr/verdicts.md").read_text()
    # The same tables as the command line computes from the same directories.
    table = pd.read_csv(results / "external/plain_fast/runs/fast0/metrics.csv")
    direct = external_run_metrics(read_external_run(workdir / "plain" / "fast0"))
    assert_same_metrics(table, direct)
    # A damaged checkpoint: refused by the config check, naming key and file; no job runs.
    (workdir / "plain" / "slow2" / "step_30.pt").write_text("damaged")
    failed = snakemake("-n", "--cores", "1", "--configfile", "external.yaml", cwd=workdir,
                       check=False, MLFLOW_TRACKING_URI=uri, timeout=120)  # fmt: skip
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0
    assert "config key external[0].runs: " in output and "slow2/step_30.pt: damaged" in output


@pytest.mark.parametrize(
    ("external", "joint", "message"),
    [
        ('[{name: a, runs: ["nothing*"], threshold: 0.6}]', "[]",
         r"config key external\[0\]\.runs: the patterns \['nothing\*'\] match 0 run directories"),
        ('[{name: a, runs: ["plain/slow*"], threshold: 0.6}, '
         '{name: a, runs: ["plain/fast*"], threshold: 0.6}]', "[]",
         r"config key external\[1\]\.name: 'a' is used twice"),
        ('[{name: a, runs: ["plain/slow*"], threshold: 0.6}]',
         "[{name: j, external: [b, a]}]",
         r"config key analysis\.joint\[0\]\.external\[0\]: no external set 'b'; sets: a"),
        ('[{name: a, runs: ["plain/slow*"], threshold: 0.6}]', "[{name: j, external: [a]}]",
         r"config key analysis\.joint\[0\]\.external: a comparison of external sets alone needs "
         r"at least two sets"),
        ('[{name: a, runs: ["plain/slow*"], threshold: 0.6, arch: nope, task: sparse_parity}]',
         "[]", r"config key external\[0\]\.arch: unknown architecture 'nope'"),
        ('[{name: a, runs: ["plain/slow*"], threshold: 1.5}]', "[]", r"external\[0\]\.threshold"),
        ('[{name: kaiming, runs: ["plain/slow*"], threshold: 0.6}]', "[]",
         r"config key external\[0\]\.name: 'kaiming' is a registered method"),
    ],
)  # fmt: skip
def test_bad_external_settings_are_refused(tmp_path: Path, external: str, joint: str,
                                           message: str) -> None:  # fmt: skip
    from conftest import REPO_ROOT

    from trainmap.grid import ConfigError, load_config

    write_plain_runs(tmp_path / "plain")
    (tmp_path / "c.yaml").write_text(f"dvc: {{configfile: c.yaml}}\nexternal: {external}\n"
                                     f"analysis: {{joint: {joint}}}\n")  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        load_config(REPO_ROOT / "params.yaml", REPO_ROOT / "config/config.yaml",
                    tmp_path / "c.yaml", check_paths_from=tmp_path)  # fmt: skip


def test_a_good_external_set_with_an_architecture_is_accepted(tmp_path: Path) -> None:
    from conftest import REPO_ROOT

    from trainmap.grid import load_config

    write_plain_runs(tmp_path / "plain")
    (tmp_path / "c.yaml").write_text(
        "dvc: {configfile: c.yaml}\n"
        'external: [{name: a, runs: ["plain/slow*"], threshold: 0.6, arch: mlp,\n'
        "            task: sparse_parity, options: {hidden: [8]}}]\n"
    )
    config = load_config(REPO_ROOT / "params.yaml", REPO_ROOT / "config/config.yaml",
                         tmp_path / "c.yaml", check_paths_from=tmp_path)  # fmt: skip
    assert config["external"][0]["arch"] == "mlp"


@pytest.mark.integration  # starts a program (a subprocess)
def test_the_cli_reads_runs_through_a_registered_architecture(tmp_path: Path) -> None:
    """--arch/--meta/--arch-options: the layout of that model (here trainmap's mlp, whose names the
    plain runs share), tables only with --metrics-only; a state dict that does not fit is refused."""
    write_plain_runs(tmp_path / "plain")
    meta = json.dumps({"input_kind": "vector", "input_shape": [40], "num_classes": 2})
    command = [sys.executable, "-m", "trainmap.dynamics", str(tmp_path / "plain"), "--out",
               str(tmp_path / "out"), "--metrics-only", "--arch", "mlp", "--meta", meta]  # fmt: skip
    result = subprocess.run([*command, "--arch-options", '{"hidden": [8]}'], capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(tmp_path / "out" / "metrics" / "fast1" / "metrics.csv")
    assert_same_metrics(table, external_run_metrics(read_external_run(tmp_path / "plain/fast1")))
    assert not (tmp_path / "out" / "hmm.npz").exists()
    wrong = subprocess.run([*command, "--out", str(tmp_path / "wrong"), "--arch-options",
                            '{"hidden": [16]}'], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert wrong.returncode != 0
    assert "does not fit the given architecture" in wrong.stderr
    assert not (tmp_path / "wrong" / "metrics").exists()


def test_the_cheap_check_finds_truncated_and_legacy_files(tmp_path: Path) -> None:
    """check_run_shapes (the config check's) reads headers only, yet refuses a safetensors file cut
    short, and reads a legacy (non-zip) torch.save file."""
    from trainmap.dynamics.runs.external import check_run_shapes

    inputs, labels = parity_data()
    plain_training_run(PlainMLP(8), inputs, labels, tmp_path / "run", 0, 0.1, safetensors=True)
    run = read_external_run(tmp_path / "run")
    check_run_shapes(run)
    last = run.checkpoints[max(run.checkpoints)]
    legacy = tmp_path / "run" / "step_60.pt"
    torch.save(load_file(last), legacy, _use_new_zipfile_serialization=False)
    pd.concat([run.evaluation, run.evaluation.tail(1).assign(step=60)]).to_csv(
        tmp_path / "run" / "evaluation.csv", index=False)  # fmt: skip
    check_run_shapes(read_external_run(tmp_path / "run"))
    last.write_bytes(last.read_bytes()[:-16])
    with pytest.raises(ExternalRunError, match=rf"{last.name}: damaged .*ends before its data"):
        check_run_shapes(read_external_run(tmp_path / "run"))
