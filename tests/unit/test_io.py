"""Tests for atomic output and safe checkpoint loading (trainmap.io)."""

from __future__ import annotations

import math
import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from trainmap.io import (
    CHECKSUM_PREFIX,
    DamagedFileError,
    atomic_path,
    load_json,
    load_resume_or_none,
    load_torch,
    save_json,
    save_text,
    save_torch,
    verify_checksum,
    write_atomic,
)


class Boom(Exception):
    pass


class RunsCode:
    """An object whose unpickling would create ``marker``: what weights_only must refuse."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def names(directory: Path) -> set[str]:
    return {path.name for path in directory.iterdir()}


def test_write_atomic_success_leaves_only_the_target(tmp_path):
    target = tmp_path / "sub" / "out.txt"  # the parent directory is created
    write_atomic(target, lambda tmp: tmp.write_text("hello"))
    assert target.read_text() == "hello"
    assert names(target.parent) == {"out.txt"}

    save_text("again", target)
    assert target.read_text() == "again"
    save_torch({"w": torch.arange(3)}, tmp_path / "sub" / "w.pt")
    save_json({"a": 1}, tmp_path / "sub" / "a.json")
    assert names(target.parent) == {"out.txt", "w.pt", "a.json"}


def test_the_writer_sees_a_temporary_path_in_the_same_directory(tmp_path):
    target = tmp_path / "out.txt"
    seen = []
    write_atomic(target, lambda tmp: seen.append(tmp) or tmp.write_text("x"))
    assert seen[0].parent == tmp_path and seen[0] != target  # same file system: rename is atomic
    assert not seen[0].exists()


def test_failed_write_keeps_the_previous_content(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("previous")

    def half_write(tmp: Path) -> None:
        tmp.write_text("truncat")
        raise Boom

    with pytest.raises(Boom):
        write_atomic(target, half_write)
    assert target.read_text() == "previous"
    assert names(tmp_path) == {"out.txt"}

    with pytest.raises(Boom), atomic_path(target) as tmp:
        tmp.write_bytes(b"partial")
        raise Boom
    assert target.read_text() == "previous"
    assert names(tmp_path) == {"out.txt"}


def test_failed_first_write_creates_nothing(tmp_path):
    def save_then_fail(tmp: Path) -> None:
        torch.save([1], tmp)
        raise Boom

    with pytest.raises(Boom):
        write_atomic(tmp_path / "new.pt", save_then_fail)
    assert names(tmp_path) == set()
    # An object torch.save cannot pickle: the error propagates and nothing is left behind.
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        save_torch({"f": lambda: None}, tmp_path / "lambda.pt")
    assert names(tmp_path) == set()


def test_written_files_get_the_usual_permissions(tmp_path):
    # Outputs must be as readable as any file the user creates (umask), not owner-only (0600).
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    save_text("x", tmp_path / "atomic.txt")
    save_torch([1], tmp_path / "atomic.pt")
    expected = plain.stat().st_mode & 0o777
    assert (tmp_path / "atomic.txt").stat().st_mode & 0o777 == expected
    assert (tmp_path / "atomic.pt").stat().st_mode & 0o777 == expected


def test_save_json_writes_non_finite_floats_as_null(tmp_path):
    path = tmp_path / "metrics.json"
    save_json(
        {"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "ok": 0.5,
         "nested": [1.0, math.nan, {"x": float("nan")}], "tensor": torch.tensor([1.0, math.nan]),
         "np": np.float64("nan"), "np_int": np.int64(3), 2: "int key"},
        path,
    )  # fmt: skip
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert load_json(path) == {
        "nan": None, "inf": None, "ninf": None, "ok": 0.5, "nested": [1.0, None, {"x": None}],
        "tensor": [1.0, None], "np": None, "np_int": 3, "2": "int key",
    }  # fmt: skip
    assert text.endswith("\n")
    assert text.index('"inf"') < text.index('"nan"')  # keys sorted


def test_load_torch_round_trip(tmp_path):
    saved = {"step": torch.arange(4), "state": {"w": torch.randn(2, 3)}, "history": [{"a": 1.5}]}
    save_torch(saved, tmp_path / "x.pt")
    loaded = load_torch(tmp_path / "x.pt")
    assert torch.equal(loaded["step"], saved["step"])
    assert torch.equal(loaded["state"]["w"], saved["state"]["w"])
    assert loaded["history"] == [{"a": 1.5}]


def test_load_torch_refuses_arbitrary_pickles(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pt"
    torch.save({"payload": RunsCode(marker)}, path)
    with pytest.warns(UserWarning, match="no checksum"), pytest.raises(DamagedFileError) as caught:
        load_torch(path)
    assert not marker.exists()
    assert_one_clear_error(caught.value, path, "objects other than tensors")
    # The same file does run code under a full unpickle: the refusal above is what protects us.
    torch.load(path, weights_only=False)
    assert marker.exists()
    os.remove(marker)


# --- checksums ----------------------------------------------------------


def assert_one_clear_error(error: DamagedFileError, path: Path, problem: str) -> None:
    """One error whose first line names the file and the damage and says how to remake it, and
    which nowhere suggests the unsafe weights_only=False (torch's hint; no chained exception)."""
    first_line = str(error).splitlines()[0]
    assert first_line.startswith(f"damaged file {path}: "), first_line
    assert problem in first_line and "delete it and rerun" in first_line, first_line
    assert error.__cause__ is None, "torch's error must not show"
    assert error.__context__ is None or error.__suppress_context__, "torch's error must not show"
    assert "weights_only" not in str(error)


def flip_bytes(path: Path, count: int = 64, at: float = 0.5) -> None:
    """Invert ``count`` bytes in the middle of ``path`` (where the tensors' data is)."""
    data = bytearray(path.read_bytes())
    start = int(len(data) * at)
    for index in range(start, start + count):
        data[index] ^= 0xFF
    path.write_bytes(bytes(data))


def test_every_saved_checkpoint_carries_a_checksum_that_plain_torch_load_ignores(tmp_path):
    path = tmp_path / "x.pt"
    saved = {"w": torch.randn(50, 50)}
    save_torch(saved, path)
    assert CHECKSUM_PREFIX in path.read_bytes()[-100:]
    assert verify_checksum(path) is True
    # Still an ordinary checkpoint: torch.load (users' scripts, MLflow artifacts) reads it.
    assert torch.equal(torch.load(path, weights_only=True)["w"], saved["w"])


def test_flipped_bytes_in_model_and_checkpoint_are_caught(tmp_path):
    """Case 9: 64 flipped bytes inside model.pt and a torch checkpoint loaded silently before."""
    from trainmap.models import build_model
    from trainmap.training.checkpoints import load_model, save_dense

    meta = {"input_kind": "vector", "input_shape": [40], "num_classes": 2}
    model = build_model("mlp", meta, hidden=[128])
    model_path, checkpoint_path = tmp_path / "model.pt", tmp_path / "checkpoint.pt"
    save_dense(model, model_path, arch="mlp", model_options={"hidden": [128]}, meta=meta)
    save_torch({"step": torch.arange(20), "w": torch.randn(20, 128, 40)}, checkpoint_path)
    load_model(model_path)  # control: intact files load
    load_torch(checkpoint_path)
    for path, load in ((model_path, load_model), (checkpoint_path, load_torch)):
        flip_bytes(path)
        with pytest.raises(DamagedFileError) as caught:
            load(path)
        assert_one_clear_error(caught.value, path, "does not match the checksum")


def test_damage_anywhere_in_the_file_is_caught(tmp_path):
    path = tmp_path / "x.pt"
    save_torch({"w": torch.randn(64, 64), "meta": {"arch": "mlp"}}, path)
    intact = path.read_bytes()
    for position in (0, 40, len(intact) // 3, len(intact) - 120, len(intact) - 90, len(intact) - 5):
        data = bytearray(intact)
        data[position] ^= 0x01  # one bit
        path.write_bytes(bytes(data))
        with pytest.raises(DamagedFileError):
            load_torch(path)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        pytest.param(lambda data: data[: len(data) // 2], "truncated", id="truncated"),
        pytest.param(lambda data: b"", "empty", id="empty"),
        pytest.param(lambda data: b"epoch,loss\n1,0.5\n", "not a checkpoint", id="text"),
        pytest.param(lambda data: bytes(range(256)) * 40, "not a checkpoint", id="garbage"),
        pytest.param(lambda data: _zip_of_text(), "cannot be read", id="zip_not_torch"),
    ],
)
def test_unreadable_files_give_one_clear_error(tmp_path, damage, problem):
    """Case 10: before, OSError [Errno 22] without a path, EOFError, KeyError: 101, or torch's
    hint to retry with weights_only=False."""
    path = tmp_path / "model.pt"
    save_torch({"w": torch.randn(100, 100)}, path)
    path.write_bytes(damage(path.read_bytes()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the last case looks like a file without a checksum
        with pytest.raises(DamagedFileError) as caught:
            load_torch(path)
    assert_one_clear_error(caught.value, path, problem)


def _zip_of_text() -> bytes:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("notes.txt", "not a checkpoint")
    return buffer.getvalue()


def test_files_from_before_checksums_load_with_a_warning(tmp_path):
    """Results an older trainmap wrote (plain torch.save) stay usable: loaded unverified, named."""
    path = tmp_path / "old.pt"
    torch.save({"w": torch.arange(3)}, path)
    with pytest.warns(UserWarning, match=f"{path} has no checksum"):
        assert torch.equal(load_torch(path)["w"], torch.arange(3))


def test_a_missing_file_is_not_called_damaged(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_torch(tmp_path / "absent.pt")


def test_a_damaged_resume_file_is_deleted_with_a_warning(tmp_path):
    """Case 11 (the training loop calls load_resume_or_none): Snakemake does not track resume.pt,
    so a damaged one would fail its cell on every rerun."""
    path = tmp_path / "resume.pt"
    assert load_resume_or_none(path) is None
    save_torch({"step": 105, "w": torch.randn(30, 30)}, path)
    assert load_resume_or_none(path)["step"] == 105
    flip_bytes(path)
    with pytest.warns(UserWarning, match=rf"damaged resume file {path}: .*training starts from"):
        assert load_resume_or_none(path) is None
    assert not path.exists()


def test_a_damaged_file_in_a_seed_block_names_the_blocks_manifest(tmp_path):
    """Snakemake tracks a seed block by its manifest: the remedy for a damaged per-seed file names
    the manifest whose seed range holds that seed, since deleting the file alone remakes nothing."""
    method_dir = tmp_path / "results/train/digits/vgg_bn/kaiming"
    path = method_dir / "seed33" / "model.pt"
    save_torch({"w": torch.ones(64)}, path)
    for name in ("seeds0-31.json", "seeds32-63.json"):
        (method_dir / name).write_text("{}")
    flip_bytes(path, count=8)
    with pytest.raises(DamagedFileError) as caught:
        load_torch(path)
    first_line = str(caught.value).splitlines()[0]
    assert first_line.startswith(f"damaged file {path}: ")
    assert f"delete it and its block's manifest {method_dir / 'seeds32-63.json'}" in first_line


@pytest.mark.parametrize("text", ["", '{"status": "compl', "\x00\x01binary"])
def test_a_damaged_json_record_is_named_with_the_remedy(tmp_path, text):
    """A cut-off or foreign evaluation.json stops its reader naming the file and the block manifest
    to delete, not with a bare JSONDecodeError."""
    seed_dir = tmp_path / "evaluate" / "digits" / "mlp" / "kaiming" / "seed3"
    seed_dir.mkdir(parents=True)
    (seed_dir.parent / "seeds0-7.json").write_text("{}")
    damaged = seed_dir / "evaluation.json"
    damaged.write_text(text)
    with pytest.raises(DamagedFileError) as caught:
        load_json(damaged)
    message = str(caught.value)
    assert message.startswith(f"damaged file {damaged}: not valid JSON"), message
    assert f"its block's manifest {seed_dir.parent / 'seeds0-7.json'}" in message
