"""The study configuration: one grid, validated before anything runs.

A configuration is ``params.yaml`` (hyperparameters per task, the file DVC tracks) extended by a grid
file (``config/config.yaml`` by default), exactly as Snakemake merges ``configfile:`` directives and
``--configfile``: mappings merge key by key, lists (the grid) are replaced whole.

Config files are read strictly before Snakemake merges them
(:func:`~trainmap.grid.files.check_config_files`): a YAML syntax error names the file and line, and
a key repeated in one mapping is refused (YAML would keep only its last value). Validation then has
two layers. The JSON schema in ``workflow/schemas/config.schema.yaml`` checks types and ranges and
refuses unknown keys at every level (:func:`~trainmap.grid.schema_checks.validate_schema`, with a
"did you mean" suggestion). :func:`check_config` checks what a schema cannot: names unknown to the
model/method/data registries, tasks no ``data`` entry defines, duplicate seeds or cells, data
paths that do not exist, options a builder does not take, values that must fit together (``k <=
n_bits``, ``checkpoint_every <= steps``). Every error's first line leads with ``config key <path>:``
(or ``config file <path>, line N:``), names the bad value and what is allowed, and is raised at
parse time, before any job starts.

This module runs the layers in order (:func:`load_config`, :func:`check_config`) and reports their
errors to the user (:func:`config_problems_reported`, ``python -m trainmap.grid``). Each concern's
checks live in a module of their own: which files make the study (:mod:`.study`), the schema
(:mod:`.schema_checks`), the grid's entries and cells (:mod:`.grid_checks`), each task's data
(:mod:`.data_checks`) and its other sections (:mod:`.section_checks`), the analysis sections
(:mod:`.analysis_checks`), external run sets (:mod:`.external`) and where results are recorded
(:mod:`.tracking_checks`).
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainmap import plugins
from trainmap.errors import ConfigError
from trainmap.grid.study import merged_config, results_root, study_files, user_layers
from trainmap.portable import switch_problem


def load_config(*paths: str | os.PathLike, check_paths_from: Path | None = None) -> dict:
    """Merge YAML files left to right (params.yaml first), load the config's ``plugins`` (files
    relative to ``check_paths_from``, the project directory), validate and return the config.
    The files after ``params.yaml`` and :data:`~trainmap.grid.study.DEFAULT_STUDY` are the user's
    (:func:`~trainmap.grid.study.own_study`)."""
    from trainmap.grid.schema_checks import validate_schema

    config = merged_config(*paths)
    plugins.load_plugins(config.get("plugins"), check_paths_from or Path.cwd())
    validate_schema(config)
    check_config(config, base_dir=check_paths_from or Path.cwd())
    return config


def check_config(config: dict, base_dir: Path | None = None, read_runs: bool = True) -> None:
    """Semantic checks a schema cannot express; raises :class:`ConfigError` on the first problem.
    ``read_runs=False`` leaves the external runs' checkpoint headers unread (their directories
    are still matched): a cluster job's parse of the workflow, after the main process checked
    them (a file changed since is refused by the job that reads it)."""
    # The checks are imported when a config is checked, not with this module: some build the
    # grid's models (torch), which `trainmap check --help` and config_problems_reported never need.
    from trainmap.grid.analysis_checks import (
        check_analysis_runs,
        check_features,
        check_joint_comparisons,
        check_paper,
    )
    from trainmap.grid.data_checks import check_data
    from trainmap.grid.external import check_external
    from trainmap.grid.grid_checks import check_grid_entry, check_job_count, check_unique_cells
    from trainmap.grid.roots import check_roots
    from trainmap.grid.section_checks import (
        STAGE_VALIDATORS,
        check_augment,
        check_buildable,
        check_model_options,
        check_quantize,
        check_sparsifiable,
        check_train,
        validate_stage_settings,
    )
    from trainmap.grid.tracking_checks import check_dvc, check_tracking_uri

    base_dir = base_dir or Path.cwd()
    if problem := switch_problem():  # every job pins its kernels by it: refuse it before any job
        raise ConfigError(problem)
    check_roots(config, base_dir)  # where every job writes (and Snakemake deletes): first
    check_dvc(config, base_dir)
    for task in config["data"]:  # every task's settings, used by the grid or not
        check_data(config, task)
    for task, archs in config["model"].items():
        for arch, options in archs.items():
            check_model_options(task, arch, options)
    for task, settings in config["train"].items():
        check_train(f"train.{task}", settings)
    if not config["grid"] and not config.get("external"):
        raise ConfigError("config key grid: empty, and no external: run sets; a study needs at "
                          "least one grid entry or one external set")  # fmt: skip
    for index, entry in enumerate(config["grid"]):
        check_grid_entry(config, index, entry, base_dir)
    check_unique_cells(config)
    for stage in STAGE_VALIDATORS:
        for task in config.get(stage, {}):
            validate_stage_settings(config, stage, task)
    check_quantize(config)
    check_job_count(config)  # before Snakemake builds a DAG of them
    check_joint_comparisons(config)
    check_paper(config)
    check_external(config, base_dir, read_runs)
    check_features(config)
    check_analysis_runs(config)
    built = check_buildable(config, base_dir)
    check_sparsifiable(config, built)
    check_augment(config, base_dir, built)
    check_tracking_uri(config)


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
            from trainmap.grid.effective import params_edit_hint

            if verbose:
                traceback.print_exc(file=sys.stderr)
            print(params_edit_hint(str(error)), file=sys.stderr)
            if not verbose:
                print(f"(stopped before any job ran; {VERBOSE_ENV}=1 shows where in the code)",
                      file=sys.stderr)  # fmt: skip
            raise SystemExit(1) from None


def refuse_held_root(root: str, base_dir: Path) -> None:
    """Raise :class:`~trainmap.grid.roots.RootInUseError` when a running workflow holds the results
    root ``root`` (relative to ``base_dir``): a second workflow on it would delete and rewrite the
    first one's outputs. Not part of :func:`check_config`: the Snakefile checks its config while its
    own process holds the root."""
    from trainmap.grid.roots import RootInUseError, in_use_message, root_holder

    if holder := root_holder(base_dir / root):
        raise RootInUseError(in_use_message(root, holder), root, holder)


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
            if not args.results_root:  # the Makefile asks for the root while its workflow runs
                refuse_held_root(results_root(config), Path.cwd())
    except SystemExit as stop:
        return int(stop.code or 0)
    if args.results_root:
        print(results_root(config))
        return 0
    from trainmap.grid.cells import expand_grid

    files = study_files(user_layers(args.files))
    print(f"ok: {' + '.join(files)} define {len(expand_grid(config))} grid cells")
    return 0
