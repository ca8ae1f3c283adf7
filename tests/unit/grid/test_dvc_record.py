"""What a plain Snakemake run leaves under DVC (trainmap.grid.dvc_record): recorded when it is the
run dvc.yaml makes, a warning naming the risk otherwise, nothing outside a DVC project, for another
results root or inside a DVC stage (the deletion itself, and that recording prevents it, are shown
with real DVC in tests/integration/test_dvc.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmap.grid import dvc_record
from trainmap.grid.dvc_record import record_finished_work, runs_dvc_study, stage_directories

REPO_ROOT = Path(__file__).resolve().parents[3]
STUDY = {"dvc": {"configfile": "config/config.yaml"}}


@pytest.mark.parametrize(
    ("configfiles", "overrides", "targets", "expected"),
    [
        ([], {}, [], True),  # plain `snakemake`: params.yaml + config/config.yaml
        (["config/config.yaml"], {}, [], True),  # make run's --configfile
        (["config/smoke.yaml"], {}, [], False),  # another study into results/
        ([], {"train": {"digits": {"lr": 0.5}}}, [], False),  # --config overrides
        ([], {}, ["results/summary/evaluation.csv"], False),  # part of the DAG only
    ],
)
def test_only_the_run_dvc_yaml_makes_counts_as_its_study(configfiles, overrides, targets,
                                                        expected):  # fmt: skip
    assert runs_dvc_study(STUDY, configfiles, overrides, targets, REPO_ROOT) is expected
    # Snakemake gives its --configfile files as absolute paths
    absolute = [str(REPO_ROOT / name) for name in configfiles]
    assert runs_dvc_study(STUDY, absolute, overrides, targets, REPO_ROOT) is expected
    smoke = {"dvc": {"configfile": "config/smoke.yaml"}}
    assert runs_dvc_study(smoke, [str(REPO_ROOT / "config/smoke.yaml")], {}, [], REPO_ROOT)
    assert runs_dvc_study(smoke, [], {}, [], REPO_ROOT) is False


def test_a_plain_run_is_recorded_warned_about_or_left_alone(tmp_path, monkeypatch):
    (tmp_path / "dvc.yaml").write_text((REPO_ROOT / "dvc.yaml").read_text())
    commits = []
    monkeypatch.setattr(dvc_record, "commit_outputs", lambda base: commits.append(base) or "")
    monkeypatch.delenv("DVC_STAGE", raising=False)
    # not a DVC project: nothing to say
    assert record_finished_work(STUDY, tmp_path, [], {}, []) == ""
    (tmp_path / ".dvc").mkdir()
    said = record_finished_work(STUDY, tmp_path, [], {}, [])
    assert said.startswith("Recorded the results in DVC") and commits == [tmp_path]
    warned = record_finished_work(STUDY, tmp_path, ["config/smoke.yaml"], {}, [])
    assert warned.startswith("warning:") and "dvc exp run" in warned and "results:" in warned
    assert commits == [tmp_path]  # nothing recorded that dvc.yaml's stages did not make
    # another results root: DVC does not version it
    assert record_finished_work({**STUDY, "results": "results-mine"}, tmp_path, [], {}, []) == ""
    # inside a DVC stage DVC records the outputs itself
    monkeypatch.setenv("DVC_STAGE", "train")
    assert record_finished_work(STUDY, tmp_path, [], {}, []) == ""
    # a failed commit says so and how to record by hand
    monkeypatch.delenv("DVC_STAGE")
    monkeypatch.setattr(dvc_record, "commit_outputs", lambda base: "`dvc commit` failed (lock)")
    failed = record_finished_work(STUDY, tmp_path, [], {}, [])
    assert failed.startswith("warning: `dvc commit` failed (lock)") and "Run `dvc commit`" in failed


def test_stage_directories_are_those_the_stage_commands_make():
    made = stage_directories(REPO_ROOT)
    assert "results/summary" in made and all(path.startswith("results") for path in made)
