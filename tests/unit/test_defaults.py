"""One declaration per default: each setting's default is the config schema's
(``workflow/schemas/config.schema.yaml``), and what repeats it is held to it here.

params.yaml writes values out (DVC sets only keys that are written): every key it sets that has a
schema default holds that default, or is listed below as a task's own choice, with the reason.
:class:`TrainingHMM`'s keyword defaults, the HMM modules' ``DEFAULT_*`` constants and the options
of ``python -m trainmap.dynamics`` read the schema; these tests keep anyone from writing a literal
back in. config/config.yaml is the default study's own choices, not defaults: it is not held to
the schema.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

# At module level: the first import of torch (which trainmap.grid and the CLI's modules load)
# starts ldconfig, which a test outside the integration tier may not.
from trainmap.dynamics.__main__ import parse_args
from trainmap.dynamics.maps.hmm import (
    DEFAULT_FOLDS,
    DEFAULT_HALF_SIZE,
    DEFAULT_REPRODUCE_ARI,
    DEFAULT_REPRODUCE_SHARE,
    TrainingHMM,
)
from trainmap.dynamics.maps.settings import ANALYSIS_DEFAULTS
from trainmap.grid import seed_block
from trainmap.schema import check_section, config_schema, section_defaults

ROOT = Path(__file__).resolve().parents[2]


def each(prefix: str, keys: str, reason: str) -> dict[str, str]:
    """``{prefix.key: reason}`` for each of the space-separated ``keys``."""
    return {f"{prefix}.{key}": reason for key in keys.split()}


#: A task's own GradInit recipe: the schema's defaults are the paper's CIFAR-10 setting (SGD
#: variant, eta 0.1, gamma 1, batch 128, 390 iterations); each task sets the variant, eta and
#: gamma for its optimiser and the iterations and batch size for its data (params.yaml gradinit:).
GRADINIT_RECIPE = "the task's own GradInit recipe (params.yaml gradinit:)"
SEED_BLOCK = (
    "the block bench/seed_batch.py chose for the task's model on 2 CPU cores (params.yaml "
    "train:); a block never changes a run's result"
)
SEED_BLOCK_TASKS = ("sparse_parity", "digits", "mnist_5k", "mnist1d")
#: Keys params.yaml sets to another value than the schema's default, each with the reason. The
#: default is what a task that omits the key takes; these are per-task choices.
DELIBERATE: dict[str, str] = {
    **each("gradinit.sparse_parity", "iterations batch_size", GRADINIT_RECIPE),
    **each("gradinit.modular_addition", "variant eta gamma iterations batch_size", GRADINIT_RECIPE),
    **each("gradinit.digits", "eta tau iterations", GRADINIT_RECIPE),
    **each("gradinit.mnist_5k", "eta tau iterations", GRADINIT_RECIPE),
    **each("gradinit.mnist1d", "variant eta gamma iterations batch_size", GRADINIT_RECIPE),
    **each("gradinit.mnist", "variant eta gamma iterations batch_size", GRADINIT_RECIPE),
    **each("gradinit.cifar100", "gamma", GRADINIT_RECIPE),
    "sparse.sparse_parity.dense_layers": "the one-hidden-layer MLP has no middle layer to keep "
    "dense: both of its layers are made 2:4 sparse",
    "sparse.modular_addition.srste_lambda": "the transformer retrains with AdamW: the LLM value "
    "(1e-4 with Adam), not the SGD default (the schema's comment on srste_lambda)",
    **{f"train.{task}.seed_block": SEED_BLOCK for task in SEED_BLOCK_TASKS},
}


def resolved(node: Mapping[str, Any]) -> dict[str, Any]:
    """``node`` with its ``$ref`` followed (the referring node's own keys kept)."""
    node = dict(node)
    while "$ref" in node:
        target: Any = config_schema()
        for part in node.pop("$ref").removeprefix("#/").split("/"):
            target = target[part]
        node = {**target, **node}
    return node


def child(node: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """The schema of ``key`` inside ``node``: a declared property (an ``if``/``then`` branch's too,
    as a data kind's options), else ``additionalProperties`` (a section keyed by task); None where
    the schema says nothing of it (a model builder's options)."""
    properties = dict(node.get("properties", {}))
    for branch in node.get("allOf", []):
        properties.update(branch.get("then", {}).get("properties", {}))
    spec = properties.get(key, node.get("additionalProperties"))
    return resolved(spec) if isinstance(spec, Mapping) else None


def compare_with_defaults(value: Any, node: Mapping[str, Any] | None, path: str = "") -> tuple:
    """``(compared, differ)``: the key paths of ``value`` (a config) whose schema node has a
    default, and those among them whose value is not that default (path -> (value, default)).
    Mappings are entered key by key; a value equals a default only with the same type too
    (``1`` is not ``1.0``)."""
    compared: list[str] = []
    differ: dict[str, tuple[Any, Any]] = {}
    if node is None:
        return compared, differ
    if isinstance(value, Mapping):
        for key, item in value.items():
            inner = compare_with_defaults(item, child(node, key), f"{path}.{key}".lstrip("."))
            compared += inner[0]
            differ |= inner[1]
    elif "default" in node:
        compared.append(path)
        if (type(value), value) != (type(node["default"]), node["default"]):
            differ[path] = (value, node["default"])
    return compared, differ


def test_the_comparison_finds_a_value_that_is_not_the_default() -> None:
    """Positive control, on the smallest configs that show it."""
    schema = resolved(config_schema())
    assert compare_with_defaults({"analysis": {"k_max": 9}}, schema)[1] == {
        "analysis.k_max": (9, 8)
    }
    assert compare_with_defaults({"analysis": {"holdout": 1}}, schema)[1] == {
        "analysis.holdout": (1, 0.2)
    }
    assert compare_with_defaults({"train": {"any": {"seed_block": 1}}}, schema) == (
        ["train.any.seed_block"],
        {},
    )
    assert compare_with_defaults({"sparse": {"any": {"train": {"seed_block": 2}}}}, schema)[1]


def test_params_yaml_sets_each_key_to_the_schemas_default_or_says_why() -> None:
    """Every key params.yaml sets that has a schema default holds it, except the listed per-task
    choices; the list is exact, so a new difference, or a listed one that is gone, fails here."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    compared, differ = compare_with_defaults(params, resolved(config_schema()))
    assert len(compared) > 100, compared
    assert "train.sparse_parity.seed_block" in compared
    assert {path for path in compared if path.startswith("analysis.")} == {
        f"analysis.{key}" for key in section_defaults("analysis")
    }
    unexplained = {path: differ[path] for path in sorted(set(differ) - set(DELIBERATE))}
    assert not unexplained, f"params.yaml (value, schema default): {unexplained}"
    assert set(DELIBERATE) <= set(differ), sorted(set(DELIBERATE) - set(differ))


def test_training_hmm_keyword_defaults_are_the_schemas() -> None:
    """TrainingHMM() fits as the workflow does, its selection rule included: one rule everywhere
    (the schema, params.yaml, TrainingHMM, the CLI and the default study)."""
    assert ANALYSIS_DEFAULTS == section_defaults("analysis")
    hmm = {name: p.default for name, p in inspect.signature(TrainingHMM).parameters.items()}
    hmm["seed"] = hmm.pop("random_state")
    shared = set(hmm) & set(ANALYSIS_DEFAULTS)
    assert len(shared) == 20, sorted(shared)
    differ = {key: (hmm[key], ANALYSIS_DEFAULTS[key]) for key in shared
              if (type(hmm[key]), hmm[key]) != (type(ANALYSIS_DEFAULTS[key]), ANALYSIS_DEFAULTS[key])}  # fmt: skip
    assert differ == {}, differ
    # The rest have no schema default (params.yaml does not write them either).
    assert set(hmm) - shared == {"min_covar", "n_jobs", "features"}
    # The default study does not set a rule of its own, in analysis or in a comparison.
    study = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["analysis"]
    assert "selection" not in study
    assert all("selection" not in entry.get("analysis", {}) for entry in study["joint"])


def test_the_hmm_modules_default_constants_are_the_schemas() -> None:
    defaults = section_defaults("analysis")
    assert (DEFAULT_FOLDS, DEFAULT_HALF_SIZE, DEFAULT_REPRODUCE_ARI, DEFAULT_REPRODUCE_SHARE) == (
        defaults["folds"],
        defaults["half_size"],
        defaults["reproduce_ari"],
        defaults["reproduce_share"],
    )


def test_the_analysis_cli_defaults_are_the_schemas() -> None:
    """Every ``python -m trainmap.dynamics`` option named like an analysis setting defaults to the
    schema's value, and ``--convention`` to ``analysis.metrics``."""
    options = vars(parse_args(["runs", "--out", "out"]))
    shared = set(options) & set(ANALYSIS_DEFAULTS)
    assert len(shared) >= 12, sorted(shared)
    assert {key: options[key] for key in shared} == {key: ANALYSIS_DEFAULTS[key] for key in shared}
    assert options["convention"] == ANALYSIS_DEFAULTS["metrics"]


def test_training_defaults_declared_in_the_schema_are_the_training_loops() -> None:
    """The training settings the schema gives a default (seed_block aside, read by the grid) are
    TrainConfig's defaults, read from the schema."""
    from trainmap.training.config import TrainConfig

    defaults = section_defaults("train")
    assert set(defaults) == {"seed_block", "precision", "deterministic", "param_groups"}
    assert TrainConfig().precision == defaults["precision"] == "fp32"
    assert TrainConfig().deterministic is defaults["deterministic"] is False
    assert TrainConfig().param_groups == defaults["param_groups"] == "single"


def test_seed_block_takes_the_schemas_default_and_range() -> None:
    """A task without ``seed_block`` trains one seed per job, the schema's default; the schema
    allows what the block code takes, a whole number >= 1."""
    assert section_defaults("train")["seed_block"] == 1
    assert seed_block({"train": {"task": {}}}, "task") == 1
    assert seed_block({"train": {"task": {"seed_block": 8}}}, "task") == 8
    check_section("train", {"seed_block": 1}, what="train")
    for refused in (0, 2.0, True):
        with pytest.raises(ValueError, match="seed_block"):
            check_section("train", {"seed_block": refused}, what="train")
