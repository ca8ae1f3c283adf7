"""One job's plan (:class:`JobPlan`), the error of a plan past a node (:class:`PlanError`), what
a scheduler is asked for on top of a plan, and the plan of a training-map job (:func:`map_job`);
:mod:`.estimates` (the grid's jobs) and :mod:`.suites` (a fetched suite's jobs) both build on
these."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainmap import grid
from trainmap.plan.assumptions import (
    ANALYSIS_S_PER_OBSERVATION,
    ANALYSIS_SOURCE,
    BASE_RAM,
    STARTUP_S,
)
from trainmap.schema import section_defaults

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


def map_job(
    config: Mapping[str, Any], rule: str, job: str, runs: int, observations: int,
    fraction: float = 1.0, keys: tuple[str, ...] = ("analysis.bootstrap", "analysis.stability",
                                                     "grid seeds"),
) -> JobPlan:  # fmt: skip
    """A training-map job over ``runs`` runs of ``observations`` checkpoints in all (fit_hmm,
    joint_comparison, paper_map, external_map): memory from the observations x (14 metrics +
    the config's ``analysis.k_max`` states) in float64 x 10 working copies, time scaled from the
    default study's measured joint comparison (x ``fraction`` for lighter rules); ``keys``: the
    config keys that size it."""
    k_max = int({**section_defaults("analysis"), **grid.analysis_settings(config)}["k_max"])
    return small_job(
        rule,
        job,
        runs,
        runs * 5000 + 1e6,
        BASE_RAM + observations * (14 + k_max) * 8 * 10,
        STARTUP_S + fraction * observations * ANALYSIS_S_PER_OBSERVATION,
        "size-based: a few JSON/NPZ/PNG files of the map (~1 MB) + 5 KB a run",
        f"size-based: {observations:,} observations x (14 + {k_max}) x 8 B x 10 copies",
        ANALYSIS_SOURCE + (f" x {fraction}" if fraction != 1 else ""),
        keys,
    )
