"""A suite fetched from the Hub in the workflow (config key external, hub.fetch: true), against the
local fake Hub (tests/hub_server.py) and the real huggingface_hub client: ``trainmap resolve``
writes revisions.json from refs and headers; Snakemake runs one external_revisions job per block of
a run's revisions and joins their tables into the tables ``trainmap map hf://... --fetch`` writes;
no weights stay in the cache; a revisions.json missing, or no longer matching the config, stops the
workflow before any job, naming the command that resolves it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import copy_workflow, run_command, snakemake
from hub_server import HubServer

pytest.importorskip("huggingface_hub")

SUITE = "EleutherAI/pythia-tiny-seed{seed}"
RUNS = ["pythia-tiny-seed1", "pythia-tiny-seed2"]


def tiny_suite() -> dict:
    from safetensors.torch import save as safetensors_bytes
    from unit.dynamics.runs.test_hub_cache import weights

    repos = {}
    for seed in (1, 2):
        repo = SUITE.format(seed=seed)
        repos[repo] = {f"step{step}": {"config.json": b"{}",
                                       "model.safetensors": safetensors_bytes(weights(repo, f"step{step}"))}
                       for step in (0, 1, 2)}  # fmt: skip
    return repos


def study(steps: str) -> str:
    return f"""
external:
  - name: tiny
    hub: {{repo: "{SUITE}", seeds: "1-2", steps: "{steps}", fetch: true, revisions_per_job: 2,
           cache: hub}}
mlflow: {{experiment: fetched-suite}}
"""


def resolve(workdir: Path, server: HubServer, check: bool = True):
    return run_command([str(Path(sys.executable).parent / "trainmap"), "resolve", "--configfile", "tiny.yaml",
                        "--hf-endpoint", server.endpoint], cwd=workdir, check=check)  # fmt: skip


def refused_dry_run(workdir: Path, target: str, uri: str) -> str:
    """A dry run of ``target`` that the config check stops: its output."""
    refused = snakemake(target, "-n", "--cores", "1", "--configfile", "tiny.yaml", cwd=workdir,
                        check=False, MLFLOW_TRACKING_URI=uri, timeout=300)  # fmt: skip
    assert refused.returncode != 0
    return refused.stdout + refused.stderr


def test_a_fetched_suite_runs_a_job_per_block_of_revisions(tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path / "workflow")
    (workdir / "tiny.yaml").write_text(study("0-2"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    target = "results/external/tiny/metrics.json"
    with HubServer(tiny_suite()) as server:
        # Not resolved: refused before any job, naming the command; nothing downloaded.
        said = refused_dry_run(workdir, target, uri)
        assert "config key external[0].hub: EleutherAI/pythia-tiny-seed{seed}: the suite is " \
               "fetched from the Hub" in said and "trainmap resolve --configfile" in said, said[-3000:]  # fmt: skip
        out = resolve(workdir, server).stdout
        assert "tiny: 2 runs, 6 revisions" in out and "4 jobs of up to 2 revisions" in out, out
        manifest = workdir / "results/external/tiny/revisions.json"
        stamp = manifest.stat().st_mtime_ns
        assert "unchanged" in resolve(workdir, server).stdout
        assert manifest.stat().st_mtime_ns == stamp, "an unchanged suite was rewritten"
        listed = len(server.log)
        snakemake(target, "--cores", "2", "--configfile", "tiny.yaml", cwd=workdir,
                  MLFLOW_TRACKING_URI=uri, timeout=900)  # fmt: skip
        assert not [s for s in server.log[listed:] if "/refs" in s.path], "a job listed the Hub"
        # The same suite through the command line.
        run_command([str(Path(sys.executable).parent / "trainmap"), "map", "hf://" + SUITE, "--seeds", "1-2",
                     "--steps", "0-2", "--fetch", "--hf-endpoint", server.endpoint, "--hf-cache",
                     str(tmp_path / "cli-hub"), "--out", str(tmp_path / "cli"), "--metrics-only"],
                    cwd=workdir)  # fmt: skip
    results = workdir / "results/external/tiny"
    assert sorted(p.relative_to(results / "blocks").as_posix()
                  for p in (results / "blocks").rglob("*.csv")) == [
        f"{run}/{block}.csv" for run in RUNS for block in (0, 1)]  # fmt: skip
    for run in RUNS:
        table = pd.read_csv(results / "runs" / run / "metrics.csv")
        assert list(table["step"]) == [0, 1, 2]
        pd.testing.assert_frame_equal(
            table, pd.read_csv(tmp_path / "cli/metrics" / run / "metrics.csv")
        )
    assert json.loads((results / "metrics.json").read_text())["runs"].keys() == set(RUNS)
    assert not list((workdir / "hub").glob("models--*/snapshots/*")), "weights left in the cache"

    # The config now asks for other steps: the old revisions.json is refused, not read.
    (workdir / "tiny.yaml").write_text(study("0-1"))
    said = refused_dry_run(workdir, target, uri)
    assert "revisions.json no longer matches the config (steps: ((0, 2),) there, ((0, 1),) in " \
           "the config)" in said and "trainmap resolve" in said, said[-3000:]  # fmt: skip


def test_a_pass_killed_with_sigkill_resumes_measuring_each_revision_once(tmp_path: Path) -> None:
    """``trainmap map --fetch`` killed with SIGKILL in the middle of a pass (a slow link: each
    download waits 0.3 s): every row written before the kill is kept as it was, the rerun
    downloads only the revisions without a row, and no weights stay in the cache."""
    import signal
    import subprocess
    import time
    from collections import Counter

    from unit.dynamics.runs.test_hub_fetch import revision_files

    repo = SUITE.format(seed=1)
    steps = range(8)
    repos = {repo: {f"step{s}": revision_files(repo, f"step{s}") for s in steps}}
    out, cache = tmp_path / "out", tmp_path / "hub"
    command = [str(Path(sys.executable).parent / "trainmap"), "map", "hf://" + SUITE, "--seeds", "1",
               "--steps", "0-7", "--fetch", "--hf-cache", str(cache), "--out", str(out),
               "--metrics-only"]  # fmt: skip
    with HubServer(repos) as server:
        server.download_delay = 0.3
        pass_one = subprocess.Popen([*command, "--hf-endpoint", server.endpoint],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + 120
        while len(list(out.glob("rows/*/*/step*.csv"))) < 3 and time.monotonic() < deadline:
            assert pass_one.poll() is None, "the pass ended before it could be killed"
            time.sleep(0.02)
        pass_one.send_signal(signal.SIGKILL)
        pass_one.wait(timeout=30)
        kept = {p.name: p.stat().st_mtime_ns for p in out.glob("rows/*/*/step*.csv")}
        assert 3 <= len(kept) < len(steps), kept
        # a download the kill cut short may still be answered (and logged) after this point
        before = len(server.log)
        server.download_delay = 0.0
        run_command([*command, "--hf-endpoint", server.endpoint], cwd=tmp_path)
        rerun = server.log[before:]
    rows = {p.name: p.stat().st_mtime_ns for p in out.glob("rows/*/*/step*.csv")}
    assert len(rows) == len(steps)
    assert {name: rows[name] for name in kept} == kept, "a row written before the kill changed"
    commits = {name.split(".")[1] for name in rows}
    measured = {name.split(".")[1] for name in kept}
    fetched = Counter(served.path.split("/")[-2] for served in rerun
                      if served.method == "GET" and served.path.endswith("/model.safetensors")
                      and served.range is None)  # fmt: skip
    assert not measured & set(fetched), "a revision with a row was fetched again"
    assert all(fetched[commit] >= 1 for commit in commits - measured), (fetched, commits)
    assert sum(fetched.values()) <= len(commits - measured) + 1, fetched  # + the one cut short
    table = pd.read_csv(out / "metrics" / "pythia-tiny-seed1" / "metrics.csv")
    assert list(table["step"]) == list(steps)
    assert not list(cache.glob("models--*/snapshots/*")), "weights left in the cache"
