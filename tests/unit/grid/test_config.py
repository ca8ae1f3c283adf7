"""The study configuration: loading, merging, grid expansion and every way a config is refused.

Malformed configs are built by mutating a copy of the valid merged config (params.yaml extended by
config/config.yaml); each must be refused with a ConfigError that names the offending key and the
bad value. Three of them are also fed to Snakemake itself (`snakemake -n --configfile bad.yaml`) in
a temporary copy of the workflow, which must refuse them before building any job.
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from trainmap.data import missing_data_files
from trainmap.grid import (
    Cell,
    ConfigError,
    check_config,
    check_config_files,
    expand_grid,
    grid_tasks,
    load_config,
    merge_config,
    read_config_file,
    results_root,
    validate_schema,
)
from trainmap.grid.grid_checks import check_job_count
from trainmap.io import copy_workflow

PARAMS = "params.yaml"
GRID = "config/config.yaml"
SMOKE = "config/smoke.yaml"


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
    # params.yaml's hyperparameters survive the merge with the grid file: every key the grid file
    # does not set is params.yaml's, and the ones it sets (the default study's budget: digits
    # steps, the sparse-parity archive) are its own.
    params_train = read_yaml(repo_root / PARAMS)["train"]
    own_train = read_yaml(repo_root / GRID).get("train", {})
    assert base_config["train"] == merge_config(copy.deepcopy(params_train), own_train)
    assert base_config["train"]["digits"]["lr"] == params_train["digits"]["lr"]
    assert base_config["train"]["digits"]["steps"] == own_train["digits"]["steps"]
    assert base_config["mlflow"] == read_yaml(repo_root / PARAMS)["mlflow"]


def test_default_study_has_at_least_32_seeds_per_method_in_every_joint_comparison(
    base_config: dict,
) -> None:
    """The default study's answers rest on enough seeds (the paper: 40 per setting)."""
    from trainmap.grid import joint_comparisons

    joints = joint_comparisons(base_config)
    assert set(joints) == {spec["name"] for spec in base_config["analysis"]["joint"]}
    for name, cells in joints.items():
        per_method: dict[tuple[str, str], int] = {}
        for cell in cells:
            per_method[cell.arch, cell.method] = per_method.get((cell.arch, cell.method), 0) + 1
        assert len(per_method) >= 2, f"{name} compares nothing"
        assert min(per_method.values()) >= 32, f"{name}: {per_method}"


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
    for name in missing_data_files("mnist", tmp_path / "data" / "mnist"):  # the reader's files
        dims = (1, 28, 28) if "images" in name else (1,)  # one blank image, one label
        header = struct.pack(f">{1 + len(dims)}I", 0x800 + len(dims), *dims)
        (tmp_path / "data" / "mnist" / name).write_bytes(header + bytes(math.prod(dims)))
    del config["dvc"]  # dvc.configfile also resolves against base_dir (tested on its own below)
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
    ("per_seed_lr_not_positive", _set("train", "digits", "lr", [0.1, -0.5]),
     ["train.digits.lr[1]", "-0.5", "minimum"]),
    ("per_seed_momentum_empty", _set("train", "digits", "momentum", []),
     ["train.digits.momentum", "non-empty"]),
    ("momentum_wrong_type_names_the_list_form", _set("train", "digits", "momentum", "high"),
     ["train.digits.momentum", "'high'", "number", "a list of such values, one per seed"]),
    ("unknown_optimizer", _set("train", "digits", "optimizer", "rmsprop"),
     ["train.digits.optimizer", "'rmsprop'", "'sgd'", "'adamw'"]),
    ("unknown_train_key", _set("train", "digits", "learning_rate", 0.1),
     ["train.digits.learning_rate", "'learning_rate'", "unknown key", "allowed", "lr"]),
    ("train_key_missing", _delete("train", "digits", "steps"),
     ["train.digits.steps", "missing", "requires 'steps'"]),
    ("checkpoint_every_over_steps", _set("train", "digits", "checkpoint_every", 1000),
     ["train.digits.checkpoint_every", "1000", "80"]),
    ("checkpoints_past_the_limit",
     lambda c: c["train"]["digits"].update(steps=1_000_000_000, checkpoint_every=1),
     ["train.digits.checkpoint_every", "1,000,000,001 checkpoints per run", "at most 1,000,000",
      "set checkpoint_every to 1001 or more"]),
    ("warmup_not_below_steps", _set("train", "digits", "warmup_steps", 240),
     ["train.digits.warmup_steps", "240", "steps"]),
    ("missing_grid", _delete("grid"),
     ["config key grid:", "missing", "requires 'grid'"]),
    ("empty_grid", _set("grid", []),
     ["config key grid:", "empty, and no external: run sets"]),
    ("grid_entry_unknown_key", _set("grid", 0, "seed", 3),
     ["grid[0].seed", "'seed'", "unknown key", "did you mean 'seeds'?"]),
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
     ["sparse.digits", "n: 4", "m: 4"]),
    ("empty_experiment", _set("mlflow", "experiment", ""),
     ["mlflow.experiment", "''"]),
    # batch augmentation (train.<task>.augment): each refusal names the key
    ("augment_vector_task", _set("train", "sparse_parity", "augment", {"flip": True}),
     ["train.sparse_parity.augment", "image tasks", "vector"]),
    ("augment_crop_too_large", _set("train", "digits", "augment", {"crop": 32}),
     ["train.digits.augment.crop", "32", "8x8", "at most 8"]),
    ("augment_cutout_too_large", _set("train", "digits", "augment", {"cutout": 9}),
     ["train.digits.augment.cutout", "9", "at most 8"]),
    ("augment_cutout_zero", _set("train", "digits", "augment", {"cutout": 0}),
     ["train.digits.augment.cutout", "0"]),
    ("augment_mixup_zero", _set("train", "digits", "augment", {"mixup": 0}),
     ["train.digits.augment.mixup", "0"]),
    ("augment_unknown_preset", _set("train", "digits", "augment", {"preset": "autoaugment"}),
     ["train.digits.augment.preset", "'autoaugment'", "gradinit_cifar"]),
    ("augment_option_preset_lacks", _set("train", "digits", "augment",
                                         {"preset": "gradinit_cifar", "resized_crop": 8}),
     ["train.digits.augment.resized_crop", "does not take", "gradinit_cifar"]),
    ("augment_channels", _set("train", "digits", "augment",
                              {"normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2]}}),
     ["train.digits.augment.normalize", "3 means", "1 channel"]),
    ("augment_under_gradinit", _set("gradinit", "digits", "augment", {"flip": True}),
     ["gradinit.digits.augment", "training setting", "train.<task>"]),
    ("param_groups_unknown", _set("train", "digits", "param_groups", "lamb"),
     ["train.digits.param_groups", "'lamb'", "gradinit"]),
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


# Malformed configs a new user wrote. Each is refused at parse time (validate_schema in the
# Snakefile, check_config in common.smk, before any rule or job exists), and the error's FIRST line
# leads with the key, then names the bad value and what is allowed.
# (id, mutation, key, bad value as printed, what is allowed)
MALFORMED_CONFIGS = [
    # 1. unknown keys at every level, the top included, with a suggestion when one is close
    ("1_top_level_grdi", lambda c: c.update(grdi=c["grid"]),
     "grdi", "'grdi'", "did you mean 'grid'?"),
    ("1_top_level_quantise", lambda c: c.update(quantise={"methods": ["kaiming"]}),
     "quantise", "'quantise'", "did you mean 'quantize'?"),
    ("1_top_level_analisys", lambda c: c.update(analisys={"k_max": 4}),
     "analisys", "'analisys'", "did you mean 'analysis'?"),
    ("1_task_key_typo", _set("train", "digitz", {"steps": 60}),
     "train.digitz", "'digitz'", "did you mean 'digits'?"),
    ("1_model_arch_typo", _set("model", "digits", {"vgg_bnn": {"widths": [8, 16, 32]}}),
     "model.digits.vgg_bnn", "'vgg_bnn'", "did you mean 'vgg_bn'?"),
    ("1_sparse_key_typo", _set("sparse", "digits", "srste_lamda", 0.1),
     "sparse.digits.srste_lamda", "'srste_lamda'", "did you mean 'srste_lambda'?"),
    ("1_analysis_key_typo", _set("analysis", "restart", 3),
     "analysis.restart", "'restart'", "did you mean 'restarts'?"),
    # 2. the sparse stage's retraining is validated like train.<task>
    ("2_sparse_train_lr", _set("sparse", "digits", "train", "lr", -1),
     "sparse.digits.train.lr", "-1", "minimum of 0"),
    ("2_sparse_train_steps", _set("sparse", "digits", "train", "steps", 0),
     "sparse.digits.train.steps", "0", "minimum of 1"),
    ("2_sparse_train_batch", _set("sparse", "digits", "train", "batch_size", 0),
     "sparse.digits.train.batch_size", "0", "minimum of 1"),
    ("2_sparse_train_key_typo", _set("sparse", "digits", "train", "stpes", 10),
     "sparse.digits.train.stpes", "'stpes'", "did you mean 'steps'?"),
    ("2_sparse_train_checkpoints", _set("sparse", "digits", "train", "steps", 3),
     "sparse.digits.train.checkpoint_every", "5", "at most steps"),
    # 3. data option values, before the data job
    ("3_n_bits", _set("data", "sparse_parity", "n_bits", -3),
     "data.sparse_parity.n_bits", "-3", "minimum of 1"),
    ("3_k_over_n_bits", _set("data", "sparse_parity", "k", 50),
     "data.sparse_parity.k", "50", "1 <= k <= n_bits"),
    ("3_n_train", _set("data", "sparse_parity", "n_train", 0),
     "data.sparse_parity.n_train", "0", "minimum of 1"),
    ("3_train_frac", _set("data", "modular_addition", "train_frac", 1.5),
     "data.modular_addition.train_frac", "1.5", "maximum of 1"),
    ("3_empty_split", lambda c: c["data"]["modular_addition"].update(p=3, train_frac=0.01),
     "data.modular_addition.train_frac", "0.01", "both the train and the test split non-empty"),
    # 4. text where a number belongs: a config error naming the key, never a TypeError
    ("4_gradinit_eta_text", _set("gradinit", "digits", "eta", "fast"),
     "gradinit.digits.eta", "'fast'", "of type 'number'"),
    ("4_srste_lambda_text", _set("sparse", "digits", "srste_lambda", "big"),
     "sparse.digits.srste_lambda", "'big'", "of type 'number'"),
    ("4_yaml_exponent_is_text", _set("train", "digits", "lr", "1e-3"),
     "train.digits.lr", "'1e-3'", "1.0e-3"),
    ("4_float_steps", _set("train", "digits", "steps", 240.0),
     "train.digits.steps", "240.0", "of type 'integer'"),
    # 7. a joint group naming an unknown task is an error
    ("7_joint_unknown_task", _set("analysis", "joint", [{"name": "j", "task": "digitz"}]),
     "analysis.joint[0].task", "'digitz'", "did you mean 'digits'?"),
    # 13. dvc.configfile is pasted into shell commands: a plain project path that exists
    ("13_dvc_configfile_shell", _set("dvc", "configfile", "config/x.yaml; touch pwned"),
     "dvc.configfile", "'config/x.yaml; touch pwned'", "letters, digits"),
    ("13_dvc_configfile_option", _set("dvc", "configfile", "--help.yaml"),
     "dvc.configfile", "'--help.yaml'", "letters, digits"),
    ("13_dvc_configfile_missing", _set("dvc", "configfile", "config/nope.yaml"),
     "dvc.configfile", "'config/nope.yaml'", "does not exist"),
    # keys the lead's seed-batched training and the method options add
    ("new_seed_block", _set("train", "digits", "seed_block", 0),
     "train.digits.seed_block", "0", "minimum of 1"),
    ("new_conv_groups", _set("sparse", "digits", "conv_groups", "channels"),
     "sparse.digits.conv_groups", "'channels'", "'input_channels', 'flattened'"),
    ("new_second_order", _set("gradinit", "digits", "second_order", "yes"),
     "gradinit.digits.second_order", "'yes'", "of type 'boolean'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "key", "value", "allowed"),
    [pytest.param(*case[1:], id=case[0]) for case in MALFORMED_CONFIGS],
)
def test_malformed_config_first_line_names_key_value_and_allowed(
    config: dict, repo_root: Path, mutate, key: str, value: str, allowed: str
) -> None:
    mutate(config)
    with pytest.raises(ConfigError) as caught:
        validate_schema(config)
        check_config(config, base_dir=repo_root)
    first_line = str(caught.value).splitlines()[0]
    assert first_line.startswith(f"config key {key}: "), first_line
    assert value in first_line and allowed in first_line, first_line


def test_dvc_yaml_quotes_the_config_file_in_every_command(repo_root: Path) -> None:
    """``dvc.yaml`` pastes ${dvc.configfile} into shell commands; it is quoted there
    (and the schema test cases above keep shell characters out of the value)."""
    stages = read_yaml(repo_root / "dvc.yaml")["stages"]
    commands = [stage["cmd"] for stage in stages.values()]
    assert all("${dvc.configfile}" in command for command in commands)
    for command in commands:
        unquoted = command.replace('"${dvc.configfile}"', "")
        assert "${dvc.configfile}" not in unquoted, command
        assert "${" not in unquoted.replace("${dvc.cores}", ""), command  # cores: an integer


def test_seed_blocks_second_order_and_conv_groups_are_accepted(config: dict, repo_root) -> None:
    """train.<task>.seed_block, gradinit.<task>.second_order, sparse.<task>.conv_groups."""
    config["train"]["digits"]["seed_block"] = 8
    config["gradinit"]["digits"]["second_order"] = True
    for choice in ("input_channels", "flattened"):
        config["sparse"]["digits"]["conv_groups"] = choice
        validate_schema(config)
        check_config(config, base_dir=repo_root)
    # Seed ranges come from train.<task>.seed_block for every rule: one under sparse.<task>.train
    # would be silently unused, so it is refused.
    config["sparse"]["digits"]["train"]["seed_block"] = 4
    with pytest.raises(ConfigError, match=r"^config key sparse.digits: .*'seed_block'"):
        check_config(config, base_dir=repo_root)


@pytest.mark.parametrize(
    ("start", "key", "message"),
    [
        ({"step": 242}, "sparse.digits.start.step", "242 is not a checkpoint of the dense runs"),
        ({"step": 245}, "sparse.digits.start.step", "a multiple of 5 from 0 to 240"),
        ({"step": -5}, "sparse.digits.start.step", "-5 is not a step"),
        ({"stpe": 5}, "sparse.digits.start", "allowed: final, init or {step: N}"),
        ("middle", "sparse.digits.start", "'middle' is not a start"),
    ],
)
def test_sparse_start_must_be_a_checkpoint_of_the_dense_runs(
    config: dict, repo_root: Path, start, key: str, message: str
) -> None:
    """``sparse.<task>.start`` {step: N} prunes the dense run's checkpoint at step N; a step the
    dense runs never record (digits: every 5 of 240 steps) is refused before any job."""
    config["grid"][1]["methods"] = ["kaiming", "ast"]
    config["train"]["digits"]["steps"] = 240  # params.yaml's recipe (the default study trains 80)
    config["sparse"]["digits"]["start"] = start
    with pytest.raises(ConfigError) as caught:
        validate_schema(config)
        check_config(config, base_dir=repo_root)
    first_line = str(caught.value).splitlines()[0]
    assert first_line.startswith(f"config key {key}: ") and message in first_line, first_line


def test_sparse_start_choices_are_accepted(config: dict, repo_root: Path) -> None:
    """final, init and any checkpoint step; a grid without sparse cells of the task (a smoke
    test's short training) does not check the step it would never use."""
    config["grid"][1]["methods"] = ["kaiming", "ast"]
    config["train"]["digits"]["steps"] = 240  # params.yaml's recipe (the default study trains 80)
    for start in ("final", "init", {"step": 0}, {"step": 120}, {"step": 240}):
        config["sparse"]["digits"]["start"] = start
        validate_schema(config)
        check_config(config, base_dir=repo_root)
    config["grid"][1]["methods"] = ["kaiming"]
    config["sparse"]["digits"]["start"] = {"step": 100000}
    check_config(config, base_dir=repo_root)


#: Leaves that legitimately take any text or null (names, paths, URIs).
TAKES_TEXT = ("mlflow.*", "data.*.path", "analysis.joint[[]*[]].name")
TAKES_NULL = ("mlflow.tracking_uri", "*.grad_clip", "analysis.halves", "analysis.half_size",
              "analysis.checkpoints_per_run", "analysis.first_n")  # fmt: skip


def _leaves(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list) and node and isinstance(node[0], dict):
        for index, value in enumerate(node):
            yield from _leaves(value, (*path, index))
    else:  # a scalar or a list of scalars (seeds, widths): replaced whole
        yield path


def _dotted(path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


@pytest.mark.parametrize("bad", ["fast", -1, None])
def test_every_setting_with_a_wrong_value_is_a_config_error_naming_it(
    config: dict, repo_root: Path, bad
) -> None:
    """Over the whole config: every leaf of params.yaml + the grid set to text, a
    negative number or null is a ConfigError naming that key (or its parent), never a crash."""
    import fnmatch

    config["grid"].append(
        {"task": "digits", "archs": ["vgg_bn"], "methods": ["gradinit", "ast"], "seeds": [0]}
    )
    accepted = {"fast": TAKES_TEXT, None: TAKES_NULL}.get(bad, ())
    problems = []
    for path in _leaves(config):
        mutated = copy.deepcopy(config)
        target = mutated
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = bad
        key = _dotted(path)
        try:
            validate_schema(mutated)
            check_config(mutated, base_dir=repo_root)
        except ConfigError as error:
            named = str(error).splitlines()[0].removeprefix("config key ").split(":")[0]
            if not (key.startswith(named) or named.startswith(key)):
                problems.append(f"{key}: error names {named!r}")
            continue
        except Exception as error:  # noqa: BLE001 - the point: no other exception escapes
            problems.append(f"{key}: {type(error).__name__}: {error}")
            continue
        if not any(fnmatch.fnmatchcase(key, pattern) for pattern in accepted):
            problems.append(f"{key}: {bad!r} accepted")
    assert not problems, "\n".join(problems)


def test_base_config_is_valid(config: dict, repo_root: Path) -> None:
    """Control for the cases above: the unmutated config passes both layers."""
    validate_schema(config)
    check_config(config, base_dir=repo_root)


def test_each_shipped_config_writes_under_a_root_of_its_own(repo_root: Path) -> None:
    """The default study, the smoke grid and the test configs write under results/ (the published
    digest's paths, what dvc.yaml versions); every other shipped config under a root no other
    config shares, outside results/ (whose paper/ the default study's own rule may write)."""
    default_roots = {}
    other_roots: dict[str, str] = {}
    defaults = merge_config(
        read_config_file(repo_root / PARAMS), read_config_file(repo_root / GRID)
    )
    shipped = [*repo_root.glob("config/*.yaml"), *repo_root.glob("config/paper/*.yaml"),
               *repo_root.glob("config/suites/*.yaml")]  # fmt: skip
    for path in sorted(shipped):
        config = merge_config(copy.deepcopy(defaults), read_config_file(path))
        validate_schema(config)
        name = str(path.relative_to(repo_root))
        if name in (GRID, SMOKE):
            default_roots[name] = results_root(config)
        else:
            other_roots[name] = results_root(config)
    assert default_roots == {GRID: "results", SMOKE: "results"}
    assert len(set(other_roots.values())) == len(other_roots), other_roots
    for name, root in other_roots.items():
        assert root != "results" and not root.startswith("results/"), (name, root)
        assert not any(root.startswith(f"{other}/") for other in other_roots.values()), (name, root)


@pytest.mark.parametrize("root", ["../elsewhere", "results/../x", "/abs", "results/", ".", ""])
def test_results_root_outside_the_project_is_refused(config: dict, root: str) -> None:
    config["results"] = root
    with pytest.raises(ConfigError, match=r"^config key results: "):
        validate_schema(config)


def test_dvc_stage_refuses_a_root_dvc_yaml_does_not_version(
    config: dict, repo_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under DVC the jobs must write where dvc.yaml's outs are, else a stage versions nothing."""
    config["results"] = "results-paper/cpu"
    check_config(config, base_dir=repo_root)  # outside DVC: any root
    monkeypatch.setenv("DVC_STAGE", "train")
    with pytest.raises(ConfigError, match=r"config key results: 'results-paper/cpu' under DVC"):
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
# Config files


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("grid: [1]\ntrain: {}\ngrid: [2]\n",
                     "config key grid ({file}, line 3): duplicate key 'grid', already set at line 1",
                     id="top_level"),
        pytest.param("grid:\n  - task: digits\n    seeds: [0]\n    seeds: [1]\n",
                     "config key grid[0].seeds ({file}, line 4): duplicate key 'seeds', already "
                     "set at line 3", id="in_a_list_item"),
        pytest.param('{"train": {"digits": {"lr": 0.1, "lr": 0.2}}}',
                     "config file {file}: duplicate key 'lr' in one JSON mapping", id="json"),
        pytest.param("train:\n  digits:\n    lr: 0.1\n   steps: 3\n",
                     "config file {file}, line 4, column 4: not valid YAML", id="indentation"),
        pytest.param("train:\n\tdigits: {}\n",
                     "config file {file}, line 2, column 1: not valid YAML", id="tab"),
        pytest.param("- task: digits\n", "config file {file}: the top level is a list",
                     id="not_a_mapping"),
    ],
)  # fmt: skip
def test_config_file_problems_name_file_and_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    for read in (read_config_file, lambda p: check_config_files([p])):
        if "top level is a list" in expected and read is not read_config_file:
            continue  # check_config_files checks syntax and keys only; the merge refuses lists
        with pytest.raises(ConfigError) as caught:
            read(path)
        first_line = str(caught.value).splitlines()[0]
        assert first_line.startswith(expected.format(file=path)), first_line


def test_a_key_may_repeat_in_different_mappings(tmp_path: Path) -> None:
    """Control for the duplicate check: the same key under two parents, merge keys, YTE's ?else."""
    path = tmp_path / "fine.yaml"
    path.write_text(
        "train:\n  digits: &d {steps: 3, lr: 0.1}\n  mnist:\n    <<: *d\n    steps: 4\n"
        "evaluate:\n  digits: {threshold: 0.5}\n"
    )
    assert read_config_file(path)["train"] == {"digits": {"steps": 3, "lr": 0.1},
                                               "mnist": {"steps": 4, "lr": 0.1}}  # fmt: skip
    check_config_files([path, tmp_path / "absent.yaml"])  # a missing file is Snakemake's to report


def test_a_config_file_using_yte_runs_python(tmp_path: Path, repo_root: Path) -> None:
    """`__use_yte__: true` makes a config file a template whose ?expressions are
    Python, evaluated when the file is read, also in a dry run; the configuration page says to
    trust such a file like a Snakefile."""
    marker = tmp_path / "ran"
    path = tmp_path / "template.yaml"
    path.write_text(
        "__use_yte__: true\n"
        f"mlflow:\n  experiment: ?__import__('pathlib').Path({str(marker)!r}).touch() or 'x'\n"
    )
    assert read_config_file(path) == {"mlflow": {"experiment": "x"}}
    assert marker.exists(), "the template's Python ran"
    page = (repo_root / "docs" / "configuration.md").read_text()
    assert "__use_yte__" in page and "like a Snakefile" in page


def test_check_command_reports_a_bad_file(
    repo_root: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """`python -m trainmap.grid FILE`: a check without Snakemake (which reads --configfile files
    before the Snakefile, so their syntax errors get its message: use this for file and line)."""
    from trainmap.grid.validate import main

    monkeypatch.chdir(repo_root)
    assert main([SMOKE]) == 0
    assert "define 8 grid cells" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  digits: {steps: 3\n")
    assert main([str(bad)]) == 1
    assert capsys.readouterr().err.startswith(f"config file {bad}, line 3")


# --------------------------------------------------------------------------------------------------
# Through Snakemake: a bad config is refused at parse time, before any job is built or started

# Config files as a user writes them (--configfile FILE), and the first line of the error Snakemake
# prints (the line after "ConfigError in file ...:"); {file} is the bad file's path.
SNAKEMAKE_BAD = {
    "unknown_arch": (
        "grid:\n  - {task: digits, archs: [vgg_typo], methods: [kaiming], seeds: [0]}\n",
        "config key grid[0].archs[0]: unknown architecture 'vgg_typo'; allowed: ",
    ),
    "duplicate_seeds": (
        "grid:\n  - {task: sparse_parity, archs: [mlp], methods: [kaiming], seeds: [0, 1, 0]}\n",
        "config key grid[0].seeds: duplicate seeds [0]",
    ),
    "1_top_level_typo": (
        "grdi:\n  - {task: digits, archs: [vgg_bn], methods: [kaiming], seeds: [0]}\n",
        "config key grdi: unknown top-level key 'grdi'; allowed: ",
    ),
    "billion_steps_typo": (
        "train:\n  sparse_parity: {steps: 1000000000, checkpoint_every: 1}\n",
        "config key train.sparse_parity.checkpoint_every: 1 with train.sparse_parity.steps = "
        "1000000000 plans 1,000,000,001 checkpoints per run",
    ),
    "2_sparse_train_steps": (
        "sparse:\n  digits:\n    train: {steps: 0}\n",
        "config key sparse.digits.train.steps: 0 is less than the minimum of 1",
    ),
    "3_data_k_over_n_bits": (
        "data:\n  sparse_parity: {k: 50}\n",
        "config key data.sparse_parity.k: 50 exceeds data.sparse_parity.n_bits = 40; allowed: ",
    ),
    "4_text_for_number": (
        "gradinit:\n  digits: {eta: fast}\n",
        "config key gradinit.digits.eta: 'fast' is not of type 'number'",
    ),
    "5_schema_type_error": (
        "train:\n  digits:\n    lr: fast\n",
        "config key train.digits.lr: 'fast' is not of type 'number'",
    ),
    "6_duplicate_key": (
        "train:\n  digits:\n    steps: 30\n    steps: 60\n",
        "config key train.digits.steps ({file}, line 4): duplicate key 'steps', already set at "
        "line 3",
    ),
    "7_joint_unknown_task": (
        "analysis:\n  joint:\n    - {name: j, task: digitz}\n",
        "config key analysis.joint[0].task: unknown task 'digitz'",
    ),
    "13_dvc_configfile": (
        'dvc:\n  configfile: "config/x.yaml; touch pwned"\n',
        "config key dvc.configfile: 'config/x.yaml; touch pwned' does not match",
    ),
}


@pytest.fixture(scope="module")
def workflow_copy(repo_root: Path, tmp_path_factory) -> Path:
    """The workflow's sources (no results, no tracking store); the package is installed editable."""
    return copy_workflow(repo_root, tmp_path_factory.mktemp("workflow"))


def snakemake_dry_run(workdir: Path, tmp_path: Path, *args: str) -> str:
    """``snakemake -n ARGS`` in ``workdir``; asserts it failed before any job, returns its output."""
    env = dict(os.environ)
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "rule train" not in output and "Building DAG" not in output, output[-3000:]
    assert "Job stats" not in output, output[-3000:]
    assert not (workdir / "results").exists()
    assert not (workdir / "logs").exists()
    assert not (tmp_path / "mlflow.db").exists(), "tracking must not be set up for a bad config"
    return output


def error_first_line(output: str) -> str:
    """The first line of trainmap's configuration error in Snakemake's output: the message alone,
    leading with ``config key`` or ``config file``, with no Python traceback after it."""
    lines = output.splitlines()
    for index, line in enumerate(lines):
        if line.startswith(("config key ", "config file ")):
            assert not any(rest.lstrip().startswith('File "') for rest in lines[index:]), output
            assert "Error in file" not in output, output
            return line
    raise AssertionError(f"no error in the output:\n{output[-3000:]}")


@pytest.mark.integration  # starts a program (a subprocess)
@pytest.mark.parametrize("case", sorted(SNAKEMAKE_BAD))
def test_snakemake_refuses_bad_config_before_any_job(
    workflow_copy: Path, tmp_path: Path, case: str
) -> None:
    text, expected = SNAKEMAKE_BAD[case]
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    output = snakemake_dry_run(workflow_copy, tmp_path, "--configfile", str(bad))
    assert error_first_line(output).startswith(expected.format(file=bad)), output[-3000:]


@pytest.mark.integration  # starts a program (a subprocess)
def test_snakemake_names_file_and_line_of_a_yaml_syntax_error(
    repo_root: Path, tmp_path: Path
) -> None:
    """The Snakefile's own config files are read strictly before Snakemake's
    loader, which would only say "Config file is not valid JSON or YAML"."""
    workdir = copy_workflow(repo_root, tmp_path / "workflow")
    grid = workdir / "config" / "config.yaml"
    grid.write_text("grid:\n  - task: digits\n    archs: [vgg_bn\n    seeds: [0]\n")
    output = snakemake_dry_run(workdir, tmp_path)
    first_line = error_first_line(output)
    assert first_line.startswith("config file config/config.yaml, line 4, column "), output
    assert "while parsing a flow sequence at line 3" in first_line, first_line


def test_joint_comparisons_the_grid_cannot_fill_are_skipped_with_a_warning(config: dict) -> None:
    from trainmap.grid import joint_comparisons

    config["analysis"]["joint"] = [
        {"name": "ok", "task": "digits", "archs": ["vgg_bn", "resnet_bn"], "methods": ["kaiming"]},
        {"name": "absent", "task": "digits", "archs": ["repvgg"], "methods": ["kaiming"]},
    ]
    with pytest.warns(UserWarning, match=r"analysis.joint\[1\] \('absent'\).*skipped"):
        check_config(config)
    joints = joint_comparisons(config)
    assert list(joints) == ["ok"] and len(joints["ok"]) == 16


@pytest.mark.parametrize(
    ("group_maps", "expected"),
    [
        ("all", ["digits/resnet_bn/kaiming", "digits/vgg_bn/kaiming", "sparse_parity/mlp/kaiming"]),
        ("outside_joint", ["digits/resnet_bn/kaiming", "sparse_parity/mlp/kaiming"]),
        ("none", []),
    ],
)  # fmt: skip
def test_group_maps_chooses_which_groups_get_a_map_of_their_own(
    config: dict, group_maps: str, expected: list[str]
) -> None:
    from trainmap.grid import analysis_groups

    config["analysis"]["group_maps"] = group_maps
    config["analysis"]["joint"] = [
        {"name": "bn", "task": "digits", "archs": ["vgg_bn"], "methods": ["kaiming"]}
    ]
    check_config(config)
    assert sorted(analysis_groups(config)) == expected


def test_group_maps_rejects_an_unknown_choice(config: dict) -> None:
    config["analysis"]["group_maps"] = "joint_only"
    with pytest.raises(ConfigError, match=r"analysis.group_maps.*'joint_only'.*outside_joint"):
        validate_schema(config)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"name": "a", "task": "digits", "methods": ["gradinitt"]},
         ["analysis.joint[0].methods[0]", "'gradinitt'", "allowed"]),
        ({"name": "a", "task": "digits", "archs": ["vgg_bnn"]},
         ["analysis.joint[0].archs[0]", "'vgg_bnn'", "allowed"]),
    ],
)  # fmt: skip
def test_joint_comparisons_with_unknown_names_are_refused(
    config: dict, spec: dict, expected
) -> None:
    config["analysis"]["joint"] = [spec]
    with pytest.raises(ConfigError) as caught:
        check_config(config)
    assert all(text in str(caught.value) for text in expected), str(caught.value)


def test_duplicate_joint_names_are_refused(config: dict) -> None:
    spec = {"name": "twice", "task": "digits", "archs": ["vgg_bn"]}
    config["analysis"]["joint"] = [spec, dict(spec)]
    with pytest.raises(ConfigError, match=r"analysis.joint\[1\].name: 'twice' is used twice"):
        check_config(config)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"checkpoints_per_run": 500}, r"analysis.checkpoints_per_run: 500 is more than the 321 "
                                       r"checkpoints of the shortest run of group"),
        ({"first_n": 400}, r"analysis.first_n: 400 is beyond the 321 checkpoints"),
        ({"checkpoints_per_run": 30, "first_n": 31}, r"analysis.first_n: 31 is beyond the 30"),
        ({"selection": "reproducible", "halves": 40}, r"analysis.halves: 40 splits into halves, "
                                                      r"but the runs of group .* \(8 per group\) "
                                                      r"allow 35 distinct ones"),
        ({"selection": "reproducible", "half_size": 1, "halves": 30},
         r"analysis.halves: 30 splits into halves, but the runs of group .* allow 28 distinct"),
    ],
)  # fmt: skip
def test_analysis_settings_beyond_what_the_runs_allow_are_refused_before_any_job(
    config: dict, change: dict, message: str
) -> None:
    config["analysis"] |= change
    validate_schema(config)
    with pytest.raises(ConfigError, match=message):
        check_config(config)


@pytest.mark.parametrize("key", ["reproduce_ari", "reproduce_share"])
@pytest.mark.parametrize("value", [0, 1.5])
def test_a_reproducibility_target_outside_0_1_is_a_schema_error(
    config: dict, key: str, value: float
) -> None:
    config["analysis"] |= {"selection": "reproducible", key: value}
    with pytest.raises(ConfigError, match=f"analysis.{key}"):
        validate_schema(config)


def test_an_unknown_reproduce_k_is_a_schema_error_naming_the_choices(config: dict) -> None:
    config["analysis"] |= {"selection": "reproducible", "reproduce_k": "smallest"}
    with pytest.raises(ConfigError, match="analysis.reproduce_k.*largest.*nested"):
        validate_schema(config)


def test_a_joint_comparison_halves_each_method_and_is_checked_per_method(config: dict) -> None:
    config["analysis"]["joint"] = [{"name": "nets", "task": "digits",
                                    "archs": ["vgg_bn", "resnet_bn"],
                                    "analysis": {"selection": "reproducible", "halves": 5000}}]  # fmt: skip
    validate_schema(config)
    # 8 seeds per arch: C(8, 4) x C(8, 4) / 2 = 2450 distinct splits with each arch halved
    with pytest.raises(ConfigError, match=r"analysis.joint\[0\].analysis.halves: 5000 .* allow "
                                          r"2450 distinct ones"):  # fmt: skip
        check_config(config)
    config["analysis"]["joint"][0]["analysis"]["halves"] = 5
    check_config(config)


def test_a_joint_comparison_can_have_its_own_analysis_settings(config: dict) -> None:
    from trainmap.grid import joint_settings

    spec = {"name": "a", "task": "digits", "archs": ["vgg_bn"],
            "analysis": {"selection": "folds", "folds": 4}}  # fmt: skip
    config["analysis"]["joint"] = [spec, {"name": "b", "task": "digits", "archs": ["vgg_bn"]}]
    validate_schema(config)
    assert joint_settings(config, "a")["selection"] == "folds"
    assert joint_settings(config, "a")["folds"] == 4
    assert joint_settings(config, "b")["selection"] == config["analysis"]["selection"]
    spec["analysis"] = {"selection": "fold"}
    with pytest.raises(ConfigError, match=r"analysis.joint\[0\].analysis.selection: 'fold'"):
        validate_schema(config)
    spec["analysis"] = {"group_maps": "all"}  # not a per-comparison setting
    with pytest.raises(ConfigError, match=r"analysis.joint\[0\].analysis"):
        validate_schema(config)


def test_a_typo_of_a_billion_steps_is_refused_in_bounded_memory(config: dict, repo_root: Path):
    """``train.sparse_parity: {steps: 1000000000, checkpoint_every: 1}`` (three zeros too many)
    is refused naming the key and the planned count, the checkpoints counted without listing
    them: under 50 MB of Python allocations and a second (listing them took 23.5 GB)."""
    import time
    import tracemalloc

    config["train"]["sparse_parity"].update(steps=1_000_000_000, checkpoint_every=1)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(ConfigError, match=r"^config key train\.sparse_parity\."
                           r"checkpoint_every: 1 with train\.sparse_parity\.steps = 1000000000 "
                           r"plans 1,000,000,001 checkpoints per run"):  # fmt: skip
            validate_schema(config)
            check_config(config, base_dir=repo_root)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50e6 and time.perf_counter() - started < 10, peak


@pytest.mark.slow  # in-process, seconds: 100,001 cells counted
def test_a_grid_of_more_jobs_than_a_dag_can_hold_is_refused_naming_the_count(config: dict,
                                                                            repo_root: Path):  # fmt: skip
    """100,001 seeds of one group, one seed a job: 300,003 jobs (train, evaluate, metrics), past
    MAX_JOBS; refused before Snakemake builds their DAG, naming the count and the key that
    packs seeds into jobs. The same grid in blocks of 32 seeds fits."""
    import time

    from trainmap.grid.grid_checks import MAX_JOBS

    seeds = list(range(MAX_JOBS + 1))
    config["grid"] = [{"task": "sparse_parity", "archs": ["mlp"], "methods": ["kaiming"],
                       "seeds": seeds}]  # fmt: skip
    config["analysis"]["joint"] = []
    config["train"]["sparse_parity"]["seed_block"] = 1
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"^config key grid: 300,003 jobs planned \(100,001 "
                       r"cells; 300,003 of the jobs are task sparse_parity's, 1 seed\(s\) a job\)"
                       r".*raise train\.sparse_parity\.seed_block"):  # fmt: skip
        check_config(config, base_dir=repo_root)
    assert time.perf_counter() - started < 30
    config["train"]["sparse_parity"]["seed_block"] = 32
    check_job_count(config)  # 3 x 3,126 jobs
