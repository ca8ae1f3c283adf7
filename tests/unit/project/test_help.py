"""Every ``trainmap`` command and every bench script answers ``--help`` at once: it parses its
arguments before it imports torch, pandas, matplotlib or the analysis stack
(``bench/help_cost.py`` measures the CPU seconds; here, what a ``--help`` leaves in sys.modules)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = sorted(path.name for path in (ROOT / "bench").glob("*.py"))
COMMANDS = ("map", "check", "plan", "digest", "run")
#: packages and trainmap modules (each with its submodules) a ``--help`` must not import
HEAVY = ("torch", "pandas", "matplotlib", "scipy", "sklearn", "statsmodels", "hmmlearn",
         "trainmap.dynamics.maps", "trainmap.dynamics.verdicts", "trainmap.dynamics.pipeline",
         "trainmap.training", "trainmap.grid.cells")  # fmt: skip
#: run in a fresh interpreter: the ``--help`` (a bench script as ``python bench/X.py`` runs it,
#: its folder first on sys.path; a command through ``trainmap.cli.main``), then one JSON line
PROBE = """
import json, runpy, sys
kind, target, heavy = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
code = 0
try:
    if kind == "script":
        sys.path.insert(0, target.rsplit("/", 1)[0])
        sys.argv = [target, "--help"]
        runpy.run_path(target, run_name="__main__")
    else:
        from trainmap.cli import main
        code = main([target, "--help"])
except SystemExit as stopped:
    code = stopped.code
loaded = sorted({name if name.startswith("trainmap.") else name.split(".")[0]
                 for name in sys.modules
                 if any(name == h or name.startswith(h + ".") for h in heavy)})
print(json.dumps({"code": code, "loaded": loaded}))
"""


def probe(kind: str, target: str) -> tuple[dict, str]:
    """The probe's report (exit code, heavy modules loaded) and the help text printed."""
    result = subprocess.run([sys.executable, "-c", PROBE, kind, target, ",".join(HEAVY)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    *text, report = result.stdout.rstrip("\n").splitlines()
    return json.loads(report), "\n".join(text)


@pytest.mark.integration  # starts a Python process per script
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_bench_scripts_help_imports_nothing_heavy(script: str) -> None:
    report, text = probe("script", str(ROOT / "bench" / script))
    assert report["code"] in (0, None) and "usage:" in text, text
    assert report["loaded"] == [], f"bench/{script} --help imports {report['loaded']}"


@pytest.mark.integration  # starts a Python process per command
@pytest.mark.parametrize("command", COMMANDS)
def test_a_commands_help_imports_nothing_heavy(command: str) -> None:
    report, text = probe("command", command)
    assert report["code"] in (0, None) and "usage:" in text, text
    assert report["loaded"] == [], f"trainmap {command} --help imports {report['loaded']}"
