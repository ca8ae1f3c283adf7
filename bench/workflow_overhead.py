"""Per-job overhead of the workflow: wall time over the jobs' own compute time per core.

Runs a grid (default: the embedded default, config/config.yaml) with ``snakemake --cores N`` in a
temporary copy of the workflow, every job recording its own compute time (``$TRAINMAP_JOB_TIMES``:
the time inside the job's function, without interpreter start, imports, Snakemake's scheduling and
file checks), and prints

    overhead ratio = wall time / (sum of the jobs' compute time / cores)      (target <= 1.15)

A job's compute time is its own wall time times the cores Snakemake gave it (``threads``): fit_hmm
and joint_comparison run their EM fits and bootstrap refits on 2 processes. 1.0 would mean the cores
never waited and no job paid any start-up cost. With ``--compare`` it also
runs the same grid with the job server off (``TRAINMAP_WORKER=off``: every job a fresh Python
process importing torch, pandas and MLflow), side by side.

Usage::

    .venv/bin/python bench/workflow_overhead.py --quick           # the smoke grid, ~1 minute
    .venv/bin/python bench/workflow_overhead.py                   # the default grid, ~12 minutes
    .venv/bin/python bench/workflow_overhead.py --quick --compare

With ``--out DIR`` each run's job records (``DIR/jobs_server_on.jsonl``, ``..._off.jsonl``: rule,
compute seconds, cores, finish time) are kept, for the timeline of a run.

Last line: ``workflow_overhead_ratio=... (target <= 1.15)``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from trainmap.io import copy_workflow

REPO = Path(__file__).resolve().parents[1]
TARGET = 1.15


def run_grid(configfile: str, cores: int, worker: bool, out: Path | None = None) -> dict:
    """Run the grid in a fresh copy; return wall time and per-job compute times (the job records
    also copied to ``out``/jobs_server_{on,off}.jsonl when given)."""
    with tempfile.TemporaryDirectory(prefix="overhead-") as tmp:
        workdir = copy_workflow(REPO, Path(tmp))
        times_file = workdir / "job_times.jsonl"
        env = dict(os.environ, TRAINMAP_JOB_TIMES=str(times_file), MLFLOW_DISABLE_TELEMETRY="true")
        env.pop("MLFLOW_TRACKING_URI", None)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        if not worker:
            env["TRAINMAP_WORKER"] = "off"
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "snakemake", "--cores", str(cores), "--configfile", configfile],
            cwd=workdir, env=env, capture_output=True, text=True,
        )  # fmt: skip
        wall = time.perf_counter() - started
        if result.returncode != 0:
            sys.exit(f"snakemake failed:\n{result.stderr[-3000:]}")
        jobs = [json.loads(line) for line in times_file.read_text().splitlines()]
        digest = check_digest(workdir, configfile, env)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            name = f"jobs_server_{'on' if worker else 'off'}.jsonl"
            (out / name).write_text(times_file.read_text())
    per_rule: dict[str, list[float]] = defaultdict(list)
    for job in jobs:
        per_rule[job["function"].split(":")[1].removesuffix("_job")].append(core_seconds(job))
    return {"wall": wall, "jobs": jobs, "per_rule": per_rule, "digest": digest}


def check_digest(workdir: Path, configfile: str, env: dict) -> str:
    """Whether the run's result files match the config's published digest
    (``published/<config>.results.sha256``, as ``make run`` checks), or why it was not checked."""
    from trainmap.io import published_digest_of

    published = published_digest_of(configfile)
    if not (workdir / published).exists():
        return f"not checked (no {published})"
    root = subprocess.run(
        [sys.executable, "-m", "trainmap.grid", "--results-root", configfile],
        cwd=workdir, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    check = subprocess.run(
        [sys.executable, "-m", "trainmap.digest", "check", str(published), root],
        cwd=workdir, env=env, capture_output=True, text=True,
    )  # fmt: skip
    said = (check.stdout + check.stderr).strip()
    return said.splitlines()[-1] if check.returncode == 0 else f"DIFFER: {said[-2000:]}"


def core_seconds(job: dict) -> float:
    """A job's compute: its wall time on each of the cores it was given."""
    return job["seconds"] * job.get("threads", 1)


def report(label: str, run: dict, cores: int) -> float:
    compute = sum(core_seconds(job) for job in run["jobs"])
    ratio = run["wall"] / (compute / cores)
    print(f"\n{label}: {len(run['jobs'])} jobs, wall {run['wall']:.1f} s, jobs' own compute "
          f"{compute:.1f} s over {cores} cores -> ratio {ratio:.3f}")  # fmt: skip
    print(f"  result files: {run['digest']}")
    print(f"  {'rule':18}{'jobs':>6}{'core s':>11}{'mean s':>9}")
    for rule, values in sorted(run["per_rule"].items(), key=lambda item: -sum(item[1])):
        print(f"  {rule:18}{len(values):>6}{sum(values):>11.1f}{sum(values) / len(values):>9.2f}")
    return ratio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="the smoke grid instead of the default"
    )
    parser.add_argument(
        "--config", help="grid file (default config/config.yaml, or smoke with --quick)"
    )
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="snakemake --cores")
    parser.add_argument("--compare", action="store_true", help="also run with the job server off")
    parser.add_argument("--out", type=Path, help="keep each run's job records in this folder")
    args = parser.parse_args(argv)
    configfile = args.config or ("config/smoke.yaml" if args.quick else "config/config.yaml")
    print(f"grid {configfile}, {args.cores} cores")
    on_run = run_grid(configfile, args.cores, worker=True, out=args.out)
    ratio = report("job server on", on_run, args.cores)
    if args.compare:
        off_run = run_grid(configfile, args.cores, worker=False, out=args.out)
        off = report("job server off", off_run, args.cores)
        print(f"\nserver off / on ratio: {off / ratio:.2f}x more overhead without the server")
        saved = 1 - on_run["wall"] / off_run["wall"]
        print(f"wall time: server on {on_run['wall']:.1f} s, off {off_run['wall']:.1f} s: the "
              f"server saves {100 * saved:.1f} % of the wall time (kept if >= 10 %)")  # fmt: skip
    print(f"workflow_overhead_ratio={ratio:.3f} (target <= {TARGET})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
