"""Fault points (trainmap.faults) and what a full disk looks like to a job (trainmap.io)."""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainmap import faults
from trainmap.io import DiskFullError, atomic_path, save_json


@pytest.mark.parametrize(
    "text",
    ["checkpoint", "checkpoint:x", "nowhere:1", "checkpoint:0", "checkpoint:1:explode"],
)
def test_a_malformed_spec_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="TRAINMAP_FAULT"):
        faults.FaultSpec.parse(text)


def test_a_spec_reads_point_count_action_and_job() -> None:
    assert faults.FaultSpec.parse("rename:3:fsize@train/x/") == faults.FaultSpec(
        "rename", 3, "fsize", "train/x/"
    )
    assert faults.FaultSpec.parse("analysis:1").action == "kill"


def test_a_point_fires_at_its_nth_pass_in_the_job_it_names(monkeypatch) -> None:
    fired = []
    monkeypatch.setattr(faults, "act", fired.append)
    monkeypatch.setattr(faults, "_passes", {})
    monkeypatch.setenv(faults.FAULT_ENV, "rename:3@logs/train/")
    monkeypatch.setenv(faults.JOB_ENV, "logs/evaluate/a.log")
    for _ in range(5):
        faults.fault_point("rename")
    assert fired == []  # another job
    monkeypatch.setenv(faults.JOB_ENV, "logs/train/a.log")
    for _ in range(2):
        faults.fault_point("rename")
        faults.fault_point("checkpoint")  # another point counts apart
    assert fired == []
    faults.fault_point("rename")
    assert fired == [faults.FaultSpec("rename", 3, "kill", "logs/train/")]
    faults.fault_point("rename")
    assert len(fired) == 1


def test_unarmed_points_do_nothing(monkeypatch) -> None:
    monkeypatch.delenv(faults.FAULT_ENV, raising=False)
    monkeypatch.setattr(faults, "act", lambda spec: pytest.fail("fired"))
    faults.fault_point("checkpoint")


def test_a_full_disk_names_the_file_and_keeps_the_previous_one(tmp_path: Path) -> None:
    target = tmp_path / "table.json"
    save_json({"version": 1}, target)
    with pytest.raises(DiskFullError) as raised, atomic_path(target) as tmp:
        tmp.write_text("partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    message = str(raised.value)
    assert str(target) in message and "ENOSPC" in message
    assert "previous version is intact" in message
    assert target.read_text().startswith("{") and '"version": 1' in target.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["table.json"]  # no temporary file left


SCRIPT = """
import os, sys
os.environ["TRAINMAP_FAULT"] = sys.argv[1]
os.environ["TRAINMAP_JOB"] = "logs/train/a.log"
os.environ["TRAINMAP_WORKFLOW_PID"] = sys.argv[3]
from trainmap.io import save_torch
for step in range(3):
    save_torch({"step": step, "pad": "x" * 20000}, sys.argv[2])
    print("wrote", step, flush=True)
"""


@pytest.mark.integration
def test_kill_ends_the_workflow_and_the_job_at_the_point(tmp_path: Path) -> None:
    workflow = subprocess.Popen(["sleep", "60"])
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), "torch-write:2", str(tmp_path / "a.pt"),
         str(workflow.pid)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split("\n")[:-1] == ["wrote 0"]
    assert workflow.wait(timeout=10) == -signal.SIGKILL


@pytest.mark.integration
def test_file_size_limit_fails_the_write_naming_it(tmp_path: Path) -> None:
    target = tmp_path / "a.pt"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), "torch-write:2:fsize", str(target), "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "DiskFullError" in done.stderr and f"could not write {target}" in done.stderr
    assert "file-size limit" in done.stderr and "EFBIG" in done.stderr
    from trainmap.io import load_torch

    assert load_torch(target)["step"] == 0  # the first write stands
