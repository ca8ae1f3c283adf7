"""The fake Hugging Face Hub (tests/hub_server.py) against the real huggingface_hub client: the
branches and their commits are listed; a safetensors header is read by a range request without
the whole file; snapshot_download and hf_hub_download fill the cache in the client's layout (which
scan_cache_dir then deletes); a gated, missing repository, revision or file raises the client's
own error; a download cut mid-file is retried by the client (resumed by a range request past the
whole chunks it kept), and one cut at every try is given up."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hub_server import HubServer, git_blob_id
from safetensors.torch import save as safetensors_bytes

hub = pytest.importorskip("huggingface_hub")
constants = pytest.importorskip("huggingface_hub.constants")
errors = pytest.importorskip("huggingface_hub.errors")
file_download = pytest.importorskip("huggingface_hub.file_download")
httpx2 = pytest.importorskip("httpx2")  # the client's HTTP library

SUITE = ("EleutherAI/pythia-tiny-seed1", "EleutherAI/pythia-tiny-seed2")
BRANCHES = ("step0", "step1", "step2", "main")
GATED = "EleutherAI/pythia-tiny-gated"
REPO = SUITE[0]
#: The embedding makes model.safetensors larger (about 128 KiB) than the first 100,000 bytes that
#: get_safetensors_metadata asks for: reading its header then provably leaves most of it unsent.
SHAPES = {"embed.weight": (64, 512), "layers.0.weight": (6, 4), "layers.0.bias": (6,)}


def weights(repo: str, branch: str) -> dict[str, torch.Tensor]:
    """Small random tensors, the same shapes at every revision, different values."""
    seed = int(hashlib.sha256(f"{repo}@{branch}".encode()).hexdigest()[:8], 16)
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}


def revision_files(repo: str, branch: str) -> dict[str, bytes]:
    """One revision's files: a config, the weights and a README (left out by the patterns)."""
    config = {"model_type": "gpt_neox", "hidden_size": 512, "revision": branch}
    return {
        "config.json": json.dumps(config, indent=2).encode(),
        "model.safetensors": safetensors_bytes(weights(repo, branch)),
        "README.md": f"# {repo} at {branch}\n".encode(),
    }


@pytest.fixture(scope="module")
def repos() -> dict[str, dict[str, dict[str, bytes]]]:
    return {repo: {branch: revision_files(repo, branch) for branch in BRANCHES} for repo in SUITE}


@pytest.fixture(autouse=True)
def online_quiet() -> Iterator[None]:
    """The client online whatever HF_HUB_OFFLINE said at its import, and without progress bars."""
    with pytest.MonkeyPatch.context() as patch, hub.utils.disable_progress_bars():
        patch.setattr(constants, "HF_HUB_OFFLINE", False)
        yield


@pytest.fixture
def server(repos: dict[str, dict[str, dict[str, bytes]]]) -> Iterator[HubServer]:
    with HubServer(repos, gated=frozenset({GATED})) as running:
        yield running


@pytest.fixture
def api(server: HubServer) -> Any:
    return hub.HfApi(endpoint=server.endpoint, token=False)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pauses http_get takes before resuming a cut download (recorded, not slept)."""
    slept: list[float] = []
    monkeypatch.setattr(file_download, "time", SimpleNamespace(sleep=slept.append))
    return slept


def resolve_path(repo: str, revision: str, filename: str) -> str:
    """The path (as the client quotes it) of a file's ``resolve`` route."""
    return f"/{repo}/resolve/{revision}/{filename}"


def download(server: HubServer, cache: Path, repo: str, revision: str, filename: str) -> Path:
    """``hf_hub_download`` of one file from the fake into ``cache``: the snapshot's path."""
    return Path(
        hub.hf_hub_download(
            repo,
            filename,
            revision=revision,
            cache_dir=cache,
            endpoint=server.endpoint,
            token=False,
        )
    )


def test_list_repo_refs_gives_each_branch_and_its_commit(server: HubServer, api: Any) -> None:
    refs = api.list_repo_refs(REPO)
    assert {ref.name: ref.target_commit for ref in refs.branches} == {
        branch: server.commit(REPO, branch) for branch in BRANCHES
    }
    assert {ref.ref for ref in refs.branches} == {f"refs/heads/{branch}" for branch in BRANCHES}
    assert refs.tags == [] and refs.converts == [] and refs.pull_requests is None
    assert api.list_repo_refs(REPO, include_pull_requests=True).pull_requests == []
    assert server.commit(REPO, "step1") == hashlib.sha1(f"{REPO}@step1".encode()).hexdigest()
    assert server.requests == [("GET", f"/api/models/{REPO}/refs")] * 2


def test_model_info_and_tree_describe_the_revision(
    server: HubServer, api: Any, repos: dict[str, dict[str, dict[str, bytes]]]
) -> None:
    files = repos[REPO]["step1"]
    commit = server.commit(REPO, "step1")
    info = api.model_info(REPO, revision="step1", files_metadata=True)
    assert (info.id, info.sha, info.private) == (REPO, commit, False)
    assert {s.rfilename: s.size for s in info.siblings} == {n: len(c) for n, c in files.items()}
    weights_sibling = next(s for s in info.siblings if s.rfilename == "model.safetensors")
    assert weights_sibling.lfs.sha256 == hashlib.sha256(files["model.safetensors"]).hexdigest()
    assert api.model_info(REPO, revision=commit).sha == commit  # a commit is a revision too

    tree = {
        entry.path: entry for entry in api.list_repo_tree(REPO, revision=commit, recursive=True)
    }
    assert {path: entry.size for path, entry in tree.items()} == {
        n: len(c) for n, c in files.items()
    }
    assert tree["config.json"].blob_id == git_blob_id(files["config.json"])
    assert tree["config.json"].lfs is None
    assert tree["model.safetensors"].lfs.sha256 == weights_sibling.lfs.sha256


def test_safetensors_header_is_read_by_range_without_the_whole_file(
    server: HubServer, api: Any, repos: dict[str, dict[str, dict[str, bytes]]]
) -> None:
    metadata = api.get_safetensors_metadata(REPO, revision="step1")
    tensors = metadata.files_metadata["model.safetensors"].tensors
    assert {name: tuple(info.shape) for name, info in tensors.items()} == SHAPES
    assert {info.dtype for info in tensors.values()} == {"F32"}
    assert metadata.weight_map == dict.fromkeys(SHAPES, "model.safetensors")

    path = resolve_path(REPO, "step1", "model.safetensors")
    assert ("HEAD", path) in server.requests  # file_exists
    gets = [r for r in server.log if r.method == "GET" and r.path == path]
    assert gets and all(r.range is not None and r.status == 206 for r in gets)
    size = len(repos[REPO]["step1"]["model.safetensors"])
    assert sum(r.body_bytes for r in gets) < size


def test_snapshot_download_fills_the_cache_and_scan_cache_dir_deletes_it(
    tmp_path: Path, server: HubServer, repos: dict[str, dict[str, dict[str, bytes]]]
) -> None:
    cache = tmp_path / "hub"
    commit = server.commit(REPO, "step1")
    folder = hub.snapshot_download(
        REPO,
        revision="step1",
        allow_patterns=["config.json", "*.safetensors"],
        cache_dir=cache,
        endpoint=server.endpoint,
        token=False,
    )
    files = repos[REPO]["step1"]
    snapshot = Path(folder)
    assert {p.name: p.read_bytes() for p in snapshot.iterdir()} == {
        name: files[name] for name in ("config.json", "model.safetensors")
    }
    storage = cache / ("models--" + REPO.replace("/", "--"))
    assert snapshot == storage / "snapshots" / commit
    assert (storage / "refs" / "step1").read_text() == commit
    assert {blob.name for blob in (storage / "blobs").iterdir()} == {
        git_blob_id(files["config.json"]),
        hashlib.sha256(files["model.safetensors"]).hexdigest(),
    }
    assert all((snapshot / name).is_symlink() for name in ("config.json", "model.safetensors"))
    assert ("GET", f"/api/models/{REPO}/revision/step1") in server.requests
    assert ("GET", f"/api/models/{REPO}/tree/{commit}") in server.requests
    assert ("GET", resolve_path(REPO, commit, "README.md")) not in server.requests

    (cached,) = hub.scan_cache_dir(cache).repos
    assert cached.repo_id == REPO and {r.commit_hash for r in cached.revisions} == {commit}
    hub.scan_cache_dir(cache).delete_revisions(commit).execute()
    assert not storage.exists()  # its only revision deleted, the repository's folder goes too


def test_hf_hub_download_gets_one_file_by_branch_or_commit(
    tmp_path: Path, server: HubServer, repos: dict[str, dict[str, dict[str, bytes]]]
) -> None:
    cache = tmp_path / "hub"
    expected = repos[SUITE[1]]["step2"]["config.json"]
    local = download(server, cache, SUITE[1], "step2", "config.json")
    assert local.read_bytes() == expected
    commit = server.commit(SUITE[1], "step2")
    assert local.parent.name == commit
    path = resolve_path(SUITE[1], "step2", "config.json")
    assert server.requests == [("HEAD", path), ("GET", path)]

    weights_file = download(server, cache, SUITE[1], commit, "model.safetensors")
    assert weights_file.read_bytes() == repos[SUITE[1]]["step2"]["model.safetensors"]


#: The client calls tried on a gated or missing repository, revision or file (see :func:`call`).
KINDS = ("refs", "info", "download", "snapshot")


def call(
    server: HubServer, api: Any, cache: Path, kind: str, repo: str, revision: str, name: str
) -> None:
    """One client call of ``kind`` on ``repo`` at ``revision`` (``name``: the file, if any)."""
    if kind == "refs":
        api.list_repo_refs(repo)
    elif kind == "info":
        api.model_info(repo, revision=revision)
    elif kind == "download":
        download(server, cache, repo, revision, name)
    else:
        hub.snapshot_download(
            repo, revision=revision, cache_dir=cache, endpoint=server.endpoint, token=False
        )


@pytest.mark.parametrize("kind", KINDS)
def test_a_gated_repo_raises_the_clients_gated_error(
    tmp_path: Path, server: HubServer, api: Any, kind: str
) -> None:
    with pytest.raises(errors.GatedRepoError) as raised:
        call(server, api, tmp_path / "hub", kind, GATED, "main", "config.json")
    assert raised.value.response.status_code == 401
    assert all(
        request[1].startswith(("/api/models/" + GATED, "/" + GATED)) for request in server.requests
    )


ABSENT = "EleutherAI/pythia-absent"
#: (call, repo, revision, file, the error the client raises): an absent repository, a revision
#: that is no branch nor commit, a file that is not in the revision.
MISSING = [
    *[(kind, ABSENT, "step1", "config.json", errors.RepositoryNotFoundError) for kind in KINDS],
    *[(kind, REPO, "step9", "config.json", errors.RevisionNotFoundError) for kind in KINDS[1:]],
    ("download", REPO, "step1", "tokenizer.json", errors.EntryNotFoundError),
]


@pytest.mark.parametrize(("kind", "repo", "revision", "name", "error"), MISSING)
def test_a_missing_repo_revision_or_file_raises_the_clients_error(
    tmp_path: Path,
    server: HubServer,
    api: Any,
    kind: str,
    repo: str,
    revision: str,
    name: str,
    error: type[Exception],
) -> None:
    with pytest.raises(error) as raised:
        call(server, api, tmp_path / "hub", kind, repo, revision, name)
    assert not isinstance(raised.value, errors.GatedRepoError)
    assert raised.value.response.status_code == 404  # type: ignore[attr-defined]


def test_a_download_cut_once_is_retried_by_the_client(
    tmp_path: Path,
    server: HubServer,
    sleeps: list[float],
    repos: dict[str, dict[str, dict[str, bytes]]],
) -> None:
    """http_get keeps what it wrote and asks for the rest; it writes whole chunks of
    DOWNLOAD_CHUNK_SIZE (10 MB) only, so a small file cut mid-way is fetched again from byte 0."""
    expected = repos[REPO]["step0"]["model.safetensors"]
    server.cut_after(REPO, "model.safetensors", 1000)
    local = download(server, tmp_path / "hub", REPO, "step0", "model.safetensors")
    assert local.read_bytes() == expected
    gets = [(r.range, r.status, r.body_bytes) for r in server.log if r.method == "GET"]
    assert gets == [(None, 200, 1000), (None, 200, len(expected))]
    assert sleeps == [1]  # http_get waits a second before it tries again


def test_a_download_cut_after_whole_chunks_is_resumed_by_range(
    tmp_path: Path,
    server: HubServer,
    sleeps: list[float],
    monkeypatch: pytest.MonkeyPatch,
    repos: dict[str, dict[str, dict[str, bytes]]],
) -> None:
    """With 512-byte chunks the first 512 bytes of a download cut after 1000 are kept: the retry
    asks for ``bytes=512-`` and the fake answers 206 with the rest."""
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 512)
    expected = repos[REPO]["step0"]["model.safetensors"]
    server.cut_after(REPO, "model.safetensors", 1000)
    local = download(server, tmp_path / "hub", REPO, "step0", "model.safetensors")
    assert local.read_bytes() == expected
    path = resolve_path(REPO, "step0", "model.safetensors")
    assert server.ranges("GET", path) == [None, "bytes=512-"]
    gets = [(r.status, r.body_bytes) for r in server.log if r.method == "GET"]
    assert gets == [(200, 1000), (206, len(expected) - 512)]
    assert sleeps == [1]


def test_a_download_cut_at_every_try_is_given_up(
    tmp_path: Path,
    server: HubServer,
    sleeps: list[float],
    repos: dict[str, dict[str, dict[str, bytes]]],
) -> None:
    """http_get resumes at most 5 times without progress, then lets httpx's error through (the
    HEAD metadata call succeeded, so no cache fallback happens) and keeps no partial blob."""
    server.cut_after(REPO, "model.safetensors", 0, times=10)
    cache = tmp_path / "hub"
    with pytest.raises(httpx2.RemoteProtocolError):
        download(server, cache, REPO, "step0", "model.safetensors")
    assert [r.method for r in server.log] == ["HEAD"] + ["GET"] * 6
    assert len(sleeps) == 5
    blobs = cache / ("models--" + REPO.replace("/", "--")) / "blobs"
    assert not any(blobs.iterdir())
    # 4 cuts are left: the next call's 5th try gets the whole file
    local = download(server, cache, REPO, "step0", "model.safetensors")
    assert local.read_bytes() == repos[REPO]["step0"]["model.safetensors"]
