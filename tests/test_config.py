"""The study configuration: loading, merging, grid expansion and every way a config is refused.

Malformed configs are built by mutating a copy of the valid merged config (params.yaml extended by
config/config.yaml); each must be refused with a ConfigError that names the offending key and the
bad value. Three of them are also fed to Snakemake itself (`snakemake -n --configfile bad.yaml`) in
a temporary copy of the workflow, which must refuse them before building any job.
"""

from __future__ import annotations

import copy
import itertools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from trainmap.config import (
    Cell,
    ConfigError,
    check_config,
    expand_grid,
    grid_tasks,
    load_config,
    merge_config,
    validate_schema,
)
from trainmap.io import copy_workflow

PARAMS = "params.yaml"
GRID = "config/config.yaml"
SMOKE = "config/smoke.yaml"


@pytest.fixture(scope="module")
def base_config(repo_root: Path) -> dict:
    """params.yaml extended by config/config.yaml, validated (the default study)."""
    return load_config(repo_root / PARAMS, repo_root / GRID, check_paths_from=repo_root)


# The grid the malformed configs mutate: fixed here, so the default study can change freely.
TEST_GRID = [
    {"task": "sparse_parity", "archs": ["mlp"], "methods": ["kaiming"], "seeds": list(range(8))},
    {"task": "digits", "archs": ["vgg_bn", "resnet_bn"], "methods": ["kaiming"],
     "seeds": list(range(8))},
]  # fmt: skip


@pytest.fixture
def config(base_config: dict) -> dict:
    """A private copy of the default study's config with :data:`TEST_GRID`, free to mutate."""
    config = copy.deepcopy(base_config)
    config["grid"] = copy.deepcopy(TEST_GRID)
    config["analysis"]["joint"] = []
    config["quantize"]["methods"] = []
    return config


def read_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def grid_cells(grid: list[dict]) -> list[Cell]:
    """Expected cells, spelled out independently of expand_grid: archs, then methods, then seeds."""
    return [
        Cell(entry["task"], arch, method, seed)
        for entry in grid
        for arch, method, seed in itertools.product(
            entry["archs"], entry["methods"], entry["seeds"]
        )
    ]


# --------------------------------------------------------------------------------------------------
# Valid configs


def test_default_config_loads_and_expands(repo_root: Path, base_config: dict) -> None:
    raw_grid = read_yaml(repo_root / GRID)["grid"]
    cells = expand_grid(base_config)
    assert cells == grid_cells(raw_grid)
    assert len(cells) == len(set(cells)), "the default grid must not repeat a cell"
    assert len(cells) == sum(
        len(e["archs"]) * len(e["methods"]) * len(e["seeds"]) for e in raw_grid
    )
    assert grid_tasks(base_config) == list(dict.fromkeys(e["task"] for e in raw_grid))
    # params.yaml's hyperparameters survive the merge with the grid file.
    assert base_config["train"] == read_yaml(repo_root / PARAMS)["train"]
    assert (
        base_config["mlflow"]["experiment"] == read_yaml(repo_root / GRID)["mlflow"]["experiment"]
    )


def test_smoke_config_loads_and_expands(repo_root: Path) -> None:
    config = load_config(
        repo_root / PARAMS, repo_root / GRID, repo_root / SMOKE, check_paths_from=repo_root
    )
    assert expand_grid(config) == grid_cells(read_yaml(repo_root / SMOKE)["grid"])
    assert len(expand_grid(config)) == 8
    assert grid_tasks(config) == ["sparse_parity", "digits"]
    assert config["quantize"]["methods"] == ["ast"]  # smoke's list replaces the default's
    assert config["sparse"]["digits"]["train"]["steps"] == 30  # nested mappings merge key by key
    assert config["sparse"]["digits"]["train"]["lr"] == read_yaml(repo_root / PARAMS)["sparse"][
        "digits"]["train"]["lr"]  # fmt: skip
    params = read_yaml(repo_root / PARAMS)
    # Mappings merge key by key: smoke.yaml's few keys override, params.yaml's others remain.
    assert config["train"]["digits"] == {**params["train"]["digits"], "steps": 60,
                                         "checkpoint_every": 10, "resume_every": 30}  # fmt: skip
    assert config["evaluate"]["digits"] == {**params["evaluate"]["digits"], "latency_repeats": 3}
    assert config["data"] == params["data"]
    assert config["mlflow"] == {"tracking_uri": None, "experiment": "trainmap-smoke"}


def test_relative_paths_load_from_repo_root(repo_root: Path, monkeypatch) -> None:
    """`load_config("params.yaml", "config/config.yaml")` as Snakemake does it, from the root."""
    monkeypatch.chdir(repo_root)
    assert expand_grid(load_config(PARAMS, GRID)) == grid_cells(read_yaml(repo_root / GRID)["grid"])
    assert len(expand_grid(load_config(PARAMS, GRID, SMOKE))) == 8


def test_merge_config_lists_replace_mappings_merge() -> None:
    base = {
        "grid": [{"task": "a", "seeds": [0, 1, 2]}, {"task": "b", "seeds": [0]}],
        "train": {"a": {"lr": 0.1, "steps": 100, "betas": [0.9, 0.99]}, "b": {"lr": 1.0}},
        "mlflow": {"tracking_uri": None, "experiment": "x"},
    }
    frozen = copy.deepcopy(base)
    override = {
        "grid": [{"task": "c", "seeds": [5]}],
        "train": {"a": {"steps": 7, "betas": [0.5]}, "c": {"lr": 2.0}},
        "mlflow": {"tracking_uri": "sqlite:///x.db"},
        "new": [1],
    }
    merged = merge_config(base, override)
    assert merged == {
        "grid": [{"task": "c", "seeds": [5]}],  # a list is replaced whole, not merged
        "train": {
            "a": {"lr": 0.1, "steps": 7, "betas": [0.5]},  # nested mappings merge key by key
            "b": {"lr": 1.0},
            "c": {"lr": 2.0},
        },
        "mlflow": {"tracking_uri": "sqlite:///x.db", "experiment": "x"},
        "new": [1],
    }
    assert base == frozen, "merge_config must not mutate its base"
    merged["grid"][0]["seeds"].append(6)
    merged["train"]["a"]["betas"].append(0.1)
    assert override["grid"][0]["seeds"] == [5] and override["train"]["a"]["betas"] == [0.5]
    # A mapping replaces a scalar and vice versa (Snakemake's rule: only mapping+mapping merges).
    assert merge_config({"a": 1}, {"a": {"b": 2}}) == {"a": {"b": 2}}
    assert merge_config({"a": {"b": 2}}, {"a": None}) == {"a": None}


def test_override_file_replaces_grid(repo_root: Path, tmp_path: Path) -> None:
    override = tmp_path / "mine.yaml"
    override.write_text(
        yaml.safe_dump(
            {
                "grid": [
                    {
                        "task": "digits",
                        "archs": ["resnet_bn"],
                        "methods": ["kaiming"],
                        "seeds": [4, 2],
                    }
                ],  # fmt: skip
                "train": {"digits": {"steps": 40}},
            }
        )
    )
    config = load_config(repo_root / PARAMS, repo_root / GRID, override, check_paths_from=repo_root)
    assert expand_grid(config) == [
        Cell("digits", "resnet_bn", "kaiming", 4),
        Cell("digits", "resnet_bn", "kaiming", 2),
    ]
    assert config["train"]["digits"]["steps"] == 40
    assert config["train"]["digits"]["optimizer"] == "sgd"


def test_reader_kind_with_existing_path_is_accepted(config: dict, tmp_path: Path) -> None:
    """Positive control of the data-path check: a relative path resolves against base_dir."""
    (tmp_path / "data" / "mnist").mkdir(parents=True)
    config["grid"].append({"task": "mnist", "archs": ["mlp"], "methods": ["kaiming"], "seeds": [0]})
    config["data"]["mnist"] = {"kind": "mnist", "path": "data/mnist"}
    validate_schema(config)
    check_config(config, base_dir=tmp_path)
    config["data"]["mnist"]["path"] = str(tmp_path / "data" / "mnist")  # absolute works anywhere
    check_config(config, base_dir=tmp_path / "elsewhere")


# --------------------------------------------------------------------------------------------------
# Malformed configs


def _set(*keys_and_value) -> Callable[[dict], None]:
    """A mutation that sets config[k1][k2]... = value."""
    *keys, value = keys_and_value

    def mutate(config: dict) -> None:
        target = config
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return mutate


def _delete(*keys) -> Callable[[dict], None]:
    def mutate(config: dict) -> None:
        target = config
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]

    return mutate


def _add_mnist(path: str | None) -> Callable[[dict], None]:
    def mutate(config: dict) -> None:
        config["grid"].append(
            {"task": "mnist", "archs": ["mlp"], "methods": ["kaiming"], "seeds": [0]}
        )
        config["data"]["mnist"] = {"kind": "mnist"} | ({"path": path} if path else {})

    return mutate


def _append_grid(entry: dict) -> Callable[[dict], None]:
    return lambda config: config["grid"].append(entry)


# TEST_GRID: grid[0] is sparse_parity/mlp (vector input), grid[1] digits/vgg_bn+resnet_bn
# (image input), seeds 0..7; digits trains 240 steps (params.yaml). Each case: (id, mutation, expected substrings).
BAD_CONFIGS = [
    ("unknown_arch", _set("grid", 1, "archs", 1, "resnet_typo"),
     ["grid[1].archs[1]", "'resnet_typo'", "allowed", "resnet_bn"]),
    ("unknown_method", _set("grid", 0, "methods", ["kaiming", "xavier_typo"]),
     ["grid[0].methods[1]", "'xavier_typo'", "allowed", "kaiming"]),
    ("empty_seeds", _set("grid", 0, "seeds", []),
     ["grid[0].seeds", "[]", "non-empty"]),
    ("duplicate_seeds", _set("grid", 1, "seeds", [0, 3, 1, 3]),
     ["grid[1].seeds", "[3]", "duplicate"]),
    ("negative_seed", _set("grid", 0, "seeds", [0, 1, -3]),
     ["grid[0].seeds[2]", "-3", "minimum of 0"]),
    ("float_seed", _set("grid", 0, "seeds", [0, 2.0]),
     ["grid[0].seeds[1]", "2.0", "integer"]),
    ("task_without_train", _delete("train", "digits"),
     ["grid[1].task", "'digits'", "train", "sparse_parity"]),
    ("task_without_data", _append_grid(
        {"task": "imagenet", "archs": ["mlp"], "methods": ["kaiming"], "seeds": [0]}),
     ["grid[2].task", "'imagenet'", "data", "digits"]),
    ("mnist_path_missing_dir", _add_mnist("data/no_such_mnist_dir"),
     ["data.mnist.path", "data/no_such_mnist_dir", "does not exist"]),
    ("mnist_path_absent", _add_mnist(None),
     ["data.mnist.path", "'mnist'", "needs a path"]),
    ("unknown_data_kind", _set("data", "digits", "kind", "digitz"),
     ["data.digits.kind", "'digitz'", "allowed", "digits", "sparse_parity"]),
    ("unknown_data_option", _set("data", "sparse_parity", "n_bitz", 20),
     ["data.sparse_parity.n_bitz", "'n_bitz'", "allowed", "n_bits"]),
    ("unknown_model_option", _set("model", "digits", {"vgg_bn": {"depth": 3}}),
     ["model.digits.vgg_bn", "'depth'", "allowed"]),
    ("arch_wrong_input_kind", _set("grid", 1, "archs", ["vgg_bn", "transformer"]),
     ["grid[1].archs[1]", "'transformer'", "'image'", "tokens"]),
    ("mlp_on_tokens", _append_grid(
        {"task": "modular_addition", "archs": ["mlp"], "methods": ["kaiming"], "seeds": [0]}),
     ["grid[2].archs[0]", "'mlp'", "'tokens'"]),
    ("lr_wrong_type", _set("train", "digits", "lr", "fast"),
     ["train.digits.lr", "'fast'", "number"]),
    ("lr_not_positive", _set("train", "sparse_parity", "lr", 0),
     ["train.sparse_parity.lr", "0", "minimum"]),
    ("unknown_optimizer", _set("train", "digits", "optimizer", "rmsprop"),
     ["train.digits.optimizer", "'rmsprop'", "'sgd'", "'adamw'"]),
    ("unknown_train_key", _set("train", "digits", "learning_rate", 0.1),
     ["train.digits", "'learning_rate'", "not allowed"]),
    ("train_key_missing", _delete("train", "digits", "steps"),
     ["train.digits", "'steps'", "required"]),
    ("checkpoint_every_over_steps", _set("train", "digits", "checkpoint_every", 1000),
     ["train.digits.checkpoint_every", "1000", "240"]),
    ("warmup_not_below_steps", _set("train", "digits", "warmup_steps", 240),
     ["train.digits.warmup_steps", "240", "steps"]),
    ("missing_grid", _delete("grid"),
     ["(top level)", "'grid'", "required"]),
    ("empty_grid", _set("grid", []),
     ["grid", "[]", "non-empty"]),
    ("grid_entry_unknown_key", _set("grid", 0, "seed", 3),
     ["grid[0]", "'seed'", "unexpected"]),
    ("duplicate_cell_across_entries", _append_grid(
        {"task": "digits", "archs": ["vgg_bn"], "methods": ["kaiming"], "seeds": [9, 3]}),
     ["grid[2]", "digits/vgg_bn/kaiming/seed3", "grid[1]"]),
    ("threshold_over_one", _set("evaluate", "digits", "threshold", 1.5),
     ["evaluate.digits.threshold", "1.5", "maximum of 1"]),
    ("task_name_with_slash", _set("grid", 1, "task", "digits/x"),
     ["grid[1].task", "'digits/x'", "does not match"]),
    ("unknown_quant_scheme", _set("quantize", "schemes", ["int8", "int3"]),
     ["quantize.schemes[1]", "'int3'", "allowed", "awq_int4"]),
    ("unknown_quant_method", _set("quantize", "methods", ["astt"]),
     ["quantize.methods[0]", "'astt'", "allowed"]),
    ("gradinit_bad_setting", _set("gradinit", "digits", {"itrations": 3}),
     ["gradinit.digits", "'itrations'", "allowed"]),
    ("gradinit_task_missing", lambda c: (c["grid"][1].update(methods=["gradinit"]),
                                         c["gradinit"].pop("digits")),
     ["gradinit.digits", "'gradinit'", "params.yaml"]),
    ("sparse_bad_nm", lambda c: (c["grid"][1].update(methods=["ast"]),
                                 c["sparse"]["digits"].update(n=4, m=4)),
     ["sparse.digits", "n=4", "m=4"]),
    ("empty_experiment", _set("mlflow", "experiment", ""),
     ["mlflow.experiment", "''"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [pytest.param(mutate, expected, id=name) for name, mutate, expected in BAD_CONFIGS],
)
def test_bad_config_is_refused(
    config: dict, repo_root: Path, mutate: Callable[[dict], None], expected: list[str]
) -> None:
    mutate(config)
    with pytest.raises(ConfigError) as caught:
        validate_schema(config)
        check_config(config, base_dir=repo_root)
    message = str(caught.value)
    missing = [text for text in expected if text not in message]
    assert not missing, f"error message lacks {missing}: {message}"
    assert message.startswith("config key "), message


def test_base_config_is_valid(config: dict, repo_root: Path) -> None:
    """Control for the cases above: the unmutated config passes both layers."""
    validate_schema(config)
    check_config(config, base_dir=repo_root)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        pytest.param({"grid": [{"task": "digits", "archs": ["vgg_bn"], "methods": ["kaiming"],
                                "seeds": [1, 1]}]},  # fmt: skip
                     ["grid[0].seeds", "[1]"], id="duplicate_seeds"),
        pytest.param({"train": {"digits": {"batch_size": "big"}}},
                     ["train.digits.batch_size", "'big'"], id="type_error"),
        pytest.param({"evaluate": {"sparse_parity": {"threshold": 2}}},
                     ["evaluate.sparse_parity.threshold", "2"], id="threshold"),
    ],
)  # fmt: skip
def test_load_config_refuses_bad_override_file(
    repo_root: Path, tmp_path: Path, override: dict, expected: list[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(override))
    with pytest.raises(ConfigError) as caught:
        load_config(repo_root / PARAMS, repo_root / GRID, bad, check_paths_from=repo_root)
    assert all(text in str(caught.value) for text in expected), str(caught.value)


# --------------------------------------------------------------------------------------------------
# Through Snakemake: a bad config is refused at parse time, before any job is built or started

SNAKEMAKE_BAD = {
    "unknown_arch": (
        {
            "grid": [
                {"task": "digits", "archs": ["vgg_typo"], "methods": ["kaiming"], "seeds": [0]}
            ]
        },  # fmt: skip
        ["grid[0].archs[0]", "vgg_typo"],
    ),
    "duplicate_seeds": (
        {
            "grid": [
                {
                    "task": "sparse_parity",
                    "archs": ["mlp"],
                    "methods": ["kaiming"],
                    "seeds": [0, 1, 0],
                }
            ]
        },  # fmt: skip
        ["grid[0].seeds", "duplicate seeds [0]"],
    ),
    "schema_type_error": (
        {"train": {"digits": {"lr": "fast"}}},
        ["'fast' is not of type 'number'", "['train']['digits']['lr']"],
    ),
}


@pytest.fixture(scope="module")
def workflow_copy(repo_root: Path, tmp_path_factory) -> Path:
    """The workflow's sources (no results, no tracking store); the package is installed editable."""
    return copy_workflow(repo_root, tmp_path_factory.mktemp("workflow"))


@pytest.mark.parametrize("case", sorted(SNAKEMAKE_BAD))
def test_snakemake_refuses_bad_config_before_any_job(
    workflow_copy: Path, tmp_path: Path, case: str
) -> None:
    override, expected = SNAKEMAKE_BAD[case]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(override))
    env = dict(os.environ)
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(bad)],
        cwd=workflow_copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    missing = [text for text in expected if text not in output]
    assert not missing, f"snakemake output lacks {missing}:\n{output[-3000:]}"
    assert "rule train" not in output and "Building DAG" not in output, output[-3000:]
    assert "Job stats" not in output, output[-3000:]
    assert not (workflow_copy / "results").exists()
    assert not (workflow_copy / "logs").exists()
    assert not (tmp_path / "mlflow.db").exists(), "tracking must not be set up for a bad config"


def test_joint_groups_the_grid_cannot_fill_are_skipped_with_a_warning(config: dict) -> None:
    from trainmap.config import joint_groups

    config["analysis"]["joint"] = [
        {"name": "ok", "task": "digits", "archs": ["vgg_bn", "resnet_bn"], "methods": ["kaiming"]},
        {"name": "absent", "task": "digits", "archs": ["repvgg"], "methods": ["kaiming"]},
    ]
    with pytest.warns(UserWarning, match=r"analysis.joint\[1\] \('absent'\).*skipped"):
        check_config(config)
    groups = joint_groups(config)
    assert list(groups) == ["ok"] and len(groups["ok"]) == 16


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"name": "a", "task": "digits", "methods": ["gradinitt"]},
         ["analysis.joint[0].methods[0]", "'gradinitt'", "allowed"]),
        ({"name": "a", "task": "digits", "archs": ["vgg_bnn"]},
         ["analysis.joint[0].archs[0]", "'vgg_bnn'", "allowed"]),
    ],
)  # fmt: skip
def test_joint_groups_with_unknown_names_are_refused(config: dict, spec: dict, expected) -> None:
    config["analysis"]["joint"] = [spec]
    with pytest.raises(ConfigError) as caught:
        check_config(config)
    assert all(text in str(caught.value) for text in expected), str(caught.value)


def test_duplicate_joint_names_are_refused(config: dict) -> None:
    spec = {"name": "twice", "task": "digits", "archs": ["vgg_bn"]}
    config["analysis"]["joint"] = [spec, dict(spec)]
    with pytest.raises(ConfigError, match=r"analysis.joint\[1\].name: 'twice' is used twice"):
        check_config(config)
