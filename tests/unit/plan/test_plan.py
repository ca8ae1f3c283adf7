"""trainmap.plan: one row per rule, sources named, limits refused with the key to change, archive
bytes counted exactly, and the paper's and the 1,000-seed configs within one node."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from trainmap import grid, plan
from trainmap.grid import SeedRange
from trainmap.training.archive import ArchivePolicy, checkpoint_steps

REPO = Path(__file__).resolve().parents[3]
SOURCES = ("measured: ", "FLOP-based: ", "size-based: ", "assumed: ")
PAPER_CONFIGS = ["config/paper.yaml", *sorted(p.relative_to(REPO).as_posix()
                                                for p in (REPO / "config/paper").glob("*.yaml"))]  # fmt: skip


@pytest.fixture(autouse=True)
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


@pytest.fixture(scope="module")
def smoke() -> dict:
    return plan.load_plan_config(["config/smoke.yaml"])


def test_smoke_plan_has_one_row_per_rule_and_says_where_each_number_comes_from(smoke: dict) -> None:
    jobs = plan.plan_jobs(smoke)
    totals = plan.rule_totals(jobs)
    assert list(totals.index) == list(dict.fromkeys(jobs["rule"]))
    assert {"data", "gradinit", "train", "sparse_retrain", "reparam", "quantize", "evaluate",
            "collect_metrics", "fit_hmm", "joint_comparison"} <= set(totals.index)  # fmt: skip
    assert totals.loc["train", "jobs"] == 4  # parity kaiming + gradinit, digits vgg_bn + repvgg
    for column in ("bytes_from", "memory_from", "time_from"):
        assert jobs[column].str.startswith(SOURCES).all(), jobs[column]
    assert (jobs[["bytes", "ram", "seconds"]] > 0).all().all()
    assert (jobs["gpu"] == 0).all()  # the smoke grid trains on the CPU


def test_a_plan_past_the_node_names_rule_job_resource_and_key(smoke: dict) -> None:
    jobs = plan.plan_jobs(smoke)
    with pytest.raises(plan.PlanError, match=r"rule \w+, job .*host RAM .* GB planned .*change "):
        plan.check_limits(jobs, plan.NodeLimits(ram_gb=0.5))
    with pytest.raises(plan.PlanError, match=r"time .* h planned .*train\.\w+\.seed_block"):
        plan.check_limits(jobs.query("rule == 'train'"), plan.NodeLimits(job_hours=1e-4))
    with pytest.raises(plan.PlanError, match=r"disk: .*archive"):
        plan.check_limits(jobs.query("rule == 'train'"), plan.NodeLimits(disk_tb=1e-9))


def test_a_run_is_held_to_this_machines_memory_and_free_disk(
    smoke: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workflow's onstart check: what cannot finish here, before any job; files already in
    the results directory count as room (a rerun rewrites only what is missing)."""
    jobs = plan.plan_jobs(smoke)
    total = int(plan.disk_bytes(jobs))
    results = tmp_path / "results"
    monkeypatch.setattr("trainmap.plan.report.machine_memory_bytes", lambda: 64 * 2**30)
    free = {"bytes": total + 1}
    monkeypatch.setattr("shutil.disk_usage", lambda path: type("U", (), {"free": free["bytes"]}))
    assert plan.machine_problem(jobs, results, local=True) is None
    free["bytes"] = total // 2
    problem = plan.machine_problem(jobs, results, local=True)
    assert problem.startswith("disk: the grid writes") and f"{tmp_path} has" in problem
    assert "change train." in problem and "archive" in problem
    results.mkdir()  # a rerun: what the results hold already makes room
    (results / "done.bin").write_bytes(b"0" * (total - total // 2))
    assert plan.machine_problem(jobs, results, local=True) is None
    monkeypatch.setattr("trainmap.plan.report.machine_memory_bytes", lambda: 2**20)
    problem = plan.machine_problem(jobs, results, local=True)
    assert re.match(r"rule \w+, job .*: host RAM .* GB planned .*exceeds this machine's 0\.0 GB; "
                    r"change ", problem), problem  # fmt: skip
    assert plan.machine_problem(jobs, results, local=False) is None  # cluster nodes: not this one
    assert plan.machine_problem(jobs.iloc[0:0].loc[:, []], results, local=True) is None  # no grid


def test_the_command_exits_non_zero_past_the_limits(capsys: pytest.CaptureFixture) -> None:
    assert plan.main(["--configfile", "config/smoke.yaml", "--node-ram-gb", "0.5"]) == 1
    assert "host RAM" in capsys.readouterr().err
    assert plan.main(["--configfile", "config/smoke.yaml"]) == 0
    assert "fits the node" in capsys.readouterr().out
    # --check (make run's first step): one line, or the refusal naming the key
    assert plan.main(["--configfile", "config/smoke.yaml", "--check"]) == 0
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and "jobs" in out and "GB written; fits the node" in out
    assert (
        plan.main(["--configfile", "config/smoke.yaml", "--check", "--node-disk-tb", "1e-9"]) == 1
    )
    refused = capsys.readouterr()
    assert not refused.out and "does not fit the node: disk: " in refused.err
    assert "archive" in refused.err


def test_the_check_holds_gpu_jobs_to_this_machines_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --node-gpu-gb the limit is this machine's largest GPU (nvidia-smi): a block that
    does not fit it is refused before any job, naming the key."""
    smoke = yaml.safe_load((REPO / "config/smoke.yaml").read_text())
    smoke["train"]["sparse_parity"]["device"] = "cuda"
    on_gpu = tmp_path / "gpu.yaml"
    on_gpu.write_text(yaml.safe_dump(smoke))
    monkeypatch.setattr("trainmap.plan.cli.node_gpus", lambda: [(0, 500), (1, 400)])  # 0.5 GB
    assert plan.main(["--configfile", str(on_gpu), "--check"]) == 1
    refused = capsys.readouterr().err
    assert "GPU memory" in refused and "0.5 GB" in refused and "seed_block" in refused
    monkeypatch.setattr("trainmap.plan.cli.node_gpus", lambda: [])  # none here: a cluster node's
    assert plan.main(["--configfile", str(on_gpu), "--check"]) == 0


@pytest.mark.parametrize("archive", [None, {"schedule": "every 3", "dtype": "bfloat16"},
                                     {"schedule": "log 5", "dtype": "float16"},
                                     {"schedule": "none"}])  # fmt: skip
def test_archive_bytes_are_kept_checkpoints_times_state_times_dtype(smoke: dict, archive) -> None:
    profile = plan.model_profile(smoke, "sparse_parity", "mlp")
    assert (
        profile.int_state_bytes == 0
        and profile.n_state == profile.n_params == 40 * 128 + 128 + 128 * 2 + 2
    )
    steps = checkpoint_steps(300, 25)
    policy = ArchivePolicy.from_value(archive)
    dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}[policy.dtype]
    expected = len(policy.kept_steps(steps)) * profile.n_params * dtype_bytes
    assert plan.archive_bytes(profile, len(steps), policy) == expected
    settings = {**grid.with_train_defaults({"steps": 300, "checkpoint_every": 25})}
    if archive is not None:
        settings["archive"] = archive
    block = SeedRange("sparse_parity", "mlp", "kaiming", 0, 1, (0, 1))
    job = plan.training_job(smoke, "train", block, settings, "train.sparse_parity")
    tables = len(steps) * (120 + 3 * 16 * 20) + 2000
    assert job.bytes == 2 * (expected + profile.state_bytes + tables)


def test_a_bad_archive_schedule_names_the_key(smoke: dict) -> None:
    with pytest.raises(plan.PlanError, match=r"train\.sparse_parity\.archive\.schedule"):
        plan.archive_policy({"archive": {"schedule": "log"}}, "train.sparse_parity")


def test_resources_come_from_the_plan_with_the_safety_factor(smoke: dict) -> None:
    block = SeedRange("sparse_parity", "mlp", "kaiming", 0, 1, (0, 1))
    job = plan.training_job(smoke, "train", block, smoke["train"]["sparse_parity"],
                            "train.sparse_parity")  # fmt: skip
    resources = plan.job_resources(smoke, "train", block)
    assert resources["mem_mb"] >= job.ram * plan.SAFETY_FACTOR / 1e6
    assert resources["runtime"] >= plan.MIN_MINUTES and resources["gpu"] == 0
    evaluate = plan.job_resources(smoke, "evaluate", block)
    assert evaluate["mem_mb"] >= plan.MIN_MEMORY_MB
    assert resources["gpu_mem_mb"] == 0  # a CPU job reserves no device memory
    on_gpu = {**smoke, "train": {**smoke["train"],
                                 "sparse_parity": {**smoke["train"]["sparse_parity"], "device": "cuda"}}}  # fmt: skip
    gpu_job = plan.training_job(on_gpu, "train", block, on_gpu["train"]["sparse_parity"],
                                "train.sparse_parity")  # fmt: skip
    gpu_resources = plan.job_resources(on_gpu, "train", block)
    assert gpu_resources["gpu"] == 1
    # evaluation runs where training did: a GPU job; without the CPU latency probe it is shorter
    evaluate_on_gpu = plan.block_job(on_gpu, "evaluate", block)
    assert evaluate_on_gpu.device == "cuda" and evaluate_on_gpu.gpu > 0
    assert plan.job_resources(on_gpu, "evaluate", block)["gpu"] == 1
    no_latency = {**on_gpu, "evaluate": {**on_gpu["evaluate"], "sparse_parity": {
        **on_gpu["evaluate"]["sparse_parity"], "latency": "none"}}}  # fmt: skip
    assert plan.block_job(no_latency, "evaluate", block).seconds < evaluate_on_gpu.seconds
    assert gpu_resources["gpu_mem_mb"] >= gpu_job.gpu * plan.SAFETY_FACTOR / 1e6 > 0


def test_an_omitted_stage_or_probe_setting_is_planned_at_the_schemas_default(smoke: dict) -> None:
    """A task whose gradinit settings leave out iterations and batch_size, or whose evaluate
    settings leave out the latency probe, is planned as the jobs run it: at the schema's defaults
    (GradInit's 390 iterations of 128, the probe's 256 x 20), not at numbers of the plan's own."""
    from trainmap.schema import section_defaults

    block = SeedRange("sparse_parity", "mlp", "gradinit", 0, 1, (0, 1))
    omitted = {**smoke, "gradinit": {"sparse_parity": {}}}
    defaults = section_defaults("gradinit")
    stated = {**smoke, "gradinit": {"sparse_parity": {
        "iterations": defaults["iterations"], "batch_size": defaults["batch_size"]}}}  # fmt: skip
    assert defaults["iterations"] == 390
    assert plan.block_job(omitted, "gradinit", block).seconds == pytest.approx(
        plan.block_job(stated, "gradinit", block).seconds
    )
    probe = section_defaults("evaluate")
    assert (probe["latency_batch"], probe["latency_repeats"]) == (256, 20)
    evaluate = {task: {"threshold": settings["threshold"]}
                for task, settings in smoke["evaluate"].items()}  # fmt: skip
    spelled = {task: {"threshold": settings["threshold"], "latency_batch": 256,
                      "latency_repeats": 20} for task, settings in smoke["evaluate"].items()}  # fmt: skip
    assert plan.block_job({**smoke, "evaluate": evaluate}, "evaluate", block).seconds == (
        plan.block_job({**smoke, "evaluate": spelled}, "evaluate", block).seconds
    )


@pytest.mark.slow  # in-process, seconds
@pytest.mark.parametrize("config", [*PAPER_CONFIGS, "config/sparse_parity_1000.yaml"])
def test_paper_settings_and_the_1000_seed_study_fit_one_node(config: str) -> None:
    loaded = plan.load_plan_config([config])
    jobs = plan.plan_jobs(loaded)
    plan.check_limits(jobs, plan.NodeLimits(gpu_gb=80, ram_gb=128, disk_tb=1, job_hours=24))


def _profile(**counts: float) -> plan.ModelProfile:
    base = dict(n_params=0, n_state=0, int_state_bytes=0, state_bytes=0, forward_flops=0.0,
                saved_bytes=0.0, widest_bytes=0.0, svd_flops=0.0, input_bytes=0, linear_only=False)  # fmt: skip
    return plan.ModelProfile(**{**base, **counts})


def test_cpu_checkpoint_and_step_costs_reproduce_their_measurements() -> None:
    # Streamed metrics per checkpoint (the loop's metrics_s): ResNet-18 ~2 s a seed, the
    # 40-seed sparse-parity MLP ~0.05 s, an 8-seed digits RepVGG 0.06-0.08 s.
    resnet18 = _profile(svd_flops=19.5e9, n_matrices=21)
    assert 1.5 < plan.CPU.metrics_seconds(resnet18, 1) < 3.0
    mlp = _profile(svd_flops=821248.0, n_matrices=2, n_tensors=4, linear_only=True)
    assert 0.03 < plan.CPU.metrics_seconds(mlp, 40) < 0.08
    repvgg = _profile(svd_flops=8.49e6, n_matrices=15, n_tensors=50, forward_flops=503040.0)
    assert 0.04 < plan.CPU.metrics_seconds(repvgg, 8) < 0.12
    # An 8-seed RepVGG step at batch 128 took 0.2 s here: overhead-bound as much as FLOP-bound.
    step = plan.CPU.step_seconds(repvgg, 8) + 3 * 503040 * 128 * 8 / plan.CPU.flops_per_s(repvgg)
    assert 0.1 < step < 0.3 and plan.CPU.step_seconds(repvgg, 8) > 0.1 * step
    assert plan.CPU.flops_per_s(mlp) > plan.CPU.flops_per_s(repvgg)
    # Archive: ~0.8 ms a 22 kB MLP file.
    assert 0.5e-3 < plan.CPU.archive_seconds(1, 22024) < 2e-3


def test_a_profile_is_measured_once_per_project_and_code(
    smoke: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a profile directory (the Snakefile's), a later process reads the profile it kept
    instead of building the model again; other code, or a damaged file, measures it again."""
    from trainmap.plan import profile as profiles

    measured = []
    measure = profiles._measure
    monkeypatch.setattr(profiles, "_measure", lambda *args: measured.append(args) or measure(*args))
    monkeypatch.setattr(profiles, "_PROFILE_DIRECTORY", [None])
    profiles._profile.cache_clear()
    monkeypatch.setattr(profiles, "_profile", profiles._profile.__wrapped__)  # a new process each
    plan.set_profile_directory(tmp_path)
    first = plan.model_profile(smoke, "sparse_parity", "mlp")
    (kept,) = tmp_path.iterdir()
    assert plan.model_profile(smoke, "sparse_parity", "mlp") == first and len(measured) == 1

    kept.write_text(kept.read_text()[:20])  # a writer killed half-way
    assert plan.model_profile(smoke, "sparse_parity", "mlp") == first and len(measured) == 2
    assert plan.model_profile(smoke, "sparse_parity", "mlp") == first and len(measured) == 2

    wider = {**smoke, "model": {"sparse_parity": {"mlp": {"hidden": [256]}}}}
    assert plan.model_profile(wider, "sparse_parity", "mlp").n_params > first.n_params
    assert len(measured) == 3 and len(list(tmp_path.iterdir())) == 2

    monkeypatch.setattr(profiles, "_code_digest", lambda: "other code")
    assert plan.model_profile(smoke, "sparse_parity", "mlp") == first and len(measured) == 4

    plan.set_profile_directory(None)
    assert plan.model_profile(smoke, "sparse_parity", "mlp") == first and len(measured) == 5
    assert len(list(tmp_path.iterdir())) == 3


def test_a_plugin_architecture_is_profiled_in_each_process(
    smoke: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trainmap's code digest does not cover a plugin's code: its profiles are never kept."""
    from trainmap.models import registry
    from trainmap.plan import profile as profiles

    monkeypatch.setattr(registry, "ARCHITECTURES", registry.ARCHITECTURES.copy())
    spec = registry.ARCHITECTURES["mlp"]
    registry.ARCHITECTURES.unregister("mlp")
    registry.ARCHITECTURES.register("mlp", spec, "my_lab.models")
    monkeypatch.setattr(profiles, "_PROFILE_DIRECTORY", [tmp_path])
    assert profiles._disk_key('{"kind": "sparse_parity"}', "mlp", "{}") is None
    profiles._profile.__wrapped__(json_of(grid.data_settings(smoke, "sparse_parity")), "mlp",
                                  json_of(grid.model_settings(smoke, "sparse_parity", "mlp")))  # fmt: skip
    assert not any(tmp_path.iterdir())


def json_of(settings) -> str:
    import json

    return json.dumps(settings, sort_keys=True)


def test_a_kept_profile_is_named_after_the_data_file_it_read(tmp_path: Path) -> None:
    """An arrays data set is read for its shapes: rewritten, it gives another profile file."""
    import json
    import os

    from trainmap.plan import profile as profiles

    data = tmp_path / "data.npz"
    data.write_bytes(b"x" * 10)
    settings = json.dumps({"kind": "arrays", "path": str(data)}, sort_keys=True)
    first = profiles._disk_key(settings, "mlp", "{}")
    assert first == profiles._disk_key(settings, "mlp", "{}")
    data.write_bytes(b"y" * 20)
    os.utime(data, ns=(1, 1))
    assert profiles._disk_key(settings, "mlp", "{}") not in (None, first)
