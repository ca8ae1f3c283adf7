"""The fault tier (``make test-faults``): the smoke study stopped at named points of its work, then
recovered the documented way, must end byte for byte where an uninterrupted run ends.

Every case starts from a copy of one finished smoke tree (results, Snakemake's records, the MLflow
store), makes part of it run again with a fault armed (:mod:`trainmap.faults`: a SIGKILL of the
workflow and the job at "the N-th checkpoint write", "before the rename", "during the analysis"; a
file-size limit or a full file system during a checkpoint write; a run held open while a second one
starts; a metric table flipped by one byte), checks what the fault left (no process of the tree alive
once the workflow is gone, the previous checkpoint intact, the error's words), recovers
(``snakemake --unlock``, then the plain run again) and checks:

* the results' digest equals the uninterrupted tree's (every result file's SHA-256);
* no process of the tree outlived its workflow (a job that trains on behind a dead workflow could
  run twice at once with its rerun);
* MLflow holds no RUNNING run and one FINISHED run per (job, run name, config hash).

The N of each kill point comes from a generator seeded by ``$TRAINMAP_FAULT_SEED`` (default 0) and
the case's name; each case's row (fault, N, exit status, recovery, digest, leftovers, runs) goes to
``.test-durations/faults.md``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import GIT_IDENTITY, REPO_ROOT, SMOKE, copy_workflow, git, workflow_env

pytestmark = [pytest.mark.faults, pytest.mark.integration]

SEED = int(os.environ.get("TRAINMAP_FAULT_SEED", "0"))
#: How long a job's process group gets to end after its workflow is gone: the tier's grace, short
#: (training writes its resume state within it), plus the workflow watch's poll.
GRACE_S = 5
SETTLE_S = GRACE_S + 20
TABLE = REPO_ROOT / ".test-durations" / "faults.md"
PARITY = "sparse_parity/mlp/kaiming"
PARITY_TRAIN = f"results/train/{PARITY}/seeds0-1.json"
DIGITS_TRAIN = "results/train/digits/vgg_bn/kaiming/seeds0-7.json"
ROWS: list[dict] = []


def draw(case: str, low: int, high: int) -> int:
    """The case's N, from the tier's seed and the case's name (same seed, same N)."""
    return random.Random(f"{SEED}:{case}").randint(low, high)


def workflow(tree: Path, *args: str, fault: str | None = None, gate: Path | None = None,
             background: bool = False, timeout: int = 600):  # fmt: skip
    """``snakemake --cores 2 --configfile config/smoke.yaml --rerun-incomplete ARGS`` in ``tree``."""
    env = workflow_env(TRAINMAP_STOP_GRACE_S=str(GRACE_S))
    env.pop("TRAINMAP_FAULT", None)
    if fault:
        env["TRAINMAP_FAULT"] = fault
    if gate:
        env["TRAINMAP_FAULT_GATE"] = str(gate)
    command = [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", SMOKE,
               "--rerun-incomplete", *args]  # fmt: skip
    if background:
        return subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
    return subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def processes_in(tree: Path) -> list[str]:
    """The live processes (not zombies) working in ``tree``: ``pid command``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        except OSError:
            continue
        if state != "Z" and (cwd == str(tree) or cwd.startswith(f"{tree}/")):
            found.append(f"{entry.name} {command}")
    return found


def settle(tree: Path) -> list[str]:
    """Wait up to :data:`SETTLE_S` for every process of ``tree`` to end; those still alive."""
    deadline = time.monotonic() + SETTLE_S
    while (alive := processes_in(tree)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for line in alive:  # a failed case must not leave them to the next
        os.kill(int(line.split()[0]), signal.SIGKILL)
    return alive


def recover(tree: Path) -> subprocess.CompletedProcess:
    """The documented recovery after a killed workflow: ``--unlock``, then the plain run."""
    workflow(tree, "--unlock")
    return workflow(tree)


def tracking_runs(tree: Path) -> dict[str, int]:
    """The tree's MLflow runs: their statuses counted, and FINISHED duplicates of one (job, run
    name, config hash) as ``duplicates``."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tree}/mlflow.db")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs, token = [], None
    while True:
        page = client.search_runs(experiments, max_results=1000, page_token=token)
        runs += page
        token = page.token
        if not token:
            break
    statuses = Counter(run.info.status for run in runs)
    finished = Counter(
        (run.data.tags.get("job"), run.info.run_name, run.data.tags.get("config_hash"))
        for run in runs
        if run.info.status == "FINISHED" and run.data.tags.get("role") != "cell"
    )
    return dict(statuses) | {"duplicates": sum(n - 1 for n in finished.values() if n > 1)}


def hashes_of(tree: Path) -> dict[str, str]:
    """Every result file's SHA-256 (the published digest's), by its path under the tree."""
    from trainmap.digest import result_hashes

    root = (tree / "results").as_posix()
    return {name.removeprefix(root): digest for name, digest in result_hashes(root).items()}


def finish_case(tree: Path, expected: dict[str, str], row: dict) -> None:
    """The checks every case ends with, after its recovery; the case's row for the table."""
    hashes = hashes_of(tree)
    differ = sorted(k for k in set(hashes) | set(expected) if hashes.get(k) != expected.get(k))
    runs = tracking_runs(tree)
    row |= {"digest equal": not differ, "runs": runs}
    ROWS.append(row)
    assert not differ, f"results differ from the uninterrupted tree's: {differ}"
    assert runs.get("RUNNING", 0) == 0, runs
    assert runs["duplicates"] == 0, runs
    assert not row.get("leftovers"), row["leftovers"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """One finished smoke tree and its results' hashes."""
    tree = copy_workflow(tmp_path_factory.mktemp("finished") / "tree")
    done = workflow(tree)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # a finished run leaves no process behind (its jobs' loky workers included)
    ROWS.append({"case": "uninterrupted run", "fault": "none", "exit": done.returncode,
                 "leftovers": processes_in(tree), "digest equal": True, "runs": tracking_runs(tree)})  # fmt: skip
    assert not ROWS[-1]["leftovers"], ROWS[-1]["leftovers"]
    yield tree, hashes_of(tree)
    write_table()


@pytest.fixture()
def tree(finished, tmp_path: Path) -> Path:
    """A copy of the finished tree (modification times kept: Snakemake finds it complete)."""
    copy = tmp_path / "tree"
    shutil.copytree(finished[0], copy, symlinks=True)
    return copy


def write_table() -> None:
    lines = ["| case | fault | exit | recovery | digest equal | leftovers | runs |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in ROWS:
        lines.append(f"| {row['case']} | `{row['fault']}` | {row.get('exit')} | "
                     f"{row.get('recovery')} | {row['digest equal']} | "
                     f"{len(row.get('leftovers', []))} | {json.dumps(row['runs'])} |")  # fmt: skip
    TABLE.parent.mkdir(exist_ok=True)
    TABLE.write_text(f"Fault tier, seed {SEED}\n\n" + "\n".join(lines) + "\n")


KILLS = {
    # case: (what reruns, fault spec template, N's range)
    "kill-checkpoint": (PARITY_TRAIN, f"checkpoint:{{n}}@train/{PARITY}/", (2, 20)),
    "kill-before-rename": (DIGITS_TRAIN, "rename:{n}@train/digits/vgg_bn/kaiming/", (2, 12)),
    "kill-analysis": ("fit_hmm", "analysis:1@fit_hmm/", (1, 1)),
}


@pytest.mark.parametrize("case", sorted(KILLS))
def test_killed_workflow_recovers(case: str, tree: Path, finished) -> None:
    """SIGKILL of the workflow and the job at a named point: every process of the tree ends, and
    `--unlock` + the plain run ends where the uninterrupted tree is."""
    target, template, (low, high) = KILLS[case]
    fault = template.format(n=draw(case, low, high))
    killed = workflow(tree, "--forcerun", target, fault=fault)
    row = {"case": case, "fault": fault, "exit": killed.returncode}
    assert killed.returncode == -signal.SIGKILL, (
        f"the fault {fault} did not fire:\n{killed.stdout[-2000:]}{killed.stderr[-2000:]}"
    )
    row["leftovers"] = settle(tree)
    done = recover(tree)
    row["recovery"] = f"unlock + run: exit {done.returncode}"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finish_case(tree, finished[1], row)


def test_file_size_limit_during_a_checkpoint_write(tree: Path, finished) -> None:
    """A write past the file-size limit (EFBIG) fails the job with an error naming the checkpoint;
    every checkpoint written before is intact; the plain rerun finishes."""
    from trainmap.io import verify_checksum

    fault = f"checkpoint:{draw('efbig', 2, 12)}:fsize@train/{PARITY}/"
    failed = workflow(tree, "--forcerun", PARITY_TRAIN, fault=fault)
    row = {"case": "file-size limit", "fault": fault, "exit": failed.returncode}
    log = (tree / f"logs/train/{PARITY}/seeds0-1.log").read_text()
    assert failed.returncode != 0
    assert "could not write" in log and "file-size limit" in log and "EFBIG" in log, log[-2000:]
    for archive in (tree / f"results/train/{PARITY}").glob("seed*/checkpoints/*.safetensors"):
        from safetensors.torch import load_file

        load_file(archive)  # a torn file fails to parse
    for checkpoint in (tree / "results/train").rglob("*.pt"):
        assert verify_checksum(checkpoint), checkpoint
    row["leftovers"] = settle(tree)
    done = workflow(tree)
    row["recovery"] = f"run: exit {done.returncode}"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finish_case(tree, finished[1], row)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small file system needs root")
def test_full_file_system_during_a_checkpoint_write(tree: Path, finished) -> None:
    """A seed's checkpoint archive on a 64 KiB tmpfs: the write that does not fit fails with
    ENOSPC naming the file; unmounted, the plain rerun finishes."""
    archive = tree / f"results/train/{PARITY}/seed1/checkpoints"
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(archive)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        failed = workflow(tree, "--forcerun", PARITY_TRAIN)
    finally:
        subprocess.run(["umount", str(archive)], check=True)
    row = {"case": "full file system", "fault": "tmpfs 64k (ENOSPC)", "exit": failed.returncode}
    log = (tree / f"logs/train/{PARITY}/seeds0-1.log").read_text()
    assert failed.returncode != 0
    named = str(archive.relative_to(tree))
    assert "could not write" in log and "ENOSPC" in log and named in log, log[-2000:]
    row["leftovers"] = settle(tree)
    done = workflow(tree)
    row["recovery"] = f"run: exit {done.returncode}"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finish_case(tree, finished[1], row)


def test_second_run_on_one_root_is_refused(tree: Path, finished, tmp_path: Path) -> None:
    """While a run holds the results root, a second one (the config check, or Snakemake itself)
    is refused at once naming the first one's pid; a study with another root is allowed."""
    gate = tmp_path / "gate"
    fault = f"checkpoint:1:pause@train/{PARITY}/"
    first = workflow(tree, "--forcerun", PARITY_TRAIN, fault=fault, gate=gate, background=True)
    row = {"case": "second run", "fault": fault}
    try:
        deadline = time.monotonic() + 300
        while not gate.exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()
            time.sleep(0.1)
        check = subprocess.run([sys.executable, "-m", "trainmap.grid", SMOKE], cwd=tree,
                               env=workflow_env(), capture_output=True, text=True)  # fmt: skip
        assert check.returncode != 0 and f"pid {first.pid}" in check.stderr, check.stderr
        second = workflow(tree, "--nolock")
        assert second.returncode != 0 and f"pid {first.pid}" in second.stderr, second.stderr[-2000:]
        other = tree / "config/other_root.yaml"
        other.write_text((tree / SMOKE).read_text() + "\nresults: results-other\n")
        allowed = subprocess.run([sys.executable, "-m", "trainmap.grid", str(other)], cwd=tree,
                                 env=workflow_env(), capture_output=True, text=True)  # fmt: skip
        assert allowed.returncode == 0, allowed.stderr
        row["exit"] = f"second: {second.returncode}"
    finally:
        gate.unlink(missing_ok=True)
    out, _ = first.communicate(timeout=600)
    row["recovery"] = f"first run: exit {first.returncode}"
    assert first.returncode == 0, out[-3000:]
    row["leftovers"] = settle(tree)
    finish_case(tree, finished[1], row)


def test_flipped_metric_table_is_refused(tree: Path, finished) -> None:
    """A metric table with one byte flipped between runs: the job that reads it refuses, naming the
    file and the fix; done as it says, the run ends where the uninterrupted tree is."""
    table = tree / f"results/metrics/{PARITY}/seed0/metrics.csv"
    data = bytearray(table.read_bytes())
    position = draw("flip", 100, len(data) - 2)
    data[position] ^= 0x01
    table.write_bytes(bytes(data))
    failed = workflow(tree, "--forcerun", "fit_hmm")
    row = {"case": "flipped metric table", "fault": f"byte {position} of {table.name} flipped",
           "exit": failed.returncode}  # fmt: skip
    logs = "".join(p.read_text() for p in (tree / "logs").rglob("*.log"))
    assert failed.returncode != 0
    assert str(table.relative_to(tree)) in logs or str(table) in logs, logs[-3000:]
    manifest = f"results/metrics/{PARITY}/seeds0-1.json"
    assert f"--forcerun {manifest}" in logs, logs[-3000:]
    done = workflow(tree, "--forcerun", manifest)  # the fix the message gives
    row["recovery"] = f"--forcerun its block's manifest: exit {done.returncode}"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row["leftovers"] = settle(tree)
    finish_case(tree, finished[1], row)


def dvc_project(tree: Path) -> None:
    """Make the finished tree a git + DVC project whose dvc.yaml runs the smoke study."""
    import yaml

    (tree / ".dvc").mkdir()
    for name in ("config", ".gitignore"):
        shutil.copy2(REPO_ROOT / ".dvc" / name, tree / ".dvc" / name)
    shutil.copy2(REPO_ROOT / ".gitignore", tree / ".gitignore")
    params = yaml.safe_load((tree / "params.yaml").read_text())
    params["dvc"]["configfile"] = SMOKE
    (tree / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "workflow"]):
        git(*args, cwd=tree)


def dvc_command(tree: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = workflow_env(**GIT_IDENTITY)
    if fault:
        env["TRAINMAP_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", *args], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_killed_dvc_commit_and_a_damaged_lock(tree: Path, finished) -> None:
    """`make run`'s `dvc commit` killed once N files are in the cache: the rerun records the study
    (`dvc status` clean). A dvc.lock with one hash digit flipped, or cut in half, is detected
    (`dvc status` names the stages) and recording again restores it."""
    dvc_project(tree)
    fault = f"dvc-commit:{draw('dvc-commit', 5, 150)}"
    killed = dvc_command(tree, "trainmap.grid.dvc_record", fault=fault)
    row = {"case": "kill in dvc commit", "fault": fault, "exit": killed.returncode}
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    row["leftovers"] = settle(tree)
    recorded = dvc_command(tree, "trainmap.grid.dvc_record")
    assert recorded.returncode == 0, recorded.stderr[-2000:]
    assert dvc_command(tree, "dvc", "status", "--quiet").returncode == 0
    lock = tree / "dvc.lock"
    text = lock.read_text()
    start = text.index("md5: ") + len("md5: ")
    lock.write_text(text[:start] + ("1" if text[start] != "1" else "2") + text[start + 1 :])
    changed = dvc_command(tree, "dvc", "status")
    assert changed.returncode == 0 and "modified" in changed.stdout, changed.stdout[-2000:]
    assert dvc_command(tree, "trainmap.grid.dvc_record").returncode == 0
    assert dvc_command(tree, "dvc", "status", "--quiet").returncode == 0
    lock.write_text(text[: len(text) // 2])  # cut mid-line: the stages it lost read as changed
    cut = dvc_command(tree, "dvc", "status")
    assert "changed" in cut.stdout or cut.returncode != 0, cut.stdout[-2000:]
    assert dvc_command(tree, "trainmap.grid.dvc_record").returncode == 0
    assert dvc_command(tree, "dvc", "status", "--quiet").returncode == 0
    assert lock.read_text() == text  # recorded again, the same lock
    row["recovery"] = ("dvc_record again: dvc status clean; flipped or cut dvc.lock: dvc status "
                       "reports the stages, recording again restores it")  # fmt: skip
    finish_case(tree, finished[1], row)
