"""What the plan knows of a model and its data set before anything runs: a model's parameter
and state counts, bytes, forward FLOPs and autograd-saved activations per example
(:class:`ModelProfile`), and a data kind's example counts and bytes, without the data.

Models are built once per (task, arch, options) on the CPU (:func:`model_profile`, cached): a dry
run of the workflow pays that once per architecture, never per job. With a profile directory set
(:func:`set_profile_directory`: the Snakefile sets ``.snakemake/trainmap/profiles``), a profile is
also kept on disk and read back by every later Snakemake process of the project (each dry run,
each cluster job's own parse), so only the first one builds the model; the file's name is a hash of
everything the profile is made from (see :func:`_disk_key`)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainmap import data as data_module
from trainmap import grid
from trainmap.models import build_model

# --- a model's sizes, FLOPs and activations (once per task, arch and options) -------------------


@dataclass(frozen=True)
class ModelProfile:
    """What the plan needs of one (task, arch): counts, bytes and FLOPs per example.

    ``n_params``: trainable parameters; ``n_state``: floating-point numel of the state dict
    (buffers included); ``int_state_bytes``: its integer buffers' bytes (BatchNorm's counters);
    ``state_bytes``: its bytes as stored (fp32); ``forward_flops``: forward FLOPs per example
    (FlopCounterMode, batch 2 minus batch 1); ``saved_bytes``: autograd-saved activation bytes per
    example (parameters excluded); ``widest_bytes``: the largest module output per example;
    ``svd_flops``: 4 m n min(m, n) summed over every 2-D and conv weight (as (out, in*k*k));
    ``input_bytes``: one example's input; ``linear_only``: no conv layer (MLP, transformer);
    ``n_tensors``: trainable parameter tensors; ``n_matrices``: 2-D and conv weights.
    """

    n_params: int
    n_state: int
    int_state_bytes: int
    state_bytes: int
    forward_flops: float
    saved_bytes: float
    widest_bytes: float
    svd_flops: float
    input_bytes: int
    linear_only: bool
    n_tensors: int = 0
    n_matrices: int = 0


def _example_batch(meta: Mapping[str, Any], size: int) -> torch.Tensor:
    shape = (size, *meta["input_shape"])
    if meta["input_kind"] == "tokens":
        return torch.randint(0, int(meta.get("vocab_size", 2)), shape)
    return torch.randn(shape)


def _forward_flops(model: nn.Module, x: torch.Tensor) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x)
    return float(counter.get_total_flops())


def _saved_and_widest(model: nn.Module, x: torch.Tensor) -> tuple[float, float]:
    """Bytes autograd saves for backward (parameters excluded) and the largest leaf output."""
    params = {p.data_ptr() for p in model.parameters()} | {b.data_ptr() for b in model.buffers()}
    saved: dict[tuple[int, tuple[int, ...]], int] = {}
    widest = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.data_ptr() not in params:
            saved[(tensor.data_ptr(), tuple(tensor.shape))] = tensor.numel() * tensor.element_size()
        return tensor

    def record(_module: nn.Module, _inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            widest[0] = max(widest[0], output.numel() * output.element_size())

    handles = [m.register_forward_hook(record) for m in model.modules() if not list(m.children())]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(x).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    return float(sum(saved.values())), float(widest[0])


#: Where profiles are kept between processes (:func:`set_profile_directory`); None: not kept.
_PROFILE_DIRECTORY: list[Path | None] = [None]
#: The packages whose code builds a built-in model: a new version of any of them is a new profile.
_BUILDING_PACKAGES = ("torch", "torchvision", "transformers")


def set_profile_directory(directory: str | os.PathLike | None) -> None:
    """Keep model profiles as JSON files in ``directory`` (None: in this process only)."""
    _PROFILE_DIRECTORY[0] = None if directory is None else Path(directory)


@functools.cache
def _code_digest() -> str:
    """A hash of trainmap's own source files and the versions of the packages that build models:
    a profile kept on disk is read back only by the code that made it."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    for name in _BUILDING_PACKAGES:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "-"
        digest.update(f"{name}={version}\0".encode())
    return digest.hexdigest()


def _disk_key(task_data_json: str, arch: str, options_json: str) -> str | None:
    """The file name of a profile on disk: a hash of the code (:func:`_code_digest`), the settings,
    and the size and modification time of each data file or folder they name; None when it is
    not kept there: an architecture or data kind that a plugin registered (its code is not part
    of the hash)."""
    from trainmap.data.registry import DATA_KINDS
    from trainmap.models.registry import ARCHITECTURES

    data = json.loads(task_data_json)
    for source in (ARCHITECTURES.source_of(arch), DATA_KINDS.source_of(data["kind"])):
        if not source.startswith("trainmap."):
            return None
    # A data file or folder the settings name (arrays, image_folder) is read for the model's
    # input shape and classes: its size and modification time are part of the key.
    stamps = []
    for key, value in sorted(data.items()):
        path = Path(value).expanduser() if isinstance(value, str) and value else None
        if path is not None and path.exists():
            info = path.stat()
            stamps.append([key, info.st_size, info.st_mtime_ns])
    key = json.dumps([_code_digest(), task_data_json, arch, options_json, stamps])
    return hashlib.sha256(key.encode()).hexdigest()[:32] + ".json"


def _read_kept(path: Path) -> ModelProfile | None:
    try:
        return ModelProfile(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):  # missing, half-written by a crash, another layout
        return None


def _keep(path: Path, profile: ModelProfile) -> None:
    """Write ``profile`` to ``path`` whole or not at all (processes may write it at once); a
    directory that cannot be written keeps nothing."""
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(dataclasses.asdict(profile)))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


@functools.cache
def _profile(task_data_json: str, arch: str, options_json: str) -> ModelProfile:
    directory = _PROFILE_DIRECTORY[0]
    name = None if directory is None else _disk_key(task_data_json, arch, options_json)
    if name is not None:
        kept = _read_kept(directory / name)
        if kept is not None:
            return kept
    profile = _measure(task_data_json, arch, options_json)
    if name is not None:
        _keep(directory / name, profile)
    return profile


def _measure(task_data_json: str, arch: str, options_json: str) -> ModelProfile:
    """Build the model on the CPU and measure its :class:`ModelProfile`."""
    data_options = json.loads(task_data_json)
    kind = data_options.pop("kind")
    meta = data_module.model_meta(kind, data_options)
    torch.manual_seed(0)
    model = build_model(arch, meta, **json.loads(options_json))
    model.train()
    state = model.state_dict()
    flops = [_forward_flops(model, _example_batch(meta, size)) for size in (2, 4)]
    saved = [_saved_and_widest(model, _example_batch(meta, size)) for size in (2, 4)]
    svd_flops, n_matrices = 0.0, 0
    for tensor in state.values():
        if tensor.dim() in (2, 4) and tensor.is_floating_point():
            m, n = tensor.shape[0], tensor[0].numel()
            svd_flops += 4.0 * m * n * min(m, n)
            n_matrices += 1
    x = _example_batch(meta, 1)
    return ModelProfile(
        n_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        n_state=sum(t.numel() for t in state.values() if t.is_floating_point()),
        int_state_bytes=sum(
            t.numel() * t.element_size() for t in state.values() if not t.is_floating_point()
        ),
        state_bytes=sum(t.numel() * t.element_size() for t in state.values()),
        forward_flops=max(flops[1] - flops[0], 0.0) / 2,
        saved_bytes=max(saved[1][0] - saved[0][0], 0.0) / 2,
        widest_bytes=saved[1][1] / 4,
        svd_flops=svd_flops,
        input_bytes=x.numel() * x.element_size(),
        linear_only=not any(isinstance(m, nn.Conv2d) for m in model.modules()),
        n_tensors=sum(1 for p in model.parameters() if p.requires_grad),
        n_matrices=n_matrices,
    )


def model_profile(config: Mapping[str, Any], task: str, arch: str) -> ModelProfile:
    """The :class:`ModelProfile` of ``arch`` on ``task`` as the config builds it (data meta from
    ``data.<task>`` without the data, ``model.<task>.<arch>``); built once per process and
    settings."""
    return _profile(
        json.dumps(grid.data_settings(config, task), sort_keys=True),
        arch,
        json.dumps(grid.model_settings(config, task, arch), sort_keys=True),
    )


def dataset_examples(kind: str, options: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(n_train, n_test)`` of a data kind with ``options``, known without the data (an
    ``image_folder``'s: counted from its listing); None when only the data knows (``arrays``, a
    plugin's kind)."""
    options = {**data_module.data_kind_options(kind), **options}
    if kind == "image_folder":  # a folder not there yet (planned from num_classes): unknown
        if not Path(options["path"]).is_dir():
            return None
        return _image_folder_sizes(str(options["path"]), options["n_train"])
    if kind == "sparse_parity":
        return int(options["n_train"]), int(options["n_test"])
    if kind == "modular_addition":
        pairs = int(options["p"]) ** 2
        n_train = int(pairs * float(options["train_frac"]))
        return n_train, pairs - n_train
    if kind == "digits":
        n_test = math.ceil(1797 * float(options["test_frac"]))
        return 1797 - n_test, n_test
    if kind == "mnist_5k":
        return data_module.mnist_5k_split_sizes(float(options["test_frac"]))
    if kind == "mnist1d":
        return data_module.mnist1d_split_sizes(
            int(options["num_samples"]), float(options["train_split"])
        )
    if kind == "mnist":
        return 60000, 10000
    if kind in ("cifar10", "cifar100"):
        return 50000, 10000
    return None


def dataset_bytes(config: Mapping[str, Any], task: str, profile: ModelProfile) -> tuple[float, int]:
    """The task's data set in bytes (inputs as the model takes them, an ``image_folder``'s as its
    uint8 cache; int64 labels) and its test examples; a kind whose size only its data knows counts
    as 60000 + 10000 examples."""
    options = dict(grid.data_settings(config, task))
    kind = options.pop("kind")
    n_train, n_test = dataset_examples(kind, options) or (60000, 10000)
    input_bytes = profile.input_bytes
    if kind == "image_folder":  # its uint8 cache (data.image_folder_cache_bytes): 3 x size^2
        input_bytes = 3 * int(options.get("size", data_module.data_kind_options(kind)["size"])) ** 2
    return (n_train + n_test) * (input_bytes + 8), n_test


@functools.cache
def _image_folder_sizes(path: str, n_train: int | None) -> tuple[int, int]:
    # Listed once per process: every block job's estimate asks again, and a folder may be large.
    return data_module.image_folder_sizes(path, n_train)
