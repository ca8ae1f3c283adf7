"""External runs: the 14 metrics of checkpoints trainmap did not train.

An external run is one directory of checkpoints named by step with its evaluation curve, or the
output directory of a Hugging Face Trainer or of Lightning, read as it is; the files each layout
holds, and how they are read, are :mod:`trainmap.dynamics.runs.layouts`
(:func:`read_external_run` reads any of them).

A run's own hyperparameters (``hparams.yaml``, ``config.json``, ``trainer_state.json``:
:func:`run_hyperparameters`) group runs on the command line (``--group-by lr``).

:func:`external_run_metrics` gives the run's metric table in the format of
:func:`trainmap.dynamics.metrics.weights.collect_run_metrics`, so everything after it (maps, regressions,
joint comparisons, also together with trainmap's own runs) reads external and own runs alike. The
counted matrices come from the state dict alone (:func:`trainmap.dynamics.metrics.weights.state_dict_layout`:
names and shapes; attention heads split when ``heads`` is given; under ``paper`` a residual
block's 1x1 ``shortcut``/``downsample`` conv left out, as the authors' ResNet walker does; a
GPT-NeoX, Llama-style or BERT checkpoint by its family's names,
:func:`trainmap.dynamics.runs.families.checkpoint_layout`), or
from a model of a registered architecture (a plugin's) when exact conventions matter. A damaged or
inconsistent run raises :class:`ExternalRunError` naming the file and the fix, before any metric
is written.

Command line: ``python -m trainmap.dynamics.runs.external RUN_DIR... --out DIR --threshold T`` writes
``DIR/metrics/<run>/metrics.csv`` and fits the map into ``DIR`` (``--help``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from trainmap.dynamics.metrics.weights import (
    WeightLayout,
    collect_run_metrics,
    layout_of_model,
)
from trainmap.dynamics.runs.families import checkpoint_layout
from trainmap.dynamics.runs.layouts import (
    DEFAULT_CURVE,
    HF_CHECKPOINT_DIR,
    HF_WEIGHTS,
    LIGHTNING_CHECKPOINTS,
    LIGHTNING_METRICS,
    LIGHTNING_SUFFIX,
    ExternalRunError,
    checkpoint_shapes,
    find_checkpoints,
    hf_checkpoints,
    hf_evaluation,
    is_hf_run,
    is_lightning_run,
    lightning_checkpoints,
    lightning_evaluation,
    load_state_dict_file,
    read_evaluation,
    run_layouts,
)
from trainmap.dynamics.runs.names import (
    CHECKPOINT_SUFFIXES,
    EVALUATION_FILE,
    HF_ACCURACY_KEY,
    HF_STATE,
    HYPERPARAMETER_FILES,
    LIGHTNING_ACCURACY_KEY,
)

#: At most this many checkpoints' metrics are computed in one batch ...
CHUNK = 32
#: ... and at most this many bytes of counted weights held at once (:func:`chunk_size`): a large
#: checkpoint (a language model's, hundreds of MB) is measured one at a time, so peak memory is
#: about one checkpoint's counted weights plus a constant, whatever the model.
CHUNK_BYTES = 256 * 2**20


@dataclass(frozen=True)
class ExternalRun:
    """One run directory: its checkpoint files by step and its evaluation curve."""

    directory: Path
    checkpoints: dict[int, Path]
    evaluation: pd.DataFrame


def check_run_shapes(run: ExternalRun) -> None:
    """Every checkpoint of ``run`` readable, holding the same tensors as its first one."""
    first_step, first_path = next(iter(run.checkpoints.items()))
    reference = checkpoint_shapes(first_path)
    for step, path in run.checkpoints.items():
        _check_same_shapes(path, step, checkpoint_shapes(path), first_path, first_step, reference)


def _check_same_shapes(
    path: Path, step: int, shapes: dict, first_path: Path, first_step: int, reference: dict
) -> None:
    differ = _differing_entries(shapes, reference)
    if not differ:
        return
    key = differ[0]
    raise ExternalRunError(
        f"{path}: entry {key} has shape {shapes.get(key, 'absent')} at step {step} but "
        f"{reference.get(key, 'absent')} at step {first_step} ({first_path.name}); every "
        "checkpoint of a run must hold the same tensors (one architecture per run)"
    )


def _differing_entries(shapes: Mapping[str, tuple], reference: Mapping[str, tuple]) -> list[str]:
    """The entries one of two state-dict shape maps lacks, else those whose shapes differ."""
    return sorted(set(shapes) ^ set(reference)) or sorted(
        key for key in shapes if shapes[key] != reference[key]
    )


def run_hyperparameters(directory: Path) -> dict[str, str]:
    """A run's own hyperparameters, flat (``optimizer.lr``; a nested key also under its last
    part, ``lr``, when that is unambiguous): :data:`HYPERPARAMETER_FILES` in ``directory`` and,
    for those it lacks, its parent (a sweep's folder per setting)."""
    import yaml

    values: dict[str, str] = {}
    for folder in (directory, directory.parent):
        for name in HYPERPARAMETER_FILES:
            path = folder / name
            if not path.is_file():
                continue
            try:
                loaded = (yaml.safe_load(path.read_text()) if path.suffix == ".yaml"
                          else json.loads(path.read_text()))  # fmt: skip
            except (OSError, ValueError, yaml.YAMLError) as error:
                raise ExternalRunError(f"{path}: not readable ({type(error).__name__})") from None
            for key, value in _flat(loaded if isinstance(loaded, Mapping) else {}).items():
                values.setdefault(key, value)
    short: dict[str, set[str]] = {}
    for key, value in values.items():
        short.setdefault(key.rsplit(".", 1)[-1], set()).add(value)
    for key, found in short.items():
        if key not in values and len(found) == 1:
            values[key] = next(iter(found))
    return values


def _flat(mapping: Mapping, prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            flat |= _flat(value, f"{prefix}{key}.")
        elif not isinstance(value, list):  # log_history and the like are no hyperparameters
            flat[f"{prefix}{key}"] = str(value)
    return flat


def run_files(directory: str | Path, evaluation_file: str = EVALUATION_FILE) -> list[Path]:
    """Every file a run is read from (a changed one reruns its metrics): its checkpoint files and
    evaluation curve, or a Hugging Face run's weights and ``trainer_state.json`` files."""
    directory = Path(directory)
    if is_lightning_run(directory):
        checkpoints = directory / LIGHTNING_CHECKPOINTS
        files = [p for p in checkpoints.iterdir() if p.suffix == LIGHTNING_SUFFIX]
        return sorted(files + [p for p in [directory / LIGHTNING_METRICS] if p.is_file()])
    if is_hf_run(directory):
        folders = [c for c in directory.iterdir() if HF_CHECKPOINT_DIR.match(c.name) and c.is_dir()]
        files = [f for folder in folders for f in folder.iterdir()
                 if f.name in (*HF_WEIGHTS, HF_STATE)]  # fmt: skip
        return sorted(files + [p for p in [directory / HF_STATE] if p.is_file()])
    return sorted(p for p in directory.iterdir()
                  if p.suffix in CHECKPOINT_SUFFIXES or p.name == evaluation_file)  # fmt: skip


def read_external_run(
    directory: str | Path,
    evaluation_file: str = EVALUATION_FILE,
    accuracy_key: str | None = None,
    curve: str | None = DEFAULT_CURVE,
) -> ExternalRun:
    """One external run directory, its checkpoints found and its evaluation curve checked. A
    trainmap run's checkpoint archive (``<run>/checkpoints``, trainmap.training.archive) reads
    as one: without an ``evaluation.csv`` of its own, its run's ``history.csv`` is the curve. A
    Hugging Face Trainer output directory (:func:`is_hf_run`) reads as it is: its
    ``checkpoint-<step>/`` folders, and its accuracy under ``accuracy_key`` (default
    :data:`HF_ACCURACY_KEY`) in ``trainer_state.json``. So does a Lightning run
    (:func:`is_lightning_run`, without an ``evaluation.csv`` of its own): ``checkpoints/*.ckpt``
    and the column ``accuracy_key`` (default :data:`LIGHTNING_ACCURACY_KEY`) of its
    ``metrics.csv``. ``curve``: the column an ``evaluation.csv`` must hold (``test_acc``, or
    ``test_loss`` for a curve that falls); None: a run needs no curve (a map without convergence),
    and one without an evaluation file has none (:func:`no_curve`)."""
    directory = Path(directory)
    layouts = run_layouts(directory)
    if len(layouts) > 1:
        raise ExternalRunError(f"{directory}: holds runs in {' and '.join(layouts)} layouts at "
                               "once; keep one run per directory (move the other checkpoints "
                               "into a directory of their own)")  # fmt: skip
    if is_lightning_run(directory) and not (directory / evaluation_file).is_file():
        checkpoints = lightning_checkpoints(directory)
        evaluation = lightning_evaluation(directory, list(checkpoints),
                                          accuracy_key or LIGHTNING_ACCURACY_KEY)  # fmt: skip
        return ExternalRun(directory, checkpoints, evaluation)
    if is_hf_run(directory):
        checkpoints = hf_checkpoints(directory)
        evaluation = hf_evaluation(directory, list(checkpoints), accuracy_key or HF_ACCURACY_KEY)
        return ExternalRun(directory, checkpoints, evaluation)
    checkpoints = find_checkpoints(directory)
    evaluation_path = directory / evaluation_file
    history = directory.parent / "history.csv"
    if not evaluation_path.exists() and directory.name == "checkpoints" and history.is_file():
        evaluation_path = history  # a trainmap run's archive: its history is the curve
    if curve is None and not evaluation_path.exists():
        return ExternalRun(directory, checkpoints, no_curve(list(checkpoints)))
    evaluation = read_evaluation(evaluation_path, list(checkpoints), curve)
    return ExternalRun(directory, checkpoints, evaluation)


def no_curve(steps: list[int]) -> pd.DataFrame:
    """The evaluation record of a run without a curve: its checkpoint steps alone (its metric
    table's history columns are then NaN)."""
    return pd.DataFrame({"step": steps})


def run_layout(
    shapes: Mapping[str, tuple[int, ...]], path: Path, convention: str, heads: int | None,
    model: nn.Module | None,
) -> WeightLayout:  # fmt: skip
    """The counted matrices of a run whose checkpoints hold ``shapes`` (its first one, ``path``):
    from ``model`` (a registered architecture) when given, else from the names and shapes."""
    if model is None:
        try:
            return checkpoint_layout(shapes, convention, heads)
        except ValueError as error:
            raise ExternalRunError(f"{path}: {error}") from None
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if v.is_floating_point()}
    differ = _differing_entries(expected, shapes)
    if differ:
        raise ExternalRunError(
            f"{path}: the state dict does not fit the given architecture: entries "
            f"{differ[:5]} differ in name or shape; give the architecture and options the run "
            "was trained with, or leave them out to read the state dict by name and shape"
        )
    return layout_of_model(model, convention)


def stacked_states(
    run: ExternalRun,
    steps: list[int],
    reference: Mapping[str, tuple[int, ...]],
    keep: set[str] | None = None,
) -> dict[str, torch.Tensor]:
    """The state dicts of ``steps`` stacked ``[n, *shape]``, each checked to hold the tensors of
    ``reference`` (the shapes of the run's first checkpoint); ``keep``: only these entries are
    kept once a checkpoint is checked (the counted ones), the rest freed at once. One checkpoint
    is returned as views of its own tensors (no stacked copy)."""
    first_step, first_path = next(iter(run.checkpoints.items()))
    names = [key for key in reference if keep is None or key in keep]
    states = []
    for step in steps:
        path = run.checkpoints[step]
        state = load_state_dict_file(path)
        shapes = {k: tuple(v.shape) for k, v in state.items()}
        _check_same_shapes(path, step, shapes, first_path, first_step, reference)
        # float64 once per entry (the metrics' precision): every head slice of a fused matrix is
        # then a view of the one copy, not a float64 copy of the whole matrix each
        states.append({key: state[key].to(torch.float64) for key in names})
        del state
    if len(states) == 1:
        return {key: value.unsqueeze(0) for key, value in states[0].items()}
    return {key: torch.stack([state[key] for state in states]) for key in names}


def counted_entries(layout: WeightLayout) -> set[str]:
    """The state entries ``layout``'s metrics read: its matrices and biases."""
    return {matrix.name for matrix in layout.matrices} | set(layout.biases)


def chunk_size(counted_bytes: int) -> int:
    """How many checkpoints to measure together: :data:`CHUNK`, or fewer so that their counted
    weights stay within :data:`CHUNK_BYTES` (at least one)."""
    return max(1, min(CHUNK, CHUNK_BYTES // max(1, counted_bytes)))


def external_run_metrics(
    run: ExternalRun, convention: str = "paper", heads: int | None = None,
    model: nn.Module | None = None, bounded: bool | None = None,
) -> pd.DataFrame:  # fmt: skip
    """The run's metric table (``collect_run_metrics``'s format), :func:`chunk_size` checkpoints
    at a time (each checkpoint's metrics depend on that checkpoint alone), only the counted
    entries of each kept in memory. A checkpoint whose counted entries in float64 exceed
    :data:`CHUNK_BYTES` (a language model's) is measured entry by entry instead
    (:func:`trainmap.dynamics.runs.bounded.bounded_checkpoint_metrics`: peak memory about its counted
    weights in their own dtype; the same numbers within 1e-12); ``bounded`` forces either way."""
    steps = list(run.checkpoints)
    first_path = run.checkpoints[steps[0]]
    reference = checkpoint_shapes(first_path)
    layout = run_layout(reference, first_path, convention, heads, model)
    if not layout.matrices:
        raise ExternalRunError(f"{first_path}: no 2-D or 4-D weight to compute metrics on (left "
                               f"out: {layout.ignored})")  # fmt: skip
    keep = counted_entries(layout)
    if bounded is None:
        bounded = 8 * sum(math.prod(reference[name]) for name in keep) > CHUNK_BYTES
    if bounded:
        return _bounded_run_metrics(run, steps, reference, layout, convention)
    first = stacked_states(run, steps[:1], reference, keep)  # measured first: it sizes the chunks
    size = chunk_size(sum(t.numel() * t.element_size() for t in first.values()))
    trajectory = {"step": torch.tensor(steps[:1]), "state": first}
    tables = [collect_run_metrics(trajectory, layout, run.evaluation, convention)]
    del first, trajectory
    for start in range(1, len(steps), size):
        chunk = steps[start : start + size]
        state = stacked_states(run, chunk, reference, keep)
        trajectory = {"step": torch.tensor(chunk), "state": state}
        tables.append(collect_run_metrics(trajectory, layout, run.evaluation, convention))
    return pd.concat(tables, ignore_index=True)


def _bounded_run_metrics(
    run: ExternalRun, steps: list[int], reference: Mapping[str, tuple[int, ...]],
    layout: WeightLayout, convention: str,
) -> pd.DataFrame:  # fmt: skip
    """:func:`external_run_metrics` one checkpoint at a time, each entry by entry, every
    checkpoint's header checked against the first's first."""
    from trainmap.dynamics.runs.bounded import bounded_checkpoint_metrics

    first_step, first_path = steps[0], run.checkpoints[steps[0]]
    rows = []
    for step in steps:
        path = run.checkpoints[step]
        _check_same_shapes(path, step, checkpoint_shapes(path), first_path, first_step, reference)
        rows.append(bounded_checkpoint_metrics(path, step, layout, reference, run.evaluation,
                                               convention))  # fmt: skip
    return pd.concat(rows, ignore_index=True)
