"""Integration: the smoke grid through `--profile profiles/slurm` on a real single-node SLURM.

profiles/slurm/local_cluster.sh starts munge, slurmctld and slurmd (installing Debian's slurm-wlm
and munge when missing); every job goes through sbatch; the jobs log to an `mlflow server` over HTTP,
as jobs on a cluster must. Skipped, with the reason, only where SLURM cannot run here (not root, or
neither SLURM nor apt-get).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from conftest import (
    REPO_ROOT,
    MlflowServer,
    copy_workflow,
    dry_run_job_counts,
    run_command,
    snakemake,
)

from .test_workflow import cells_of_block_rules

pytestmark = pytest.mark.integration

SCRIPT = REPO_ROOT / "profiles/slurm/local_cluster.sh"
SMOKE = "config/smoke.yaml"
#: Snakemake with the SLURM executor's status checks at a fixed pause (the plugin lengthens it by
#: 10 s after each check that finds no job finished, up to 180 s: fixed_status_checks.py).
FIXED_STATUS_CHECKS = Path(__file__).parent / "fixed_status_checks.py"


def slurm_snakemake(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    """``snakemake ARGS`` through :data:`FIXED_STATUS_CHECKS`, with this environment's
    interpreter."""
    return run_command([sys.executable, str(FIXED_STATUS_CHECKS), *args], cwd=cwd, **kwargs)


def slurm_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "starting SLURM daemons needs root"
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        return "neither SLURM nor apt-get (to install Debian's slurm-wlm) is available"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("slurm")
    started = subprocess.run([str(SCRIPT), "start", str(directory)], capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    if started.returncode != 0:
        pytest.fail(f"the local cluster did not start:\n{started.stdout}\n{started.stderr}")
    yield directory
    subprocess.run([str(SCRIPT), "stop", str(directory)], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def slurm_run(cluster, tmp_path_factory):
    """The smoke grid through the SLURM profile, logging to an MLflow server; returns its dir."""
    server = MlflowServer(tmp_path_factory.mktemp("slurm-mlflow"))
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm-run"))
    (workdir / "server.yaml").write_text(
        f"mlflow:\n  tracking_uri: {server.uri}\n  experiment: slurm-smoke\n"
    )
    env = {"SLURM_CONF": str(cluster / "slurm.conf")}
    configs = ["--configfile", SMOKE, "server.yaml"]
    try:
        planned = snakemake("-n", "--cores", "2", *configs, cwd=workdir, **env)
        (workdir / "planned_jobs.json").write_text(json.dumps(dry_run_job_counts(planned.stdout)))
        started = time.monotonic()
        slurm_snakemake(
            "--profile", "profiles/slurm", *configs,
            "--slurm-status-command", "squeue", "--slurm-no-account",
            "--slurm-init-seconds-before-status-checks", "1",
            "--seconds-between-status-checks", "2",
            "--default-resources", "slurm_partition=debug", "mem_mb=1000", "runtime=30",
            "--jobs", "4", cwd=workdir, timeout=1800, **env,
        )  # fmt: skip
        (workdir / "wall_time_s").write_text(f"{time.monotonic() - started:.1f}")
        yield workdir, server.uri
    finally:
        server.stop()


def test_every_output_exists_and_jobs_went_through_sbatch(slurm_run, cluster):
    workdir, _ = slurm_run
    table = pd.read_csv(workdir / "results/summary/evaluation.csv")
    assert len(table) == 8 and (table["status"] == "completed").all()
    assert (workdir / "results/joint/parity_init/joint.json").exists()
    assert (workdir / "results/hmm/sparse_parity/mlp/kaiming/map.png").exists()
    planned = json.loads((workdir / "planned_jobs.json").read_text())
    submitted, succeeded = _controller_job_ids(cluster / "log/slurmctld.log")
    local = sum(count for rule, count in planned.items() if rule.startswith("all"))
    assert len(submitted) >= sum(planned.values()) - local, (len(submitted), planned)
    assert submitted <= succeeded, f"jobs that did not exit 0: {sorted(submitted - succeeded)}"
    print(f"SLURM smoke grid: {sum(planned.values())} jobs, {len(submitted)} sbatch submissions, "
          f"{(workdir / 'wall_time_s').read_text()} s")  # fmt: skip


def _submitted_jobs(output: str) -> dict[str, str]:
    """SLURM job id -> rule of every job Snakemake's SLURM executor submitted with sbatch."""
    found = re.findall(r"submitted with SLURM jobid (\d+) \(log: \S+/rule_(\w+)/", output)
    return dict(found)


def _controller_job_ids(log: Path) -> tuple[set[str], set[str]]:
    """Job ids slurmctld accepted from sbatch, and those that exited 0.

    Submissions are counted rather than `sched: Allocate` lines: a job the backfill scheduler
    starts is logged as `sched/backfill: ... Started JobId=` instead, so allocations undercount.
    """
    text = log.read_text()
    submitted = set(re.findall(r"_slurm_rpc_submit_batch_job: JobId=(\d+)", text))
    succeeded = set(re.findall(r"_job_complete: JobId=(\d+) WEXITSTATUS 0", text))
    return submitted, succeeded


def test_every_job_is_an_mlflow_run_on_the_server(slurm_run):
    from mlflow import MlflowClient

    workdir, uri = slurm_run
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("slurm-smoke")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    rules = pd.Series([r.data.tags["rule"] for r in runs if "rule" in r.data.tags])
    planned = json.loads((workdir / "planned_jobs.json").read_text())
    expected = {rule: count for rule, count in planned.items() if not rule.startswith("all")}
    expected |= cells_of_block_rules(workdir)  # a block job logs one run per cell
    assert rules.value_counts().to_dict() == expected
    assert all(run.info.status == "FINISHED" for run in runs)
    assert not (workdir / "mlflow.db").exists()


def test_profile_declares_what_users_must_set():
    text = (REPO_ROOT / "profiles/slurm/config.yaml").read_text()
    assert "executor: slurm" in text and "CHANGE" in text
    assert "slurm-status-command" in text and "squeue" in text
    assert Path(SCRIPT).stat().st_mode & 0o111, "local_cluster.sh must be executable"


RESNET18_BLOCK = """
data:
  fake_images: {kind: arrays, path: fake_images.npz}
model:
  fake_images:
    resnet_bn: {widths: [64, 128, 256, 512], blocks_per_stage: [2, 2, 2, 2]}
train:
  fake_images: {optimizer: adamw, lr: 0.001, weight_decay: 1.0, batch_size: 4, steps: 4,
                checkpoint_every: 2, resume_every: 2, seed_block: 2,
                archive: {schedule: "log 2", dtype: bfloat16}}
evaluate:
  fake_images: {threshold: 0.5}
grid:
  - {task: fake_images, archs: [resnet_bn], methods: [kaiming], seeds: [0, 1]}
analysis: {joint: [], group_maps: none}
quantize: {methods: []}
"""


def test_a_block_of_a_resnet18_sized_model_trains_through_sbatch(cluster, tmp_path):
    """One block of two ResNet-18 seeds (11.2 M parameters each; fake 16x16 images, a few steps)
    through the SLURM profile: trained in one sbatch job with the memory and runtime the plan
    gives, its metrics streamed at every checkpoint and collected by a second job, its archive
    the sparse bfloat16 schedule it asked for."""
    import numpy as np

    from trainmap.grid import expand_grid, seed_ranges_of
    from trainmap.plan import job_resources

    workdir = copy_workflow(tmp_path / "run")
    generator = np.random.default_rng(0)
    np.savez(workdir / "fake_images.npz",
             x_train=generator.standard_normal((32, 3, 16, 16)).astype(np.float32),
             y_train=generator.integers(0, 100, 32), x_test=generator.standard_normal(
                 (16, 3, 16, 16)).astype(np.float32), y_test=generator.integers(0, 100, 16))  # fmt: skip
    (workdir / "resnet18.yaml").write_text(
        RESNET18_BLOCK.replace("fake_images.npz", str(workdir / "fake_images.npz"))
    )
    configs = ["--configfile", SMOKE, "resnet18.yaml"]
    block = "fake_images/resnet_bn/kaiming/seeds0-1"
    done = slurm_snakemake(
        f"results/metrics/{block}.json", "--profile", "profiles/slurm", *configs,
        "--slurm-status-command", "squeue", "--slurm-no-account",
        "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "2",
        "--default-resources", "slurm_partition=debug", "--jobs", "2", cwd=workdir,
        timeout=1800, SLURM_CONF=str(cluster / "slurm.conf"),
    )  # fmt: skip
    output = done.stdout + done.stderr
    submitted = set(_submitted_jobs(output).values())
    assert {"data", "train", "collect_metrics"} <= submitted, output[-3000:]
    config = yaml.safe_load((workdir / "params.yaml").read_text())
    for path in ("config/config.yaml", SMOKE, "resnet18.yaml"):  # as the Snakefile reads them
        _merge(config, yaml.safe_load((workdir / path).read_text()))
    (train_block,) = seed_ranges_of(config, expand_grid(config))
    planned = job_resources(config, "train", block=train_block)
    assert f"mem_mb={planned['mem_mb']}," in output  # the train job's request: the plan's
    run = workdir / "results/train" / block.rsplit("/", 1)[0] / "seed1"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_00000000.safetensors", "step_00000004.safetensors"]  # fmt: skip
    from trainmap.training.archive import read_checkpoint

    state = read_checkpoint(run / "checkpoints/step_00000004.safetensors")
    assert sum(v.numel() for v in state.values() if v.is_floating_point()) > 11_000_000
    assert {v.dtype for v in state.values() if v.is_floating_point()} == {torch.bfloat16}
    table = pd.read_csv(workdir / "results/metrics" / block.rsplit("/", 1)[0] / "seed1/metrics.csv")
    assert table["step"].tolist() == [0, 2, 4] and table["l2"].notna().all()


def _merge(base: dict, update: dict) -> None:
    """Snakemake's config merge: mappings recursively, everything else replaced."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
