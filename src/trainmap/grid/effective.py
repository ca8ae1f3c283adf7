"""One value per setting under DVC: the settings the grid's jobs read, and the params.yaml edits a
run must honour.

DVC records ``params.yaml`` (``dvc.lock``, ``dvc params diff``, ``dvc exp show``), but Snakemake
reads ``params.yaml``, then ``config/config.yaml``, then each ``--configfile`` (the grid file
``dvc.configfile``), a later file's value replacing an earlier one. ``dvc exp run -S key=value``
rewrites the workspace ``params.yaml`` before the stages run, so a key a config file also sets was
recorded at one value and trained at the other. The keys that differ between the workspace
``params.yaml`` and git's (the experiment's baseline commit, ``$DVC_EXP_BASELINE_REV``, else
``HEAD``) are the ones ``-S`` or a hand edit set for this run: :func:`check_params_edits` refuses
one a later config file overrides, or one no job reads, before any job starts.
:func:`effective_settings` is what the jobs do read; rule ``effective_settings`` writes it where
DVC reads metrics (``results/summary/settings.json``), so ``dvc exp show`` shows what was trained.
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from trainmap.errors import ConfigError, key_path
from trainmap.grid.cells import (
    analysis_settings,
    canonical,
    data_settings,
    evaluate_settings,
    expand_grid,
    method_of,
    model_settings,
    stage_settings,
    without_off_keys,
)
from trainmap.grid.files import YAML_LOADER, read_config_file

#: DVC sets these for every stage command it runs (``dvc/stage/run.py``: ``DVC_STAGE``, ``dvc exp
#: run`` adds ``DVC_EXP_BASELINE_REV``, the commit the experiment's params are compared with).
DVC_STAGE_ENV = "DVC_STAGE"
DVC_BASELINE_ENV = "DVC_EXP_BASELINE_REV"

#: Sections keyed by task (``model`` by task, then architecture): the grid reads only its tasks'.
_TASK_KEYED = {"data": 2, "train": 2, "evaluate": 2, "gradinit": 2, "sparse": 2, "model": 3}

#: A key absent on one side of :func:`params_edits`.
MISSING = object()


def effective_settings(config: dict) -> dict:
    """The settings the grid's jobs read, as they read them (``config`` is the merged, validated
    configuration): per grid task its ``data``, ``train`` and ``evaluate`` settings, ``model``
    options per architecture it trains, ``gradinit`` / ``sparse`` settings where one of its methods
    has that stage; then ``quantize`` and ``analysis``, which every run reads."""
    settings: dict[str, dict] = {section: {} for section in ("data", "model", "train")}
    settings |= {"gradinit": {}, "sparse": {}, "evaluate": {}}
    for cell in expand_grid(config):
        task = cell.task
        settings["data"][task] = data_settings(config, task)
        settings["model"].setdefault(task, {})[cell.arch] = model_settings(config, task, cell.arch)
        # seed_block too (jobs read it); a key at its off value is not a setting a run read
        settings["train"][task] = without_off_keys(canonical(config["train"][task]))
        for stage in method_of(cell).stages:
            settings[stage][task] = stage_settings(config, stage, task)
        settings["evaluate"][task] = evaluate_settings(config, task)
    settings["quantize"] = canonical(config.get("quantize", {}))
    settings["analysis"] = analysis_settings(config)
    return settings


def settings_record(settings: dict) -> dict:
    """``settings`` as DVC shows metrics: DVC leaves out lists and nulls, so they are written as
    their JSON text (``betas: "[0.9, 0.98]"``, ``grad_clip: "null"``); an analysis comparison's
    list (``analysis.joint``) is the grid's structure, not a setting, and is left out."""

    def shown(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: shown(item) for key, item in value.items()}
        if isinstance(value, list | tuple) or value is None:
            return json.dumps(value)
        return value

    record = shown(settings)
    record.get("analysis", {}).pop("joint", None)
    return record


def save_effective_settings(settings: dict, path: str | os.PathLike) -> None:
    """Write :func:`settings_record` of ``settings`` as JSON (rule ``effective_settings``)."""
    from trainmap.io import save_json

    save_json(settings_record(settings), path)


# --- what -S (or a hand edit) set ---------------------------------------------------------------


def under_dvc() -> bool:
    """Whether this process is a DVC stage command (``dvc repro``, ``dvc exp run``)."""
    return bool(os.environ.get(DVC_STAGE_ENV))


def committed_params(path: str | os.PathLike, rev: str | None = None) -> dict | None:
    """``path`` as committed at ``rev`` (``$DVC_EXP_BASELINE_REV``, else ``HEAD``): None where
    there is no such commit or file (no git, not a repository, a file git does not track)."""
    path = Path(path)
    rev = rev or os.environ.get(DVC_BASELINE_ENV) or "HEAD"
    try:
        shown = subprocess.run(
            ["git", "-C", str(path.parent.resolve()), "show", f"{rev}:./{path.name}"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    if shown.returncode != 0:
        return None
    try:
        committed = yaml.load(shown.stdout, Loader=YAML_LOADER)
    except yaml.YAMLError:
        return None
    return committed if isinstance(committed, dict) else None


def params_edits(path: str | os.PathLike, rev: str | None = None) -> dict[tuple, tuple[Any, Any]]:
    """The keys whose value in the workspace ``path`` differs from the committed one
    (:func:`committed_params`): ``{key path: (committed value, workspace value)}``, a value
    missing on one side being :data:`MISSING`. Empty without a committed file to compare with."""
    committed = committed_params(path, rev)
    if committed is None or not os.path.exists(path):
        return {}
    return dict(_differences(committed, read_config_file(path), ()))


def _differences(old: Any, new: Any, where: tuple) -> Iterator[tuple[tuple, tuple[Any, Any]]]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in [*old, *(key for key in new if key not in old)]:
            yield from _differences(old.get(key, MISSING), new.get(key, MISSING), (*where, key))
    elif old is MISSING or new is MISSING or old != new or type(old) is not type(new):
        yield where, (old, new)


def check_params_edits(config: dict, configfiles: Sequence[str | os.PathLike]) -> None:
    """Refuse, before any job, what would make DVC's record of a run differ from the run.

    ``configfiles`` are the files Snakemake merged, in order: ``params.yaml`` (the file DVC
    tracks) first. A key ``dvc exp run -S`` or an edit set in ``params.yaml``
    (:func:`params_edits`) that a later file sets to another value would be recorded at one value
    and run at the other; a key of a task, architecture or method stage that the grid does not run
    would be recorded as an experiment's setting while changing nothing. Under DVC
    (``$DVC_STAGE``) both raise :class:`ConfigError`, naming the key, both files and values and the
    fix. Outside DVC nothing records params.yaml as the run's settings and the layering is
    Snakemake's documented one, so an overridden edit is a warning and an unread one passes (a
    shared defaults file routinely holds settings of tasks another grid runs).
    """
    params_path, *later = (_relative(path) for path in configfiles)
    edits = params_edits(params_path)
    if not edits:
        return
    strict = under_dvc()
    read = effective_settings(config)
    layers = [(path, read_config_file(path)) for path in later if os.path.exists(path)]
    for key, (committed, edited) in edits.items():
        ran = _lookup(config, key)
        if ran != edited:
            message = _overridden_message(params_path, key, committed, edited, ran, layers)
            if strict:
                raise ConfigError(message)
            # stacklevel 1: a warning attributed to the Snakefile's frame is never shown (measured)
            warnings.warn(f"{message} (`dvc repro` and `dvc exp run` refuse this)", stacklevel=1)
        elif strict and (reason := _unread_reason(config, read, key)):
            raise ConfigError(_unread_message(params_path, key, committed, edited, reason, layers))


def params_edit_hint(message: str, params_path: str = "params.yaml") -> str:
    """A configuration error under DVC whose key ``dvc exp run -S`` (or an edit) set in
    ``params_path``, with one more line saying so and how to restore the committed file: DVC leaves
    a failed experiment's values in the workspace, where the next ``dvc exp run`` would start from
    them. Other messages are returned as they are."""
    if not under_dvc() or not message.startswith("config key "):
        return message
    key = message[len("config key ") :].split(":", 1)[0].split(" ", 1)[0]
    edits = {key_path(edited): values for edited, values in params_edits(params_path).items()}
    if key not in edits:
        return message
    return (
        f"{message}\n{key} is set in {params_path} by `dvc exp run -S` or an edit (git's "
        f"{params_path}: {_shown(edits[key][0])}), and DVC leaves it there after this failure: "
        f"restore the committed file first (`git checkout {params_path}`)"
    )


# --- messages -----------------------------------------------------------------------------------


def _relative(path: str | os.PathLike) -> str:
    """``path`` as a user wrote it: relative to the working directory where it lies below it
    (Snakemake makes ``--configfile`` paths absolute)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _lookup(data: Any, key: tuple) -> Any:
    for part in key:
        if not isinstance(data, dict) or part not in data:
            return MISSING
        data = data[part]
    return data


def _setter(key: tuple, layers: list[tuple[str, dict]]) -> str | None:
    """The last config file that sets ``key`` (or replaces a mapping above it)."""
    for path, data in reversed(layers):
        for depth in range(1, len(key) + 1):
            value = _lookup(data, key[:depth])
            if value is not MISSING and (depth == len(key) or not isinstance(value, dict)):
                return path
    return None


def _shown(value: Any) -> str:
    return "(not set)" if value is MISSING else json.dumps(value)


def _cli(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value).replace(" ", "")


def _edit(params_path: str, committed: Any, edited: Any) -> str:
    was = "not set" if committed is MISSING else _shown(committed)
    return f"{params_path} sets {_shown(edited)} (`dvc exp run -S` or an edit; git's: {was})"


def _overridden_message(
    params_path: str, key: tuple, committed: Any, edited: Any, ran: Any, layers: list
) -> str:
    name = key_path(key)
    setter = _setter(key, layers)
    if setter is None:
        return (
            f"config key {name}: {_edit(params_path, committed, edited)}, but the jobs would read "
            f"{_shown(ran)}, set after the config files (snakemake --config?), while DVC records "
            f"{_shown(edited)}. Fix: drop that override"
        )
    files = " -> ".join([params_path, *dict.fromkeys(path for path, _ in layers)])
    return (
        f"config key {name}: {_edit(params_path, committed, edited)}, but {setter} sets "
        f"{_shown(ran)} and wins (Snakemake reads {files}, a later file's value replacing an "
        f"earlier one): the jobs would run with {_shown(ran)} while DVC records {_shown(edited)}. "
        f"Fix: set it in the config file, `dvc exp run -S '{setter}:{name}={_cli(edited)}'`, or "
        f"delete {name} from {setter} so that {params_path} decides"
    )


def _unread_reason(config: dict, read: dict, key: tuple) -> str | None:
    """Why no job reads ``key`` (a key of a task, architecture or stage the grid does not run),
    or None when a job does."""
    depth = _TASK_KEYED.get(key[0])
    if depth is None or _lookup(read, key[:depth]) is not MISSING:
        return None
    cells = expand_grid(config)
    task = key[1] if len(key) > 1 else None
    if task is None:
        return None
    if not any(cell.task == task for cell in cells):
        tasks = ", ".join(dict.fromkeys(cell.task for cell in cells))
        return f"the grid has no task {task!r} (its tasks: {tasks})"
    if key[0] == "model" and len(key) > 2:
        archs = ", ".join(sorted({cell.arch for cell in cells if cell.task == task}))
        return f"the grid trains no {key[2]!r} on {task!r} (its architectures there: {archs})"
    used = ", ".join(sorted({cell.method for cell in cells if cell.task == task}))
    return f"no method the grid runs on {task!r} ({used}) has a {key[0]} stage"


def _unread_message(
    params_path: str, key: tuple, committed: Any, edited: Any, reason: str, layers: list
) -> str:
    grid_file = _setter(("grid",), layers) or params_path
    return (
        f"config key {key_path(key)}: {_edit(params_path, committed, edited)}, but no job reads "
        f"it: {reason} in {grid_file}, so DVC would record a setting that changes nothing. Fix: "
        f"set a key of what the grid runs, or add what it names to the grid in {grid_file}"
    )
