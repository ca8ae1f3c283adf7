"""One job's plan (:class:`JobPlan`), the error of a plan past a node (:class:`PlanError`) and
what a scheduler is asked for on top of a plan; :mod:`.estimates` (the grid's jobs) and
:mod:`.suites` (a fetched suite's jobs) both build on these."""

from __future__ import annotations

from dataclasses import dataclass

#: Resources requested from a scheduler are the plan's estimate times this, once, for every rule:
#: the FLOP-based times hold to ~2x (bench/plan_accuracy.py), and a job past its request is killed.
SAFETY_FACTOR = 1.5
#: The smallest requests (a job's start-up alone: importing torch and MLflow).
MIN_MEMORY_MB = 1000
MIN_MINUTES = 5


class PlanError(ValueError):
    """A plan past the limits of the node it was given; the message names the rule, the job, the
    resource, the estimate and the config key to change."""


@dataclass
class JobPlan:
    """One job's plan: bytes it leaves on disk (``bytes``), its transient disk use (``scratch``),
    peak host RAM and GPU memory (bytes), seconds, and where each estimate comes from."""

    rule: str
    job: str
    seeds: int
    device: str
    bytes: float
    scratch: float
    ram: float
    gpu: float
    seconds: float
    bytes_from: str
    memory_from: str
    time_from: str
    #: The config keys that change this job's size and time (named by a limit's error).
    keys: tuple[str, ...] = ()
    #: Bytes it downloads (a suite fetched from the Hub: :mod:`trainmap.plan.suites`).
    download: float = 0.0


def small_job(
    rule: str, job: str, seeds: int, bytes_: float, ram: float, seconds: float,
    bytes_from: str, memory_from: str, time_from: str, keys: tuple[str, ...] = (),
) -> JobPlan:  # fmt: skip
    """A CPU job's plan from its three numbers and their sources."""
    return JobPlan(rule, job, seeds, "cpu", bytes_, 0.0, ram, 0.0, seconds, bytes_from,
                   memory_from, time_from, keys)  # fmt: skip
