"""Integration: under `dvc exp run -S`, the experiment table shows what was trained.

A tiny grid (two digits MLPs, 40 steps) whose config file sets lr. `-S <config
file>:train.digits.lr=0.2` trains at 0.2, and `dvc exp show` records it (results/summary/settings.json)
beside params.yaml's 0.05; then `-S train.digits.lr=0.3` is refused before any job, naming both files
and the fix, and what trained stays.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from conftest import dvc, dvc_smoke_project, git

pytestmark = pytest.mark.integration

TINY = """\
grid:
  - {task: digits, archs: [mlp], methods: [kaiming], seeds: [0, 1]}
train:
  digits: {lr: 0.05, steps: 40, checkpoint_every: 10, resume_every: 20, seed_block: 2}
analysis: {joint: []}
quantize: {methods: []}
mlflow: {experiment: tiny}
"""
TARGETS = ("train", "settings")  # and the stages before them, not the analysis


def md5s(directory: Path) -> dict[str, str]:
    return {str(path.relative_to(directory)): hashlib.md5(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}  # fmt: skip


def shown_lrs(project: Path) -> list[tuple[float, float]]:
    """(params.yaml's train.digits.lr, the trained one) of every experiment `dvc exp show` lists
    (its commits, not the workspace)."""
    shown = json.loads(dvc("exp", "show", "--json", cwd=project).stdout)
    found = []

    def visit(entry: dict) -> None:
        data = entry.get("data") or {}
        params = data.get("params", {}).get("params.yaml", {}).get("data", {})
        metrics = data.get("metrics", {}).get("results/summary/settings.json", {}).get("data")
        if metrics:
            found.append((params["train"]["digits"]["lr"], metrics["train"]["digits"]["lr"]))
        for group in entry.get("experiments") or []:
            for rev in group.get("revs", []):
                visit(rev)

    for entry in shown:
        if entry.get("rev") != "workspace":
            visit(entry)
    return found


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The tiny grid, committed, then one experiment: `-S` on the config file (the refusal's fix)."""
    workdir = dvc_smoke_project(tmp_path_factory.mktemp("dvc_settings"))
    (workdir / "config/tiny.yaml").write_text(TINY)
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["dvc"]["configfile"] = "config/tiny.yaml"
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    git("add", "-A", cwd=workdir)
    git("commit", "-qm", "tiny grid", cwd=workdir)
    result = dvc("exp", "run", "-S", "config/tiny.yaml:train.digits.lr=0.2", *TARGETS, cwd=workdir)
    assert "Running stage 'train'" in result.stdout
    return workdir


def test_exp_show_records_the_lr_that_trained(project: Path) -> None:
    # params.yaml (all DVC showed before) says 0.05; the settings the jobs read say 0.2
    assert (0.05, 0.2) in shown_lrs(project)


def test_an_s_key_the_config_file_overrides_is_refused_before_any_job(project: Path) -> None:
    trained = md5s(project / "results/train")
    assert trained, "the experiment trained nothing"
    result = dvc("exp", "run", "-S", "train.digits.lr=0.3", *TARGETS, cwd=project, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "config key train.digits.lr: params.yaml sets 0.3" in output
    assert "config/tiny.yaml sets 0.2" in output
    assert "dvc exp run -S 'config/tiny.yaml:train.digits.lr=0.3'" in output
    assert "git checkout params.yaml" in output
    assert "stopped before any job ran" in output
    assert "rule train" not in output
    assert md5s(project / "results/train") == trained, "a refused experiment changed results"
    assert len(shown_lrs(project)) == 1, "a refused experiment was recorded"
