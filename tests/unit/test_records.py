"""The times the README and the docs quote come from records (trainmap.records): a findings page's
run time, the test tiers' record, and the generated table that the docs include and the README
holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainmap import records
from trainmap.records import (
    BLOCK_END,
    README_START,
    RunTime,
    duration_text,
    masked,
    record_tiers,
    run_time,
    stale,
    tier_summary,
    times_page,
    times_table,
    with_table,
)

REPO = Path(__file__).resolve().parents[2]


def test_durations_read_as_the_docs_write_them() -> None:
    assert duration_text(58.4) == "58 s"
    assert duration_text(473) == "7 min 53 s"
    assert duration_text(1635) == "27 min 15 s"
    assert duration_text(3900) == "1 h 5 min"
    assert (
        masked("took 7 min 53 s, then 58 s and 1 h 5 min") == "took <time>, then <time> and <time>"
    )
    assert masked("1,436 passed on 2026-12-06") == "1,436 passed on 2026-12-06"


def test_the_run_time_is_the_one_the_findings_page_writes(tmp_path: Path) -> None:
    """What trainmap.findings writes from make run's timing sidecar, trainmap.records reads."""
    from trainmap.findings import RUN_TIMING, _run_time
    from trainmap.io import timing_path

    sidecar = timing_path(tmp_path / RUN_TIMING)
    sidecar.parent.mkdir(parents=True)
    sidecar.write_text(json.dumps({"snakemake_wall_s": 473.4, "cores": 2, "cpu": "AMD EPYC",
                                   "date": "2026-12-06"}))  # fmt: skip
    page = tmp_path / "study.findings.md"
    page.write_text(f"# Findings\n\n{_run_time(tmp_path)}\n\n## a comparison\n")
    assert run_time(page) == RunTime(473, 2, "AMD EPYC", "2026-12-06")
    page.write_text("# Findings\n\n## a comparison\n")  # a page of an untimed run
    with pytest.raises(ValueError, match="no 'Run time:' line"):
        run_time(page)


def durations(**changes) -> dict:
    """A durations file as tests/conftest.py writes it: a green, whole-suite fast tier."""
    tests = {f"tests/unit/test_x.py::test_{index}": float(index) for index in range(12)}
    made = {"date": "2026-12-06", "commit": "abc1234", "cpu": "AMD EPYC", "cores": 2,
            "workers": 2, "markexpr": "not integration and not slow and not faults", "whole_suite": True,
            "exitstatus": 0, "wall_s": 164.2, "counts": {"passed": 12}, "tests": tests}  # fmt: skip
    return {**made, **changes}


def test_a_tier_is_recorded_from_a_green_whole_run_only() -> None:
    summary = tier_summary("fast", durations())
    assert summary["passed"] == 12 and summary["wall_s"] == 164.2
    assert [name for name, _ in summary["slowest"]][:2] == [
        "tests/unit/test_x.py::test_11", "tests/unit/test_x.py::test_10"
    ]  # fmt: skip
    assert len(summary["slowest"]) == records.SLOWEST
    for broken, why in (
        (durations(exitstatus=1, counts={"passed": 11, "failed": 1}), "did not pass"),
        (durations(whole_suite=False), "part of the suite"),
        (durations(markexpr=""), "not make test-fast's"),
    ):
        with pytest.raises(ValueError, match=why):
            tier_summary("fast", broken)


def test_recording_a_tier_keeps_the_others(tmp_path: Path) -> None:
    record = tmp_path / "test_tiers.json"
    record.write_text(json.dumps({"full": {"passed": 1436, "wall_s": 1635}}))
    (tmp_path / "durations").mkdir()
    (tmp_path / "durations/fast.json").write_text(json.dumps(durations()))
    assert record_tiers(tmp_path / "durations", record) == ["fast"]
    kept = json.loads(record.read_text())
    assert kept["full"] == {"passed": 1436, "wall_s": 1635}
    assert kept["fast"]["passed"] == 12 and kept["fast"]["commit"] == "abc1234"
    with pytest.raises(FileNotFoundError, match="run make test"):
        record_tiers(tmp_path / "nothing", record)


def test_a_session_writes_its_durations_file(tmp_path: Path) -> None:
    path = records.durations_file(
        tmp_path / "d/fast.json", {"t::a": 1.25, "t::b": 0.5}, {"passed": 2}, 3.21,
        workers=2, markexpr="not integration and not slow and not faults", whole_suite=True, exitstatus=0,
    )  # fmt: skip
    written = json.loads(path.read_text())
    assert written["tests"] == {"t::a": 1.25, "t::b": 0.5} and written["wall_s"] == 3.2
    assert tier_summary("fast", written)["passed"] == 2


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The repository as the working directory: the records' paths are relative to it."""
    monkeypatch.chdir(REPO)
    return REPO


def test_the_table_quotes_each_record(in_repo: Path) -> None:
    table = times_table()
    default = run_time("config/published/config.findings.md")
    assert f"| `make run` | the default study, Snakemake's wall time | " \
           f"{duration_text(default.seconds)} |" in table  # fmt: skip
    tiers = json.loads(records.TEST_RECORD.read_text())
    assert f"every test but the fault tier ({tiers['full']['passed']:,} passed)" in table
    assert times_page().endswith(table + "\n")


def test_the_readme_block_is_rewritten_and_checked(in_repo: Path, tmp_path: Path) -> None:
    """``write`` puts the table between the README's markers; ``--check`` passes when only a time
    differs (a machine's), fails when a count does, and names the file."""
    readme, page = tmp_path / "README.md", tmp_path / "times.md"
    readme.write_text(f"# x\n\n{README_START}\nstale\n{BLOCK_END}\n\nafter\n")
    assert records.main(["write", "--readme", str(readme), "--page", str(page)]) == 0
    text = readme.read_text()
    assert text == with_table(text, times_table(), "README.md") and text.endswith("\nafter\n")
    assert page.read_text() == times_page()
    assert stale(readme, page, records.TEST_RECORD, exact=True) == []

    other_time = text.replace(duration_text(run_time(records.STUDIES[0][2]).seconds), "9 min 1 s")
    readme.write_text(other_time)
    assert stale(readme, page, records.TEST_RECORD, exact=True) == [str(readme)]
    assert records.main(["write", "--check", "--readme", str(readme), "--page", str(page)]) == 0

    passed = json.loads(records.TEST_RECORD.read_text())["full"]["passed"]
    readme.write_text(text.replace(f"{passed:,} passed", "999 passed"))
    assert records.main(["write", "--check", "--readme", str(readme), "--page", str(page)]) == 1
    readme.write_text("# no block\n")
    with pytest.raises(SystemExit):
        records.main(["write", "--readme", str(readme), "--page", str(page)])
