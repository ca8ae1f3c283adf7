"""Checkpoint suites from the local Hugging Face Hub cache: a cache downloaded by huggingface_hub's
own snapshot_download from a local fake Hub (and, for the damaged and unusual caches, revisions
written by hand in the same layout: ``blobs/<hash>``, ``refs/<revision>`` holding the commit,
``snapshots/<commit>/<file>`` relative symlinks into the blobs, checked against the client's)
resolves, offline, into runs of
the three suite shapes (a branch per checkpoint, a repository per seed, a repository per seed and
step), agreeing with ``huggingface_hub.scan_cache_dir``; the manifest round-trips; sharded and
``pytorch_model.bin`` checkpoints load as the same tensors; each damaged cache is refused naming
the repository, the revision and the fix, before any metric."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save as safetensors_bytes

from trainmap.dynamics.runs.external import ExternalRun, check_run_shapes, external_run_metrics
from trainmap.dynamics.runs.hub import (
    MANIFEST_FILE,
    HubCacheError,
    HubRevisionWarning,
    HubSpec,
    hub_run_checkpoints,
    hub_run_files,
    parse_hub_source,
    read_manifest,
    resolve_hub_runs,
    write_manifest,
)
from trainmap.dynamics.runs.layouts import (
    ExternalRunError,
    checkpoint_shapes,
    load_state_dict_file,
)

hub = pytest.importorskip("huggingface_hub")

SHAPES = {"layers.0.weight": (6, 4), "layers.0.bias": (6,), "layers.1.weight": (3, 6)}


def weights(repo: str, revision: str) -> dict[str, torch.Tensor]:
    """Tiny random weights, the same shapes at every revision, different values."""
    seed = int(hashlib.sha256(f"{repo}@{revision}".encode()).hexdigest()[:8], 16)
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}


def repo_folder(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def add_revision(cache: Path, repo: str, revision: str, files: dict[str, bytes]) -> Path:
    """One revision as snapshot_download leaves it: each file a blob named by its ETag (a weights
    file's sha256, any other file's git blob id), the ref holding the commit (no newline), the
    snapshot's relative symlinks into blobs/; the commit the fake Hub gives the branch."""
    from hub_server import commit_sha, git_blob_id, is_lfs

    folder = repo_folder(cache, repo)
    commit = commit_sha(repo, revision)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "blobs").mkdir(exist_ok=True)
    (folder / "refs" / revision).write_text(commit)
    snapshot = folder / "snapshots" / commit
    for name, data in files.items():
        digest = hashlib.sha256(data).hexdigest() if is_lfs(name) else git_blob_id(data)
        (folder / "blobs" / digest).write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(folder / "blobs" / digest, link.parent))
    return snapshot


def add_checkpoint(cache: Path, repo: str, revision: str) -> Path:
    return add_revision(cache, repo, revision, checkpoint_files(repo, revision))


def blob_of(snapshot: Path, name: str) -> Path:
    return (snapshot / name).resolve()


def checkpoint_files(repo: str, revision: str) -> dict[str, bytes]:
    return {"config.json": b'{"model_type": "tiny"}',
            "model.safetensors": safetensors_bytes(weights(repo, revision))}  # fmt: skip


def three_shapes() -> dict[str, dict[str, dict[str, bytes]]]:
    """Shape 1 (EleutherAI/pythia-tiny, branches step0/100/200, main the last), shape 2 (a
    repository per seed 1-3) and shape 3 (google/multiberts-seed_{0,1,10}-step_{0,20,40}k at
    main), as the fake Hub serves them."""
    repos: dict[str, dict[str, dict[str, bytes]]] = {"EleutherAI/pythia-tiny": {}}
    for revision in ("step0", "step100", "step200"):
        repos["EleutherAI/pythia-tiny"][revision] = checkpoint_files(
            "EleutherAI/pythia-tiny", revision
        )
        for seed in (1, 2, 3):
            repo = f"EleutherAI/pythia-14m-seed{seed}"
            repos.setdefault(repo, {})[revision] = checkpoint_files(repo, revision)
    repos["EleutherAI/pythia-tiny"]["main"] = repos["EleutherAI/pythia-tiny"]["step200"]
    for seed in (0, 1, 10):
        for step in (0, 20, 40):
            repo = f"google/multiberts-seed_{seed}-step_{step}k"
            repos[repo] = {"main": checkpoint_files(repo, "main")}
    return repos


@pytest.fixture(scope="module")
def downloaded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three shapes downloaded once by huggingface_hub's own snapshot_download from the local
    fake Hub (tests/hub_server.py): the cache layout is the client's, not one written by hand."""
    from hub_server import HubServer

    cache = tmp_path_factory.mktemp("downloaded") / "hub"
    repos = three_shapes()
    with HubServer(repos) as server:
        for repo, branches in repos.items():
            for branch in branches:
                hub.snapshot_download(repo, revision=branch, cache_dir=cache,
                                      endpoint=server.endpoint, token=False)  # fmt: skip
    return cache


@pytest.fixture
def cache(downloaded: Path, tmp_path: Path) -> Path:
    """A copy of :func:`downloaded` a test may change (its symlinks kept as links)."""
    import shutil

    return Path(shutil.copytree(downloaded, tmp_path / "hub", symlinks=True))


def test_a_revision_written_by_hand_is_laid_out_as_snapshot_download_lays_it_out(
    downloaded: Path, tmp_path: Path
) -> None:
    """add_revision, which writes the damaged and unusual caches below, writes the client's
    layout: the same refs, blobs and relative snapshot links as snapshot_download left (the
    client's trees/<commit>.json, its listing of a commit, is not read by the resolution)."""

    def layout(root: Path, repo: str) -> dict[str, str]:
        folder = repo_folder(root, repo)
        return {str(p.relative_to(folder)): (os.readlink(p) if p.is_symlink() else p.read_text()
                                             if p.parent.name == "refs" else "blob")
                for p in sorted(folder.rglob("*"))
                if (p.is_symlink() or p.is_file() and not p.name.startswith("."))
                and p.relative_to(folder).parts[0] in ("refs", "blobs", "snapshots")}  # fmt: skip

    repo = "EleutherAI/pythia-14m-seed2"
    for revision in ("step0", "step100", "step200"):
        add_checkpoint(tmp_path / "hub", repo, revision)
    assert layout(tmp_path / "hub", repo) == layout(downloaded, repo)


def spec(cache: Path, source: str, **options: object) -> HubSpec:
    return parse_hub_source(source, cache_dir=cache, **options)


# --- the three shapes -----------------------------------------------------------------------------


def test_a_branch_per_checkpoint_is_one_run(cache: Path) -> None:
    manifest = resolve_hub_runs(spec(cache, "hf://EleutherAI/pythia-tiny"))
    assert list(manifest.runs) == ["pythia-tiny"]
    run = manifest.runs["pythia-tiny"]
    assert list(run) == [0, 100, 200]  # main matches no step, and is left out
    folder = repo_folder(cache, "EleutherAI/pythia-tiny")
    for step, checkpoint in run.items():
        assert checkpoint.revision == f"step{step}"
        assert checkpoint.commit == (folder / "refs" / f"step{step}").read_text()
        assert checkpoint.snapshot == folder / "snapshots" / checkpoint.commit
        assert checkpoint.files == ("model.safetensors",)
    loaded = load_state_dict_file(hub_run_checkpoints(manifest, "pythia-tiny")[100])
    expected = weights("EleutherAI/pythia-tiny", "step100")
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)


def test_a_repository_per_seed_is_a_run_per_seed_and_steps_select(cache: Path) -> None:
    manifest = resolve_hub_runs(spec(cache, "hf://EleutherAI/pythia-14m-seed{seed}", seeds="1-3",
                                     steps="0-150"))  # fmt: skip
    assert list(manifest.runs) == ["pythia-14m-seed1", "pythia-14m-seed2", "pythia-14m-seed3"]
    for seed in (1, 2, 3):
        run = manifest.runs[f"pythia-14m-seed{seed}"]
        assert list(run) == [0, 100]  # step 200 lies outside 0-150
        assert {c.repo for c in run.values()} == {f"EleutherAI/pythia-14m-seed{seed}"}
    listed = resolve_hub_runs(spec(cache, "EleutherAI/pythia-14m-seed{seed}", seeds=[2],
                                   steps=[200]))  # fmt: skip
    assert {run: list(steps) for run, steps in listed.runs.items()} == {"pythia-14m-seed2": [200]}


def test_a_repository_per_seed_and_step_reads_k_as_thousands(cache: Path) -> None:
    manifest = resolve_hub_runs(spec(cache, "hf://google/multiberts-seed_{seed}-step_{step}k",
                                     seeds=[0, 1]))  # fmt: skip
    assert list(manifest.runs) == ["multiberts-seed_0", "multiberts-seed_1"]
    run = manifest.runs["multiberts-seed_1"]  # seed 10's repositories are not seed 1's
    assert list(run) == [0, 20000, 40000]
    assert [c.repo for c in run.values()] == [f"google/multiberts-seed_1-step_{k}k"
                                              for k in (0, 20, 40)]  # fmt: skip
    assert {c.revision for c in run.values()} == {"main"}
    loaded = load_state_dict_file(run[20000].weights)
    expected = weights("google/multiberts-seed_1-step_20k", "main")
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)


def test_scan_cache_dir_agrees_with_the_resolution(cache: Path) -> None:
    """huggingface_hub's own scan reads the fake cache without a warning and finds, for each
    resolved checkpoint, the same repository, commit, ref and file."""
    scanned = hub.scan_cache_dir(cache)
    assert scanned.warnings == []
    revisions = {(repo.repo_id, rev.commit_hash): rev for repo in scanned.repos
                 for rev in repo.revisions}  # fmt: skip
    manifests = [
        resolve_hub_runs(spec(cache, "EleutherAI/pythia-tiny")),
        resolve_hub_runs(spec(cache, "EleutherAI/pythia-14m-seed{seed}", seeds="1-3")),
        resolve_hub_runs(spec(cache, "google/multiberts-seed_{seed}-step_{step}k", seeds="0-1")),
    ]
    checkpoints = [c for m in manifests for run in m.runs.values() for c in run.values()]
    assert len(checkpoints) == 3 + 9 + 6
    for checkpoint in checkpoints:
        revision = revisions[(checkpoint.repo, checkpoint.commit)]
        assert checkpoint.revision in revision.refs
        assert revision.snapshot_path == checkpoint.snapshot
        assert checkpoint.weights in {file.file_path for file in revision.files}


def test_the_cache_dir_comes_from_huggingface_hub(cache: Path, monkeypatch) -> None:
    """Without a cache_dir, huggingface_hub's HF_HUB_CACHE (set from the environment when it was
    imported) is read at each resolution."""
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", str(cache))
    manifest = resolve_hub_runs(parse_hub_source("hf://EleutherAI/pythia-tiny"))
    assert manifest.cache_dir == cache
    assert list(manifest.runs["pythia-tiny"]) == [0, 100, 200]


def test_the_manifest_round_trips(cache: Path, tmp_path: Path) -> None:
    manifest = resolve_hub_runs(spec(cache, "EleutherAI/pythia-14m-seed{seed}", seeds="1-2"))
    path = tmp_path / "map" / MANIFEST_FILE
    write_manifest(manifest, path)
    assert [p.name for p in path.parent.iterdir()] == [MANIFEST_FILE]  # no temporary file left
    again = read_manifest(path)
    assert again == manifest
    assert hub_run_checkpoints(again, "pythia-14m-seed2") == {
        step: c.snapshot / "model.safetensors"
        for step, c in manifest.runs["pythia-14m-seed2"].items()
    }
    assert hub_run_files(again, "pythia-14m-seed2") == list(
        hub_run_checkpoints(again, "pythia-14m-seed2").values()
    )
    with pytest.raises(HubCacheError, match=r"no run 'seed9' \(runs: pythia-14m-seed1, "):
        hub_run_checkpoints(again, "seed9")


def test_a_manifest_whose_files_were_cleaned_is_refused(cache: Path, tmp_path: Path) -> None:
    manifest = resolve_hub_runs(spec(cache, "EleutherAI/pythia-tiny"))
    write_manifest(manifest, tmp_path / MANIFEST_FILE)
    blob_of(manifest.runs["pythia-tiny"][100].snapshot, "model.safetensors").unlink()
    with pytest.raises(HubCacheError, match=r"run pythia-tiny step 100: .* \(EleutherAI/pythia-tiny "
                       "revision step100.* no longer there.*--revision step100"):  # fmt: skip
        read_manifest(tmp_path / MANIFEST_FILE)
    (tmp_path / "bad.json").write_text('{"format": 1, "runs": {}}')
    with pytest.raises(HubCacheError, match="bad.json: not a suite manifest"):
        read_manifest(tmp_path / "bad.json")


def test_a_resolved_run_maps_like_an_external_run(cache: Path) -> None:
    """The manifest's checkpoints are an ExternalRun's: shapes checked, metrics computed."""
    manifest = resolve_hub_runs(spec(cache, "EleutherAI/pythia-tiny"))
    checkpoints = hub_run_checkpoints(manifest, "pythia-tiny")
    evaluation = pd.DataFrame({"step": list(checkpoints), "test_acc": [0.1, 0.5, 0.9]})
    run = ExternalRun(Path("pythia-tiny"), checkpoints, evaluation)
    check_run_shapes(run)
    table = external_run_metrics(run)
    assert list(table["step"]) == [0, 100, 200]


# --- sharded, pytorch_model.bin and half-precision checkpoints -------------------------------------


def sharded_files(tensors: dict[str, torch.Tensor]) -> dict[str, bytes]:
    """``tensors`` as save_pretrained shards them: an index and two shard files."""
    names = list(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:1],
              "model-00002-of-00002.safetensors": names[1:]}  # fmt: skip
    weight_map = {name: shard for shard, held in shards.items() for name in held}
    index = json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    files = {"model.safetensors.index.json": index.encode()}
    files |= {
        shard: safetensors_bytes({n: tensors[n] for n in held}) for shard, held in shards.items()
    }
    return files


def test_a_sharded_checkpoint_loads_merged(cache: Path) -> None:
    repo = "EleutherAI/pythia-sharded"
    tensors = weights(repo, "step0")
    snapshot = add_revision(cache, repo, "step0", sharded_files(tensors))
    manifest = resolve_hub_runs(spec(cache, repo))
    checkpoint = manifest.runs["pythia-sharded"][0]
    assert checkpoint.files == ("model.safetensors.index.json", "model-00001-of-00002.safetensors",
                                "model-00002-of-00002.safetensors")  # fmt: skip
    assert hub_run_files(manifest, "pythia-sharded") == [snapshot / f for f in checkpoint.files]
    for given in (checkpoint.weights, snapshot):  # the index, or the snapshot folder
        loaded = load_state_dict_file(given)
        assert loaded.keys() == tensors.keys()
        assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)
        assert checkpoint_shapes(given) == SHAPES


def test_a_missing_shard_is_refused_naming_it(cache: Path, tmp_path: Path) -> None:
    repo = "EleutherAI/pythia-sharded"
    snapshot = add_revision(cache, repo, "step0", sharded_files(weights(repo, "step0")))
    (snapshot / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(HubCacheError, match=f"{repo} revision step0: shard "
                       "model-00002-of-00002.safetensors of model.safetensors.index.json is "
                       "missing"):  # fmt: skip
        resolve_hub_runs(spec(cache, repo))
    for read in (load_state_dict_file, checkpoint_shapes):  # outside the cache too
        with pytest.raises(ExternalRunError, match="shard.s. model-00002-of-00002.safetensors "
                           "missing"):  # fmt: skip
            read(snapshot / "model.safetensors.index.json")


def test_pytorch_model_bin_and_bf16_weights_are_read(cache: Path, tmp_path: Path) -> None:
    """A revision with only pytorch_model.bin (read weights_only); bf16 weights give the metrics
    of the same values in float32 (measured in float64 either way)."""
    repo = "EleutherAI/pythia-old"
    tensors = {k: v.to(torch.bfloat16) for k, v in weights(repo, "step0").items()}
    saved = tmp_path / "pytorch_model.bin"
    torch.save(tensors, saved)
    add_revision(cache, repo, "step0", {"pytorch_model.bin": saved.read_bytes()})
    add_revision(cache, repo, "step10", {"model.safetensors": safetensors_bytes(tensors)})
    checkpoints = hub_run_checkpoints(resolve_hub_runs(spec(cache, repo)), "pythia-old")
    assert checkpoints[0].name == "pytorch_model.bin"
    assert checkpoint_shapes(checkpoints[0]) == checkpoint_shapes(checkpoints[10]) == SHAPES
    loaded = load_state_dict_file(checkpoints[0])
    assert loaded["layers.0.weight"].dtype == torch.bfloat16
    assert torch.equal(loaded["layers.0.weight"], tensors["layers.0.weight"])
    evaluation = pd.DataFrame({"step": [0, 10], "test_acc": [0.2, 0.8]})
    half = external_run_metrics(ExternalRun(Path("half"), checkpoints, evaluation))
    plain = tmp_path / "plain"
    plain.mkdir()
    for step in (0, 10):
        torch.save({k: v.float() for k, v in tensors.items()}, plain / f"step_{step}.pt")
    full = external_run_metrics(ExternalRun(plain, {s: plain / f"step_{s}.pt" for s in (0, 10)},
                                            evaluation))  # fmt: skip
    numeric = half.select_dtypes("number").columns
    np.testing.assert_array_equal(half[numeric].to_numpy(), full[numeric].to_numpy())


# --- two revisions of one step ---------------------------------------------------------------------


def test_two_revisions_of_one_step_warn_naming_both(cache: Path) -> None:
    repo = "allenai/olmo-tiny"
    add_checkpoint(cache, repo, "step1000-tokens4B")
    add_checkpoint(cache, repo, "step1000")
    add_checkpoint(cache, repo, "step2000-tokens8B")
    with pytest.warns(HubRevisionWarning, match="'step1000' and 'step1000-tokens4B' both give step "
                      "1000; reading 'step1000'"):  # fmt: skip
        manifest = resolve_hub_runs(spec(cache, repo))
    run = manifest.runs["olmo-tiny"]
    assert {step: c.revision for step, c in run.items()} == {1000: "step1000",
                                                            2000: "step2000-tokens8B"}  # fmt: skip


# --- a cache that cannot give what was asked -------------------------------------------------------


def test_a_ref_whose_commit_has_no_snapshot_is_refused(cache: Path) -> None:
    folder = repo_folder(cache, "EleutherAI/pythia-tiny")
    (folder / "refs" / "step300").write_text("f" * 40)
    with pytest.raises(HubCacheError, match="EleutherAI/pythia-tiny revision step300: "
                       f"refs/step300 points to commit {'f' * 40}, which has no snapshot folder.*"
                       "hf download EleutherAI/pythia-tiny --revision step300"):  # fmt: skip
        resolve_hub_runs(spec(cache, "EleutherAI/pythia-tiny"))


def test_a_symlink_into_a_deleted_blob_is_refused(cache: Path) -> None:
    repo = "EleutherAI/pythia-14m-seed2"
    snapshot = (repo_folder(cache, repo) / "snapshots"
                / (repo_folder(cache, repo) / "refs" / "step100").read_text())  # fmt: skip
    blob_of(snapshot, "model.safetensors").unlink()
    with pytest.raises(HubCacheError, match=f"{repo} revision step100: model.safetensors links "
                       "to a deleted blob .*--revision step100"):  # fmt: skip
        resolve_hub_runs(spec(cache, "EleutherAI/pythia-14m-seed{seed}", seeds="1-3"))


@pytest.mark.parametrize("how", ["interrupted", "linked"])
def test_an_incomplete_blob_is_refused(cache: Path, how: str) -> None:
    """An interrupted download leaves ``blobs/<hash>.incomplete``: the snapshot's link to the
    finished blob dangles beside it, or (``linked``) points at the partial file itself."""
    repo = "EleutherAI/pythia-tiny"
    folder = repo_folder(cache, repo)
    snapshot = folder / "snapshots" / (folder / "refs" / "step0").read_text()
    blob = blob_of(snapshot, "model.safetensors")
    partial = blob.with_name(blob.name + ".incomplete")
    blob.rename(partial)
    if how == "linked":
        (snapshot / "model.safetensors").unlink()
        (snapshot / "model.safetensors").symlink_to(os.path.relpath(partial, snapshot))
    with pytest.raises(HubCacheError, match=f"{repo} revision step0: model.safetensors was not "
                       r"fully downloaded \(its blob .*\.incomplete is unfinished\)"):  # fmt: skip
        resolve_hub_runs(spec(cache, repo))


def test_absent_steps_are_listed_with_the_cached_ones(cache: Path) -> None:
    with pytest.raises(HubCacheError, match=r"EleutherAI/pythia-tiny: steps 150, 300-400 not in "
                       r"the cache \(cached steps: 0, 100, 200\).*--revision step150"):  # fmt: skip
        resolve_hub_runs(spec(cache, "EleutherAI/pythia-tiny", steps="0,150,300-400"))
    with pytest.raises(HubCacheError, match=r"steps 60000 not in the cache \(cached steps: 0, "
                       r"20000, 40000\).*hf download google/multiberts-seed_0-step_60k "
                       "--revision main"):  # fmt: skip
        resolve_hub_runs(spec(cache, "google/multiberts-seed_{seed}-step_{step}k", seeds=[0],
                              steps=[0, 60000]))  # fmt: skip


def test_a_step_value_that_is_not_an_integer_is_refused(cache: Path) -> None:
    add_checkpoint(cache, "google/multiberts-seed_0-step_2xk", "main")
    with pytest.raises(HubCacheError, match=r"google/multiberts-seed_0-step_2xk \(revision main\): "
                       "its step '2x' .* is not an integer"):  # fmt: skip
        resolve_hub_runs(spec(cache, "google/multiberts-seed_{seed}-step_{step}k", seeds=[0]))


def test_runs_of_another_architecture_are_refused_naming_both_revisions(cache: Path) -> None:
    wider = {"layers.0.weight": torch.zeros(8, 4), "layers.0.bias": torch.zeros(8),
             "layers.1.weight": torch.zeros(3, 8)}  # fmt: skip
    for revision in ("step0", "step100", "step200"):
        add_revision(cache, "EleutherAI/pythia-14m-seed4", revision,
                     {"model.safetensors": safetensors_bytes(wider)})  # fmt: skip
    with pytest.raises(HubCacheError, match=r"EleutherAI/pythia-14m-seed4 at revision step0: run "
                       r"pythia-14m-seed4 holds other tensors than run pythia-14m-seed1 "
                       r"\(EleutherAI/pythia-14m-seed1 at revision step0\): layers.0.bias, "):  # fmt: skip
        resolve_hub_runs(spec(cache, "EleutherAI/pythia-14m-seed{seed}", seeds="1,4"))


def test_a_repository_not_in_the_cache_names_the_download(cache: Path) -> None:
    with pytest.raises(HubCacheError, match=r"EleutherAI/pythia-14m-seed7: not in the Hugging "
                       r"Face cache .*hf download EleutherAI/pythia-14m-seed7 --revision step0  "
                       r"\(or snapshot_download\('EleutherAI/pythia-14m-seed7', "
                       r"revision='step0'\)\)"):  # fmt: skip
        resolve_hub_runs(spec(cache, "EleutherAI/pythia-14m-seed{seed}", seeds="1-3,7"))
    with pytest.raises(HubCacheError, match="google/bert-seed_0-step_{step}k: no repository "
                       "of the suite is in the Hugging Face cache .*hf download "
                       "google/bert-seed_0-step_0k --revision main"):  # fmt: skip
        resolve_hub_runs(spec(cache, "google/bert-seed_{seed}-step_{step}k", seeds=[0]))
    add_revision(cache, "EleutherAI/pythia-config-only", "step0", {"config.json": b"{}"})
    with pytest.raises(HubCacheError, match="pythia-config-only revision step0: the snapshot .* "
                       "holds no weights .*it holds config.json"):  # fmt: skip
        resolve_hub_runs(spec(cache, "EleutherAI/pythia-config-only"))


def test_no_cache_directory_is_refused_saying_offline(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    absent = tmp_path / "absent"
    with pytest.raises(HubCacheError, match="EleutherAI/pythia-tiny: HF_HUB_OFFLINE=1 and there is "
                       f"no Hugging Face cache at {absent}; point HF_HUB_CACHE"):  # fmt: skip
        resolve_hub_runs(spec(absent, "EleutherAI/pythia-tiny"))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(HubCacheError, match="EleutherAI/pythia-tiny: there is no Hugging Face "
                       "cache at .*download the suite first"):  # fmt: skip
        resolve_hub_runs(spec(absent, "EleutherAI/pythia-tiny"))


@pytest.mark.parametrize(
    ("source", "options", "message"),
    [
        ("hf://pythia", {}, "give ORG/NAME"),
        ("hf://EleutherAI/pythia-{size}", {}, r"placeholders \['\{size\}'\] not understood"),
        ("hf://EleutherAI/pythia-14m-seed{seed}", {}, "give seeds exactly when the name holds"),
        ("hf://EleutherAI/pythia-14m", {"seeds": "1-9"}, "give seeds exactly when the name holds"),
        ("hf://EleutherAI/pythia-14m-seed{seed}", {"seeds": "1-x"}, "'1-x' is neither an integer"),
        ("hf://EleutherAI/pythia-14m", {"steps": "9-1"}, "'9-1' ends before it starts"),
        ("hf://EleutherAI/pythia-14m", {"revision_pattern": "step"}, "has no group"),
    ],
)
def test_bad_specs_are_refused(source: str, options: dict, message: str) -> None:
    with pytest.raises(HubCacheError, match=message):
        parse_hub_source(source, **options)


def test_without_huggingface_hub_one_line_names_the_extra(cache: Path, monkeypatch) -> None:
    loaded = [m for m in sys.modules if m.split(".")[0] == "huggingface_hub"]
    for name in loaded:
        monkeypatch.setitem(sys.modules, name, None)  # an import of any of them now fails
    with pytest.raises(HubCacheError) as raised:
        resolve_hub_runs(spec(cache, "EleutherAI/pythia-tiny"))
    assert str(raised.value) == ("reading checkpoint suites from the Hugging Face cache needs "
                                 "huggingface_hub: pip install 'trainmap[hub]'")  # fmt: skip


def test_huggingface_hub_is_imported_lazily() -> None:
    """trainmap.dynamics is imported by the core: hub.py imports huggingface_hub in functions."""
    source = Path(sys.modules["trainmap.dynamics.runs.hub"].__file__).read_text()
    top_level = [node for node in ast.parse(source).body
                 if isinstance(node, ast.Import | ast.ImportFrom)]  # fmt: skip
    names = [alias.name for node in top_level for alias in node.names]
    names += [node.module or "" for node in top_level if isinstance(node, ast.ImportFrom)]
    assert names and not any(name.startswith("huggingface_hub") for name in names)


# --- the command line: trainmap map hf://... ------------------------------------------------------


def test_the_command_line_measures_a_suite_as_the_plain_layout_of_the_same_weights(
    cache: Path, tmp_path: Path
) -> None:
    """``trainmap map hf://ORG/NAME --metrics-only`` resolves the suite offline, writes its
    revisions.json and each run's metric table; the metrics equal those of the same checkpoint
    files laid out plainly (a directory of step<N>.safetensors)."""
    from trainmap.dynamics.__main__ import main

    out = tmp_path / "out"
    main(["hf://EleutherAI/pythia-14m-seed{seed}", "--seeds", "1-2", "--steps", "0-100",
          "--hf-cache", str(cache), "--out", str(out), "--metrics-only"])  # fmt: skip
    manifest = read_manifest(out / "revisions.json")
    assert sorted(manifest.runs) == ["pythia-14m-seed1", "pythia-14m-seed2"]
    for run in manifest.runs:
        plain = tmp_path / "plain" / run
        plain.mkdir(parents=True)
        checkpoints = hub_run_checkpoints(manifest, run)
        for step, path in checkpoints.items():
            (plain / f"step{step}.safetensors").symlink_to(path.resolve())
        (plain / "evaluation.csv").write_text(
            "step,test_acc\n" + "".join(f"{step},0.5\n" for step in checkpoints)
        )
        from trainmap.dynamics.runs.external import read_external_run

        expected = external_run_metrics(read_external_run(plain))
        table = pd.read_csv(out / "metrics" / run / "metrics.csv")
        assert list(table["step"]) == [0, 100]
        metrics = [c for c in expected.columns if c not in ("step", "test_acc", "train_acc",
                                                            "test_loss", "train_loss", "lr")]  # fmt: skip
        pd.testing.assert_frame_equal(table[metrics], expected[metrics], check_dtype=False)


def test_the_command_line_wants_a_curve_for_a_map_of_a_suite(cache: Path, tmp_path: Path) -> None:
    from trainmap.dynamics.__main__ import main

    with pytest.raises(SystemExit, match="--threshold needs each suite run's curve"):
        main(["hf://EleutherAI/pythia-14m-seed{seed}", "--seeds", "1-2", "--hf-cache",
              str(cache), "--out", str(tmp_path / "out"), "--threshold", "0.5"])  # fmt: skip
    with pytest.raises(SystemExit, match="absent|not cached|9"):
        main(["hf://EleutherAI/pythia-14m-seed{seed}", "--seeds", "9", "--hf-cache",
              str(cache), "--out", str(tmp_path / "out"), "--metrics-only"])  # fmt: skip


MAP = ["--features", "l1", "l2", "w_mean", "--k-max", "2", "--restarts", "1", "--bootstrap", "0",
       "--stability", "0"]  # fmt: skip


def test_a_suite_maps_without_a_curve_saying_what_is_left_out(cache: Path, tmp_path: Path,
                                                              capsys) -> None:  # fmt: skip
    """No --threshold, no --curves: the map is made from the weights and the detour regression
    says why it is not fitted; the runs need no curve."""
    from trainmap.dynamics.__main__ import main

    out = tmp_path / "out"
    main(["hf://EleutherAI/pythia-14m-seed{seed}", "--seeds", "1-3", "--hf-cache", str(cache),
          "--out", str(out), *MAP])  # fmt: skip
    assert "no --threshold" in capsys.readouterr().out
    detours = json.loads((out / "detours.json").read_text())
    assert not detours["fitted"] and "--threshold" in detours["not_fitted"]
    assert (out / "map.json").is_file() and (out / "states.csv").is_file()


def test_a_suite_converges_on_a_falling_loss(cache: Path, tmp_path: Path) -> None:
    """--curves with a held-out loss per run, --curve test_loss --direction falling: a run
    converges at its first revision at or below the threshold; one that stays above is listed as
    never converged."""
    from trainmap.dynamics.__main__ import main

    curves = tmp_path / "curves"
    curves.mkdir()
    losses = {1: (6.0, 3.5, 2.9), 2: (6.0, 5.0, 4.0), 3: (6.0, 2.5, 2.0)}
    for seed, values in losses.items():
        rows = "".join(f"{step},{loss}\n" for step, loss in zip((0, 100, 200), values, strict=True))
        (curves / f"pythia-14m-seed{seed}.csv").write_text("step,test_loss\n" + rows)
    out = tmp_path / "out"
    main(["hf://EleutherAI/pythia-14m-seed{seed}", "--seeds", "1-3", "--hf-cache", str(cache),
          "--out", str(out), "--curves", str(curves), "--threshold", "3.0", "--curve",
          "test_loss", "--direction", "falling", *MAP])  # fmt: skip
    table = pd.read_csv(out / "metrics" / "pythia-14m-seed1" / "metrics.csv")
    assert list(table["test_loss"]) == [6.0, 3.5, 2.9]
    detours = json.loads((out / "detours.json").read_text())
    assert detours["excluded"]["never_converged"] == ["pythia-14m-seed2"]
    with pytest.raises(SystemExit, match="test_loss"):  # the curve must hold the column read
        main(["hf://EleutherAI/pythia-14m-seed{seed}", "--seeds", "1-3", "--hf-cache",
              str(cache), "--out", str(out), "--curves", str(curves), "--threshold", "0.5",
              *MAP])  # fmt: skip
