"""The published answer (trainmap.digest): a sha256sum listing of a study's result files, and the
one line `make run` ends with."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from trainmap.digest import check_digest, main, parse_hashes, study_digest, write_digest


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    root = Path("results")
    for name, content in {"train/a/seed0/model.pt": b"w0", "train/a/seed1/model.pt": b"w1",
                          "summary/evaluation.csv": b"acc\n0.9\n"}.items():  # fmt: skip
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    (root / "summary/evaluation.timing.csv").write_text("latency_ms\n1.2\n")  # differs every run
    return root


@pytest.mark.integration  # starts a program (a subprocess)
def test_the_listing_is_sha256sum_format_without_timing_sidecars(results: Path) -> None:
    digest = write_digest("published.sha256", results)
    text = Path("published.sha256").read_text()
    assert "timing" not in text and len(text.splitlines()) == 3
    assert study_digest(parse_hashes(text)) == digest
    # coreutils agrees with every line
    checked = subprocess.run(
        ["sha256sum", "-c", "published.sha256"], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_reproduced_run_matches_and_a_changed_file_is_named(results: Path, capsys) -> None:
    write_digest("published.sha256", results)
    (results / "summary/evaluation.timing.csv").write_text("latency_ms\n9.9\n")
    (results / "extra.txt").write_text("another config's file")
    check = check_digest("published.sha256", results)
    assert check.matches and check.extra == ["results/extra.txt"]
    assert check.line().startswith("Results match the published digest")
    (results / "train/a/seed1/model.pt").write_bytes(b"other bits")
    (results / "summary/evaluation.csv").unlink()
    check = check_digest("published.sha256", results)
    assert not check.matches
    assert check.differ == ["results/train/a/seed1/model.pt"]
    assert check.missing == ["results/summary/evaluation.csv"]
    assert (
        "differ from the published digest" in check.line()
        and "in 2 files (1 missing)" in check.line()
    )
    assert main(["check", "published.sha256", "results"]) == 0
    assert "results/train/a/seed1/model.pt" in capsys.readouterr().out


def test_no_published_digest_says_how_to_publish_one(results: Path, capsys) -> None:
    assert main(["check", "none.sha256", "results"]) == 0
    assert "python -m trainmap.digest write none.sha256" in capsys.readouterr().out


def test_a_damaged_listing_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="line 2"):
        parse_hashes(f"{'0' * 64}  results/a\nnot a line\n")


# --- where a difference starts ------------------------------------------------------------------


def _block(root: Path, stage: str, group: str, files: dict[int, dict[str, bytes]],
           made_from: list[str]) -> None:  # fmt: skip
    """A seed block as the workflow writes one: each cell's files and a manifest recording what it
    was made from (paths relative to the manifest, as trainmap.lineage.made_from writes them)."""
    directory = root / stage / group
    for seed, cell in files.items():
        for name, content in cell.items():
            (directory / f"seed{seed}" / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / f"seed{seed}" / name).write_bytes(content)
    manifest = directory / f"seeds0-{max(files)}.json"
    inputs = {os.path.relpath(root / path, directory): "0" * 64 for path in made_from}
    manifest.write_text(json.dumps({"cells": [{"cell": f"{group}/seed{s}"} for s in files],
                                    "made_from": inputs}))  # fmt: skip


@pytest.fixture
def study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """data -> gradinit -> train (gradinit runs), data -> train (kaiming runs) -> quantize, and a
    comparison outside the blocks."""
    monkeypatch.chdir(tmp_path)
    root = Path("results")
    (root / "data/t").mkdir(parents=True)
    (root / "data/t/dataset.pt").write_bytes(b"data")
    seeds = range(3)
    _block(root, "gradinit", "t/mlp/gradinit", {s: {"scales.json": b"s%d" % s} for s in seeds},
           ["data/t/dataset.pt"])  # fmt: skip
    _block(root, "train", "t/mlp/gradinit",
           {s: {"model.pt": b"g%d" % s, "checkpoints/step_0.safetensors": b"c%d" % s}
            for s in seeds},
           ["data/t/dataset.pt", "gradinit/t/mlp/gradinit/seeds0-2.json"])  # fmt: skip
    _block(root, "train", "t/mlp/kaiming", {s: {"model.pt": b"k%d" % s} for s in seeds},
           ["data/t/dataset.pt"])  # fmt: skip
    _block(root, "quantize", "t/mlp/kaiming", {s: {"awq.pt": b"q%d" % s} for s in seeds},
           ["train/t/mlp/kaiming/seeds0-2.json"])  # fmt: skip
    (root / "joint/c").mkdir(parents=True)
    (root / "joint/c/verdicts.md").write_text("GradInit converges sooner")
    return root


def test_a_mismatch_names_the_stages_where_it_starts_and_what_follows(study: Path) -> None:
    write_digest("published.sha256", study)
    # GradInit's scales of seed 1 change, and with them that seed's training; quantisation of
    # kaiming seed 2 changes while its trained model is the published one; the comparison follows.
    (study / "gradinit/t/mlp/gradinit/seed1/scales.json").write_bytes(b"other")
    (study / "train/t/mlp/gradinit/seed1/model.pt").write_bytes(b"other")
    # its checkpoint archive too: one entry of the listing, one folder below the cell
    (study / "train/t/mlp/gradinit/seed1/checkpoints/step_0.safetensors").write_bytes(b"other")
    (study / "quantize/t/mlp/kaiming/seed2/awq.pt").write_bytes(b"other")
    (study / "joint/c/verdicts.md").write_text("no difference")
    check = check_digest("published.sha256", study)
    origins = check.origins
    assert origins.starts == {"gradinit": ["results/gradinit/t/mlp/gradinit/seed1"],
                              "quantize": ["results/quantize/t/mlp/kaiming/seed2"]}  # fmt: skip
    assert origins.follows == {"train": ["results/train/t/mlp/gradinit/seed1"]}
    assert origins.outside == {"joint": ["results/joint/c/verdicts.md"]}
    assert origins.order == ["data", "gradinit", "train", "quantize"]  # from made_from
    text = "\n".join(check.lines())
    assert (
        "starts (the cells' inputs are the published bits) at: gradinit in 1 cell: "
        "t/mlp/gradinit seeds 1 (scales.json); quantize in 1 cell: t/mlp/kaiming seeds 2 "
        "(awq.pt)"
    ) in text
    assert "What follows from it: train 1 cell, joint 1 file." in text


def test_a_difference_only_in_the_analysis_says_so(study: Path) -> None:
    write_digest("published.sha256", study)
    (study / "joint/c/verdicts.md").write_text("no difference")
    text = "\n".join(check_digest("published.sha256", study).lines())
    assert "Every seed block's files are the published bits: the difference starts in the " \
           "analysis, at joint (results/joint/c/verdicts.md)" in text  # fmt: skip


def test_the_machine_is_recorded_with_the_digest_and_compared_on_a_mismatch(study: Path) -> None:
    from trainmap.portable import numeric_environment

    write_digest("published.sha256", study)
    record = json.loads(Path("published.environment.json").read_text())
    assert record == json.loads(json.dumps(numeric_environment()))
    assert {"cpu", "cpu_vendor", "cpu_flags", "cpu_caches", "libc", "torch",
            "torch_cpu_capability", "mkl", "onednn", "numpy", "blas", "python",
            "portable"} <= set(record)  # fmt: skip
    assert record["libc"].startswith("glibc ") and record["cpu_vendor"]  # this Linux machine
    assert "L2" in record["cpu_caches"], record["cpu_caches"]
    (study / "joint/c/verdicts.md").write_text("no difference")
    assert "the difference is not the machine's" in "\n".join(
        check_digest("published.sha256", study).lines()
    )
    # the published run's machine: another CPU with a flag this one lacks, another torch (names
    # no real machine has, so the test holds on any CPU)
    record |= {"cpu": "Other CPU 9000", "cpu_flags": [*record["cpu_flags"], "other_flag"],
               "torch": "2.0.0", "cpu_caches": {"L1d": "48K", "L2": "2048K"}}  # fmt: skip
    del record["libc"]  # a record written before trainmap recorded the C library
    Path("published.environment.json").write_text(json.dumps(record))
    text = "\n".join(check_digest("published.sha256", study).lines())
    assert "This machine (the run kept no record of its own" in text
    assert "cpu: " in text and "'Other CPU 9000' published" in text and "-other_flag" in text
    assert "torch: " in text and "'2.0.0' published" in text
    assert "'2048K'}" in text and "libc" not in text
    Path("published.environment.json").unlink()
    text = "\n".join(check_digest("published.sha256", study).lines())
    assert "no record of its machine" in text and "not the machine's" not in text


def test_another_studys_listing_is_refused_naming_its_directory(study: Path, capsys) -> None:
    study.rename("results-smoke")
    write_digest("published.sha256", "results-smoke")  # the smoke study's listing
    Path("results").mkdir()
    with pytest.raises(ValueError, match="lists the results under results-smoke/, not results/"):
        check_digest("published.sha256", "results")
    assert main(["check", "published.sha256", "results"]) == 2
    assert "another study's digest" in capsys.readouterr().out


def test_the_run_s_own_machine_record_is_what_the_check_compares(study: Path, monkeypatch) -> None:
    """make run records the run's machine with the results (findings time): a check made later,
    from another environment, still compares the run's, e.g. an unpinned run's level."""
    from trainmap.findings import record_run_time

    write_digest("published.sha256", study)
    (study / "joint/c/verdicts.md").write_text("no difference")
    monkeypatch.setenv("TRAINMAP_PORTABLE", "0")
    record_run_time(study, 60, 2)  # the run's own environment: unpinned
    monkeypatch.delenv("TRAINMAP_PORTABLE")
    text = "\n".join(check_digest("published.sha256", study).lines())
    assert "This run's machine against the published run's: portable: '0' here" in text, text


def test_a_listing_most_of_whose_files_are_missing_asks_whether_it_is_another_studys(
    study: Path,
) -> None:
    """The same results directory, another study's listing (the smoke study's beside the default
    study's results): most listed files missing and others beyond it say so."""
    write_digest("published.sha256", study)
    for cell in ("gradinit", "train", "quantize"):
        shutil.rmtree(study / cell)
    (study / "train/other/mlp/kaiming/seed0").mkdir(parents=True)
    (study / "train/other/mlp/kaiming/seed0/model.pt").write_bytes(b"another study")
    line = check_digest("published.sha256", study).line()
    assert "Most listed files are missing and 1 are beyond the listing" in line, line
    assert "another study's digest" in line


@pytest.mark.parametrize("config", ["config", "smoke"])
def test_make_run_checks_a_config_against_its_published_files(config: str) -> None:
    """config/<name>.yaml's run is checked against config/published/<name>.results.sha256 (the
    Makefile's PUBLISHED_OF spells the same path), its machine record and findings page beside it;
    the digest lists the study's own results root."""
    from trainmap.digest import environment_path
    from trainmap.findings import findings_path
    from trainmap.io import published_digest_of

    root = Path(__file__).resolve().parents[2]
    published = published_digest_of(f"config/{config}.yaml")
    assert published == Path(f"config/published/{config}.results.sha256")
    for path in (published, environment_path(published), findings_path(published)):
        assert (root / path).is_file(), f"{path} is missing"
    listed = parse_hashes((root / published).read_text())
    assert listed and all(name.startswith("results/") for name in listed)
    rule = "PUBLISHED_OF = $(dir $(1))published/$(notdir $(basename $(1))).results.sha256"
    assert rule in (root / "Makefile").read_text()
