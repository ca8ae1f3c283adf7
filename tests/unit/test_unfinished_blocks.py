"""A block job killed mid-run is finished by the next plain `snakemake`, and said so.

Snakemake deletes a job's manifest before it runs the job, and reruns a job whose output is missing
only when a job that needs it has to run. After `kill -9` of a forced training block a plain rerun
said "Nothing to be done": the earlier run's results stayed, the resume file too, without a word.
Now trainmap.unfinished finds such blocks at parse time (manifest missing, resume file or seed
directories there), the Snakefile makes their manifests targets of rule all, and a line on stderr
names each block, its resume file and the commands that finish it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import copy_workflow, snakemake, workflow_env

from trainmap import unfinished
from trainmap.grid import SeedRange
from trainmap.io import load_json
from trainmap.unfinished import find_unfinished


def block(method: str = "kaiming", first: int = 0, last: int = 1) -> SeedRange:
    return SeedRange("parity", "mlp", method, first, last, tuple(range(first, last + 1)))


def make_files(results: Path, *paths: str) -> None:
    """Empty files (or directories, for paths ending in /) below ``results``."""
    for path in paths:
        target = results / path
        if path.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()


# --- detection -----------------------------------------------------------------------------------


def test_no_results_yet_finds_nothing(tmp_path: Path) -> None:
    scan = find_unfinished(tmp_path / "results", {"train": [block()], "evaluate": [block()]})
    assert scan.blocks == () and scan.leftover_resumes == ()
    assert scan.manifests == [] and scan.messages() == []


def test_finished_and_not_started_blocks_are_not_unfinished(tmp_path: Path) -> None:
    results = tmp_path / "results"
    make_files(results, "train/parity/mlp/kaiming/seeds0-1.json",
               "train/parity/mlp/kaiming/seed0/train.json",
               "train/parity/mlp/kaiming/seed1/")  # fmt: skip
    later = block(first=2, last=3)  # in the grid, never run: nothing of it on disk
    scan = find_unfinished(results, {"train": [block(), later]})
    assert scan.blocks == () and scan.messages() == []


def test_killed_training_block_with_its_resume_file(tmp_path: Path) -> None:
    results = tmp_path / "results"
    make_files(results, "train/parity/mlp/kaiming/seeds0-1.resume.pt",
               "train/parity/mlp/kaiming/seed0/train.json",
               "train/parity/mlp/kaiming/seed1/")  # fmt: skip
    command = ["snakemake", "--cores", "2", "--configfile", "config/smoke.yaml"]
    scan = find_unfinished(results, {"train": [block()]}, command)
    base = f"{results.as_posix()}/train/parity/mlp/kaiming"
    [found] = scan.blocks
    assert found.resume == f"{base}/seeds0-1.resume.pt"
    assert found.seed_dirs == (f"{base}/seed0", f"{base}/seed1")
    assert scan.manifests == [f"{base}/seeds0-1.json"]
    assert scan.messages() == [
        f"trainmap: unfinished block train/parity/mlp/kaiming/seeds0-1: its manifest "
        f"{base}/seeds0-1.json is missing (its job was killed or failed, or it was deleted) "
        f"while its resume file {base}/seeds0-1.resume.pt remains. `snakemake --cores 2 "
        "--configfile config/smoke.yaml` (rule all) finishes it from the resume file and reruns "
        "what depends on it; this block alone: `snakemake --cores 2 --configfile "
        f"config/smoke.yaml {base}/seeds0-1.json`"
    ]


def test_killed_block_of_a_rule_without_resume_files(tmp_path: Path) -> None:
    """evaluate, reparam, quantize, ...: only the earlier run's seed directories remain."""
    results = tmp_path / "results"
    make_files(results, "evaluate/parity/mlp/kaiming/seed0/evaluation.json",
               "evaluate/parity/mlp/kaiming/seed1/evaluation.json",
               "train/parity/mlp/kaiming/seeds0-1.json")  # fmt: skip
    scan = find_unfinished(results, {"train": [block()], "evaluate": [block()]})
    base = f"{results.as_posix()}/evaluate/parity/mlp/kaiming"
    [found] = scan.blocks
    assert (found.rule_dir, found.resume) == ("evaluate", None)
    [message] = scan.messages()
    assert message.startswith(
        f"trainmap: unfinished block evaluate/parity/mlp/kaiming/seeds0-1: its manifest "
        f"{base}/seeds0-1.json is missing (its job was killed or failed, or it was deleted) "
        f"while 2 of its 2 seed directories ({base}/seed0, ...) hold files of an earlier run. "
        "`snakemake --cores all` (rule all) remakes it and reruns what depends on it;"
    )


def test_a_new_block_after_a_seed_block_change_says_so(tmp_path: Path) -> None:
    results = tmp_path / "results"
    make_files(results, "evaluate/parity/mlp/kaiming/seeds0-3.json",
               "evaluate/parity/mlp/kaiming/seed0/evaluation.json")  # fmt: skip
    scan = find_unfinished(results, {"evaluate": [block()]})
    [found] = scan.blocks
    assert found.old_manifest == f"{results.as_posix()}/evaluate/parity/mlp/kaiming/seeds0-3.json"
    assert f"(seed_block changed: {found.old_manifest} beside it" in scan.messages()[0]
    # with a resume file, the block's own job ran: killed, whatever the seeds' earlier grouping
    make_files(results, "evaluate/parity/mlp/kaiming/seeds0-1.resume.pt")
    [found] = find_unfinished(results, {"evaluate": [block()]}).blocks
    assert found.old_manifest is None and found.resume


def test_every_leftover_resume_file_is_mentioned(tmp_path: Path) -> None:
    """Beside a finished manifest, or of a block this grid does not have: reported, not rerun."""
    results = tmp_path / "results"
    make_files(results, "train/parity/mlp/kaiming/seeds0-1.json",
               "train/parity/mlp/kaiming/seeds0-1.resume.pt",
               "sparse/parity/mlp/ast/seeds0-31.resume.pt",
               "sparse/other/mlp/ast/seeds0-1.resume.pt")  # fmt: skip
    scan = find_unfinished(results, {"train": [block()], "sparse": [block("ast")]})
    base = results.as_posix()
    assert scan.blocks == ()
    assert scan.messages() == [
        f"trainmap: resume file {base}/train/parity/mlp/kaiming/seeds0-1.resume.pt of block "
        "train/parity/mlp/kaiming/seeds0-1 is left over beside the block's finished manifest "
        f"{base}/train/parity/mlp/kaiming/seeds0-1.json: nothing reads it unless the block "
        "reruns, which would resume from it; delete it if that manifest holds the results you "
        "want",
        f"trainmap: resume file {base}/sparse/other/mlp/ast/seeds0-1.resume.pt of block "
        "sparse/other/mlp/ast/seeds0-1 belongs to no block of this grid (a killed job of another "
        "configuration or seed_block): nothing uses it; finish it with that configuration, or "
        "delete it",
        f"trainmap: resume file {base}/sparse/parity/mlp/ast/seeds0-31.resume.pt of block "
        "sparse/parity/mlp/ast/seeds0-31 belongs to no block of this grid (a killed job of "
        "another configuration or seed_block): nothing uses it; finish it with that "
        "configuration, or delete it",
    ]


def test_one_listing_per_directory_not_per_cell(tmp_path: Path, monkeypatch) -> None:
    """Parse time: a 1000-seed method directory is listed once, whatever its number of cells."""
    results = tmp_path / "results"
    blocks = [block(first=first, last=first + 99) for first in range(0, 1000, 100)]
    make_files(results, *[f"train/parity/mlp/kaiming/seed{seed}/" for seed in range(1000)],
               *[f"train/parity/mlp/kaiming/{b.name}.json" for b in blocks[1:]])  # fmt: skip
    listed = []
    scandir = os.scandir
    monkeypatch.setattr(unfinished.os, "scandir", lambda path: listed.append(path) or scandir(path))
    scan = find_unfinished(results, {"train": blocks, "evaluate": blocks})
    assert [found.block_id for found in scan.blocks] == ["parity/mlp/kaiming/seeds0-99"]
    # results/train, its task and arch directories and the method directory; results/evaluate,
    # which does not exist
    assert len(listed) == 5


# --- the workflow: kill a forced training block, then a plain rerun -------------------------------

#: One block of two sparse-parity seeds that trains for about 2 s: long enough to kill mid-run.
TINY = """\
grid:
  - {task: sparse_parity, archs: [mlp], methods: [kaiming], seeds: [0, 1]}
train:
  sparse_parity: {steps: 3000, checkpoint_every: 100, resume_every: 100, seed_block: 2}
analysis: {group_maps: all, bootstrap: 20, permutations: 200, joint: []}
evaluate:
  sparse_parity: {latency_repeats: 3}
mlflow: {experiment: trainmap-unfinished}
"""
CELL_DIR = "results/train/sparse_parity/mlp/kaiming"
MANIFEST = f"{CELL_DIR}/seeds0-1.json"
RESUME = f"{CELL_DIR}/seeds0-1.resume.pt"
EVALUATION = "results/evaluate/sparse_parity/mlp/kaiming/seeds0-1.json"
RUN = ("--cores", "2", "--configfile", "tiny.yaml")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """The tiny grid run once; each test works in its own copy of it."""
    workdir = copy_workflow(tmp_path_factory.mktemp("tiny"))
    (workdir / "tiny.yaml").write_text(TINY)
    result = snakemake(*RUN, cwd=workdir)
    assert "trainmap:" not in result.stderr  # a fresh run: nothing unfinished, nothing said
    return workdir


def copy_of(run: Path, destination: Path) -> Path:
    """A copy of a finished run with mtimes kept and a fresh tracking store (the store's artifact
    location is an absolute path into ``run``, which other tests read)."""
    ignore = shutil.ignore_patterns("mlflow.db", "mlartifacts", "mlruns")
    return Path(shutil.copytree(run, destination, symlinks=True, ignore=ignore))


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (from /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def kill_training_mid_run(workdir: Path) -> None:
    """`snakemake --forcerun train`, and `kill -9` of the training job once it saved a resume
    state; then wait for every process of that run to be gone."""
    forced = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--forcerun", "train", *RUN], cwd=workdir,
        env=workflow_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (workdir / RESUME).exists():
            assert forced.poll() is None, "the forced run ended before training saved a state"
            assert time.monotonic() < deadline, "training saved no resume state in 300 s"
            time.sleep(0.01)
        processes = descendants(forced.pid)
        jobs = [pid for pid in processes
                if b".train.py" in Path(f"/proc/{pid}/cmdline").read_bytes()]  # fmt: skip
        assert jobs, "no training job process found"
        for pid in jobs:
            os.kill(pid, signal.SIGKILL)
        assert forced.wait(timeout=300) != 0
    finally:
        if forced.poll() is None:
            forced.kill()
            forced.wait()
    deadline = time.monotonic() + 60  # the job server's child dies with its killed client
    while any(Path(f"/proc/{pid}").exists() for pid in processes):
        assert time.monotonic() < deadline, "processes of the killed run are still alive"
        time.sleep(0.1)


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the job in /proc")
def test_plain_rerun_finishes_a_killed_training_block(finished_run: Path, tmp_path: Path) -> None:
    workdir = copy_of(finished_run, tmp_path / "run")
    evaluated_before = (workdir / EVALUATION).stat().st_mtime
    kill_training_mid_run(workdir)
    assert not (workdir / MANIFEST).exists() and (workdir / RESUME).exists()

    rerun = snakemake(*RUN, cwd=workdir)
    assert (
        f"trainmap: unfinished block train/sparse_parity/mlp/kaiming/seeds0-1: its manifest "
        f"{MANIFEST} is missing (its job was killed or failed, or it was deleted) while its "
        f"resume file {RESUME} remains. `snakemake --cores 2 --configfile tiny.yaml` (rule all) "
        "finishes it from the resume file and reruns what depends on it; this block alone: "
        f"`snakemake --cores 2 --configfile tiny.yaml {MANIFEST}`"
    ) in rerun.stderr
    assert (workdir / MANIFEST).exists() and not (workdir / RESUME).exists()
    for seed in (0, 1):
        summary = load_json(workdir / CELL_DIR / f"seed{seed}/train.json")  # with its sidecar
        assert summary["status"] == "completed" and summary["resumed_from_step"] >= 100
    # what depends on the block ran again, after it
    assert (workdir / EVALUATION).stat().st_mtime > (workdir / MANIFEST).stat().st_mtime
    assert (workdir / EVALUATION).stat().st_mtime > evaluated_before
    assert (workdir / "results/summary/evaluation.csv").stat().st_mtime > evaluated_before

    again = snakemake("-n", *RUN, cwd=workdir)
    assert "Nothing to be done" in again.stdout + again.stderr
    assert "trainmap:" not in again.stderr


@pytest.mark.integration
def test_plain_rerun_remakes_a_killed_block_without_resume_file(
    finished_run: Path, tmp_path: Path
) -> None:
    """A killed evaluate job leaves what a kill leaves: no manifest, the earlier per-seed files."""
    workdir = copy_of(finished_run, tmp_path / "run")
    (workdir / EVALUATION).unlink()
    summary = workdir / "results/summary/evaluation.csv"
    summarised_before = summary.stat().st_mtime
    trained_before = (workdir / MANIFEST).stat().st_mtime

    dry = snakemake("-n", *RUN, cwd=workdir)
    assert "Nothing to be done" not in dry.stdout + dry.stderr
    rerun = snakemake(*RUN, cwd=workdir)
    assert (
        "trainmap: unfinished block evaluate/sparse_parity/mlp/kaiming/seeds0-1: its manifest "
        f"{EVALUATION} is missing (its job was killed or failed, or it was deleted) while 2 of its "
        "2 seed directories (results/evaluate/sparse_parity/mlp/kaiming/seed0, ...) hold files of "
        "an earlier run. "
        "`snakemake --cores 2 --configfile tiny.yaml` (rule all) remakes it and reruns what "
        "depends on it"
    ) in rerun.stderr
    assert (workdir / EVALUATION).exists()
    assert summary.stat().st_mtime > summarised_before
    assert (workdir / MANIFEST).stat().st_mtime == trained_before  # training did not rerun


@pytest.mark.integration  # its fixture runs the workflow (Snakemake)
@pytest.mark.parametrize(
    ("deleted", "rule"),
    [("results/data/sparse_parity/dataset.pt", "data"),
     ("results/hmm/sparse_parity/mlp/kaiming/hmm.npz", "fit_hmm")],
)  # fmt: skip
def test_a_killed_data_or_fit_job_is_redone_by_a_plain_run(
    finished_run: Path, tmp_path: Path, deleted: str, rule: str
) -> None:
    """Outputs of jobs that are not seed blocks are targets of rule all: a missing one (its forced
    job killed) is remade, with what depends on it, instead of "Nothing to be done"."""
    workdir = copy_of(finished_run, tmp_path / "run")
    (workdir / deleted).unlink()
    dry = snakemake("-n", *RUN, cwd=workdir)
    output = dry.stdout + dry.stderr
    assert "Nothing to be done" not in output and f"rule {rule}:" in output, output[-3000:]
