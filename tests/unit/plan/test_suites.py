"""The plan of suites fetched from the Hub (trainmap.plan.suites): the shipped suite studies are
planned offline from their listed steps and sizes (download, disk held at once, time, jobs), a
resolved suite from its revisions.json, and a suite the config cannot size is refused naming the
key."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainmap import plan
from trainmap.dynamics.runs.hub import HubCheckpoint, Manifest, write_manifest
from trainmap.grid.external_hub import DTYPE_BYTES, hub_manifest_path, hub_spec
from trainmap.plan.assumptions import MEASURED_REVISIONS
from trainmap.plan.suites import fetched_suite_jobs, measure_seconds

REPO = Path(__file__).resolve().parents[3]
#: Each shipped suite study: its sets' runs, revisions a run, parameters and dtype.
SUITES = {
    "config/suites/polypythias-14m.yaml": [(9, 154, 14_067_712, "float16")],
    "config/suites/polypythias-160m-data-vs-weight.yaml": [(9, 20, 162_322_944, "float16"),
                                                          (3, 20, 162_322_944, "float16"),
                                                          (3, 20, 162_322_944, "float16")],
    "config/suites/multiberts.yaml": [(5, 28, 110_106_428, "float32")],
}  # fmt: skip


@pytest.fixture(autouse=True)
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize("path", sorted(SUITES))
def test_each_shipped_suite_is_planned_offline_from_its_steps_and_sizes(path: str) -> None:
    config = plan.load_plan_config([path])
    jobs = plan.plan_jobs(config)
    revisions = jobs[jobs["rule"] == "external_revisions"]
    expected = sum(runs * steps * parameters * DTYPE_BYTES[dtype]
                   for runs, steps, parameters, dtype in SUITES[path])  # fmt: skip
    assert revisions["download"].sum() == expected
    per_job = [spec["hub"]["revisions_per_job"] for spec in config["external"]]
    assert len(revisions) == sum(runs * math.ceil(steps / block) for (runs, steps, _, _), block
                                 in zip(SUITES[path], per_job, strict=True))  # fmt: skip
    # One revision in flight a job: the disk holds the largest revision, not the suite.
    largest = max(parameters * DTYPE_BYTES[dtype] for _, _, parameters, dtype in SUITES[path])
    assert revisions["scratch"].max() == largest
    assert revisions["bytes_from"].str.contains("parameters x float").all()
    assert (jobs["rule"] == "external_map").sum() == len(config["external"])
    plan.check_limits(jobs, plan.NodeLimits())  # one node holds each
    assert "download from the Hub: " in plan.format_plan(jobs, plan.NodeLimits())


def test_a_resolved_suite_is_planned_from_its_revisions_json(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = {"name": "tiny", "hub": {"repo": "org/tiny-seed{seed}", "seeds": "1-2", "steps": "0-100",
                                    "fetch": True, "revisions_per_job": 2, "parameters": 1025}}  # fmt: skip
    config = {"external": [spec]}
    # seed 2's checkpoints are pytorch_model.bin files: no header, so no size (the config's then)
    runs = {f"tiny-seed{seed}": {step: HubCheckpoint(f"org/tiny-seed{seed}", f"step{step}", "c" * 40,
                                                     tmp_path, ("model.safetensors",),
                                                     1000 + step if seed == 1 else None)
                                 for step in (0, 50, 100)} for seed in (1, 2)}  # fmt: skip
    manifest = Manifest("hf://org/tiny-seed{seed}", tmp_path, runs, hub_spec(spec["hub"], tmp_path),
                        "http://127.0.0.1:1")  # fmt: skip
    write_manifest(manifest, hub_manifest_path(config, "tiny", tmp_path))
    revisions = [job for job in fetched_suite_jobs(config) if job.rule == "external_revisions"]
    assert [job.job for job in revisions] == ["tiny/tiny-seed1/0", "tiny/tiny-seed1/1",
                                              "tiny/tiny-seed2/0", "tiny/tiny-seed2/1"]  # fmt: skip
    assert [job.download for job in revisions] == [2050, 1100, 4100, 2050]
    assert all(job.bytes_from.startswith("size-based: each revision's safetensors")
               for job in revisions)  # fmt: skip


def test_a_suite_the_config_cannot_size_is_refused_naming_the_key(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    hub = {"repo": "org/tiny-seed{seed}", "seeds": "1-2", "fetch": True}
    with pytest.raises(plan.PlanError, match=r"external\[0\]\.hub\.steps: 0-1000: the plan counts"):
        fetched_suite_jobs({"external": [{"name": "tiny", "hub": {**hub, "steps": "0-1000"}}]})
    with pytest.raises(plan.PlanError, match=r"external\[0\]\.hub\.parameters: not given"):
        fetched_suite_jobs({"external": [{"name": "tiny", "hub": {**hub, "steps": [0, 1000]}}]})


def test_the_measuring_time_passes_through_both_measured_shapes() -> None:
    for parameters, seconds in MEASURED_REVISIONS:
        assert measure_seconds(parameters) == pytest.approx(seconds)
    assert MEASURED_REVISIONS[0][1] < measure_seconds(50e6) < MEASURED_REVISIONS[1][1]


def test_a_joint_comparison_of_fetched_sets_is_sized_by_their_checkpoints() -> None:
    config = plan.load_plan_config(["config/suites/polypythias-160m-data-vs-weight.yaml"])
    jobs = plan.plan_jobs(config).set_index("job")
    # 9 seeds of pythia-160m and 3 of a variant, 20 revisions each
    for name in ("data_order", "initial_weights"):
        assert jobs.loc[name, "memory_from"].startswith("size-based: 240 observations")


def test_a_suites_map_is_sized_as_the_grids_maps_are_with_its_k_max() -> None:
    """external_map's memory counts the set's checkpoints x (14 metrics + analysis.k_max)."""
    config = plan.load_plan_config(["config/suites/polypythias-14m.yaml"])
    config["analysis"] = {**config.get("analysis", {}), "k_max": 12}
    job = plan.plan_jobs(config).set_index("rule").loc["external_map"]
    observations = 9 * 154
    assert (
        job["memory_from"]
        == f"size-based: {observations:,} observations x (14 + 12) x 8 B x 10 copies"
    )
    assert job["ram"] == plan.BASE_RAM + observations * (14 + 12) * 8 * 10
    assert job["seeds"] == 9
