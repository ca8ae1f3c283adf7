"""The published answer (trainmap.digest): a sha256sum listing of a study's result files, and the
one line `make run` ends with."""

from __future__ import annotations

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
