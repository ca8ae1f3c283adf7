"""External runs on disk, per layout: their checkpoint files by step and their evaluation curves.

An external run is one directory holding

* one state dict per checkpoint, named by its step: ``<prefix><step>.pt`` / ``.pth`` (read with
  ``torch.load(weights_only=True)``; a dict of tensors, or one under ``state_dict``,
  ``model_state_dict`` or ``model``) or ``<prefix><step>.safetensors``, e.g. ``step_100.pt``,
  ``checkpoint-100.safetensors``, ``100.pt`` (the prefix holds letters, ``_`` and ``-`` only);
* its evaluation curve, ``evaluation.csv``: columns ``step`` and ``test_acc`` (convergence is the
  first checkpoint whose ``test_acc`` reaches the threshold), optionally ``train_loss``,
  ``train_acc``, ``test_loss``; one row per checkpoint step at least.

The output directories of the two most used training frameworks read as they are:

* **Hugging Face Trainer** (:func:`is_hf_run`): ``checkpoint-<step>/`` folders holding
  ``model.safetensors`` or ``pytorch_model.bin``; the accuracy is a key of ``trainer_state.json``'s
  ``log_history`` (default ``eval_accuracy``).
* **Lightning** (:func:`is_lightning_run`, a ``lightning_logs/version_<n>/`` folder):
  ``checkpoints/*.ckpt`` (the step from ``step=<n>`` in the name, else the file's
  ``global_step``; the weights under ``state_dict``, their names as the LightningModule holds
  them, e.g. ``model.0.weight``); the accuracy is a column of the CSVLogger's ``metrics.csv``
  (default ``val_acc``; the rows of other logging calls, blank there, are skipped).

A checkpoint saved in shards (``model.safetensors.index.json`` or ``pytorch_model.bin.index.json``
beside its shards, as ``save_pretrained`` writes a large model) is read through its index, merged
(:func:`load_state_dict_file`, :func:`checkpoint_shapes`).

A damaged or inconsistent file raises :class:`ExternalRunError` naming the file and the fix. Each
checkpoint's header (names and shapes of its tensors, Lightning's ``global_step``) is read without
its weights' values (:func:`checkpoint_header`); :func:`load_state_dict_file` reads the weights.
How a run's files make its metric table is :mod:`trainmap.dynamics.runs.external`.
"""

from __future__ import annotations

import functools
import json
import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from trainmap.dynamics.metrics.weights import HISTORY_COLUMNS
from trainmap.dynamics.runs.names import (
    CHECKPOINT_SUFFIXES,
    HF_STATE,
)
from trainmap.schema import defaults_at

#: The column of a run's curve that convergence reads when none is named: the config schema's
#: default of ``external[].curve``.
DEFAULT_CURVE: str = defaults_at("external")["curve"]

#: The Hugging Face Trainer layout: ``checkpoint-<step>/`` folders, each holding one of these.
HF_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
#: The Lightning layout (``lightning_logs/version_<n>/``): ``checkpoints/*.ckpt`` named
#: ``epoch=<e>-step=<step>.ckpt`` (else the file's ``global_step``), the CSVLogger's
#: ``metrics.csv`` (a ``step`` column, one row per logging call, other columns blank) and
#: ``hparams.yaml``.
LIGHTNING_CHECKPOINTS = "checkpoints"
LIGHTNING_SUFFIX = ".ckpt"
LIGHTNING_METRICS = "metrics.csv"
LIGHTNING_STEP = re.compile(r"(?:^|[-_])step=(\d+)(?:-v\d+)?$")
#: A checkpoint's file stem: a prefix of letters, ``_`` and ``-``, then the step.
STEP_NAME = re.compile(r"^[A-Za-z_\-]*?(\d+)$")
#: Keys under which training scripts commonly nest a state dict in a ``.pt`` file.
NESTED_STATE_KEYS = ("state_dict", "model_state_dict", "model")
#: A checkpoint saved in shards (``save_pretrained`` of a large model) is named by its index, a
#: JSON file whose ``weight_map`` gives each tensor's shard file (beside the index).
SHARD_INDEX_SUFFIX = ".index.json"
#: The weights of a Hugging Face model folder (a Hub snapshot, ``save_pretrained``'s output), in
#: the order one is read where a folder holds several.
MODEL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")  # fmt: skip


class ExternalRunError(ValueError):
    """An external run trainmap cannot read; the message names the file and the fix."""


def step_of(path: Path) -> int:
    """The step a checkpoint file's name holds (``step_100.pt`` -> 100; Lightning's
    ``epoch=0-step=100.ckpt`` -> 100)."""
    stem = path.name.removesuffix(path.suffix)
    match = STEP_NAME.match(stem) or LIGHTNING_STEP.search(stem)
    if match is None:
        raise ExternalRunError(
            f"{path}: the file name holds no integer step; name each checkpoint "
            "<prefix><step><suffix> with a prefix of letters, '_' or '-', e.g. step_100.pt, "
            "checkpoint-100.safetensors or 100.pt, and move other checkpoints out of the run"
        )
    return int(match.group(1))


def find_checkpoints(directory: Path) -> dict[int, Path]:
    """Step -> checkpoint file of one run directory, in step order."""
    if not directory.is_dir():
        raise ExternalRunError(f"{directory}: not a directory; give one directory per run")
    files = sorted(p for p in directory.iterdir() if p.suffix in CHECKPOINT_SUFFIXES)
    if not files:
        raise ExternalRunError(
            f"{directory}: no checkpoints (files ending {', '.join(CHECKPOINT_SUFFIXES)}); an "
            "external run is a directory of state dicts named by step, e.g. step_100.pt"
        )
    checkpoints: dict[int, Path] = {}
    for path in files:
        step = step_of(path)
        if step in checkpoints:
            raise ExternalRunError(f"{path} and {checkpoints[step]} both hold step {step}; keep "
                                   "one checkpoint per step")  # fmt: skip
        checkpoints[step] = path
    return dict(sorted(checkpoints.items()))


def load_state_dict_file(path: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    """A checkpoint's floating-point tensors (``weights_only=True`` for ``.pt``/``.pth``/``.bin``).
    A sharded checkpoint, given as its index JSON or as a model folder (:func:`model_weights`),
    loads as one state dict merged from all its shards."""
    path = model_weights(path) if path.is_dir() else path
    if path.name.endswith(SHARD_INDEX_SUFFIX):
        merged: dict[str, object] = {}
        for shard in _existing_shards(path):
            state = _load(shard, mmap)
            merged |= state if isinstance(state, Mapping) else {}
        return _weights_of(path, merged)
    return _weights_of(path, _load(path, mmap))


def read_entries(path: Path, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """The floating-point entries ``names`` of the checkpoint at ``path``, one at a time, each its
    own copy: a safetensors file (or a sharded checkpoint's shard, by its index) opened for each
    entry and closed again, so no more than the entry being read is held; a torch file
    memory-mapped once (its pages read as touched; a legacy non-zip file loaded whole). Reads what
    :func:`load_state_dict_file` reads, entry by entry."""
    path = model_weights(path) if path.is_dir() else path
    if path.name.endswith(SHARD_INDEX_SUFFIX):
        _existing_shards(path)
        weight_map = json.loads(path.read_text())["weight_map"]
        where = {name: path.parent / weight_map[name] for name in names}
    elif path.suffix == ".safetensors":
        where = dict.fromkeys(names, path)
    else:
        try:
            state = _weights_of(path, _load(path, mmap=True))
        except ExternalRunError:  # a legacy (non-zip) torch.save file cannot be memory-mapped
            state = load_state_dict_file(path)
        for name in names:
            yield name, state[name].clone()
        return
    from safetensors import safe_open

    for name in names:
        try:
            with safe_open(where[name], framework="pt", device="cpu") as handle:
                tensor = handle.get_tensor(name)
        except Exception as error:  # noqa: BLE001 - every failure to read is one clear error
            raise _damaged(where[name], error) from None
        yield name, tensor


def model_weights(directory: Path) -> Path:
    """The weights file of a Hugging Face model folder: the first of :data:`MODEL_WEIGHTS` it
    holds; none is an :class:`ExternalRunError` naming the folder."""
    found = next((directory / name for name in MODEL_WEIGHTS if (directory / name).is_file()), None)
    if found is None:
        held = sorted(p.name for p in directory.iterdir())[:8]
        raise ExternalRunError(f"{directory}: a model folder without weights (none of "
                               f"{', '.join(MODEL_WEIGHTS)}; it holds {held or 'nothing'}); give "
                               "the folder save_pretrained wrote, or the weights file itself")  # fmt: skip
    return found


def index_shards(index: Path) -> list[Path]:
    """The shard files a sharded checkpoint's index JSON names in its ``weight_map`` (beside the
    index), in name order, whether or not they exist; a damaged index is an
    :class:`ExternalRunError` naming it."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except Exception as error:  # noqa: BLE001 - every failure to read is one clear error
        raise ExternalRunError(f"{index}: not a shard index ({type(error).__name__}: {error}); "
                               "an index is JSON with a weight_map of tensor -> shard file, as "
                               "save_pretrained writes it") from None  # fmt: skip
    if not names or not all(isinstance(name, str) and name for name in names):
        raise ExternalRunError(f"{index}: its weight_map names no shard files; restore the index "
                               "save_pretrained wrote")  # fmt: skip
    return [index.parent / name for name in names]


def _existing_shards(index: Path) -> list[Path]:
    """:func:`index_shards`, each of which must exist: a missing one is an error naming it."""
    shards = index_shards(index)
    missing = [shard.name for shard in shards if not shard.is_file()]
    if missing:
        raise ExternalRunError(f"{index}: shard(s) {', '.join(missing)} missing (of {len(shards)} "
                               "the index names); download or copy the whole checkpoint, every "
                               "shard beside its index")  # fmt: skip
    return shards


def _load(path: Path, mmap: bool = False) -> object:
    """What a checkpoint file holds: a safetensors file's tensors, a torch file loaded with
    ``weights_only=True`` (memory-mapped when ``mmap``: the pickled structure is read, the
    tensors' data only where touched)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(path, device="cpu")
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as error:  # noqa: BLE001 - every failure to read is one clear error
        raise _damaged(path, error) from None


def _weights_of(path: Path, state: object) -> dict[str, torch.Tensor]:
    """The floating-point tensors of a loaded checkpoint ``state`` (a state dict, or one nested
    under :data:`NESTED_STATE_KEYS`)."""
    if isinstance(state, Mapping):
        nested = [key for key in NESTED_STATE_KEYS if isinstance(state.get(key), Mapping)]
        state = state[nested[0]] if nested else state
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)} \
        if isinstance(state, Mapping) else {}  # fmt: skip
    weights = {k: v for k, v in tensors.items() if v.is_floating_point()}
    if not weights:
        raise ExternalRunError(
            f"{path}: holds no floating-point tensors (found {type(state).__name__}); save "
            "model.state_dict(), or a dict with it under 'state_dict'"
        )
    return weights


@dataclass(frozen=True)
class CheckpointHeader:
    """What a checkpoint says of itself without its weights' values: the name -> shape of its
    floating-point tensors and, for a Lightning ``.ckpt``, its ``global_step`` (else None)."""

    shapes: dict[str, tuple[int, ...]]
    global_step: int | None


def checkpoint_header(path: Path) -> CheckpointHeader:
    """The header of the checkpoint at ``path``, read once per process while the file is
    unchanged (size and modification time; the last :data:`HEADER_CACHE` files kept): a safetensors file's JSON header (its data's length
    checked against the file's), a ``.pt``/``.ckpt`` zip memory-mapped (the pickled structure,
    not the tensors' data), a legacy (non-zip) torch file whole. A damaged file raises
    :class:`ExternalRunError` naming it. The config check, the run's step check and its metric
    job all ask here, so each file's weights are read once, by the metric job. A sharded
    checkpoint (its index JSON, or a model folder: :func:`model_weights`) has the shapes of all
    its shards' headers; a missing shard is an error naming it."""
    path = model_weights(path) if path.is_dir() else path
    if path.name.endswith(SHARD_INDEX_SUFFIX):  # a sharded checkpoint: its shards' headers
        shards = [checkpoint_header(shard).shapes for shard in _existing_shards(path)]
        return CheckpointHeader({k: v for shapes in shards for k, v in shapes.items()}, None)
    try:
        stat = path.stat()
    except OSError as error:
        raise _damaged(path, error) from None
    return _header(path, stat.st_size, stat.st_mtime_ns)


#: Checkpoint headers kept per process: a run's files are asked for again only while that run
#: is read (step check, then shape check), so this bounds memory (about 1.7 kB an entry of 8
#: tensors: 7 MB) without a miss for runs of up to this many checkpoints.
HEADER_CACHE = 4096


@functools.lru_cache(maxsize=HEADER_CACHE)
def _header(path: Path, size: int, mtime_ns: int) -> CheckpointHeader:
    if path.suffix == ".safetensors":
        return CheckpointHeader(_safetensors_shapes(path), None)
    try:
        state = _load(path, mmap=True)
    except ExternalRunError:  # a legacy (non-zip) torch.save file cannot be memory-mapped
        state = _load(path)
    step = state.get("global_step") if isinstance(state, Mapping) else None
    shapes = {key: tuple(value.shape) for key, value in _weights_of(path, state).items()}
    return CheckpointHeader(shapes, step if isinstance(step, int) else None)


def checkpoint_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of a checkpoint's floating-point tensors, without reading their values where
    the format allows (:func:`checkpoint_header`): the cheap check of a run before any job."""
    return dict(checkpoint_header(path).shapes)


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The floating-point entries of a safetensors header (format: 8-byte little-endian header
    length, a JSON header of dtype, shape and data offsets, then the data)."""
    try:
        with path.open("rb") as handle:
            length = struct.unpack("<Q", handle.read(8))[0]
            header = json.loads(handle.read(length))
        header.pop("__metadata__", None)
        end = max((entry["data_offsets"][1] for entry in header.values()), default=0)
        if path.stat().st_size < 8 + length + end:
            raise ValueError(f"the file ends before its data ({path.stat().st_size} bytes)")
    except Exception as error:  # noqa: BLE001 - every failure to read is one clear error
        raise _damaged(path, error) from None
    return {key: tuple(entry["shape"]) for key, entry in header.items()
            if entry["dtype"].startswith(("F", "BF"))}  # fmt: skip


def _damaged(path: Path, error: Exception) -> ExternalRunError:
    first = str(error).splitlines()[0] if str(error) else ""
    refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
    if refused:  # a pickled object (a module, an optimizer, a custom class) beside the tensors
        return ExternalRunError(
            f"{path}: damaged or not a state dict: it holds a pickled {refused.group(1)}, which "
            "loading with weights_only=True refuses (unpickling it could run code); save tensors "
            "and plain containers only (model.state_dict(), or Lightning's save_weights_only=True)"
        )
    return ExternalRunError(
        f"{path}: damaged or not a state dict ({type(error).__name__}: {first}); replace the "
        "file, or move it out of the run directory"
    )


def _read_csv(path: Path, when_missing: str, when_unreadable: str) -> pd.DataFrame:
    """``path`` as a table; a missing or unreadable file is an :class:`ExternalRunError` naming
    it and the fix."""
    if not path.is_file():
        raise ExternalRunError(f"{path}: missing; {when_missing}")
    try:
        return pd.read_csv(path)
    except Exception as error:  # noqa: BLE001 - every failure to read is one clear error
        raise ExternalRunError(f"{path}: not a readable CSV ({type(error).__name__}); "
                               f"{when_unreadable}") from None  # fmt: skip


def _check_every_step(path: Path, curve: pd.DataFrame, steps: list[int], what: str,
                      fix: str) -> None:  # fmt: skip
    """An evaluation curve must cover every checkpoint step; else an error naming the file, the
    first missing steps and the fix (the plain, Hugging Face and Lightning readers' one check)."""
    absent = sorted(set(steps) - set(curve["step"]))
    if absent:
        raise ExternalRunError(f"{path}: {what} checkpoint step(s) {absent[:5]}; {fix}")


def read_evaluation(
    path: Path, steps: list[int], curve: str | None = DEFAULT_CURVE
) -> pd.DataFrame:
    """The run's evaluation curve: ``step``, ``curve`` (the column convergence reads: ``test_acc``,
    or ``test_loss`` for a language model's held-out loss; None: none required) and the optional
    history columns."""
    required = ("step", curve) if curve else ("step",)
    table = _read_csv(path, f"each run needs its evaluation curve, a CSV with columns "
                      f"{' and '.join(required)}", f"write it with columns {', '.join(required)}")  # fmt: skip
    missing = [column for column in required if column not in table]
    if missing:
        raise ExternalRunError(
            f"{path}: no column {' or '.join(missing)}; the evaluation curve "
            f"needs {' and '.join(required)} (it has {', '.join(table.columns)})"
        )
    for column in required:
        values = pd.to_numeric(table[column], errors="coerce")
        bad = table.index[~np.isfinite(values.to_numpy(dtype=float))]
        if len(bad):
            raise ExternalRunError(
                f"{path}: row {int(bad[0]) + 2} has {column} = "
                f"{table[column].iloc[bad[0]]!r}, not a finite number"
            )
        table[column] = values
    if not (table["step"] == table["step"].round()).all():
        raise ExternalRunError(f"{path}: a step is not an integer; steps are whole numbers")
    table["step"] = table["step"].astype(int)
    _check_every_step(path, table, steps, "has no row for",
                      "evaluate every checkpoint (a row per checkpoint step)")  # fmt: skip
    columns = ["step", *[c for c in HISTORY_COLUMNS if c in table]]
    return table[columns].drop_duplicates("step", keep="last")


def is_hf_run(directory: Path) -> bool:
    """Whether ``directory`` is a Hugging Face Trainer output directory: ``checkpoint-<step>/``
    folders holding ``model.safetensors`` or ``pytorch_model.bin``."""
    return directory.is_dir() and any(
        HF_CHECKPOINT_DIR.match(child.name) and any((child / w).is_file() for w in HF_WEIGHTS)
        for child in directory.iterdir()
    )


def hf_checkpoints(directory: Path) -> dict[int, Path]:
    """Step -> weights file of a Hugging Face Trainer run (its ``checkpoint-<step>/`` folders;
    ``model.safetensors`` where a folder holds both), in step order. A folder without weights,
    or whose ``trainer_state.json`` gives another ``global_step``, is an error naming it."""
    checkpoints = {}
    for child in sorted(directory.iterdir()):
        match = HF_CHECKPOINT_DIR.match(child.name)
        if not match or not child.is_dir():
            continue
        step = int(match.group(1))
        weights = next((child / w for w in HF_WEIGHTS if (child / w).is_file()), None)
        if weights is None:
            raise ExternalRunError(f"{child}: a checkpoint folder without {' or '.join(HF_WEIGHTS)}"
                                   "; save the model with the checkpoint or remove the folder")  # fmt: skip
        state = child / HF_STATE
        if state.is_file():
            recorded = _json(state).get("global_step")
            if recorded is not None and int(recorded) != step:
                raise ExternalRunError(f"{state}: global_step {recorded} but the folder says step "
                                       f"{step}; rename the folder or restore its state file")  # fmt: skip
        checkpoints[step] = weights
    return dict(sorted(checkpoints.items()))


def hf_evaluation(directory: Path, steps: list[int], accuracy_key: str) -> pd.DataFrame:
    """A Hugging Face run's evaluation curve from ``trainer_state.json``'s ``log_history``: the
    run's own file, else its last checkpoint's; ``step`` and ``test_acc`` (the value under
    ``accuracy_key``), ``test_loss`` from ``eval_loss`` where logged."""
    last = directory / f"checkpoint-{steps[-1]}" / HF_STATE
    path = directory / HF_STATE if (directory / HF_STATE).is_file() else last
    if not path.is_file():
        raise ExternalRunError(f"{directory}: no {HF_STATE} (nor in checkpoint-{steps[-1]}/); "
                               "the Trainer writes it with each checkpoint")  # fmt: skip
    history = _json(path).get("log_history", [])
    entries = [entry for entry in history if accuracy_key in entry]
    if not entries:
        keys = sorted({k for e in history for k in e} - {"step"})
        raise ExternalRunError(f"{path}: no log_history entry has {accuracy_key!r} (keys logged: "
                               f"{', '.join(keys[:8]) or 'none'}); name the accuracy key "
                               "(--accuracy-key) or evaluate at each checkpoint")  # fmt: skip
    table = pd.DataFrame({"step": [int(e["step"]) for e in entries],
                          "test_acc": [float(e[accuracy_key]) for e in entries],
                          "test_loss": [float(e.get("eval_loss", np.nan)) for e in entries]})  # fmt: skip
    _check_every_step(path, table, steps, f"{accuracy_key!r} is not logged at",
                      "evaluate at every checkpoint (eval_strategy and save_strategy at the same "
                      "steps)")  # fmt: skip
    if table["test_loss"].isna().all():
        table = table.drop(columns="test_loss")
    return table.drop_duplicates("step", keep="last").reset_index(drop=True)


def run_layouts(directory: Path) -> list[str]:
    """The layouts ``directory`` holds checkpoints in: ``plain`` (checkpoint files directly
    inside), ``Hugging Face`` (:func:`is_hf_run`), ``Lightning`` (:func:`is_lightning_run`)."""
    if not directory.is_dir():
        return []
    plain = any(p.suffix in CHECKPOINT_SUFFIXES and p.is_file() for p in directory.iterdir())
    return [name for name, found in (("plain", plain), ("Hugging Face", is_hf_run(directory)),
                                     ("Lightning", is_lightning_run(directory))) if found]  # fmt: skip


def is_lightning_run(directory: Path) -> bool:
    """Whether ``directory`` is a Lightning run (``lightning_logs/version_<n>/``): a
    ``checkpoints/`` folder holding ``.ckpt`` files."""
    folder = directory / LIGHTNING_CHECKPOINTS
    return folder.is_dir() and any(p.suffix == LIGHTNING_SUFFIX for p in folder.iterdir())


def lightning_checkpoints(directory: Path) -> dict[int, Path]:
    """Step -> ``.ckpt`` file of a Lightning run, in step order: the step from ``step=<n>`` in the
    name, which must be the file's ``global_step`` (else that; from its header,
    :func:`checkpoint_header`, without the weights). ``last.ckpt`` (ModelCheckpoint's
    ``save_last``) repeats a step already saved under its own name and is passed over; two other
    files of one step, or a name that disagrees with the file's ``global_step``, are an error
    naming the file."""
    checkpoints: dict[int, Path] = {}
    files = sorted(p for p in (directory / LIGHTNING_CHECKPOINTS).iterdir()
                   if p.suffix == LIGHTNING_SUFFIX)  # fmt: skip
    named = [p for p in files if LIGHTNING_STEP.search(p.stem)]
    for path in named + [p for p in files if p not in named]:  # the named ones first
        match = LIGHTNING_STEP.search(path.stem)
        recorded = _global_step(path)
        step = int(match.group(1)) if match else recorded
        if step != recorded:
            raise ExternalRunError(f"{path}: global_step {recorded} but the name says step {step}; "
                                   "rename the file or restore the checkpoint Lightning saved")  # fmt: skip
        if step in checkpoints:
            if match is None:
                continue  # e.g. last.ckpt, the same step as a named checkpoint
            raise ExternalRunError(f"{path} and {checkpoints[step]} both hold step {step}; keep "
                                   "one checkpoint per step")  # fmt: skip
        checkpoints[step] = path
    return dict(sorted(checkpoints.items()))


def _global_step(path: Path) -> int:
    """A Lightning checkpoint's ``global_step`` (:func:`checkpoint_header`)."""
    step = checkpoint_header(path).global_step
    if step is None:
        raise ExternalRunError(f"{path}: neither its name (step=<n>) nor the file (global_step) "
                               "gives its step; rename it epoch=<e>-step=<n>.ckpt")  # fmt: skip
    return step


def lightning_evaluation(directory: Path, steps: list[int], accuracy_key: str) -> pd.DataFrame:
    """A Lightning run's evaluation curve from the CSVLogger's ``metrics.csv``: the rows where
    ``accuracy_key`` is logged (the others, blank there, are other logging calls), ``step`` and
    ``test_acc`` (its value), ``test_loss`` from ``val_loss`` where logged. Lightning logs a
    validation one step before the checkpoint saved after it (``step=N``); when every checkpoint
    step's accuracy is at N - 1 and not at N, the curve is read one step on."""
    path = directory / LIGHTNING_METRICS
    table = _read_csv(path, "log with Lightning's CSVLogger (the default logger without "
                      "TensorBoard) or give an evaluation.csv", "restore the file Lightning wrote")  # fmt: skip
    if "step" not in table or accuracy_key not in table:
        shown = ", ".join(c for c in table.columns if c != "step") or "none"
        raise ExternalRunError(f"{path}: no column {'step' if 'step' not in table else repr(accuracy_key)} "
                               f"(columns logged: {shown}); name the accuracy column "
                               "(--accuracy-key, or accuracy_key in the config)")  # fmt: skip
    rows = table[pd.to_numeric(table[accuracy_key], errors="coerce").notna()]
    result = pd.DataFrame({"step": rows["step"].astype(int).to_numpy(),
                           "test_acc": rows[accuracy_key].astype(float).to_numpy()})  # fmt: skip
    if "val_loss" in rows:
        result["test_loss"] = pd.to_numeric(rows["val_loss"], errors="coerce").to_numpy()
    logged = set(result["step"])
    if not set(steps) <= logged and {step - 1 for step in steps} <= logged:
        # Lightning logs the validation after N optimizer steps at step N - 1 (measured with
        # lightning 2.6: val_check_interval=8 logs steps 7, 15, ...; the checkpoints are step=8,
        # step=16, ...): the curve moves one step on to meet the checkpoint saved there
        result["step"] += 1
    _check_every_step(path, result, steps, f"{accuracy_key!r} is not logged at",
                      "validate at every checkpoint (a checkpoint after each validation, e.g. "
                      "ModelCheckpoint(every_n_train_steps=N) with val_check_interval=N)")  # fmt: skip
    return result.drop_duplicates("step", keep="last").reset_index(drop=True)


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ExternalRunError(f"{path}: not readable JSON ({type(error).__name__}); restore the "
                               "file the Trainer wrote") from None  # fmt: skip
