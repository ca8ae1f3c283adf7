"""Integration: trainmap installed into another project. The wheel's core goes into a clean
virtual environment (versions pinned to the lock, so the package manager's cache serves torch),
without Snakemake, DVC or MLflow; from a directory outside the checkout a plain training loop
records its runs with ``trainmap.recorder`` and ``trainmap map`` maps them; the workflow commands
name the extra they need."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO_ROOT, run_command

pytestmark = pytest.mark.integration

#: A plain loop: 3 seeds of a small MLP on a generated task, the recorder at every 10th step.
PLAIN_LOOP = textwrap.dedent(
    """
    import sys
    import torch
    from trainmap.recorder import MetricRecorder

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=generator)
    y = (x[:, 0] * x[:, 1] > 0).long()
    for seed in range(3):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
        recorder = MetricRecorder(f"runs/seed{seed}")
        for step in range(121):
            if step % 10 == 0:
                with torch.no_grad():
                    accuracy = (model(x).argmax(1) == y).float().mean()
                recorder.log(model, step, test_acc=accuracy)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    print("modules:", sorted({m.split(".")[0] for m in sys.modules} & {"snakemake", "dvc", "mlflow"}))
    """
)


def uv_binary() -> str:
    found = shutil.which("uv") or str(Path.home() / ".local/bin/uv")
    if not Path(found).is_file():
        pytest.fail("uv is not installed: make setup installs it")
    return found


@pytest.fixture(scope="module")
def core_env(tmp_path_factory) -> Path:
    """A clean virtual environment holding the wheel's core, pinned to the lock's versions."""
    uv = uv_binary()
    base = tmp_path_factory.mktemp("install")
    run_command([uv, "build", "--wheel", "--out-dir", str(base / "dist"), "--quiet"],
                cwd=REPO_ROOT)  # fmt: skip
    (wheel,) = (base / "dist").glob("trainmap-*.whl")
    pins = run_command([uv, "export", "--frozen", "--no-dev", "--no-emit-project", "--no-hashes",
                        "--format", "requirements-txt", "--quiet"], cwd=REPO_ROOT).stdout  # fmt: skip
    (base / "pins.txt").write_text(pins)
    env = base / "env"
    run_command([uv, "venv", "--quiet", str(env), "--python", sys.executable], cwd=base)
    python = env / "bin" / "python"
    run_command([uv, "pip", "install", "--quiet", "--python", str(python), "-c",
                 str(base / "pins.txt"), str(wheel)], cwd=base, timeout=900)  # fmt: skip
    return env


def in_env(env: Path, *args: str, cwd: Path, check: bool = True):
    """A command of the clean environment, with nothing of this checkout on its path."""
    clean = {"PATH": f"{env / 'bin'}{os.pathsep}/usr/bin:/bin", "PYTHONPATH": "",
             "VIRTUAL_ENV": str(env)}  # fmt: skip
    return run_command(list(args), cwd=cwd, check=check, **clean)


def test_the_core_records_a_plain_loop_and_maps_it_outside_the_checkout(core_env, tmp_path):
    listed = in_env(core_env, str(core_env / "bin/python"), "-m", "pip", "list", cwd=tmp_path,
                    check=False).stdout.lower()  # fmt: skip
    for workflow_package in ("snakemake", "dvc", "mlflow"):
        assert workflow_package not in listed
    (tmp_path / "loop.py").write_text(PLAIN_LOOP)
    looped = in_env(core_env, str(core_env / "bin/python"), "loop.py", cwd=tmp_path)
    assert "modules: []" in looped.stdout  # the recorder imports no workflow package
    assert len(list((tmp_path / "runs").glob("seed*/metrics.csv"))) == 3
    mapped = in_env(core_env, str(core_env / "bin/trainmap"), "map", "runs", "--threshold",
                    "0.9", "--out", "maps", "--k-max", "3", "--restarts", "2", cwd=tmp_path)  # fmt: skip
    assert (tmp_path / "maps").is_dir() and any((tmp_path / "maps").iterdir()), mapped.stdout
    version = in_env(core_env, str(core_env / "bin/trainmap"), "--version", cwd=tmp_path)
    assert version.stdout.startswith("trainmap ")


def test_the_core_names_what_it_lacks(core_env, tmp_path):
    trainmap = str(core_env / "bin/trainmap")
    empty = in_env(core_env, trainmap, "map", str(tmp_path), "--threshold", "0.9", "--out",
                   "maps", cwd=tmp_path, check=False)  # fmt: skip
    assert empty.returncode != 0 and "found 0 run(s)" in empty.stderr
    outside = in_env(core_env, trainmap, "run", cwd=tmp_path, check=False)
    assert outside.returncode == 2 and "needs a trainmap checkout" in outside.stderr
    (tmp_path / "Snakefile").write_text("")
    workflow = in_env(core_env, trainmap, "run", "-n", cwd=tmp_path, check=False)
    assert workflow.returncode == 2
    assert "pip install 'trainmap[workflow]'" in workflow.stderr, workflow.stderr
