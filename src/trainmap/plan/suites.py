"""The plan of the suites a study fetches from the Hub (external sets with ``hub.fetch``).

Each run's revisions come in jobs of ``hub.revisions_per_job`` (rule ``external_revisions``): a
job downloads its revisions (``fetch_jobs`` ahead), measures each and deletes it. Its plan
(:func:`fetched_suite_jobs`): the download (the revisions' bytes), the disk it holds at once (its
revisions in flight: ``scratch``; every fetched revision with ``keep_weights``), its rows, its
memory (:func:`trainmap.grid.external.memory_mb` of the largest revision) and its time
(:func:`block_seconds`, from :data:`~trainmap.plan.assumptions.SUITE_SOURCE`); then the set's
``external_map``, sized as the grid's maps are (:func:`~trainmap.plan.jobplan.map_job`). The
revisions and their sizes come from the set's ``revisions.json`` once ``trainmap resolve`` wrote
it, else from the config alone, offline: each step listed, times the seeds, each ``parameters`` x
``dtype`` bytes (:func:`suite_revisions`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainmap.grid.external_hub import DTYPE_BYTES
from trainmap.plan.assumptions import (
    HUB_BYTES_PER_S,
    HUB_REVISION_S,
    MEASURED_REVISIONS,
    STARTUP_S,
    SUITE_ROW_BYTES,
    SUITE_SOURCE,
)
from trainmap.plan.jobplan import MIN_MINUTES, SAFETY_FACTOR, JobPlan, PlanError, map_job


def measure_seconds(parameters: float) -> float:
    """Seconds to read and measure one revision of ``parameters`` parameters: the power law
    through :data:`~trainmap.plan.assumptions.MEASURED_REVISIONS`."""
    (small, small_s), (large, large_s) = MEASURED_REVISIONS
    exponent = math.log(large_s / small_s) / math.log(large / small)
    return small_s * (max(parameters, 1.0) / small) ** exponent


def block_seconds(sizes: Sequence[int], bytes_per_parameter: int) -> float:
    """One ``external_revisions`` job's time: start-up, then each revision of ``sizes`` bytes
    (``bytes_per_parameter`` each: the ``hub.dtype``'s) downloaded, read and measured
    (:data:`~trainmap.plan.assumptions.SUITE_SOURCE`)."""
    return STARTUP_S + sum(HUB_REVISION_S + size / HUB_BYTES_PER_S
                           + measure_seconds(size / bytes_per_parameter) for size in sizes)  # fmt: skip


def block_runtime_minutes(sizes: Sequence[int], dtype: str) -> int:
    """The scheduler's ``runtime`` (minutes) of an ``external_revisions`` job of revisions of
    ``sizes`` bytes stored in ``dtype``: :func:`block_seconds` times the plan's safety factor, at
    least its minimum."""
    seconds = block_seconds(sizes, DTYPE_BYTES[dtype])
    return max(MIN_MINUTES, math.ceil(seconds * SAFETY_FACTOR / 60))


def suite_revisions(
    config: Mapping[str, Any], spec: Mapping[str, Any], where: str, base_dir: str | Path
) -> tuple[dict[str, dict[int, int]], str]:
    """Fetched set ``spec``'s run -> step -> revision bytes, and where they come from: its
    ``revisions.json`` when ``trainmap resolve`` wrote it for these settings, else the config
    (every step listed one by one; ``parameters`` x ``dtype``). Raises :class:`PlanError` naming
    the key when the config cannot say."""
    from trainmap.dynamics.runs.hub import run_name
    from trainmap.grid.external_hub import (
        SuiteNotResolved,
        configured_size,
        fetch_setting,
        fetched_set_manifest,
        hub_spec,
        revision_sizes,
    )

    try:
        manifest = fetched_set_manifest(config, spec, base_dir)
    except SuiteNotResolved:
        manifest = None
    if manifest is not None:
        return revision_sizes(manifest, spec), (
            "size-based: each revision's safetensors header (revisions.json; else parameters x "
            "dtype)"
        )
    hub = hub_spec(spec["hub"], base_dir)
    ranges = [f"{lo}-{hi}" for lo, hi in hub.steps if lo != hi]
    if not hub.steps or ranges:
        raise PlanError(f"config key {where}.hub.steps: {', '.join(ranges) or 'left out'}: the plan counts a "
                        "suite's revisions offline only when each step is listed (0,1000,2000); "
                        "list them, or run `trainmap resolve` first (it lists them on the Hub)")  # fmt: skip
    size = configured_size(spec)
    if size is None:
        raise PlanError(f"config key {where}.hub.parameters: not given, so the plan cannot size the suite's "
                        "checkpoints offline; give the model's parameter count (e.g. 14067712 for "
                        "pythia-14m), or run `trainmap resolve` first")  # fmt: skip
    parameters = spec["hub"]["parameters"]
    sizes = {run_name(hub.repo, seed): {lo: size for lo, _ in hub.steps}
             for seed in hub.seeds or (None,)}  # fmt: skip
    return sizes, (f"size-based: {int(parameters):,} parameters x {fetch_setting(spec, 'dtype')} "
                   "a revision (config; not resolved yet)")  # fmt: skip


def fetched_checkpoints(
    config: Mapping[str, Any], base_dir: str | Path | None = None
) -> dict[str, int]:
    """Fetched set name -> its runs' checkpoints in all (what a joint comparison pooling it
    fits); a set the config cannot size counts none here (its own jobs name the key)."""
    from trainmap.grid.external import is_hub_set
    from trainmap.grid.external_hub import is_fetched

    counted = {}
    for index, spec in enumerate(config.get("external") or []):
        if is_hub_set(spec) and is_fetched(spec):
            try:
                runs, _ = suite_revisions(
                    config, spec, f"external[{index}]", base_dir or Path.cwd()
                )
            except PlanError:
                continue
            counted[spec["name"]] = sum(len(steps) for steps in runs.values())
    return counted


def fetched_suite_jobs(
    config: Mapping[str, Any], base_dir: str | Path | None = None
) -> list[JobPlan]:
    """One :class:`~trainmap.plan.jobplan.JobPlan` per ``external_revisions`` job of every
    fetched set (``download``: the bytes it fetches); ``base_dir``: the project (None: the
    working directory, as ``trainmap resolve`` and the workflow take it)."""
    from trainmap.grid.external import is_hub_set, memory_mb
    from trainmap.grid.external_hub import fetch_setting, is_fetched, revision_blocks

    plans = []
    for index, spec in enumerate(config.get("external") or []):
        if not (is_hub_set(spec) and is_fetched(spec)):
            continue
        where = f"external[{index}]"
        runs, source = suite_revisions(config, spec, where, base_dir or Path.cwd())
        per_job = int(fetch_setting(spec, "revisions_per_job"))
        in_flight = int(fetch_setting(spec, "fetch_jobs"))
        keep = bool(fetch_setting(spec, "keep_weights"))
        keys = (f"{where}.hub.revisions_per_job", f"{where}.hub.steps")
        for run, blocks in revision_blocks(runs, per_job).items():
            for block, block_steps in enumerate(blocks):
                part = [runs[run][step] for step in block_steps]
                plans.append(JobPlan(
                    "external_revisions", f"{spec['name']}/{run}/{block}", 1, "cpu",
                    len(part) * SUITE_ROW_BYTES + (sum(part) if keep else 0),
                    0.0 if keep else in_flight * max(part), memory_mb(max(part)) * 2**20, 0.0,
                    block_seconds(part, DTYPE_BYTES[str(fetch_setting(spec, "dtype"))]),
                    f"{source}; rows of {SUITE_ROW_BYTES:,} B"
                    + (", the weights kept (keep_weights)" if keep else
                       f"; {in_flight} revision(s) on disk at once (fetch_jobs)"),
                    "measured: 1.5 GB + 1.5x the largest revision (trainmap.grid.external.memory_mb)",
                    SUITE_SOURCE, keys, download=float(sum(part)),
                ))  # fmt: skip
        observations = sum(len(steps) for steps in runs.values())
        plans.append(map_job(config, "external_map", spec["name"], len(runs), observations,
                             keys=("analysis.bootstrap", f"{where}.hub.steps")))  # fmt: skip
    return plans
