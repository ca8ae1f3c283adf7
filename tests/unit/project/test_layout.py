"""The layout the docs draw is the one on disk, and dvc.yaml's deps cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
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


def docs_section(page: str, title: str) -> str:
    """The section of ``docs/<page>`` under the heading ``title``, up to the next heading of its
    level or above (a ``#`` line inside a fenced code block is code, not a heading)."""
    lines = (ROOT / "docs" / page).read_text().splitlines()
    section: list[str] = []
    level = 0
    in_code = False
    for line in lines:
        if line.startswith("```"):
            in_code = not in_code
        heading = None if in_code else re.match(r"(#+) (.*)", line)
        if heading and level and len(heading.group(1)) <= level:
            break
        if heading and heading.group(2) == title:
            level = len(heading.group(1))
        if level:
            section.append(line)
    assert section, f"docs/{page} has no heading {title!r}"
    return "\n".join(section)


def test_every_path_in_where_to_change_what_exists() -> None:
    """The docs' table names one place per kind of change; each place must be there."""
    table = docs_section("architecture.md", "Where to change what")
    paths = re.findall(r"`((?:src|workflow|tests|config)/[^`\s]+?)`", table)
    assert len(paths) >= 6, table
    missing = [path for path in paths if not (ROOT / path.split("::")[0]).exists()]
    assert not missing, missing


def test_every_package_folder_is_in_the_layout_section() -> None:
    layout = docs_section("architecture.md", "Layout")
    folders = sorted(p.name for p in (ROOT / "src" / "trainmap").iterdir()
                     if p.is_dir() and (p / "__init__.py").exists())  # fmt: skip
    assert folders, "no package folders"
    missing = [folder for folder in folders if f"{folder}/" not in layout]
    assert not missing, f"docs/architecture.md's Layout lacks {missing}"


def test_every_benchmark_is_in_the_benchmarks_table() -> None:
    """The benchmarks table names every script that `make bench` runs, and no script that is gone."""
    table = docs_section("benchmarks.md", "Tests and benchmarks")
    listed = set(re.findall(r"^\| `([\w-]+\.py)` \|", table, flags=re.MULTILINE))
    scripts = {path.name for path in (ROOT / "bench").glob("*.py")}
    assert scripts, "no benchmarks"
    assert listed == scripts, f"missing {sorted(scripts - listed)}, gone {sorted(listed - scripts)}"
