"""One value per setting under DVC.

``dvc exp run -S key=value`` rewrites the workspace params.yaml, but Snakemake reads a config file
after it: a key the config file also sets was recorded at one value and trained at the other. The
keys that differ from git's params.yaml are refused under DVC (``$DVC_STAGE``) when a later config
file overrides them or no job reads them, naming the key, both files and values and the fix; and
``effective_settings`` is what the jobs read (rule ``effective_settings``, DVC metrics).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, git

from trainmap.grid import (
    ConfigError,
    check_params_edits,
    effective_settings,
    load_config,
    params_edits,
)
from trainmap.grid.effective import MISSING, params_edit_hint, settings_record

#: A grid of two digits MLPs whose config file sets lr (as params.yaml does: 0.05).
TINY = """\
grid:
  - {task: digits, archs: [mlp], methods: [kaiming], seeds: [0, 1]}
train:
  digits: {lr: 0.05, steps: 40, checkpoint_every: 10, resume_every: 20}
analysis: {joint: []}
quantize: {methods: []}
mlflow: {experiment: tiny}
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """params.yaml and config/tiny.yaml, committed in a git repository; the working directory."""
    shutil.copy2(REPO_ROOT / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "config").mkdir()
    (tmp_path / "config/tiny.yaml").write_text(TINY)
    git("init", "-q", "-b", "main", cwd=tmp_path)
    git("add", "-A", cwd=tmp_path)
    git("commit", "-qm", "params", cwd=tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.delenv("DVC_EXP_BASELINE_REV", raising=False)
    return tmp_path


@pytest.fixture
def under_dvc(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a stage command: DVC sets DVC_STAGE for every stage it runs."""
    monkeypatch.setenv("DVC_STAGE", "train")


FILES = ["params.yaml", "config/tiny.yaml"]


def set_param(key: str, value, path: str = "params.yaml") -> None:
    """What ``dvc exp run -S key=value`` does: rewrite the workspace file with one value changed."""
    data = yaml.safe_load(Path(path).read_text())
    *parents, last = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))


def check() -> dict:
    """Merge and validate the files as Snakemake does, then check the edits; the config."""
    config = load_config(*FILES, check_paths_from=REPO_ROOT)
    check_params_edits(config, FILES)
    return config


def refusal(key: str, value) -> str:
    """Set ``key`` as ``dvc exp run -S`` would; the message the check refuses it with."""
    set_param(key, value)
    with pytest.raises(ConfigError) as error:
        check()
    return str(error.value)


# --- which keys -S set ----------------------------------------------------------------------------


def test_edits_are_the_keys_that_differ_from_git(project: Path) -> None:
    assert params_edits("params.yaml") == {}
    set_param("train.digits.lr", 0.2)
    set_param("train.digits.nesterov_typo", True)
    assert params_edits("params.yaml") == {
        ("train", "digits", "lr"): (0.05, 0.2),
        ("train", "digits", "nesterov_typo"): (MISSING, True),
    }


def test_edits_compare_with_the_experiments_baseline(project: Path, monkeypatch) -> None:
    baseline = git("rev-parse", "HEAD", cwd=project).stdout.strip()
    set_param("train.digits.steps", 50)
    git("commit", "-qam", "steps", cwd=project)
    assert params_edits("params.yaml") == {}
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", baseline)
    assert params_edits("params.yaml") == {("train", "digits", "steps"): (240, 50)}


def test_no_git_no_edits(tmp_path: Path) -> None:
    shutil.copy2(REPO_ROOT / "params.yaml", tmp_path / "params.yaml")
    assert params_edits(tmp_path / "params.yaml") == {}


# --- a key a later config file overrides -----------------------------------------------------------


def test_a_key_the_config_file_overrides_is_refused_under_dvc(project: Path, under_dvc) -> None:
    message = refusal("train.digits.lr", 0.2)
    assert message.startswith("config key train.digits.lr: params.yaml sets 0.2")
    assert "git's: 0.05" in message
    assert "config/tiny.yaml sets 0.05" in message
    assert "the jobs would run with 0.05 while DVC records 0.2" in message
    assert "dvc exp run -S 'config/tiny.yaml:train.digits.lr=0.2'" in message
    assert "delete train.digits.lr from config/tiny.yaml" in message


def test_the_refusal_says_how_to_restore_params_yaml(project: Path, under_dvc) -> None:
    message = refusal("train.digits.lr", 0.2)
    shown = params_edit_hint(message)
    assert shown.startswith(message)
    assert "DVC leaves it there after this failure" in shown
    assert "git checkout params.yaml" in shown


def test_outside_dvc_an_overridden_edit_is_a_warning(project: Path) -> None:
    set_param("train.digits.lr", 0.2)
    with pytest.warns(UserWarning, match=r"config key train\.digits\.lr: .*config/tiny\.yaml"):
        config = check()
    assert config["train"]["digits"]["lr"] == 0.05  # Snakemake's layering, unchanged


def test_an_edit_the_config_file_agrees_with_runs(project: Path, under_dvc) -> None:
    set_param("train.digits.lr", 0.05)  # written again, same value: no edit
    set_param("train.digits.momentum", 0.8)  # not in the config file: params.yaml decides
    config = check()
    assert config["train"]["digits"]["momentum"] == 0.8


def test_the_config_file_set_by_s_wins(project: Path, under_dvc) -> None:
    """The fix the message gives: -S on the config file (params.yaml as committed)."""
    set_param("train.digits.lr", 0.2, path="config/tiny.yaml")
    config = check()
    assert effective_settings(config)["train"]["digits"]["lr"] == 0.2


def test_any_section_the_config_file_overrides_is_refused(project: Path, under_dvc) -> None:
    Path("config/tiny.yaml").write_text(TINY + "data:\n  digits: {test_frac: 0.25}\n")
    git("commit", "-qam", "test_frac", cwd=project)
    set_param("data.digits.test_frac", 0.3)
    with pytest.raises(ConfigError, match=r"config key data\.digits\.test_frac: .* sets 0\.25"):
        check()


# --- a key no job reads -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("train.mnist.lr", 0.5, "the grid has no task 'mnist' (its tasks: digits)"),
        ("sparse.digits.srste_lambda", 0.1,
         "no method the grid runs on 'digits' (kaiming) has a sparse stage"),
        ("gradinit.digits.tau", 0.1,
         "no method the grid runs on 'digits' (kaiming) has a gradinit stage"),
        ("model.digits.repvgg", {"widths": [8, 16, 32, 64]},
         "the grid trains no 'repvgg' on 'digits' (its architectures there: mlp)"),
    ],
)  # fmt: skip
def test_a_key_no_job_reads_is_refused_under_dvc(
    project: Path, under_dvc, key: str, value, reason: str
) -> None:
    message = refusal(key, value)
    assert message.startswith(f"config key {key}: params.yaml sets ")
    assert f"no job reads it: {reason} in config/tiny.yaml" in message
    assert "add what it names to the grid in config/tiny.yaml" in message


def test_outside_dvc_an_unread_edit_passes(project: Path) -> None:
    """A shared params.yaml holds other grids' settings: editing one is no mistake outside DVC."""
    set_param("train.mnist.lr", 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check()


def test_an_unknown_key_names_the_key_the_allowed_keys_and_the_edit(
    project: Path, under_dvc
) -> None:
    """`dvc exp run -S train.digits.lrr=0.2` is refused by DVC itself (not in struct); with `+` it
    reaches params.yaml, and the schema refuses it before any job, naming what is allowed."""
    message = refusal("train.digits.lrr", 0.2)
    assert message.startswith("config key train.digits.lrr: unknown key 'lrr' in train.digits")
    assert "did you mean 'lr'?" in message
    shown = params_edit_hint(message)
    assert "train.digits.lrr is set in params.yaml by `dvc exp run -S` or an edit" in shown
    assert "(git's params.yaml: (not set))" in shown
    assert "git checkout params.yaml" in shown


def test_the_hint_only_names_edited_keys(project: Path, under_dvc, monkeypatch) -> None:
    set_param("train.digits.lr", 0.2)
    message = "config key train.digits.steps: 0 is less than the minimum of 1"
    assert params_edit_hint(message) == message
    monkeypatch.delenv("DVC_STAGE")
    message = "config key train.digits.lr: whatever"
    assert params_edit_hint(message) == message


# --- what the jobs read -----------------------------------------------------------------------------


def test_effective_settings_are_the_grids_and_dvc_can_show_them(project: Path) -> None:
    settings = effective_settings(check())
    assert set(settings["train"]) == set(settings["data"]) == {"digits"}
    assert settings["model"] == {"digits": {"mlp": {}}}
    assert settings["gradinit"] == settings["sparse"] == {}
    assert settings["train"]["digits"]["steps"] == 40
    record = json.loads(json.dumps(settings_record(settings)))
    assert record["train"]["digits"]["grad_clip"] == 1.0
    assert "joint" not in record["analysis"]
    assert record["quantize"]["schemes"] == '["int8", "int4", "awq_int4"]'  # DVC drops lists
