"""bench/gpu.py, the one GPU benchmark, runs here too (``--device cpu --quick``): every workload
trains with the loop the train rule runs and its report names the device and every row."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration  # starts the benchmark (five real training blocks, about 15 s)
def test_the_gpu_benchmark_runs_every_row_and_names_the_device(tmp_path):
    out = tmp_path / "gpu.md"  # a check, not bench/results/gpu.md
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench/gpu.py"), "--device", "cpu", "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    assert "Device: **" in text and "**cpu**" not in text  # the CPU's model, not just "cpu"
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split(" | ")[0] for row in rows[1:]] == (
        [
            "| mlp",
            "| mlp",
            "| mlp, host check each step",
            "| mlp, lr sweep of 4",
            "| transformer",
            "| resnet18",
            "| resnet18",
            "| resnet18, no augmentation",
        ]
    )
    assert "bf16" in text
    assert result.stdout.strip().splitlines()[-1].startswith("gpu_bench device=")
