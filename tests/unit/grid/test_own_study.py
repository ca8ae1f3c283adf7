"""Your config file is your study: a user's config file that brings its own grid starts from
params.yaml alone (none of the default study's sections, its joint comparisons included); one
holding only external run sets runs just those; listing config/config.yaml says "start from the
default study" and keeps it whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, copy_workflow, dry_run_job_counts, snakemake

from trainmap.grid import ConfigError, load_config, merge_config, merged_config, read_config_file

PARAMS, DEFAULT = REPO_ROOT / "params.yaml", REPO_ROOT / "config/config.yaml"
ONE_CELL = (
    "grid:\n  - {task: sparse_parity, archs: [mlp], methods: [kaiming], seeds: [1000, 5, 77]}\n"
)


def external_runs(root: Path) -> None:
    """Two runs in the plain layout: state dicts named by step and an evaluation curve."""
    for run in ("a", "b"):
        folder = root / "runs" / run
        folder.mkdir(parents=True)
        for step in (0, 10, 20):
            torch.save({"l1.weight": torch.randn(8, 4), "l2.weight": torch.randn(2, 8)},
                       folder / f"step_{step}.pt")  # fmt: skip
        (folder / "evaluation.csv").write_text("step,test_acc\n0,0.5\n10,0.7\n20,0.9\n")


def test_a_grid_of_ones_own_gets_no_default_comparison(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text(ONE_CELL)
    config = load_config(PARAMS, DEFAULT, mine, check_paths_from=REPO_ROOT)
    assert config["analysis"]["joint"] == [] and len(config["grid"]) == 1
    # params.yaml's hyperparameters and analysis settings apply; none of the default study's
    # sections do (its sparse recipe, model widths, quantised methods, analysis choices)
    params, default = read_config_file(PARAMS), read_config_file(DEFAULT)
    assert config["train"]["sparse_parity"]["steps"] == params["train"]["sparse_parity"]["steps"]
    assert config["analysis"]["k_max"] == params["analysis"]["k_max"]
    for key in ("sparse", "model", "quantize"):
        assert config[key] == params[key] != merge_config(params, default)[key], key
    for key in ("repvgg_weights", "group_maps"):
        assert config["analysis"][key] == params["analysis"][key] != default["analysis"][key], key
    assert config["mlflow"] == params["mlflow"]
    # its own comparisons are its own
    mine.write_text(ONE_CELL.replace("[kaiming]", "[kaiming, gradinit]")
                    + "analysis:\n  joint:\n    - {name: mine, task: sparse_parity, archs: [mlp],"
                    " methods: [kaiming, gradinit]}\n")  # fmt: skip
    assert [j["name"] for j in load_config(PARAMS, DEFAULT, mine,
                                           check_paths_from=REPO_ROOT)["analysis"]["joint"]] == ["mine"]  # fmt: skip


def test_listing_the_default_study_keeps_it_whole(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text(ONE_CELL)
    with pytest.raises(ConfigError, match=r"config key analysis.joint\[0\].methods\[1\]: the grid "
                       r"runs no method 'gradinit'"):  # fmt: skip
        load_config(PARAMS, DEFAULT, DEFAULT, mine, check_paths_from=REPO_ROOT)
    tweak = tmp_path / "tweak.yaml"  # no grid of its own: the default study with one change
    tweak.write_text("evaluate:\n  sparse_parity: {threshold: 0.5}\n")
    config = load_config(PARAMS, DEFAULT, tweak, check_paths_from=REPO_ROOT)
    assert len(config["grid"]) == 2 and len(config["analysis"]["joint"]) == 3


def test_external_sets_alone_are_the_study(tmp_path: Path) -> None:
    external_runs(tmp_path)
    (tmp_path / "config").mkdir()  # the project's files the config names (dvc.configfile)
    (tmp_path / "config/config.yaml").write_text(DEFAULT.read_text())
    sets = tmp_path / "sets.yaml"
    sets.write_text("external:\n  - {name: mine, runs: ['runs/*'], threshold: 0.8}\n")
    config = load_config(PARAMS, DEFAULT, sets, check_paths_from=tmp_path)
    assert config["grid"] == [] and config["analysis"]["joint"] == []
    empty = tmp_path / "empty.yaml"
    empty.write_text("grid: []\n")
    with pytest.raises(ConfigError, match="config key grid: empty, and no external: run sets"):
        load_config(PARAMS, DEFAULT, empty, check_paths_from=tmp_path)


@pytest.mark.integration
def test_the_workflow_runs_external_sets_alone(tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path / "project")
    external_runs(workdir)
    (workdir / "sets.yaml").write_text("external:\n  - {name: mine, runs: ['runs/*'], "
                                       "threshold: 0.8}\n")  # fmt: skip
    planned = dry_run_job_counts(snakemake("-n", "--cores", "2", "--configfile", "sets.yaml",
                                           cwd=workdir).stdout)  # fmt: skip
    assert planned == {"effective_settings": 1, "external_metrics": 1, "external_map": 1, "all": 1}
    snakemake("--cores", "2", "--configfile", "sets.yaml", cwd=workdir)
    assert (workdir / "results/external/mine/map/hmm.json").is_file()
    assert not (workdir / "results/train").exists()


def test_command_line_overrides_apply_to_a_study_of_ones_own(tmp_path: Path) -> None:
    """Snakemake's --config values (``overrides``) still win over a study of one's own, and a
    tweak with no grid keeps the default study's sections."""
    from trainmap.grid import own_study

    mine = tmp_path / "mine.yaml"
    mine.write_text(ONE_CELL)
    params = read_config_file(PARAMS)
    config = merge_config(merge_config(params, read_config_file(DEFAULT)), read_config_file(mine))
    own_study(config, [(str(mine), read_config_file(mine))], base=params,
              overrides={"analysis": {"k_max": 5}})  # fmt: skip
    assert config["analysis"]["k_max"] == 5 and config["analysis"]["joint"] == []
    assert config["sparse"] == params["sparse"]
    tweak = tmp_path / "tweak.yaml"
    tweak.write_text("analysis: {k_max: 6}\n")
    kept = merged_config(PARAMS, DEFAULT, tweak)
    assert kept["analysis"]["k_max"] == 6
    assert kept["sparse"]["sparse_parity"]["start"] == {"step": 2000}
