"""The layout the README draws is the one on disk, and dvc.yaml's deps cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
#: What every DVC stage runs: Snakemake's workflow and the whole package its jobs import.
CODE_DEPS = {"${dvc.configfile}", "Snakefile", "workflow", "src/trainmap"}


def test_every_dvc_stage_depends_on_the_code_it_runs() -> None:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        assert "snakemake" in stage["cmd"], name
        deps = set(stage["deps"])
        assert CODE_DEPS <= deps, f"stage {name} lacks {sorted(CODE_DEPS - deps)}"
        hand_kept = sorted(d for d in deps - CODE_DEPS if d.startswith(("src/", "workflow/")))
        assert not hand_kept, f"stage {name} lists single modules {hand_kept}: they drift"


def test_bytecode_caches_do_not_change_the_package_dependency() -> None:
    assert "__pycache__" in (ROOT / ".dvcignore").read_text().split()


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_every_path_in_where_to_change_what_exists() -> None:
    """The README's table names one place per kind of change; each place must be there."""
    table = readme_section("Where to change what")
    paths = re.findall(r"`((?:src|workflow|tests|config)/[^`\s]+?)`", table)
    assert len(paths) >= 6, table
    missing = [path for path in paths if not (ROOT / path.split("::")[0]).exists()]
    assert not missing, missing


def test_every_package_folder_is_in_the_layout_section() -> None:
    layout = readme_section("Layout")
    folders = sorted(p.name for p in (ROOT / "src" / "trainmap").iterdir()
                     if p.is_dir() and (p / "__init__.py").exists())  # fmt: skip
    assert folders, "no package folders"
    missing = [folder for folder in folders if f"{folder}/" not in layout]
    assert not missing, f"README Layout lacks {missing}"
