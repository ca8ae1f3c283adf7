"""Models that cannot be vectorised: a block whose model vmap refuses, or runs with other
numbers, is found by one trial step when the block is built; its seeds then train one at a time,
each as a block of one, with a warning naming the architecture and the reason, and each seed's
files are exactly those it gives trained alone."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from trainmap import models as model_registry
from trainmap.data import TaskData, make_task_data
from trainmap.methods.sparse import run_sparse_block
from trainmap.models import registry
from trainmap.training.loop import (
    TrainConfig,
    TrainHooks,
    TrainPaths,
    _first_batches,
    build_cell_model,
    train_block,
    train_model,
)
from trainmap.training.seed_block import (
    SeedBlock,
    UnvectorisableWarning,
    vectorisation_problem,
)

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = TrainConfig(lr=0.1, momentum=0.9, batch_size=16, steps=30, checkpoint_every=10,
                  resume_every=20)  # fmt: skip


class Branchy(nn.Module):
    """Data-dependent Python control flow: a branch on the hidden layer's mean (vmap refuses it)."""

    def __init__(self, n_in: int, n_out: int, width: int = 8) -> None:
        super().__init__()
        self.hidden, self.out = nn.Linear(n_in, width), nn.Linear(width, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.hidden(x))
        if h.mean() > 0.3:
            h = h * 0.5
        return self.out(h)


class Scaled(nn.Module):
    """``.item()``: the input scaled by its largest entry as a Python number (vmap refuses it)."""

    def __init__(self, n_in: int, n_out: int, width: int = 8) -> None:
        super().__init__()
        self.hidden, self.out = nn.Linear(n_in, width), nn.Linear(width, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x / (1.0 + x.abs().max().item()))))


class Dropped(nn.Module):
    """Dropout: random numbers, which vmap refuses (randomness='error')."""

    def __init__(self, n_in: int, n_out: int, width: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_in, width), nn.ReLU(), nn.Dropout(0.3),
                                 nn.Linear(width, n_out))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class RandomFeatures(nn.Module):
    """A fixed random projection held in a plain attribute (not a registered buffer), then a
    trained read-out. vmap runs it without complaint, but the block's one module holds the first
    seed's projection, so every seed of the block would compute with it: silently other numbers."""

    def __init__(self, n_in: int, n_out: int, width: int = 16) -> None:
        super().__init__()
        self.projection = torch.randn(n_in, width)
        self.readout = nn.Linear(width, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.readout(torch.relu(x @ self.projection))


def _builder(cls: type[nn.Module]):
    return lambda meta, width=8: cls(meta["input_shape"][0], meta["num_classes"], width)


@pytest.fixture(scope="module", autouse=True)
def registered():
    """The three models as registered architectures (as a plugin registers them), removed after."""
    names = {"branchy": Branchy, "scaled": Scaled, "dropped": Dropped,
             "random_features": RandomFeatures}  # fmt: skip
    for name, cls in names.items():
        registry.register_architecture(registry.ArchSpec(
            name=name, builder=_builder(cls), defaults={"width": 8},
            input_kinds=frozenset({"vector"}), description=cls.__doc__.splitlines()[0],
        ))  # fmt: skip
    yield
    for name in names:
        model_registry.ARCHITECTURES.unregister(name)


@pytest.fixture(scope="module")
def parity() -> TaskData:
    return make_task_data("sparse_parity", {"n_bits": 10, "k": 2, "n_train": 100, "n_test": 64})


def infos(arch: str, seeds: list[int], data: TaskData) -> list[dict]:
    return [{"arch": arch, "seed": seed, "model_options": {}, "meta": data.meta} for seed in seeds]


def run_block(directory: Path, arch: str, seeds: list[int], data: TaskData, **kwargs):
    models = [build_cell_model(arch, "kaiming", seed, data.meta) for seed in seeds]
    paths = [TrainPaths.in_directory(directory / f"seed{seed}") for seed in seeds]
    summaries = train_block(models, data, CFG, seeds, paths, resume_path=directory / "r.pt",
                            progress=False, model_info=infos(arch, seeds, data), **kwargs)  # fmt: skip
    return summaries, paths


def run_alone(directory: Path, arch: str, seed: int, data: TaskData) -> TrainPaths:
    paths = TrainPaths.in_directory(directory)
    model = build_cell_model(arch, "kaiming", seed, data.meta)
    torch.manual_seed(12345)  # whatever the RNG holds before: a seed's run is its own
    train_model(model, data, CFG, seed, paths, progress=False,
                model_info=infos(arch, [seed], data)[0])  # fmt: skip
    return paths


def assert_same_files(a: TrainPaths, b: TrainPaths) -> None:
    for name in ("metrics", "model", "history", "summary"):
        assert getattr(a, name).read_bytes() == getattr(b, name).read_bytes(), name
    assert archive_bytes(a) == archive_bytes(b)


def archive_bytes(paths: TrainPaths) -> dict[str, bytes]:
    """The run's archived checkpoints, by file name."""
    return {p.name: p.read_bytes() for p in sorted(paths.archive.iterdir())}


@pytest.mark.parametrize(
    ("arch", "reason"),
    [
        ("branchy", r"RuntimeError: vmap: It looks like you're attempting to use a Tensor in some "
                    r"data-dependent control flow"),
        ("scaled", r"RuntimeError: vmap: It looks like you're calling \.item\(\) on a Tensor"),
        ("dropped", r"RuntimeError: vmap: called random operation while in randomness error mode"),
        ("random_features", r"evaluation logits of seed 1: the vectorised block's differ from the "
                            r"seed's own module's by up to"),
    ],
)  # fmt: skip
def test_an_unvectorisable_block_trains_its_seeds_alone(tmp_path, parity, arch, reason):
    seeds = [3, 4, 5]
    calls = []
    with pytest.warns(UnvectorisableWarning) as caught:
        summaries, paths = run_block(
            tmp_path / "block", arch, seeds, parity,
            on_checkpoint=lambda index, metrics, step: calls.append((index, step)),
        )  # fmt: skip
    (warning,) = caught
    message = str(warning.message)
    assert message.startswith(f"architecture {arch!r} cannot be vectorised over the seeds of block")
    assert re.search(rf"\({reason}", message), message
    assert "its 3 seeds train one at a time" in message
    assert sorted(calls) == [(i, s) for i in range(3) for s in (0, 10, 20, 30)]
    assert [s["seed_block"] for s in summaries] == [1, 1, 1]
    for seed, block_paths in zip(seeds, paths, strict=True):
        assert_same_files(block_paths, run_alone(tmp_path / f"alone{seed}", arch, seed, parity))
        assert not block_paths.resume.exists()
    assert not (tmp_path / "block" / "r.pt").exists()


def test_random_features_would_silently_share_the_first_seeds_projection(parity):
    """Why the trial compares numbers: vmap runs RandomFeatures, with the wrong numbers."""
    models = [build_cell_model("random_features", "kaiming", s, parity.meta) for s in (0, 1)]
    block = SeedBlock(models)
    inputs = parity.x_train[:8]
    with torch.no_grad():
        vectorised = block.forward_shared(inputs)
        assert torch.allclose(vectorised[0], models[0](inputs), atol=1e-6)
        assert not torch.allclose(vectorised[1], models[1](inputs), atol=1e-2)


def test_writing_into_the_inputs_is_found():
    """An in-place write of a seed's parameter into the (shared) evaluation inputs."""

    class Gained(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gain, self.out = nn.Parameter(torch.randn(10)), nn.Linear(10, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(x.mul_(self.gain))

    problem = vectorisation_problem(SeedBlock([Gained(), Gained()]), torch.randn(2, 4, 10))
    assert problem.startswith("RuntimeError: vmap: inplace arithmetic(self, *extra_args) is not "
                              "possible")  # fmt: skip


def test_a_vectorisable_block_gives_no_warning(tmp_path, parity):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnvectorisableWarning)
        summaries, _ = run_block(tmp_path, "mlp", [0, 1, 2], parity)
    assert [s["seed_block"] for s in summaries] == [3, 3, 3]


@pytest.mark.parametrize("arch", ["vgg_bn", "branchy"])
def test_the_trial_leaves_no_trace(arch):
    """Parameters, BatchNorm buffers (running statistics, num_batches_tracked), gradients, the
    module's mode and the RNG are as before the trial, whether it passes or not."""
    if arch == "vgg_bn":
        data, options = make_task_data("digits", {}), {"widths": [4, 8], "convs_per_stage": [1, 1]}
    else:
        data, options = make_task_data("sparse_parity", {"n_bits": 10, "n_train": 64}), {}
    models = [build_cell_model(arch, "kaiming", seed, data.meta, options) for seed in (0, 1, 2)]
    block = SeedBlock(models)
    before = {name: tensor.clone() for name, tensor in block.tensors.items()}
    module, rng = block.module, torch.get_rng_state()
    problem = vectorisation_problem(block, _first_batches(data, CFG, [0, 1, 2]))
    assert (problem is None) == (arch == "vgg_bn"), problem
    assert block.module is module and block.training
    assert torch.equal(torch.get_rng_state(), rng)
    for name, tensor in block.tensors.items():
        assert torch.equal(tensor, before[name]), name
        assert tensor.grad is None
    assert any("num_batches_tracked" in name for name in before) == (arch == "vgg_bn")


def test_hooks_of_a_whole_block_refuse_an_unvectorisable_one(tmp_path, parity):
    class BlockHooks(TrainHooks):
        """Hooks that could hold per-seed state of the whole block."""

    with pytest.raises(ValueError, match=r"architecture 'branchy' cannot be vectorised .* and the "
                                         r"method's training hooks \(BlockHooks\) train a block "
                                         r"only as a whole; train its seeds one per job "
                                         r"\(train.<task>.seed_block: 1\)"):  # fmt: skip
        run_block(tmp_path, "branchy", [0, 1], parity, hooks=BlockHooks())
    assert not list(tmp_path.rglob("*.pt")), "refused before anything was written"


def test_sparse_retraining_refuses_an_unvectorisable_block(tmp_path, parity):
    """AST retraining (a teacher block, per-seed flip histories) is refused with a clear error,
    never trained with wrong numbers."""
    teachers = [build_cell_model("branchy", "kaiming", seed, parity.meta) for seed in (0, 1)]
    options = {"mask": "magnitude", "retrain": True, "frozen_mask": False, "decay": "annealed",
               "distill": True, "slorb": False}  # fmt: skip
    settings = {"dense_layers": "none", "train": {"steps": 4, "checkpoint_every": 2}}
    with pytest.raises(ValueError, match=r"cannot be vectorised .*\(SparseHooks\)"):
        run_sparse_block(teachers, parity, options, settings, [0, 1],
                         [tmp_path / "seed0", tmp_path / "seed1"], resume_path=tmp_path / "r.pt",
                         model_info=infos("branchy", [0, 1], parity))  # fmt: skip


def test_a_killed_unvectorisable_block_resumes_seed_by_seed(tmp_path, parity):
    """Each seed trained apart keeps its resume file in its own directory: a rerun after a crash
    in seed 4's run finishes it from there, with the files of an uninterrupted run."""
    seeds = [3, 4]
    with pytest.warns(UnvectorisableWarning):
        _, reference = run_block(tmp_path / "reference", "branchy", seeds, parity)

    def crash(index: int, metrics: dict, step: int) -> None:
        if (index, step) == (1, 30):
            raise RuntimeError("killed")

    with pytest.warns(UnvectorisableWarning), pytest.raises(RuntimeError, match="killed"):
        run_block(tmp_path / "block", "branchy", seeds, parity, on_checkpoint=crash)
    paths = [TrainPaths.in_directory(tmp_path / "block" / f"seed{seed}") for seed in seeds]
    assert torch.load(paths[1].resume, weights_only=True)["step"] == 20
    with pytest.warns(UnvectorisableWarning):
        summaries, resumed = run_block(tmp_path / "block", "branchy", seeds, parity)
    assert [s["resumed_from_step"] for s in summaries] == [None, 20]
    for a, b in zip(reference, resumed, strict=True):
        for name in ("metrics", "model", "history"):
            assert getattr(a, name).read_bytes() == getattr(b, name).read_bytes(), name
        assert archive_bytes(a) == archive_bytes(b)
        assert not b.resume.exists()
