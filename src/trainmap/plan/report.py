"""The plan of a grid against one node: per-rule totals, the node's limits (:class:`NodeLimits`,
:func:`check_limits`: a job or the grid past one is a :class:`PlanError` naming the key to change),
against the machine a run starts on (:func:`machine_problem`) and the plan as text
(:func:`format_plan`)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from trainmap.plan.assumptions import GB
from trainmap.plan.estimates import PlanError


@dataclass(frozen=True)
class NodeLimits:
    """One node: GPU memory, host RAM and disk in GB/TB, and a job's wall-time limit in hours."""

    gpu_gb: float = 80.0
    ram_gb: float = 128.0
    disk_tb: float = 1.0
    job_hours: float = 24.0

    def __str__(self) -> str:
        return (f"{self.gpu_gb:g} GB GPU memory, {self.ram_gb:g} GB RAM, {self.disk_tb:g} TB disk, "
                f"{self.job_hours:g} h a job")  # fmt: skip


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


def check_limits(jobs: pd.DataFrame, limits: NodeLimits) -> None:
    """Raise :class:`PlanError` for the first job past ``limits`` (GPU memory, RAM, hours) or a
    grid past the disk, naming rule, job, resource, estimate and the config key to change."""
    checks = (
        ("gpu", limits.gpu_gb * GB, "GPU memory", lambda v: f"{v / GB:.1f} GB", f"{limits.gpu_gb:g} GB"),
        ("ram", limits.ram_gb * GB, "host RAM", lambda v: f"{v / GB:.1f} GB", f"{limits.ram_gb:g} GB"),
        ("seconds", limits.job_hours * 3600, "time", lambda v: f"{v / 3600:.1f} h", f"{limits.job_hours:g} h"),
    )  # fmt: skip
    for column, limit, resource, show, shown_limit in checks:
        over = jobs[jobs[column] > limit]
        if len(over):
            job = over.sort_values(column).iloc[-1]
            source = job["time_from"] if column == "seconds" else job["memory_from"]
            raise PlanError(
                f"rule {job['rule']}, job {job['job']}: {resource} {show(job[column])} planned "
                f"({source}) exceeds the node's {shown_limit}; change {' or '.join(job['keys'])}"
            )
    total = disk_bytes(jobs)
    if total > limits.disk_tb * 1e12:
        by_job = jobs.sort_values("bytes").iloc[-1]
        raise PlanError(
            f"disk: the grid writes {total / 1e12:.2f} TB (largest: rule {by_job['rule']}, job "
            f"{by_job['job']}, {by_job['bytes'] / GB:.1f} GB: {by_job['bytes_from']}) past the "
            f"node's {limits.disk_tb:g} TB; change "
            f"{' or '.join([k for k in by_job['keys'] if 'archive' in k] or by_job['keys'])}"
        )


def machine_memory_bytes() -> int:
    """This machine's memory as a process sees it: physical RAM, or a lower cgroup limit."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = Path("/sys/fs/cgroup/memory.max")
    if limit.is_file() and limit.read_text().strip().isdigit():
        total = min(total, int(limit.read_text()))
    return total


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
        over = jobs[jobs["ram"] > memory]
        if len(over):
            job = over.sort_values("ram").iloc[-1]
            return (f"rule {job['rule']}, job {job['job']}: host RAM {job['ram'] / GB:.1f} GB "
                    f"planned ({job['memory_from']}) exceeds this machine's {memory / GB:.1f} GB; "
                    f"change {' or '.join(job['keys'])}")  # fmt: skip
    total = disk_bytes(jobs)
    existing = next((p for p in (results, *results.resolve().parents) if p.exists()), Path("/"))
    free = shutil.disk_usage(existing).free
    if total <= free:
        return None
    held = _bytes_under(results) if results.is_dir() else 0
    if total <= free + held:
        return None
    by_job = jobs.sort_values("bytes").iloc[-1]
    keys = [k for k in by_job["keys"] if "archive" in k] or list(by_job["keys"])
    return (f"disk: the grid writes {total / GB:,.1f} GB (largest: rule {by_job['rule']}, job "
            f"{by_job['job']}, {by_job['bytes'] / GB:.1f} GB: {by_job['bytes_from']}) and "
            f"{existing} has {free / GB:,.1f} GB free ({held / GB:,.1f} GB already in {results}); "
            f"change {' or '.join(keys)}, or set results: to a larger disk")  # fmt: skip


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
