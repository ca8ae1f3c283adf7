"""The plan of a grid against one node: per-rule totals, the node's limits (:class:`NodeLimits`,
:func:`check_limits`: a job or the grid past one is a :class:`PlanError` naming the key to change),
against the machine a run starts on (:func:`machine_problem`) and the plan as text
(:func:`format_plan`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd

from trainmap.plan.assumptions import GB
from trainmap.plan.estimates import PlanError
from trainmap.plan.limits import NodeLimits


def rule_totals(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per rule: jobs, bytes in total, the largest job's RAM, GPU memory and hours, and total
    hours (one row per rule, in plan order)."""
    order = list(dict.fromkeys(jobs["rule"]))
    totals = jobs.groupby("rule", sort=False).agg(
        jobs=("job", "size"), device=("device", lambda d: "/".join(sorted(set(d)))),
        bytes_gb=("bytes", lambda b: b.sum() / GB), ram_gb=("ram", lambda b: b.max() / GB),
        gpu_gb=("gpu", lambda b: b.max() / GB), hours_per_job=("seconds", lambda s: s.max() / 3600),
        total_hours=("seconds", lambda s: s.sum() / 3600),
    )  # fmt: skip
    return totals.loc[order]


def disk_bytes(jobs: pd.DataFrame) -> float:
    """What the grid leaves on disk, plus the largest job's transient files (a resume file)."""
    return float(jobs["bytes"].sum() + (jobs["scratch"].max() if len(jobs) else 0.0))


def _job_over(jobs: pd.DataFrame, column: str, limit: float, resource: str, shown_limit: str,
              owner: str) -> str | None:  # fmt: skip
    """The largest job past ``limit`` in ``column`` (``gpu``, ``ram``, ``seconds``) as a message
    naming rule, job, estimate, ``owner``'s limit and the keys to change; None when none is."""
    over = jobs[jobs[column] > limit]
    if not len(over):
        return None
    job = over.sort_values(column).iloc[-1]
    shown = f"{job[column] / 3600:.1f} h" if column == "seconds" else f"{job[column] / GB:.1f} GB"
    source = job["time_from"] if column == "seconds" else job["memory_from"]
    return (f"rule {job['rule']}, job {job['job']}: {resource} {shown} planned ({source}) exceeds "
            f"{owner} {shown_limit}; change {' or '.join(job['keys'])}")  # fmt: skip


def _disk_message(jobs: pd.DataFrame, total: str, limit: str) -> str:
    """The grid's ``total`` bytes past a disk ``limit``, naming the largest job and the keys that
    shrink it (the archive's first)."""
    job = jobs.sort_values("bytes").iloc[-1]
    keys = [k for k in job["keys"] if "archive" in k] or list(job["keys"])
    return (
        f"disk: the grid writes {total} (largest: rule {job['rule']}, job {job['job']}, "
        f"{job['bytes'] / GB:.1f} GB: {job['bytes_from']}) {limit}; change {' or '.join(keys)}"
    )


def check_limits(jobs: pd.DataFrame, limits: NodeLimits) -> None:
    """Raise :class:`PlanError` for the first job past ``limits`` (GPU memory, RAM, hours) or a
    grid past the disk, naming rule, job, resource, estimate and the config key to change."""
    checks = (
        ("gpu", limits.gpu_gb * GB, "GPU memory", f"{limits.gpu_gb:g} GB"),
        ("ram", limits.ram_gb * GB, "host RAM", f"{limits.ram_gb:g} GB"),
        ("seconds", limits.job_hours * 3600, "time", f"{limits.job_hours:g} h"),
    )
    for column, limit, resource, shown_limit in checks:
        problem = _job_over(jobs, column, limit, resource, shown_limit, "the node's")
        if problem:
            raise PlanError(problem)
    total = disk_bytes(jobs)
    if total > limits.disk_tb * 1e12:
        raise PlanError(_disk_message(jobs, f"{total / 1e12:.2f} TB",
                                      f"past the node's {limits.disk_tb:g} TB"))  # fmt: skip


def machine_memory_bytes() -> int:
    """This machine's memory as a process sees it: physical RAM, or a lower cgroup limit."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = Path("/sys/fs/cgroup/memory.max")
    value = limit.read_text().strip() if limit.is_file() else ""  # "max": no limit
    return min(total, int(value)) if value.isdigit() else total


def _bytes_under(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def machine_problem(jobs: pd.DataFrame, results: str | Path, *, local: bool) -> str | None:
    """Why a run of ``jobs`` cannot finish here, or None. What is known for certain before any job:
    the bytes the grid writes against the free space of the file system ``results`` lies on plus
    what ``results`` holds already (a rerun rewrites only what is missing, so this never refuses a
    grid that fits), and, for jobs that run on this machine (``local``), each job's planned host
    RAM against its memory (:func:`machine_memory_bytes`). A node's limits and a job's time are
    :func:`check_limits`' (``make run``, ``python -m trainmap.plan --check``)."""
    if jobs.empty:  # a config of external run sets only: nothing the plan sizes
        return None
    results = Path(results)
    if local:
        memory = machine_memory_bytes()
        problem = _job_over(jobs, "ram", memory, "host RAM", f"{memory / GB:.1f} GB",
                            "this machine's")  # fmt: skip
        if problem:
            return problem
    total = disk_bytes(jobs)
    existing = next((p for p in (results, *results.resolve().parents) if p.exists()), Path("/"))
    free = shutil.disk_usage(existing).free
    if total <= free:
        return None
    held = _bytes_under(results) if results.is_dir() else 0
    if total <= free + held:
        return None
    room = (f"and {existing} has {free / GB:,.1f} GB free ({held / GB:,.1f} GB already in "
            f"{results})")  # fmt: skip
    return f"{_disk_message(jobs, f'{total / GB:,.1f} GB', room)}, or set results: to a larger disk"


def format_plan(jobs: pd.DataFrame, limits: NodeLimits) -> str:
    """The plan as text: per rule totals, the grid's totals against ``limits``, the sources."""
    totals = rule_totals(jobs)
    lines = [totals.to_string(float_format=lambda v: f"{v:,.3g}")]
    lines.append(
        f"total: {len(jobs)} jobs, disk {disk_bytes(jobs) / 1e12:.3f} TB of {limits.disk_tb:g} TB; "
        f"largest job: RAM {jobs['ram'].max() / GB:.1f} of {limits.ram_gb:g} GB, GPU "
        f"{jobs['gpu'].max() / GB:.1f} of {limits.gpu_gb:g} GB, "
        f"{jobs['seconds'].max() / 3600:.2f} of {limits.job_hours:g} h; all jobs one after "
        f"another {jobs['seconds'].sum() / 3600:.1f} h"
    )
    fetching = jobs[jobs["download"] > 0] if "download" in jobs else jobs.iloc[:0]
    if len(fetching):
        lines.append(
            f"download from the Hub: {fetching['download'].sum() / GB:,.2f} GB in {len(fetching)} "
            f"jobs; a job holds at most {fetching['scratch'].max() / GB:,.2f} GB of weights at "
            "once (its revisions in flight; deleted once measured, unless keep_weights)"
        )
    lines.append("where the numbers come from (the largest job of each rule):")
    for rule in totals.index:
        job = jobs[jobs["rule"] == rule].sort_values("seconds").iloc[-1]
        lines.append(f"  {rule} ({job['job']}):")
        for label, column in (
            ("bytes", "bytes_from"),
            ("memory", "memory_from"),
            ("time", "time_from"),
        ):
            lines.append(f"    {label}: {job[column]}")
    return "\n".join(lines)
