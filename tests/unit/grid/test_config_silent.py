"""Settings that used to pass silently are refused before any job, naming the key.

NaN and infinity in any number, cross-setting checks (metric names, N:M patterns no layer takes,
joint comparisons the grid cannot fill as written, data directories without their files, MLflow
URIs MLflow cannot serve), empty and non-UTF-8 config files, and errors printed without a
traceback, warnings without Python's ``file.py:380: UserWarning`` form.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_command, snakemake

from trainmap.data import make_task_data, model_meta
from trainmap.grid import (
    TRACKING_SCHEMES,
    ConfigError,
    check_config,
    check_config_files,
    load_config,
    read_config_file,
    tracking_uri_problem,
    validate_schema,
)
from trainmap.io import copy_workflow


@pytest.fixture
def config(base_config: dict) -> dict:
    """The default study with a small grid: sparse parity MLP (kaiming, gradinit, ast) and digits."""
    config = copy.deepcopy(base_config)
    config["grid"] = [
        {"task": "sparse_parity", "archs": ["mlp"], "methods": ["kaiming", "gradinit", "ast"],
         "seeds": [0, 1]},
        {"task": "digits", "archs": ["vgg_bn"], "methods": ["kaiming"], "seeds": [0, 1]},
    ]  # fmt: skip
    config["analysis"]["joint"] = []
    config["quantize"]["methods"] = []
    config["mlflow"]["tracking_uri"] = None
    return config


def set_key(config: dict, key: str, value: object) -> None:
    *parents, last = key.split(".")
    for part in parents:
        config = config.setdefault(part, {})
    config[last] = value


def refused(config: dict, monkeypatch: pytest.MonkeyPatch | None = None) -> str:
    """The first line of the ConfigError the schema or the semantic checks raise."""
    with pytest.raises(ConfigError) as caught:
        validate_schema(config)
        check_config(config)
    return str(caught.value).splitlines()[0]


# --- NaN and infinity ---------------------------------------------------------------------------

NON_FINITE = [
    ("train.digits.lr", float("nan")),
    ("train.digits.lr", float("inf")),
    ("train.digits.weight_decay", float("nan")),
    ("train.digits.momentum", float("nan")),
    ("train.digits.grad_clip", float("inf")),
    ("evaluate.digits.threshold", float("nan")),
    ("analysis.alpha", float("nan")),
    ("analysis.tol", float("nan")),
    ("sparse.sparse_parity.train.lr", float("nan")),
    ("gradinit.sparse_parity.eta", float("nan")),
    ("data.modular_addition.train_frac", float("-inf")),
]


@pytest.mark.parametrize(("key", "value"), NON_FINITE, ids=[f"{k}={v}" for k, v in NON_FINITE])
def test_nan_and_infinity_are_refused_naming_the_key(config: dict, key: str, value: float) -> None:
    set_key(config, key, value)
    first = refused(config)
    assert first.startswith(f"config key {key}: {value!r} is not a finite number"), first
    if key.endswith("grad_clip"):
        assert "for no gradient clipping write grad_clip: null" in first


def test_nan_inside_a_list_and_a_model_option_is_refused(config: dict) -> None:
    config["train"]["modular_addition"]["betas"] = [0.9, float("nan")]
    assert refused(config).startswith("config key train.modular_addition.betas[1]: nan ")
    config["train"]["modular_addition"]["betas"] = [0.9, 0.98]
    config["model"]["sparse_parity"]["mlp"]["hidden"] = [float("inf")]
    assert refused(config).startswith("config key model.sparse_parity.mlp.hidden[0]: inf ")


def test_yaml_nan_from_a_file_is_refused(repo_root: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  digits: {lr: .nan}\n")
    with pytest.raises(ConfigError, match=r"^config key train.digits.lr: nan is not a finite"):
        load_config(repo_root / "params.yaml", repo_root / "config/config.yaml", bad,
                    check_paths_from=repo_root)  # fmt: skip


# --- settings that would make a comparison empty ------------------------------------------------


def test_unknown_metric_in_features_is_refused(config: dict) -> None:
    config["analysis"]["features"] = ["l1", "spectrl"]
    assert refused(config) == (
        "config key analysis.features[1]: unknown metric 'spectrl'; allowed: l1, l2, l1_l2, "
        "trace, spectral, trace_spectral, sv_mean, sv_var, w_mean, w_median, w_var, b_mean, "
        "b_median, b_var; did you mean 'spectral'?"
    )


def test_an_nm_pattern_no_layer_takes_is_refused(config: dict) -> None:
    """The MLP 40-128-2: grouped input sizes 40 and 128; neither divides into groups of 3."""
    config["sparse"]["sparse_parity"]["n"] = 2
    config["sparse"]["sparse_parity"]["m"] = 3
    first = refused(config)
    assert first.startswith("config key sparse.sparse_parity.m: the 2:3 pattern fits no layer of "
                            "architecture 'mlp' on task 'sparse_parity'"), first  # fmt: skip
    assert "are 40, 128, none divisible by m = 3" in first, first


def test_dense_layers_that_leave_nothing_to_sparsify_are_refused(config: dict) -> None:
    config["sparse"]["sparse_parity"]["dense_layers"] = "first_last"
    first = refused(config)
    assert first.startswith("config key sparse.sparse_parity.dense_layers: 'first_last' keeps "
                            "all 2 weight layers of architecture 'mlp'"), first  # fmt: skip
    assert first.endswith("set sparse.sparse_parity.dense_layers: none")


def test_a_pattern_that_fits_is_accepted_and_a_grid_without_sparse_methods_is_not_checked(
    config: dict,
) -> None:
    check_config(config)  # 2:4 with dense_layers none: both MLP layers take it
    config["grid"][0]["methods"] = ["kaiming"]
    config["sparse"]["sparse_parity"]["m"] = 3  # no sparse cell: nothing to refuse
    check_config(config)


@pytest.mark.parametrize(
    "kind", ["sparse_parity", "modular_addition", "digits", "mnist_5k", "mnist1d"]
)
def test_model_meta_matches_the_data_each_generator_makes(kind: str) -> None:
    """The checks build models from model_meta, without the data: it must be what the data says."""
    made = make_task_data(kind).meta
    described = model_meta(kind)
    assert described == {key: made[key] for key in described}


def test_a_joint_comparison_naming_a_method_the_grid_does_not_run_is_refused(config: dict) -> None:
    config["analysis"]["joint"] = [
        {"name": "init", "task": "sparse_parity", "archs": ["mlp"],
         "methods": ["kaiming", "metainit"]},
    ]  # fmt: skip
    first = refused(config)
    assert first.startswith(
        "config key analysis.joint[0].methods[1]: the grid runs no method 'metainit' on task "
        "'sparse_parity' (methods it runs there: ast, gradinit, kaiming)"
    ), first


def test_a_joint_comparison_naming_an_arch_the_grid_does_not_run_is_refused(config: dict) -> None:
    config["analysis"]["joint"] = [
        {"name": "archs", "task": "digits", "archs": ["vgg_bn", "repvgg"]},
    ]
    assert refused(config).startswith(
        "config key analysis.joint[0].archs[1]: the grid runs no arch 'repvgg' on task 'digits'"
    )


def test_a_joint_comparison_with_a_method_without_trajectory_is_refused(config: dict) -> None:
    config["grid"][0]["methods"].append("oneshot")
    config["analysis"]["joint"] = [
        {"name": "prune", "task": "sparse_parity", "methods": ["ast", "oneshot"]},
    ]
    first = refused(config)
    assert first.startswith("config key analysis.joint[0].methods[1]: method 'oneshot' has no "
                            "training trajectory"), first  # fmt: skip


def test_a_joint_comparison_of_a_task_the_grid_does_not_run_is_skipped_with_a_warning(
    config: dict,
) -> None:
    """A grid file that replaces the default grid keeps the default comparisons' settings."""
    config["analysis"]["joint"] = [
        {"name": "grok", "task": "modular_addition", "methods": ["kaiming", "gradinit"]},
    ]
    with pytest.warns(UserWarning, match=r"analysis.joint\[0\] \('grok'\).*skipped"):
        check_config(config)


def test_a_data_directory_without_the_reader_files_is_refused(config: dict) -> None:
    config["data"]["mnist"] = {"kind": "mnist", "path": "/etc"}
    config["train"]["mnist"] = copy.deepcopy(config["train"]["digits"])
    config["evaluate"]["mnist"] = {"threshold": 0.9}
    config["grid"].append({"task": "mnist", "archs": ["mlp"], "methods": ["kaiming"], "seeds": [0]})
    assert refused(config) == (
        "config key data.mnist.path: directory '/etc' lacks the mnist file(s) "
        "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
        "t10k-labels-idx1-ubyte (looked in /etc); put the standard mnist files there or fix the path"
    )


# --- the MLflow tracking URI --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("ftp://example.org/runs", "MLflow cannot serve scheme 'ftp'"),
        ("not a uri", "'not a uri' is not a URI (no scheme://)"),
        ("mlruns", "'mlruns' is not a URI"),
        ("sqlite://mlflow.db", "is not an SQLite URI MLflow reads"),
        ("postgresql+nosuchdriver://u@h/db", "needs the database driver module 'nosuchdriver'"),
    ],
)
def test_a_tracking_uri_mlflow_cannot_serve_is_refused_naming_the_key(
    config: dict, uri: str, expected: str
) -> None:
    config["mlflow"]["tracking_uri"] = uri
    first = refused(config)
    assert first.startswith("config key mlflow.tracking_uri: "), first
    assert expected in first, first


def test_the_environment_tracking_uri_is_checked_where_the_config_leaves_it_null(
    config: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "ftp://example.org")
    assert refused(config).startswith("environment variable MLFLOW_TRACKING_URI (config key "
                                      "mlflow.tracking_uri is null): MLflow cannot serve")  # fmt: skip


@pytest.mark.parametrize("uri", ["sqlite:///mlflow.db", "sqlite:////tmp/x.db",
                                 "http://127.0.0.1:5000", "https://mlflow.example.org"])  # fmt: skip
def test_tracking_uris_mlflow_serves_are_accepted(uri: str) -> None:
    assert tracking_uri_problem(uri) is None


def test_tracking_schemes_are_those_of_mlflows_store_registry() -> None:
    """The list the check uses (no MLflow import at parse time) against MLflow's own registry."""
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    registered = set(_tracking_store_registry._registry)
    assert set(TRACKING_SCHEMES) <= registered
    assert {"ftp", "s3"}.isdisjoint(registered)


# --- config files -------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n# nothing\n"])
def test_an_empty_config_file_is_refused_in_every_entry_point(tmp_path: Path, text: str) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text(text)
    expected = re.escape(f"config file {empty}: empty (no keys")
    with pytest.raises(ConfigError, match=f"^{expected}"):
        read_config_file(empty)
    with pytest.raises(ConfigError, match=f"^{expected}"):
        check_config_files([empty])


def test_a_non_utf8_config_file_is_named_in_one_line(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("grid: []\n# café\n".encode("latin-1"))
    message = f"config file {latin1}, line 2: not UTF-8 text (byte 0xe9 at offset 14); save the "
    for check in (read_config_file, lambda path: check_config_files([path])):
        with pytest.raises(ConfigError) as caught:
            check(latin1)
        assert str(caught.value).startswith(message), caught.value


def run_check_command(repo_root: Path, *args: str) -> subprocess.CompletedProcess:
    return run_command([sys.executable, "-m", "trainmap.grid", *args], cwd=repo_root, check=False)


@pytest.mark.integration  # starts a program (a subprocess)
def test_the_check_command_prints_the_message_only(repo_root: Path, tmp_path: Path) -> None:
    files = {"empty.yaml": b"# nothing\n", "latin1.yaml": "# caf\xe9\n".encode("latin-1"),
             "nan.yaml": b"train:\n  digits: {lr: .nan}\n"}  # fmt: skip
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
        result = run_check_command(repo_root, str(tmp_path / name))
        assert result.returncode == 1, result
        lines = result.stderr.splitlines()
        assert lines[0].startswith((f"config file {tmp_path / name}", "config key ")), lines
        assert "Traceback" not in result.stderr and len(lines) == 2, result.stderr
    verbose = run_check_command(repo_root, "--verbose", str(tmp_path / "nan.yaml"))
    assert "Traceback" in verbose.stderr and verbose.returncode == 1


#: A config of one's own with a joint comparison on a task its grid does not run: a warning, not
#: an error (the comparison is skipped).
WARNED = (
    "grid:\n  - {task: digits, archs: [vgg_bn], methods: [kaiming], seeds: [0]}\n"
    "analysis:\n  joint:\n    - {name: elsewhere, task: sparse_parity, archs: [mlp], "
    "methods: [kaiming, gradinit]}\n"
)


@pytest.mark.integration  # starts a program (a subprocess)
def test_the_check_command_prints_warnings_as_messages(repo_root: Path, tmp_path: Path) -> None:
    grid = tmp_path / "digits.yaml"
    grid.write_text(WARNED)
    result = run_check_command(repo_root, str(grid))
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if line]
    assert warned and all(line.startswith("warning: config key analysis.joint[") for line in warned)
    assert "UserWarning" not in result.stderr


@pytest.mark.integration
def test_snakemake_prints_config_problems_without_traceback(
    repo_root: Path, tmp_path: Path
) -> None:
    """A refusal (no traceback, exit 1), a warning (one line), an empty --configfile (refused)."""
    workdir = copy_workflow(repo_root, tmp_path / "workflow")
    cases = {
        "bad.yaml": "analysis:\n  features: [spectrl]\n",
        "warn.yaml": WARNED,
        "empty.yaml": "# nothing here\n",
    }
    outputs = {}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        result = snakemake("-n", "--cores", "1", "--configfile", str(tmp_path / name), cwd=workdir,
                           check=False, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")  # fmt: skip
        outputs[name] = (result.returncode, result.stdout + result.stderr)
    code, output = outputs["bad.yaml"]
    assert code == 1 and "config key analysis.features[0]: unknown metric 'spectrl'" in output
    assert 'File "' not in output and "Error in file" not in output, output
    code, output = outputs["warn.yaml"]
    assert code == 0, output
    assert "warning: config key analysis.joint[0] ('elsewhere'):" in output, output
    assert "UserWarning" not in output, output
    code, output = outputs["empty.yaml"]
    assert code != 0 and "Job stats" not in output, output
