"""``python -m trainmap.plan``: load a config as the workflow does, print its plan per rule and
in total, and check it against one node (exit status 1 past a limit). The arguments are parsed
before the estimates (torch, pandas) are imported."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from trainmap import grid
from trainmap.gpus import node_gpus
from trainmap.plan.limits import NodeLimits


def load_plan_config(files: Iterable[str]) -> dict:
    """params.yaml, config/config.yaml, then ``files``, merged (:func:`trainmap.grid.merged_config`:
    files with a grid of their own start from params.yaml alone) and validated as the workflow does,
    except that a reader kind's data files (MNIST, CIFAR) need not be here: the plan knows their
    sizes (:func:`dataset_examples`). A missing data directory is a warning; the checks after it
    (the schema has passed) are then skipped. An ``image_folder``'s is refused unless it states
    ``num_classes`` (its images are then counted as a kind whose size only the data knows). A
    suite fetched from the Hub need not be resolved yet (``trainmap resolve``): it is planned from
    the config's steps and sizes (:mod:`trainmap.plan.suites`)."""
    from trainmap import plugins
    from trainmap.grid.external import UnresolvedSuite

    config = grid.merged_config("params.yaml", "config/config.yaml", *files)
    plugins.load_plugins(config.get("plugins"), Path.cwd())
    grid.validate_schema(config)
    try:
        grid.check_config(config, base_dir=Path.cwd())
    except UnresolvedSuite as error:
        print(f"warning: {error.args[0].splitlines()[0]} (planned from the config's steps and "
              "sizes)", file=sys.stderr)  # fmt: skip
    except grid.ConfigError as error:
        if not (str(error).startswith("config key data.") and ".path: " in str(error)):
            raise
        task = str(error).removeprefix("config key data.").split(".path: ", 1)[0]
        settings = config["data"].get(task, {})
        if settings.get("kind") == "image_folder" and settings.get("num_classes") is None:
            raise
        print(f"warning: {error} (planned without the data)", file=sys.stderr)
    return config


def main(argv: list[str] | None = None) -> int:
    """``python -m trainmap.plan``: print the plan of a config and check it against a node."""
    parser = argparse.ArgumentParser(
        prog="python -m trainmap.plan",
        description="Plan a config's grid before running it: per rule and in total, the bytes "
        "written, the peak host RAM and GPU memory, and the time per job, each with where it "
        "comes from (measured or FLOP-/size-based). Exit status 1 when a job or the grid exceeds "
        "the node limits, naming the key to change.",
    )
    parser.add_argument("--configfile", nargs="*", default=[], metavar="CONFIG",
                        help="config files merged over params.yaml and config/config.yaml (a "
                        "file with a grid of its own: over params.yaml alone)")  # fmt: skip
    parser.add_argument("--node-gpu-gb", type=float, default=None,
                        help="GPU memory of one GPU of the node (default: this machine's largest "
                        f"GPU by nvidia-smi, else {NodeLimits.gpu_gb:g}, a cluster node's)")  # fmt: skip
    parser.add_argument("--node-ram-gb", type=float, default=NodeLimits.ram_gb)
    parser.add_argument("--node-disk-tb", type=float, default=NodeLimits.disk_tb)
    parser.add_argument("--job-hours", type=float, default=NodeLimits.job_hours)
    parser.add_argument("--jobs", action="store_true", help="also print one line per job")
    parser.add_argument("--check", action="store_true",
                        help="print only whether the grid fits the node (make run's first step): "
                        "one line, or the job or total past a limit and the key to change")  # fmt: skip
    args = parser.parse_args(argv)
    # The estimates (torch, pandas) after the arguments: --help and a usage error answer at once.
    from trainmap.plan.estimates import PlanError, plan_jobs
    from trainmap.plan.report import check_limits, disk_bytes, format_plan

    if args.node_gpu_gb is None:  # a local run is refused before any job on this machine's GPUs
        gpus = node_gpus()
        args.node_gpu_gb = max(mb for _, mb in gpus) / 1e3 if gpus else NodeLimits.gpu_gb
    limits = NodeLimits(args.node_gpu_gb, args.node_ram_gb, args.node_disk_tb, args.job_hours)
    with grid.config_problems_reported():
        config = load_plan_config(args.configfile)
    try:
        jobs = plan_jobs(config, grid.results_root(config))
    except PlanError as error:
        print(
            f"error: cannot plan {' + '.join(args.configfile) or 'the study'}: {error}",
            file=sys.stderr,
        )
        return 1
    study = " + ".join(grid.study_files(grid.user_layers(args.configfile)))
    if not args.check:  # --check (make run's first step): only the verdict below
        print(f"plan of {study}")
        print(format_plan(jobs, limits))
        if args.jobs:
            columns = ["rule", "job", "seeds", "device", "bytes", "ram", "gpu", "seconds"]
            print(jobs[columns].to_string(index=False))
    try:
        check_limits(jobs, limits)
    except PlanError as error:
        print(f"error: the plan of {study} does not fit the node: {error} (python -m "
              "trainmap.plan --help: the node's limits)", file=sys.stderr)  # fmt: skip
        return 1
    print(f"plan of {study}: {len(jobs):,} jobs, {disk_bytes(jobs) / 1e9:,.1f} GB written; "
          f"fits the node ({limits})")  # fmt: skip
    return 0
