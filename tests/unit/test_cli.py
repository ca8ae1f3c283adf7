"""The trainmap command (trainmap.cli): each command reaches its module's main with its own
arguments, --version and --help answer, and what an install lacks is named in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmap import cli

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_version_and_help_name_every_command(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["--version"])
    assert stopped.value.code == 0 and capsys.readouterr().out.startswith("trainmap 0.")
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    shown = capsys.readouterr().out
    assert all(f"  {name} " in shown for name in cli.COMMANDS)
    assert cli.main([]) == 2  # no command: the help, on stderr


def test_a_command_runs_its_module_with_its_own_arguments(monkeypatch, capsys):
    monkeypatch.chdir(REPO_ROOT)
    assert cli.main(["check", "config/smoke.yaml"]) == 0
    assert capsys.readouterr().out.startswith("ok: params.yaml + config/smoke.yaml")
    with pytest.raises(SystemExit) as stopped:
        cli.main(["map", "--help"])
    assert stopped.value.code == 0 and "--threshold" in capsys.readouterr().out


def test_what_the_install_lacks_is_named_with_its_install_command(monkeypatch, tmp_path, capsys):
    message = cli.missing_extra(ModuleNotFoundError("No module named 'mlflow'", name="mlflow"))
    assert message is not None and "pip install 'trainmap[workflow]'" in message
    assert cli.missing_extra(ModuleNotFoundError("x", name="numpy")) is None
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "-n"]) == 2
    assert "needs a trainmap checkout" in capsys.readouterr().err

    def without_snakemake(name, *args):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    (tmp_path / "Snakefile").write_text("")
    monkeypatch.setattr(cli.importlib, "import_module", without_snakemake)
    assert cli.main(["run", "-n"]) == 2
    assert "pip install 'trainmap[workflow]'" in capsys.readouterr().err


def test_run_refuses_a_config_file_snakemake_would_fail_on_in_one_line(monkeypatch, tmp_path,
                                                                     capsys):  # fmt: skip
    """Snakemake reads ``--configfile`` before the Snakefile (a traceback for a Latin-1 file):
    ``trainmap run`` reads each first, as the config check does, and never starts Snakemake."""
    monkeypatch.chdir(tmp_path)
    Path("Snakefile").write_text("")
    Path("latin1.yaml").write_bytes("grid: [] # caf\xe9\n".encode("latin-1"))
    Path("good.yaml").write_text("grid: []\n")
    monkeypatch.setattr("os.execv", lambda *args: pytest.fail(f"Snakemake started: {args}"))
    for args in (["--configfile", "good.yaml", "latin1.yaml"], ["--configfile=latin1.yaml"],
                 ["all", "--configfiles", "latin1.yaml", "-n"]):  # fmt: skip
        with pytest.raises(SystemExit) as stopped:
            cli.main(["run", *args])
        assert stopped.value.code == 1
        error = capsys.readouterr().err
        assert error.startswith("config file latin1.yaml, line 1: not UTF-8 text (byte 0xe9"), error


def test_a_torch_older_than_supported_is_refused_naming_the_fix():
    import trainmap

    with pytest.raises(ImportError, match=r"needs torch >= 2\.10; this environment has torch "
                                          r"2\.3\.1\+cu121: pip install 'torch>=2\.10'"):  # fmt: skip
        trainmap.check_torch("2.3.1+cu121")
    trainmap.check_torch("2.11.0+cu128")  # a GPU image's torch is accepted as it is


#: What ``--help`` must not import: torch, the numeric stack, the schema's validator and the
#: analysis (a package counts with its submodules).
HEAVY = ("torch", "numpy", "pandas", "matplotlib", "scipy", "sklearn", "hmmlearn", "jsonschema",
         "trainmap.dynamics.metrics.weights", "trainmap.dynamics.maps", "trainmap.dynamics.verdicts",
         "trainmap.dynamics.pipeline", "trainmap.dynamics.map_command", "trainmap.training",
         "trainmap.grid.cells", "trainmap.grid.section_checks", "trainmap.plan.estimates",
         "trainmap.plan.report")  # fmt: skip

#: A fresh interpreter runs ``--help`` (``trainmap <command>``, or ``python -m <module>``), then
#: prints one JSON line: the exit code and the heavy modules it left in sys.modules.
HELP_PROBE = """
import json, runpy, sys
kind, target, heavy = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
code = None
try:
    if kind == "command":
        from trainmap import cli
        cli.main([target, "--help"])
    else:
        sys.argv = [target, "--help"]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
except SystemExit as stop:
    code = stop.code
loaded = [h for h in heavy if any(m == h or m.startswith(h + ".") for m in sys.modules)]
print(json.dumps([code, loaded]))
"""


@pytest.mark.integration  # a fresh interpreter: a program started
@pytest.mark.parametrize(
    ("kind", "target", "shown"),
    [("command", "map", "--threshold"), ("command", "check", "--results-root"),
     ("command", "plan", "--node-gpu-gb"), ("command", "digest", "published"),
     ("module", "trainmap.dynamics", "--threshold"), ("module", "trainmap.grid", "--results-root"),
     ("module", "trainmap.plan", "--node-gpu-gb"), ("module", "trainmap.digest", "published"),
     ("module", "trainmap.findings", "answers"), ("module", "trainmap.lineage", "root"),
     ("module", "trainmap.seed_groups", "--metric")],
)  # fmt: skip
def test_help_answers_without_torch_or_the_analysis(kind: str, target: str, shown: str) -> None:
    """``trainmap <command> --help`` and ``python -m <module> --help`` parse before any heavy
    import (a fresh interpreter: nothing imported before), and the installed torch is checked
    from its metadata, not by importing it."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", HELP_PROBE, kind, target, ",".join(HEAVY)],
                         cwd=REPO_ROOT, capture_output=True, text=True, check=True)  # fmt: skip
    *text, report = out.stdout.rstrip("\n").splitlines()
    assert shown in "\n".join(text)
    assert json.loads(report) == [0, []]
