"""Checkpoint suites fetched from the Hub (trainmap.dynamics.runs.hub_fetch), against a local fake
of the Hub's HTTP API (tests/hub_server.py) and the real huggingface_hub client: the online
resolution reads refs and safetensors headers only and gives the offline reader's manifest; a
fetched revision holds only its weights and config and is deleted again; a revision the user had
is read where it is; each bad repository or revision is an error naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from hub_server import HubServer
from safetensors.torch import save as safetensors_bytes

from trainmap.dynamics.runs.hub import (
    HubCacheError,
    parse_hub_source,
    read_manifest,
    write_manifest,
)
from trainmap.dynamics.runs.layouts import load_state_dict_file

from .test_hub_cache import weights

hub = pytest.importorskip("huggingface_hub")
hub_fetch = pytest.importorskip("trainmap.dynamics.runs.hub_fetch")

SUITE = "EleutherAI/pythia-tiny-seed{seed}"


def revision_files(repo: str, revision: str, tensors: dict | None = None) -> dict[str, bytes]:
    return {"config.json": b'{"model_type": "tiny"}',
            "model.safetensors": safetensors_bytes(tensors or weights(repo, revision)),
            "tokenizer.json": b"{}" * 4096}  # fmt: skip


def suite(seeds=(1, 2), steps=(0, 1, 2)) -> dict[str, dict[str, dict[str, bytes]]]:
    repos = {}
    for seed in seeds:
        repo = SUITE.replace("{seed}", str(seed))
        repos[repo] = {f"step{step}": revision_files(repo, f"step{step}") for step in steps}
        repos[repo]["main"] = repos[repo][f"step{steps[-1]}"]
    return repos


@pytest.fixture
def server():
    with HubServer(suite(), gated=frozenset({"EleutherAI/gated-seed1"})) as running:
        yield running


def resolve(server: HubServer, tmp_path: Path, source: str = "hf://" + SUITE, **options):
    options.setdefault("seeds", "1-2")
    spec = parse_hub_source(source, cache_dir=tmp_path / "hub", **options)
    return hub_fetch.resolve_online(spec, endpoint=server.endpoint, token=False)


def test_the_online_resolution_reads_refs_and_headers_into_the_offline_manifest(server, tmp_path):
    manifest = resolve(server, tmp_path, steps="0-1")
    assert list(manifest.runs) == ["pythia-tiny-seed1", "pythia-tiny-seed2"]
    for seed in (1, 2):
        repo = SUITE.replace("{seed}", str(seed))
        run = manifest.runs[f"pythia-tiny-seed{seed}"]
        assert list(run) == [0, 1]
        for step, checkpoint in run.items():
            assert (checkpoint.repo, checkpoint.revision) == (repo, f"step{step}")
            assert checkpoint.commit == server.commit(repo, f"step{step}")
            assert checkpoint.files == ("model.safetensors",)
            assert checkpoint.snapshot == (tmp_path / "hub" / f"models--EleutherAI--pythia-tiny-"
                                           f"seed{seed}" / "snapshots" / checkpoint.commit)  # fmt: skip
    assert manifest.fetch_from == server.endpoint
    assert not any(path.is_file() for path in (tmp_path / "hub").rglob("*")), "it downloaded"
    write_manifest(manifest, tmp_path / "revisions.json")
    assert read_manifest(tmp_path / "revisions.json") == manifest  # its files not there yet


def test_a_fetched_revision_holds_its_weights_and_config_only_and_is_deleted_after(
    server, tmp_path
):
    manifest = resolve(server, tmp_path, seeds="1", steps="1")
    checkpoint = manifest.runs["pythia-tiny-seed1"][1]
    fetched = hub_fetch.fetch_checkpoint(checkpoint, manifest.cache_dir, server.endpoint, False)
    assert fetched.fetched and fetched.snapshot == checkpoint.snapshot
    assert sorted(path.name for path in fetched.snapshot.iterdir()) == ["config.json",
                                                                         "model.safetensors"]  # fmt: skip
    loaded = load_state_dict_file(checkpoint.weights)
    expected = weights(checkpoint.repo, "step1")
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[name], expected[name]) for name in expected)
    freed = hub_fetch.release_checkpoint(checkpoint, manifest.cache_dir)
    assert freed >= len(safetensors_bytes(expected))
    assert not checkpoint.snapshot.exists()
    assert not any((tmp_path / "hub").rglob("blobs/*")), "a blob outlived its revision"


def test_a_revision_the_user_had_is_read_where_it_is_and_never_deleted(server, tmp_path):
    manifest = resolve(server, tmp_path, seeds="1", steps="2")
    checkpoint = manifest.runs["pythia-tiny-seed1"][2]
    hub.snapshot_download(checkpoint.repo, revision="step2", cache_dir=tmp_path / "hub",
                          endpoint=server.endpoint, token=False)  # fmt: skip
    served = len(server.requests)
    fetched = hub_fetch.fetch_checkpoint(checkpoint, manifest.cache_dir, server.endpoint, False)
    assert not fetched.fetched and len(server.requests) == served
    assert (fetched.snapshot / "tokenizer.json").is_file()  # the user's own download, untouched


def test_runs_of_two_architectures_are_refused_from_their_headers(tmp_path):
    repos = suite(seeds=(1,))
    other = {"layers.0.weight": torch.zeros(7, 4)}
    repos["EleutherAI/pythia-tiny-seed2"] = {"step0": revision_files("x", "step0", other)}
    with HubServer(repos) as running:
        with pytest.raises(HubCacheError, match=r"run pythia-tiny-seed2 holds other tensors"):
            resolve(running, tmp_path, steps="0")


@pytest.mark.parametrize(("source", "options", "message"), [
    ("hf://EleutherAI/gated-seed{seed}", {"seeds": "1"}, r"EleutherAI/gated-seed1: the "
     r"repository is gated; accept its terms"),
    ("hf://EleutherAI/absent-seed{seed}", {"seeds": "1"}, r"EleutherAI/absent-seed1: no such "
     r"repository on the Hub"),
    ("hf://" + SUITE, {"seeds": "1", "steps": "0,7"}, r"pythia-tiny-seed1: steps 7 have no "
     r"branch on the Hub \(its steps: 0, 1, 2\)"),
    ("hf://EleutherAI/pythia-tiny-seed1-step{step}", {"seeds": None, "steps": "0-2"},
     r"fetched only at the steps given one by one .* not 0-2"),
])  # fmt: skip
def test_a_bad_repository_or_revision_is_named(server, tmp_path, source, options, message):
    with pytest.raises(HubCacheError, match=message):
        resolve(server, tmp_path, source, **options)


def measure_with(convention: str = "paper"):
    """``measure(path, step)`` as the map command gives it: one revision, no curve."""
    from trainmap.dynamics.runs.external import ExternalRun, external_run_metrics, no_curve

    def measure(path: Path, step: int):
        return external_run_metrics(ExternalRun(path.parent, {step: path}, no_curve([step])),
                                    convention)  # fmt: skip

    return measure


def snapshots(cache: Path) -> list[Path]:
    return sorted(path for path in cache.glob("models--*/snapshots/*") if path.is_dir())


def weight_downloads(server: HubServer) -> int:
    return sum(1 for served in server.log
               if served.method == "GET" and served.path.endswith("/model.safetensors")
               and "/resolve/" in served.path and served.range is None)  # fmt: skip


def test_a_run_is_measured_a_revision_at_a_time_with_one_revision_on_disk(server, tmp_path):
    """The rows are the metrics of the same revisions downloaded whole, to the bit when each is
    measured alone and within 1e-12 when all are measured in one batch; only one revision is ever
    in the cache, and none is left after."""
    from trainmap.dynamics.runs.external import ExternalRun, external_run_metrics, no_curve

    manifest = resolve(server, tmp_path, seeds="1")
    measure, held = measure_with(), []

    def measuring(path: Path, step: int):
        held.append(len(snapshots(tmp_path / "hub")))
        return measure(path, step)

    table = hub_fetch.suite_run_metrics(manifest, "pythia-tiny-seed1", tmp_path / "rows",
                                        measuring, token=False)  # fmt: skip
    assert held == [1, 1, 1] and snapshots(tmp_path / "hub") == []
    full = tmp_path / "full"
    paths = {step: Path(hub.snapshot_download(c.repo, revision=c.revision, cache_dir=full,
                                              endpoint=server.endpoint, token=False))
                   / "model.safetensors"
             for step, c in manifest.runs["pythia-tiny-seed1"].items()}  # fmt: skip
    one_by_one = pd.concat([measure(path, step) for step, path in paths.items()],
                           ignore_index=True)  # fmt: skip
    pd.testing.assert_frame_equal(table, one_by_one, check_exact=True)  # the CSV rows: exact
    # read at once, the checkpoints are measured in one batch: the same up to rounding
    at_once = external_run_metrics(ExternalRun(full, paths, no_curve(list(paths))))
    pd.testing.assert_frame_equal(table, at_once, check_exact=False, rtol=1e-12, atol=0)


def test_a_rerun_after_a_crash_reads_no_revision_twice(server, tmp_path):
    manifest = resolve(server, tmp_path, seeds="1")
    measure = measure_with()

    def crash_at_step_2(path: Path, step: int):
        if step == 2:
            raise KeyboardInterrupt("killed")
        return measure(path, step)

    with pytest.raises(KeyboardInterrupt):
        hub_fetch.suite_run_metrics(manifest, "pythia-tiny-seed1", tmp_path / "rows",
                                    crash_at_step_2, token=False)  # fmt: skip
    assert sorted(p.name.split(".")[0] for p in (tmp_path / "rows").glob("step*.csv")) == [
        "step0", "step1"]  # fmt: skip
    assert weight_downloads(server) == 3 and len(snapshots(tmp_path / "hub")) == 1  # step 2
    table = hub_fetch.suite_run_metrics(manifest, "pythia-tiny-seed1", tmp_path / "rows",
                                        measure, token=False)  # fmt: skip
    assert list(table["step"]) == [0, 1, 2]
    assert weight_downloads(server) == 3, "a revision was fetched twice"
    assert snapshots(tmp_path / "hub") == [], "the revision the crash left was not deleted"


def test_a_crash_after_a_row_is_written_deletes_that_revision_on_the_rerun(
    server, tmp_path, monkeypatch
):
    """Killed between writing a revision's row and deleting it: the rerun reads the row, fetches
    nothing again and deletes the revision the crash left in the cache."""
    manifest = resolve(server, tmp_path, seeds="1", steps="0-1")
    release = hub_fetch.release_checkpoint

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(hub_fetch, "release_checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        hub_fetch.suite_run_metrics(manifest, "pythia-tiny-seed1", tmp_path / "rows",
                                    measure_with(), token=False)  # fmt: skip
    assert [p.name.split(".")[0] for p in (tmp_path / "rows").glob("step*.csv")] == ["step0"]
    assert len(snapshots(tmp_path / "hub")) == 1 and weight_downloads(server) == 1
    monkeypatch.setattr(hub_fetch, "release_checkpoint", release)
    table = hub_fetch.suite_run_metrics(manifest, "pythia-tiny-seed1", tmp_path / "rows",
                                        measure_with(), token=False)  # fmt: skip
    assert list(table["step"]) == [0, 1] and weight_downloads(server) == 2
    assert snapshots(tmp_path / "hub") == [], "the measured revision the crash left was kept"
    assert not list((tmp_path / "rows").glob(".fetched-*"))


def test_keep_weights_keeps_every_revision_fetched(server, tmp_path):
    manifest = resolve(server, tmp_path, seeds="1", steps="0-1")
    hub_fetch.suite_run_metrics(manifest, "pythia-tiny-seed1", tmp_path / "rows", measure_with(),
                                keep_weights=True, token=False)  # fmt: skip
    assert len(snapshots(tmp_path / "hub")) == 2
    assert not list((tmp_path / "rows").glob(".fetched-*"))


def test_the_command_line_fetches_measures_and_frees_each_revision_and_resumes(server, tmp_path):
    """``trainmap map hf://... --fetch --metrics-only``: revisions.json resolved online, a row per
    revision, the metric tables those of the cached suite, no weights left in the cache; run
    again, it lists and downloads nothing."""
    from trainmap.dynamics.__main__ import main

    out, cache = tmp_path / "out", tmp_path / "hub"
    command = ["hf://" + SUITE, "--seeds", "1-2", "--steps", "0-1", "--fetch", "--hf-endpoint",
               server.endpoint, "--hf-cache", str(cache), "--out", str(out), "--metrics-only"]  # fmt: skip
    main(command)
    manifest = read_manifest(out / "revisions.json")
    assert manifest.fetch_from == server.endpoint and sorted(manifest.runs) == [
        "pythia-tiny-seed1", "pythia-tiny-seed2"]  # fmt: skip
    for run in manifest.runs:
        assert sorted(p.name.split(".")[0] for p in (out / "rows" / run).glob("*/step*.csv")) == [
            "step0", "step1"]  # fmt: skip
        table = pd.read_csv(out / "metrics" / run / "metrics.csv")
        assert list(table["step"]) == [0, 1]
    assert snapshots(cache) == []
    served = len(server.log)
    main(command)
    assert len(server.log) == served, "the rerun listed or fetched again"
    # Rows measured under another convention are not this one's: measured again, kept apart.
    main([*command, "--convention", "extended"])
    assert weight_downloads(server) == 8
    for run in manifest.runs:
        folders = sorted((out / "rows" / run).iterdir())
        assert len(folders) == 2
        assert {json.loads((f / "settings.json").read_text())["convention"] for f in folders} == {
            "paper", "extended"}  # fmt: skip


def test_a_network_error_mid_file_is_retried_then_named_keeping_the_rows(
    server, tmp_path, monkeypatch
):
    from types import SimpleNamespace

    from huggingface_hub import file_download

    monkeypatch.setattr(file_download, "time", SimpleNamespace(sleep=lambda seconds: None))
    manifest = resolve(server, tmp_path, seeds="1")
    server.cut_after("EleutherAI/pythia-tiny-seed1", "model.safetensors", 100, times=7)
    rows = tmp_path / "rows"
    # the first revision's downloads are cut until the client gives up: named, nothing measured
    with pytest.raises(HubCacheError, match=r"EleutherAI/pythia-tiny-seed1 revision step0 "
                       r"\(commit [0-9a-f]{40}\) could not be fetched"):  # fmt: skip
        hub_fetch.suite_run_metrics(manifest, "pythia-tiny-seed1", rows, measure_with(),
                                    token=False)  # fmt: skip
    assert not list(rows.glob("step*.csv"))
    # the network back: every revision measured, each once
    table = hub_fetch.suite_run_metrics(manifest, "pythia-tiny-seed1", rows, measure_with(),
                                        token=False)  # fmt: skip
    assert list(table["step"]) == [0, 1, 2] and snapshots(tmp_path / "hub") == []


def test_a_revision_that_cannot_be_deleted_is_named_and_its_row_kept(server, tmp_path, monkeypatch):
    manifest = resolve(server, tmp_path, seeds="1", steps="0")

    def refuse(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(hub.DeleteCacheStrategy, "execute", refuse)
    with pytest.raises(HubCacheError, match=r"pythia-tiny-seed1 revision step0 .*could not be "
                       r"deleted from .*read-only file system; what was measured of it is kept"):  # fmt: skip
        hub_fetch.suite_run_metrics(manifest, "pythia-tiny-seed1", tmp_path / "rows",
                                    measure_with(), token=False)  # fmt: skip
    assert hub_fetch.row_path(tmp_path / "rows", 0, manifest.runs["pythia-tiny-seed1"][0]).is_file()


def test_fetch_jobs_download_the_next_revisions_while_one_is_measured(server, tmp_path):
    """With 2 fetch jobs the next revision arrives while one is measured, and the cache never
    holds more than 2."""
    import time

    manifest = resolve(server, tmp_path, seeds="1")
    measure, held = measure_with(), []

    def measuring(path: Path, step: int):
        deadline = time.monotonic() + 20
        while step == 0 and len(snapshots(tmp_path / "hub")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # step 1 is downloading meanwhile
        held.append(len(snapshots(tmp_path / "hub")))
        return measure(path, step)

    table = hub_fetch.suite_run_metrics(manifest, "pythia-tiny-seed1", tmp_path / "rows",
                                        measuring, token=False, fetch_jobs=2)  # fmt: skip
    assert list(table["step"]) == [0, 1, 2]
    assert held[0] == 2 and max(held) <= 2 and snapshots(tmp_path / "hub") == []


def test_a_row_measured_at_another_commit_is_an_error_not_a_silent_reuse(tmp_path):
    """The branch step1 moved after its row was written: the rerun names both commits and
    measures nothing over the old row."""
    from dataclasses import replace

    with HubServer(suite(seeds=(1,))) as running:
        manifest = resolve(running, tmp_path, seeds="1")
        rows = tmp_path / "rows"
        hub_fetch.suite_run_metrics(manifest, "pythia-tiny-seed1", rows, measure_with(),
                                    token=False)  # fmt: skip
        run = manifest.runs["pythia-tiny-seed1"]
        moved = replace(run[1], commit="f" * 40)
        manifest.runs["pythia-tiny-seed1"] = {**run, 1: moved}
        with pytest.raises(HubCacheError, match=r"revision step1: its row in .* was measured at "
                           rf"commit {run[1].commit}, but the revision now points to f{{40}}"):  # fmt: skip
            hub_fetch.suite_run_metrics(manifest, "pythia-tiny-seed1", rows, measure_with(),
                                        token=False)  # fmt: skip
        assert hub_fetch.row_path(rows, 1, run[1]).is_file()


@pytest.mark.integration  # starts a program (a subprocess under a file-size limit)
def test_a_full_disk_while_fetching_keeps_the_rows_already_written(tmp_path):
    """``trainmap map --fetch`` under a file-size limit (RLIMIT_FSIZE, standing in for a full
    disk): the revision that does not fit is named, and the rows of the revisions measured before
    it stay."""
    import resource
    import subprocess
    import sys

    big = {"layers.0.weight": torch.randn(64, 64), "layers.1.weight": torch.randn(3, 64)}
    repo = "EleutherAI/pythia-big-seed1"
    repos = {repo: {f"step{s}": revision_files(repo, f"step{s}", big) for s in (0, 1)}}
    out, cache = tmp_path / "out", tmp_path / "hub"
    command = [sys.executable, "-m", "trainmap.dynamics", "hf://EleutherAI/pythia-big-seed{seed}",
               "--seeds", "1", "--fetch", "--hf-cache", str(cache), "--out", str(out),
               "--metrics-only"]  # fmt: skip

    def small_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    with HubServer(repos) as running:
        first = subprocess.run([*command, "--steps", "0", "--hf-endpoint", running.endpoint],
                               capture_output=True, text=True, timeout=300)  # fmt: skip
        assert first.returncode == 0, first.stderr[-2000:]
        full = subprocess.run([*command, "--steps", "0-1", "--hf-endpoint", running.endpoint],
                              capture_output=True, text=True, timeout=300,
                              preexec_fn=small_disk)  # fmt: skip
    assert full.returncode != 0
    assert "EleutherAI/pythia-big-seed1 revision step1" in full.stderr, full.stderr[-2000:]
    assert "could not be fetched: no room for it" in full.stderr, full.stderr[-2000:]
    kept = list((out / "rows" / "pythia-big-seed1").glob("*/step0.*.csv"))
    assert len(kept) == 1 and kept[0].stat().st_size > 0


def test_a_deletion_waits_for_a_download_of_the_same_repository(server, tmp_path):
    """Revisions share blobs (config.json is the same at every step): a revision deleted while
    another of its repository is being linked could take a blob that revision has just linked
    to. The deletion waits for the download (a slow link here: 0.5 s a file), and the downloaded
    revision is whole afterwards."""
    import threading
    import time

    manifest = resolve(server, tmp_path, seeds="1")
    first, second = manifest.runs["pythia-tiny-seed1"][0], manifest.runs["pythia-tiny-seed1"][1]
    hub_fetch.fetch_checkpoint(first, manifest.cache_dir, server.endpoint, False)
    server.download_delay = 0.5
    finished = {}

    def fetch_second() -> None:
        hub_fetch.fetch_checkpoint(second, manifest.cache_dir, server.endpoint, False)
        finished["fetch"] = time.monotonic()

    before = len(server.requests)
    downloading = threading.Thread(target=fetch_second)
    downloading.start()
    deadline = time.monotonic() + 30
    while not any(second.commit in path for _, path in server.requests[before:]):
        assert time.monotonic() < deadline, "the second download never started"
        time.sleep(0.01)  # its first request is answered inside the repository's lock
    hub_fetch.release_checkpoint(first, manifest.cache_dir)
    released = time.monotonic()
    downloading.join()
    assert released >= finished["fetch"], "the deletion did not wait for the download"
    assert all((second.snapshot / name).resolve().is_file()
               for name in ("config.json", "model.safetensors")), "a linked blob was deleted"  # fmt: skip
    assert snapshots(tmp_path / "hub") == [second.snapshot]
