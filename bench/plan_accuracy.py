"""How far trainmap.plan's estimates are from measured jobs: the ratio measured / planned per rule.

Three sources of measured jobs:

* a finished study under a results root (``--results``, default: the config's root): every
  training block whose seeds' ``train.timing.json`` hold ``wall_time_s`` (train and sparse
  retraining; the block's wall time, its seeds trained together), against the plan's time for
  that block (start-up excluded from both: the sidecar times the loop);
* every job of the study's Snakemake log (``<results>/../.snakemake/log/*.log``, the newest, or
  ``--snakemake-log``): its start and ``Finished`` timestamps (whole seconds) against the plan's
  time for that job, start-up excluded from the plan (the study's jobs start in a warm job server,
  :mod:`trainmap.worker`; on a cluster each pays ``plan.STARTUP_S``), per rule: median and range;
* training blocks run here, now (``trainmap.training.loop.train_block``, the loop the train rule
  runs, into a temporary directory): the config's blocks with their steps cut to ``--steps``
  (the plan is made for the same cut settings). Wall time, peak RSS of the process (ru_maxrss,
  which includes the interpreter and torch) and bytes written against the plan's time, host RAM
  and bytes.

Usage::

    .venv/bin/python bench/plan_accuracy.py                        # the smoke grid's train blocks
    .venv/bin/python bench/plan_accuracy.py --config config/config.yaml --steps 400
    .venv/bin/python bench/plan_accuracy.py --quick                # 2 blocks, 100 steps

With ``--blocks 0`` nothing is trained here. Last line (when blocks ran here):
``plan_accuracy train_time=... train_bytes=... train_ram=... (measured / planned)``.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from trainmap import grid


def finished_ratios(config: dict, results: str) -> pd.DataFrame:
    """Measured / planned time of every finished training block under ``results``."""
    import pandas as pd

    from trainmap import grid, plan

    rows = []
    for block in grid.seed_ranges_of(config, grid.trained_cells(config)):
        job = plan.block_job(config, "train", block)
        measured = plan.estimates._measured_wall_time(results, "train", block)
        if measured is not None:
            rows.append({"rule": "train", "job": block.id, "measured_s": measured[0],
                         "planned_s": job.seconds - plan.STARTUP_S})  # fmt: skip
    return pd.DataFrame(rows)


_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]$")
_STARTED = re.compile(r"^(?:local)?rule (\w+):$")
_FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")


def snakemake_durations(log: Path) -> pd.DataFrame:
    """Every finished job of a Snakemake log: rule, wildcards (as a dict), seconds from its start
    stamp to its ``Finished`` stamp (whole seconds: +-1 s)."""
    import pandas as pd

    stamp, job, started, jobs = None, None, {}, []
    for line in log.read_text().splitlines():
        line = line.strip()
        if match := _STAMP.match(line):
            stamp = datetime.strptime(match.group(1), "%a %b %d %H:%M:%S %Y")
        elif match := _STARTED.match(line):
            job = [match.group(1), stamp, {}]
        elif job and line.startswith("jobid: "):
            started[line.split()[1]] = job
        elif job and line.startswith("wildcards: "):
            job[2].update(item.split("=", 1) for item in line[len("wildcards: ") :].split(", "))
        elif match := _FINISHED.match(line):
            if match.group(1) in started:
                name, at, wildcards = started[match.group(1)]
                jobs.append({"rule": name, "wildcards": wildcards,
                             "measured_s": (stamp - at).total_seconds()})  # fmt: skip
    return pd.DataFrame(jobs)


def logged_ratios(config: dict, log: Path) -> pd.DataFrame:
    """Measured (Snakemake log) / planned time (start-up excluded) of every planned job."""
    import pandas as pd

    from trainmap import plan

    planned = plan.plan_jobs(config).set_index(["rule", "job"])
    rows = []
    for job in snakemake_durations(log).itertuples():
        wildcards = job.wildcards
        if {"task", "arch", "method", "block"} <= wildcards.keys():
            name = "/".join(wildcards[k] for k in ("task", "arch", "method", "block"))
        else:
            name = wildcards.get("name") or wildcards.get("group") or wildcards.get("task")
        if (job.rule, name) not in planned.index:
            continue
        rows.append({"rule": job.rule, "job": name, "measured_s": job.measured_s,
                     "planned_s": planned.loc[(job.rule, name), "seconds"] - plan.STARTUP_S})  # fmt: skip
    return pd.DataFrame(rows)


def rule_summary(ratios: pd.DataFrame) -> pd.DataFrame:
    """Per rule: jobs, median, min and max of measured / planned."""
    return ratios.groupby("rule", sort=False)["ratio"].agg(
        jobs="size", median="median", min="min", max="max"
    )


def default_log(results: str) -> Path | None:
    logs = sorted((Path(results).resolve().parent / ".snakemake" / "log").glob("*.snakemake.log"))
    return logs[-1] if logs else None


def directory_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def run_block(config: dict, block: grid.SeedRange, steps: int) -> dict:
    """Train ``block`` with its steps cut to ``steps`` here; measured and planned numbers."""
    from trainmap import grid, plan
    from trainmap.data import make_task_data
    from trainmap.training.loop import TrainConfig, TrainPaths, build_cell_model, train_block

    settings = dict(config["train"][block.task])
    settings.pop("seed_block", None)
    settings.update(steps=steps, resume_every=steps + 1, device="cpu")
    settings["checkpoint_every"] = min(settings["checkpoint_every"], steps)
    cut = json.loads(json.dumps(config))
    cut["train"][block.task] = {**settings, "seed_block": grid.seed_block(config, block.task)}
    job = plan.block_job(cut, "train", block)
    data = make_task_data(config["data"][block.task]["kind"],
                          {k: v for k, v in config["data"][block.task].items() if k != "kind"})  # fmt: skip
    options = grid.model_settings(config, block.task, block.arch)
    models = [build_cell_model(block.arch, block.method, seed, data.meta, options)
              for seed in block.seeds]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        paths = [TrainPaths.in_directory(directory / f"seed{seed}") for seed in block.seeds]
        start = time.perf_counter()
        train_block(models, data, TrainConfig.from_dict(settings), block.seeds, paths,
                    resume_path=directory / "resume.pt", progress=False)  # fmt: skip
        wall = time.perf_counter() - start
        written = directory_bytes(directory)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"rule": "train", "job": f"{block.id} ({steps} steps)", "measured_s": wall,
            "planned_s": job.seconds - plan.STARTUP_S, "measured_bytes": written,
            "planned_bytes": job.bytes, "measured_rss": rss, "planned_ram": job.ram}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config/smoke.yaml")
    parser.add_argument("--results", default=None, help="a finished study's results root")
    parser.add_argument("--snakemake-log", default=None,
                        help="the study's Snakemake log (default: the newest under the results "
                        "root's sibling .snakemake/log)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=300, help="steps of each block run here")
    parser.add_argument("--blocks", type=int, default=4, help="blocks run here, at most")
    parser.add_argument("--quick", action="store_true", help="2 blocks, 100 steps")
    args = parser.parse_args()
    import pandas as pd

    from trainmap import grid, plan

    if args.quick:
        args.steps, args.blocks = 100, 2
    config = plan.load_plan_config([args.config])
    results = args.results or grid.results_root(config)
    finished = finished_ratios(config, results)
    if len(finished):
        finished["ratio"] = finished["measured_s"] / finished["planned_s"]
        print(f"finished blocks under {results}:")
        print(finished.to_string(index=False))
    else:
        print(f"no finished training block under {results}/train")
    log = Path(args.snakemake_log) if args.snakemake_log else default_log(results)
    if log is not None and log.is_file():
        logged = logged_ratios(config, log)
        if len(logged):
            logged["ratio"] = logged["measured_s"] / logged["planned_s"]
            print(
                f"jobs of {log} (measured: Snakemake start to finish; planned: start-up excluded):"
            )
            print(logged.to_string(index=False))
            print("per rule, measured / planned:")
            print(rule_summary(logged).to_string(float_format=lambda v: f"{v:.2f}"))
    blocks = [b for b in grid.seed_ranges_of(config, grid.trained_cells(config))
              if not grid.method_of(b.cells[0]).has_stage("gradinit")][: args.blocks]  # fmt: skip
    if not blocks:
        return 0
    here = pd.DataFrame([run_block(config, block, args.steps) for block in blocks])
    here["time"] = here["measured_s"] / here["planned_s"]
    here["bytes"] = here["measured_bytes"] / here["planned_bytes"]
    here["ram"] = here["measured_rss"] / here["planned_ram"]
    print("blocks trained here (measured / planned):")
    print(here[["job", "measured_s", "planned_s", "time", "bytes", "ram"]].to_string(index=False))
    print(
        f"plan_accuracy train_time={statistics.median(here['time']):.2f} "
        f"train_bytes={statistics.median(here['bytes']):.2f} "
        f"train_ram={statistics.median(here['ram']):.2f} (measured / planned, medians)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
