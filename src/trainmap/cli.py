"""The ``trainmap`` command: the project's commands behind one name, each with its own ``--help``.

=====================  =====================================================  ==================
``trainmap map``       fit a training map over runs' metric tables or          ``python -m
                       checkpoints (the core install)                          trainmap.dynamics``
``trainmap check``     check a config file as the workflow will                ``trainmap.grid``
``trainmap plan``      bytes, memory and time of every job of a study          ``trainmap.plan``
``trainmap digest``    check (or write) a study's published digest             ``trainmap.digest``
``trainmap run``       the workflow in a trainmap checkout: ``snakemake``      (``make run``)
                       (the ``workflow`` extra)
=====================  =====================================================  ==================

The ``python -m`` modules keep working; this command only dispatches to their ``main``. A command
that needs a package the install lacks (Snakemake, DVC, MLflow: ``pip install
'trainmap[workflow]'``) says so in one line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

#: Packages only the ``workflow`` extra installs.
WORKFLOW_PACKAGES = ("snakemake", "dvc", "mlflow", "mlxtend", "mnist1d")
WORKFLOW_INSTALL = "pip install 'trainmap[workflow]'"

#: command -> (module whose ``main(argv)`` runs it, one line of help)
COMMANDS: dict[str, tuple[str, str]] = {
    "map": ("trainmap.dynamics.__main__", "fit a training map over runs (metric tables or "
            "checkpoints): states, the map, detours"),
    "check": ("trainmap.grid.validate", "check a config file as the workflow will, before any job"),
    "resolve": ("trainmap.grid.resolve", "list the revisions of the suites a study fetches from "
                "the Hub into their revisions.json (refs and headers, no weights)"),
    "plan": ("trainmap.plan.cli", "bytes written, peak memory and time of every job of a study, "
             "checked against one node"),
    "digest": ("trainmap.digest", "check a study's results against its published digest, or "
               "write one"),
    "run": ("", "run the workflow in this trainmap checkout (snakemake; needs the workflow extra)"),
}  # fmt: skip


def version() -> str:
    """The installed distribution's version (the source tree's when it is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("trainmap")
    except PackageNotFoundError:
        from trainmap import __version__

        return __version__


def missing_extra(error: ModuleNotFoundError) -> str | None:
    """The one-line message for a workflow package the install lacks, else None."""
    name = (error.name or "").split(".")[0]
    if name in WORKFLOW_PACKAGES:
        return (f"error: this command needs {name}, which the core install leaves out; add the "
                f"workflow: {WORKFLOW_INSTALL}")  # fmt: skip
    return None


def run_workflow(argv: Sequence[str]) -> int:
    """``trainmap run [--cores N] [SNAKEMAKE ARGS...]``: Snakemake on this checkout's Snakefile
    (``--cores`` defaults to every core of this machine)."""
    parser = argparse.ArgumentParser(
        prog="trainmap run",
        description="Run the workflow of the trainmap checkout in this directory: snakemake with "
        "the arguments given (a --configfile, targets, --profile profiles/slurm, -n for a dry "
        "run). make run also checks the config and the plan first and versions the results.",
    )
    parser.add_argument("--cores", default=str(os.cpu_count() or 1),
                        help="cores for local jobs (default: every core, %(default)s here)")  # fmt: skip
    known, rest = parser.parse_known_args(list(argv))
    if not Path("Snakefile").is_file():
        print("error: trainmap run needs a trainmap checkout (no Snakefile in "
              f"{Path.cwd()}): git clone the project and run it there, or use trainmap map on "
              "your own runs", file=sys.stderr)  # fmt: skip
        return 2
    try:
        importlib.import_module("snakemake")
    except ModuleNotFoundError as error:
        print(missing_extra(error) or f"error: {error}", file=sys.stderr)
        return 2
    # Snakemake reads --configfile files before the Snakefile, so a file that is not UTF-8 or not
    # YAML would end in its traceback: read them as the config check does (one line, the file).
    files = argparse.ArgumentParser(add_help=False)
    files.add_argument("--configfile", "--configfiles", nargs="+", action="extend", default=[])
    from trainmap.grid import check_config_files, config_problems_reported

    with config_problems_reported():
        check_config_files(files.parse_known_args(rest)[0].configfile)
    command = [sys.executable, "-m", "snakemake", "--cores", known.cores, *rest]
    os.execv(sys.executable, command)
    return 0  # not reached: execv replaces this process


def check_installed_torch() -> None:
    """:func:`trainmap.check_torch` on the installed torch's version, read from its metadata, not
    by importing it (a command's ``--help`` imports no torch); without torch, the command's own
    import says what is missing."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    from trainmap import check_torch

    try:
        check_torch(installed("torch"))
    except PackageNotFoundError:
        return


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``trainmap COMMAND ARGS...`` to the command's module."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="trainmap",
        description="trainmap: how networks train. Each command has its own --help.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n"
        + "\n".join(f"  {name:<8} {text}" for name, (_, text) in COMMANDS.items()),  # fmt: skip
    )
    parser.add_argument("--version", action="version", version=f"trainmap {version()}")
    parser.add_argument("command", choices=list(COMMANDS), help="the command to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments")
    if not argv:
        parser.print_help(sys.stderr)
        return 2
    if argv[0] in ("-h", "--help", "--version"):
        parser.parse_args(argv[:1])
    chosen = parser.parse_args(argv[:1])
    rest = argv[1:]
    if chosen.command == "run":
        return run_workflow(rest)
    module_name = COMMANDS[chosen.command][0]
    try:
        check_installed_torch()
        module = importlib.import_module(module_name)
        command_main: Callable[[list[str]], int | None] = module.main
        sys.argv = [f"trainmap {chosen.command}", *rest]
        return int(command_main(rest) or 0)
    except ModuleNotFoundError as error:
        message = missing_extra(error)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
