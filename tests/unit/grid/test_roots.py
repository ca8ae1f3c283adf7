"""Results roots: confined to directories of their own, marked, cleaned by marker, held by one run.

Each test builds a fake project in ``tmp_path`` (its own directories: src/, workflow/, .git/, ...)
and checks what :mod:`trainmap.grid.roots` refuses, marks, removes and locks there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainmap.errors import ConfigError
from trainmap.grid import roots
from trainmap.grid.roots import (
    MARKER,
    RootInUseError,
    check_roots,
    claim_root,
    clean_roots,
    mark_root,
    root_holder,
)
from trainmap.grid.study import merged_config

FIX = "choose a directory of its own, e.g. results-mine, or a link to scratch space"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory with the own directories a root may not touch, and scratch space
    beside it (``tmp_path/scratch``); no ambient MLflow URI."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(roots, "CLAIM_PATIENCE_S", 0.1)
    project = tmp_path / "project"
    for name in ("src/trainmap", "workflow", "config", "tests", "docs", ".git", ".dvc/cache"):
        (project / name).mkdir(parents=True)
    (project / "README.md").write_text("# a tracked file\n")
    (project / "gone").symlink_to(tmp_path / "nowhere")
    (tmp_path / "scratch").mkdir()
    (project / "results-scratch").symlink_to(tmp_path / "scratch")
    return project


def config_of(results: str, tracking_uri: str | None = None) -> dict:
    return {"results": results, "mlflow": {"tracking_uri": tracking_uri}}


@pytest.mark.parametrize(
    ("root", "first_line"),
    [
        ("src", "'src' is the project's source code (src/); " + FIX),
        ("src/trainmap", "'src/trainmap' lies inside the project's source code (src/); " + FIX),
        ("workflow", "'workflow' is the workflow's rules and scripts (workflow/); " + FIX),
        (".git", "'.git' is git's repository (.git/); " + FIX),
        (".dvc/cache", "'.dvc/cache' lies inside DVC's cache and settings (.dvc/); " + FIX),
        ("config", "'config' is the project's config directory (config/); " + FIX),
        (".", "'.' is the project directory itself ({project}); " + FIX),
        ("..", "'..' contains the project directory ({project}); " + FIX),
        ("gone", "'gone' is a link to {tmp}/nowhere, which does not exist: create that directory"),
        ("gone/cpu", "'gone/cpu' lies under the link {project}/gone, which leads to {tmp}/nowhere"),
        ("README.md", "'README.md' is an existing file, not a directory; " + FIX),
        ("README.md/x", "'README.md/x' lies under the file {project}/README.md, not a directory"),
    ],
)
def test_a_root_in_the_projects_own_files_is_refused_naming_it(
    project: Path, root: str, first_line: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        check_roots(config_of(root), project)
    expected = first_line.format(project=project, tmp=project.parent)
    assert str(refused.value).startswith(f"config key results: {expected}"), str(refused.value)


def test_a_link_into_the_projects_own_files_is_refused_naming_its_target(project: Path) -> None:
    (project / "results-src").symlink_to(project / "src")
    with pytest.raises(ConfigError, match=r"^config key results: 'results-src' \(a link to "
                       rf"{project}/src\) is the project's source code \(src/\)"):  # fmt: skip
        check_roots(config_of("results-src"), project)


@pytest.mark.parametrize("root", ["results", "results-paper/cpu", "results-scratch", "elsewhere"])
def test_a_directory_of_its_own_is_a_root(project: Path, root: str) -> None:
    if root == "elsewhere":  # an absolute path outside the project
        root = str(project.parent / "scratch" / "mine")
    check_roots(config_of(root, "sqlite:///mlflow.db"), project)
    assert roots.root_problem(root, project) is None


@pytest.mark.parametrize(
    ("uri", "first_line"),
    [
        ("sqlite:///src/mlflow.db", "config key mlflow.tracking_uri: 'sqlite:///src/mlflow.db' puts "
         "the database inside the project's source code (src/); name a file of its own"),
        ("sqlite:///docs", "config key mlflow.tracking_uri: 'sqlite:///docs' names a directory"),
    ],
)  # fmt: skip
def test_a_tracking_database_in_the_projects_own_files_is_refused(
    project: Path, uri: str, first_line: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        check_roots(config_of("results", uri), project)
    assert str(refused.value).startswith(first_line), str(refused.value)


def test_the_environments_tracking_uri_is_checked_naming_the_variable(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project}/.git/mlflow.db")
    with pytest.raises(ConfigError, match=r"^environment variable MLFLOW_TRACKING_URI \(config "
                       r"key mlflow.tracking_uri is null\): .* inside git's repository"):  # fmt: skip
        check_roots(config_of("results"), project)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")  # a server: not a path
    check_roots(config_of("results"), project)


def test_check_config_refuses_the_default_study_writing_into_src(repo_root: Path) -> None:
    """The real default study (params.yaml + config/config.yaml), its root set to src: refused by
    check_config (as ``python -m trainmap.grid`` and the Snakefile run it) before other checks."""
    from trainmap.grid import check_config

    config = merged_config(repo_root / "params.yaml", repo_root / "config/config.yaml")
    config["results"] = "src"
    with pytest.raises(ConfigError, match=r"^config key results: 'src' is the project's source"):
        check_config(config, base_dir=repo_root)


# --- markers and make clean ----------------------------------------------------------------------


def test_mark_root_writes_a_marker_once_and_lists_the_root(project: Path) -> None:
    mark_root(Path("results-paper/cpu"), project)
    marker = json.loads((project / "results-paper/cpu" / MARKER).read_text())
    assert marker["project"] == str(project.resolve())
    mark_root(Path("results-paper/cpu"), project)  # a rerun keeps the first marker
    assert json.loads((project / "results-paper/cpu" / MARKER).read_text()) == marker
    mark_root(Path("results-scratch"), project)
    listed = (project / roots.REGISTRY).read_text().splitlines()
    assert listed == [str(project / "results-paper/cpu"), str(project / "results-scratch"),
                      str(project.parent / "scratch")]  # fmt: skip


def test_mark_root_writes_no_marker_into_the_projects_own_files(project: Path) -> None:
    with pytest.raises(ConfigError, match=r"^config key results: 'src' is the project's source"):
        mark_root(Path("src"), project)
    assert not (project / "src" / MARKER).exists()


def test_clean_removes_exactly_the_marked_roots(project: Path, tmp_path: Path) -> None:
    outside = tmp_path / "scratch-b" / "study"  # listed in the registry only
    for root in (Path("studies/mine/sub"), outside, Path("results-scratch")):
        mark_root(root, project)
        (project / root / "out.json").write_text("{}")
    mark_root(Path("old-root"), project)
    (project / roots.REGISTRY).write_text("")  # forgotten by the registry: found by its marker
    for unmarked in (project / "notes", tmp_path / "scratch-c"):
        unmarked.mkdir()
        (unmarked / "keep.txt").write_text("mine")
    foreign = tmp_path / "other-checkout-root"  # listed, but marked by another project
    foreign.mkdir()
    (foreign / MARKER).write_text(json.dumps({"project": "/elsewhere"}))
    (project / roots.REGISTRY).write_text(f"{outside}\n{foreign}\n{project / 'results-scratch'}\n")

    expected = {project / "studies/mine/sub", outside, tmp_path / "scratch",
                project / "results-scratch", project / "old-root"}  # fmt: skip
    lines: list[str] = []
    assert set(clean_roots(project, dry_run=True, say=lines.append)) == expected
    assert all(line.startswith(("would remove", "kept")) for line in lines), lines
    assert all(path.exists() for path in expected)
    assert set(clean_roots(project)) == expected
    assert not any(os.path.lexists(path) for path in expected)
    for kept in ("notes/keep.txt", "src", "README.md", ".git", ".dvc/cache", "studies/mine"):
        assert (project / kept).exists(), kept
    assert (tmp_path / "scratch-c/keep.txt").exists() and (foreign / MARKER).exists()
    assert (project / roots.REGISTRY).read_text() == f"{foreign}\n"


def test_clean_removes_results_and_results_star_unmarked_as_make_clean_did(project: Path) -> None:
    for legacy in ("results/train", "results-paper/cpu"):
        (project / legacy).mkdir(parents=True)
    removed = clean_roots(project)
    assert set(removed) == {project / "results", project / "results-paper",
                            project / "results-scratch"}  # fmt: skip
    # an unmarked results-* link: the link alone goes, its target's contents stay
    assert (project.parent / "scratch").is_dir()


def test_clean_cli_dry_run_prints_and_removes_nothing(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mark_root(Path("results-mine"), project)
    assert roots.main(["clean", "--dry-run", "--project", str(project)]) == 0
    assert "would remove results-mine (a marked root)" in capsys.readouterr().out
    assert (project / "results-mine" / MARKER).is_file()
    assert roots.main(["clean", "--project", str(project)]) == 0
    assert "removed results-mine (a marked root)" in capsys.readouterr().out
    assert not (project / "results-mine").exists()


# --- one workflow per root -----------------------------------------------------------------------


def test_a_claimed_root_is_refused_to_a_second_claim_until_released(project: Path) -> None:
    root = project / "results-mine"
    assert root_holder(root) is None
    held = claim_root(root)
    try:
        assert root_holder(root)["pid"] == os.getpid()
        # flock belongs to an open file description: a second open() conflicts in this process
        with pytest.raises(RootInUseError) as refused:
            claim_root(root)
        assert str(refused.value).startswith(
            f"config key results: {root} is in use by another run (pid {os.getpid()} on host "
        ), str(refused.value)
        assert f"(kill {os.getpid()})" in str(refused.value)
        claim_root(project / "results-other").close()  # another root: unaffected
    finally:
        held.close()
    assert root_holder(root) is None
    claim_root(root).close()


def test_clean_keeps_a_held_root_and_what_holds_it_and_names_the_pid(project: Path) -> None:
    mark_root(Path("results-paper/cpu"), project)
    mark_root(Path("results-free"), project)
    held = claim_root(project / "results-paper/cpu")
    try:
        with pytest.raises(
            RootInUseError, match=rf"results-paper/cpu is in use .*pid {os.getpid()}"
        ):
            clean_roots(project)
        assert (project / "results-paper/cpu" / MARKER).is_file()  # results-paper holds it
        assert not (project / "results-free").exists()  # the others go
    finally:
        held.close()
    assert project / "results-paper" in clean_roots(project)


def test_the_config_check_cli_refuses_a_held_root(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainmap.grid import validate

    monkeypatch.chdir(project)
    monkeypatch.setattr(validate, "load_config", lambda *paths: config_of("results-mine"))
    held = claim_root(project / "results-mine")
    try:
        assert validate.main([]) == 1
        assert (f"config key results: results-mine is in use by another run (pid {os.getpid()}"
                in capsys.readouterr().err)  # fmt: skip
        assert validate.main(["--results-root"]) == 0  # the Makefile asks while the run goes on
        assert capsys.readouterr().out == "results-mine\n"
    finally:
        held.close()
