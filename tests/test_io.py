"""Tests for atomic output and safe checkpoint loading (trainmap.io)."""

from __future__ import annotations

import math
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from trainmap.io import (
    atomic_path,
    load_json,
    load_torch,
    save_json,
    save_text,
    save_torch,
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
    with pytest.raises(pickle.UnpicklingError):
        load_torch(path)
    assert not marker.exists()
    # The same file does run code under a full unpickle: the refusal above is what protects us.
    torch.load(path, weights_only=False)
    assert marker.exists()
    os.remove(marker)
