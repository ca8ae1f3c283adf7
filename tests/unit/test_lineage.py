"""What every result was made from (trainmap.lineage): manifests whose bytes follow their blocks'
content, and jobs that refuse a mixed generation of inputs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from trainmap.grid import SeedRange
from trainmap.io import save_json
from trainmap.jobs.analysis import group_outcomes
from trainmap.jobs.common import SeedRangeJob
from trainmap.lineage import (
    FILES,
    MADE_FROM,
    StaleInputError,
    check_current,
    check_file,
    directory_hashes,
    file_sha256,
)

TRACKING = {"uri": "", "experiment": ""}


def block(method: str = "kaiming") -> SeedRange:
    return SeedRange(task="digits", arch="mlp", method=method, first=0, last=1, seeds=(0, 1))


def job_of(root: Path, rule_dir: str, seed_range: SeedRange) -> SeedRangeJob:
    manifest = root / "results" / rule_dir / "digits/mlp/kaiming/seeds0-1.json"
    hashes = {cell.id: "0" for cell in seed_range.cells}
    return SeedRangeJob(rule_dir, seed_range, manifest, TRACKING, hashes)


def write_block(job: SeedRangeJob, name: str, content: str) -> None:
    for cell in job.cells:
        save_json(
            {"content": content, "seed": cell.seed, "wall_time_s": 1.5}, job.seed_dir(cell) / name
        )
    job.write_manifest({"status": "completed"} for _ in job.cells)


@pytest.fixture
def chain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, SeedRangeJob]:
    """A dataset, a train block made from it and an evaluate block made from the train block."""
    monkeypatch.chdir(tmp_path)
    dataset = tmp_path / "results/data/digits/dataset.pt"
    dataset.parent.mkdir(parents=True)
    dataset.write_bytes(b"data v1")
    train = job_of(tmp_path, "train", block())
    train.uses(dataset)
    write_block(train, "train.json", "lr 0.1")
    evaluate = job_of(tmp_path, "evaluate", block())
    evaluate.uses(dataset)
    for cell in evaluate.cells:
        evaluate.input_file(train.manifest, cell, "train.json")
    write_block(evaluate, "evaluation.json", "acc 0.9")
    return {"train": train, "evaluate": evaluate, "dataset": dataset}


def test_a_manifest_records_each_files_hash_and_what_it_was_made_from(chain) -> None:
    record = json.loads(chain["evaluate"].manifest.read_text())
    seed0 = chain["evaluate"].seed_dir(chain["evaluate"].cells[0])
    # the timing sidecar (evaluation.timing.json) is not a result: a rerun never reproduces it
    assert (seed0 / "evaluation.timing.json").exists()
    assert record["cells"][0][FILES] == {"evaluation.json": file_sha256(seed0 / "evaluation.json")}
    # paths relative to the manifest's directory: the same record on any machine, in any clone
    assert record[MADE_FROM] == {
        "../../../../data/digits/dataset.pt": file_sha256(chain["dataset"]),
        "../../../../train/digits/mlp/kaiming/seeds0-1.json": file_sha256(chain["train"].manifest),
    }


def test_a_retrained_block_gives_another_manifest_and_an_identical_rerun_the_same_bytes(
    chain,
) -> None:
    train = chain["train"]
    before = train.manifest.read_bytes()
    write_block(train, "train.json", "lr 0.1")  # the same content again
    assert train.manifest.read_bytes() == before
    write_block(train, "train.json", "lr 0.2")  # retrained: other models, so another manifest
    assert train.manifest.read_bytes() != before


def test_a_job_refuses_a_file_replaced_after_its_block_was_made(chain, tmp_path: Path) -> None:
    train, evaluate = chain["train"], chain["evaluate"]
    path = train.seed_dir(train.cells[1]) / "train.json"
    save_json({"content": "copied from another run"}, path)
    with pytest.raises(StaleInputError, match=r"seed1/train\.json .* is not the file its block's "
                       r"manifest .*seeds0-1\.json records.*--forcerun"):  # fmt: skip
        check_file(path)
    again = job_of(tmp_path, "evaluate", block())
    with pytest.raises(StaleInputError):
        again.input_file(train.manifest, train.cells[1], "train.json")
    # a file of the block the manifest never recorded is refused too
    (train.seed_dir(train.cells[0]) / "stray.pt").write_bytes(b"x")
    with pytest.raises(StaleInputError, match="not among the files"):
        check_file(train.seed_dir(train.cells[0]) / "stray.pt")
    assert evaluate.manifest.exists()


def test_a_result_made_from_an_older_upstream_is_refused_up_the_chain(chain) -> None:
    train, evaluate = chain["train"], chain["evaluate"]
    evaluation = evaluate.seed_dir(evaluate.cells[0]) / "evaluation.json"
    check_file(evaluation)  # current
    write_block(train, "train.json", "lr 0.2")  # retrained, evaluate not rerun
    with pytest.raises(StaleInputError, match=r"evaluate/.*seeds0-1\.json was made from "
                       r".*results/train/.*seeds0-1\.json as it was then .* has changed since"):  # fmt: skip
        check_file(evaluation)
    # an analysis job stops before reading anything
    with pytest.raises(StaleInputError):
        group_outcomes([str(evaluation)], ["seed0"])


def test_a_changed_dataset_makes_every_block_after_it_stale(chain) -> None:
    chain["dataset"].write_bytes(b"data v2")
    os.utime(chain["dataset"], ns=(1, 1))  # another modification time too
    with pytest.raises(StaleInputError, match=r"dataset\.pt"):
        check_current(chain["evaluate"].manifest)  # through the train manifest it was made from


def test_a_deleted_upstream_is_named(chain) -> None:
    shutil.rmtree(chain["train"].manifest.parent)
    with pytest.raises(StaleInputError, match="which is gone"):
        check_current(chain["evaluate"].manifest)


def test_a_manifest_from_before_content_hashes_is_read_with_a_warning(tmp_path: Path) -> None:
    manifest = tmp_path / "results/train/digits/mlp/kaiming/seeds0-1.json"
    save_json({"rule": "train", "cells": [{"cell": "digits/mlp/kaiming/seed0"}]}, manifest)
    (manifest.parent / "seed0").mkdir()
    (manifest.parent / "seed0/model.pt").write_bytes(b"weights")
    with pytest.warns(UserWarning, match="predates content hashes"):
        assert check_file(manifest.parent / "seed0/model.pt") == manifest.parent / "seed0/model.pt"


def test_files_outside_a_block_pass_unchecked(tmp_path: Path) -> None:
    path = tmp_path / "results/external/lr_sweep/runs/a/metrics.csv"
    path.parent.mkdir(parents=True)
    path.write_text("step\n0\n")
    assert check_file(path) == path


def test_directory_hashes_skip_timing_sidecars_and_temporary_files(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"w")
    (tmp_path / "train.timing.json").write_text("{}")
    (tmp_path / ".model.pt.abc.tmp").write_bytes(b"partial")
    assert list(directory_hashes(tmp_path)) == ["model.pt"]
    assert directory_hashes(tmp_path / "missing") == {}
