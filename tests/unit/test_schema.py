"""One declaration per setting: the config schema (``workflow/schemas/config.schema.yaml``) holds
each setting's type, allowed values and default, and the Python code reads them from it
(:mod:`trainmap.schema`).

What the code still spells out itself is compared with the schema here: params.yaml's ``analysis:``
block (explicit, so that ``dvc exp run -S analysis.x=y`` finds every key), the values each enum's
implementation dispatches on, and the keyword defaults of :func:`gradinit`, usable without a
config. What reads a default from the schema (:class:`TrainingHMM`, the CLI) and every value
params.yaml writes are held to it in tests/unit/test_defaults.py.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

# At module level: trainmap.grid imports torch, whose first import starts ldconfig, which a test
# outside the integration tier may not (the file run alone imports torch here first).
from trainmap import grid
from trainmap.schema import (
    SCHEMA_PATH,
    check_section,
    config_schema,
    section_choices,
    section_defaults,
    section_schema,
)

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("sparse", "gradinit", "analysis")


def test_the_schema_is_the_one_the_grid_validates_with() -> None:
    assert grid.SCHEMA_PATH == SCHEMA_PATH == ROOT / "workflow" / "schemas" / "config.schema.yaml"
    assert section_schema("sparse") is config_schema()["$defs"]["sparse_settings"]
    assert section_schema("gradinit") is config_schema()["$defs"]["gradinit_settings"]
    assert section_schema("analysis") is config_schema()["properties"]["analysis"]


def test_the_python_defaults_are_the_schemas() -> None:
    from trainmap.dynamics.maps.settings import ANALYSIS_DEFAULTS
    from trainmap.methods import gradinit, sparse

    assert sparse.DEFAULT_SETTINGS == section_defaults("sparse")
    assert gradinit.DEFAULT_SETTINGS == section_defaults("gradinit")
    assert ANALYSIS_DEFAULTS == section_defaults("analysis")
    # Every setting of the stages has a default (an omitted key takes it); of the analysis, all
    # but the list of joint comparisons and the three that TrainingHMM's defaults fill.
    for section in ("sparse", "gradinit"):
        assert set(section_defaults(section)) == set(section_schema(section)["properties"])
    undefaulted = set(section_schema("analysis")["properties"]) - set(ANALYSIS_DEFAULTS)
    assert undefaulted == {"joint", "min_covar", "n_jobs", "features"}


@pytest.mark.parametrize("section", SECTIONS)
def test_every_default_is_allowed_by_its_own_schema(section: str) -> None:
    """A default the schema refuses would be caught only when a user omits the key; and a number
    setting's default is written with a decimal point (a float, as the code used it: a JSON
    output writes 1.0, not 1)."""
    defaults = section_defaults(section)
    check_section(section, defaults, what=section)
    for key, spec in section_schema(section)["properties"].items():
        if spec.get("type") == "number" and key in defaults:
            assert isinstance(defaults[key], float), (section, key, defaults[key])


def test_params_yaml_repeats_the_analysis_defaults_exactly() -> None:
    """params.yaml's ``analysis:`` block writes every default out (DVC sets only keys that are
    written), so it must write the schema's values: same keys, same values, same types."""
    analysis = yaml.safe_load((ROOT / "params.yaml").read_text())["analysis"]
    assert analysis.pop("joint") == []
    defaults = section_defaults("analysis")
    assert set(analysis) == set(defaults), set(analysis) ^ set(defaults)
    differ = {key: (analysis[key], defaults[key]) for key in defaults
              if (type(analysis[key]), analysis[key]) != (type(defaults[key]), defaults[key])}  # fmt: skip
    assert not differ, f"params.yaml analysis: {differ} (params.yaml, schema)"
    choices = section_choices("analysis")
    outside = {key: value for key, value in analysis.items()
               if key in choices and value not in choices[key]}  # fmt: skip
    assert not outside, outside


def implemented_choices() -> dict[tuple[str, str], tuple]:
    """Per (section, key), the values the code that implements the setting takes."""
    from trainmap.dynamics.maps.hmm.curves import REPRODUCE_K, RESTART_RULES
    from trainmap.dynamics.maps.hmm.estimator import STANDARDISATIONS
    from trainmap.dynamics.maps.hmm.factory import (
        COVARIANCE_TYPES,
        EMISSIONS,
        INITIALISATIONS,
        TOL_SCALES,
    )
    from trainmap.dynamics.maps.hmm.selection import MIN_GAIN_SCALES, SELECTION_RULES
    from trainmap.dynamics.maps.regression import GROUND_METRICS
    from trainmap.dynamics.metrics.columns import CONVENTIONS
    from trainmap.dynamics.metrics.tables import NAN_RUNS
    from trainmap.methods.gradinit import VARIANTS
    from trainmap.methods.nm import GROUP_LAYOUTS

    return {
        ("gradinit", "variant"): VARIANTS,
        ("sparse", "conv_groups"): GROUP_LAYOUTS,
        # sparse_layers.sparsifiable_layers keeps the first and last layer dense for first_last
        ("sparse", "dense_layers"): ("first_last", "none"),
        ("analysis", "selection"): SELECTION_RULES,
        ("analysis", "min_gain_scale"): MIN_GAIN_SCALES,
        ("analysis", "reproduce_k"): REPRODUCE_K,
        ("analysis", "covariance_type"): COVARIANCE_TYPES,
        ("analysis", "standardisation"): STANDARDISATIONS,
        ("analysis", "restart_rule"): RESTART_RULES,
        ("analysis", "init"): INITIALISATIONS,
        ("analysis", "emission"): EMISSIONS,
        ("analysis", "tol_scale"): TOL_SCALES,
        ("analysis", "nan_runs"): NAN_RUNS,
        ("analysis", "dissimilarity"): GROUND_METRICS,
        ("analysis", "metrics"): CONVENTIONS,
        # read by the workflow: grid.cells.analysis_groups (test_blocks) and
        # jobs.metrics.collect_metrics (deploy fuses a RepVGG; test_reparam)
        ("analysis", "group_maps"): ("all", "outside_joint", "none"),
        ("analysis", "repvgg_weights"): ("train", "deploy"),
    }


def test_every_schema_enum_lists_the_values_the_code_takes() -> None:
    """Each enum of the three sections allows exactly the values its implementation takes, and
    an enum added to the schema must be added here with the code that takes it."""
    implemented = implemented_choices()
    declared = {(section, key): values for section in SECTIONS
                for key, values in section_choices(section).items()}  # fmt: skip
    assert set(declared) == set(implemented), set(declared) ^ set(implemented)
    differ = {key: (declared[key], implemented[key]) for key in declared
              if set(declared[key]) != set(implemented[key])}  # fmt: skip
    assert not differ, f"(schema, code): {differ}"


def test_training_hmm_takes_every_allowed_value_and_refuses_others() -> None:
    from trainmap.dynamics.maps.hmm.estimator import TrainingHMM

    for key, values in section_choices("analysis").items():
        if key not in inspect.signature(TrainingHMM).parameters:
            continue
        for value in values:
            TrainingHMM(**{key: value})
        with pytest.raises(ValueError, match=key):
            TrainingHMM(**{key: "no_such_value"})


def test_library_keyword_defaults_agree_with_the_schema() -> None:
    """gradinit() is usable without a config, and its signature keeps plain defaults: they must be
    the config's. (TrainingHMM's read the schema: tests/unit/test_defaults.py.)"""
    from trainmap.methods import gradinit

    function = inspect.signature(gradinit.gradinit).parameters
    settings = set(function) & set(gradinit.DEFAULT_SETTINGS)
    assert len(settings) >= 10, settings
    assert {key: function[key].default for key in settings} == {
        key: gradinit.DEFAULT_SETTINGS[key] for key in settings
    }


def test_the_metric_jobs_keyword_defaults_agree_with_the_schema() -> None:
    """The workflow passes analysis.metrics and analysis.repvgg_weights (or the schema's default);
    the job functions' own defaults, for a caller without a config, are the same."""
    from trainmap.dynamics.maps.settings import ANALYSIS_DEFAULTS
    from trainmap.jobs.external import external_metrics_job
    from trainmap.jobs.metrics import collect_metrics_block_job

    collect = inspect.signature(collect_metrics_block_job).parameters
    external = inspect.signature(external_metrics_job).parameters
    assert collect["convention"].default == ANALYSIS_DEFAULTS["metrics"]
    assert external["convention"].default == ANALYSIS_DEFAULTS["metrics"]
    assert collect["repvgg_weights"].default == ANALYSIS_DEFAULTS["repvgg_weights"]


def test_every_setting_the_code_takes_is_in_the_schema() -> None:
    """The schema refuses unknown keys, so a setting the code reads but the schema lacks could never
    be set: TrainConfig's fields and the HMM settings the analysis passes on must be schema
    properties. Extend the schema when adding one."""
    from trainmap.dynamics.maps.settings import HMM_SETTINGS
    from trainmap.training.loop import TrainConfig

    train = set(config_schema()["$defs"]["train_settings"]["properties"])
    assert {f.name for f in fields(TrainConfig)} <= train
    analysis = set(section_schema("analysis")["properties"])
    assert {*HMM_SETTINGS, "seed", "joint"} <= analysis, {*HMM_SETTINGS, "seed"} - analysis


@pytest.mark.integration  # starts a program (a subprocess)
def test_the_analysis_reads_its_defaults_without_torch() -> None:
    """trainmap.schema sits outside trainmap.grid, whose package imports the model registry."""
    probe = ("import sys, trainmap.dynamics.maps.settings; "
             "print(sorted({'torch', 'jsonschema'} & set(sys.modules)))")  # fmt: skip
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    assert loaded == "[]", loaded


# --- seeds: each seed key's maximum is the range of what consumes it -----------------------------

#: Each seed key (a path into the default study's merged config) and its schema node: the generic
#: data seed (generated kinds and readers: torch), the kinds that seed numpy's legacy generator,
#: the grid's seeds and the analysis seed.
SEED_KEYS = {
    "data.sparse_parity.seed": (("data", "sparse_parity", "seed"), 2**64 - 1),
    "data.mnist.seed": (("data", "mnist", "seed"), 2**64 - 1),
    "data.digits.seed": (("data", "digits", "seed"), 2**32 - 1),
    "data.mnist_5k.seed": (("data", "mnist_5k", "seed"), 2**32 - 1),
    "data.mnist1d.seed": (("data", "mnist1d", "seed"), 2**32 - 1),
    "grid[0].seeds[1]": (("grid", 0, "seeds", 1), 2**64 - 1),
    "analysis.seed": (("analysis", "seed"), 2**32 - 1),
}


def data_kind_seed_maximum(kind: str | None) -> int:
    """The schema's maximum of ``data.<task>.seed`` for data ``kind`` (None: any other kind)."""
    settings = config_schema()["$defs"]["data_settings"]
    for rule in settings["allOf"] if kind else ():
        if rule["if"]["properties"]["kind"].get("const") == kind:
            return rule["then"]["properties"]["seed"]["maximum"]
    return settings["properties"]["seed"]["maximum"]


@pytest.mark.parametrize("key", SEED_KEYS)
def test_each_seed_key_takes_its_maximum_and_refuses_one_more(key: str) -> None:
    path, maximum = SEED_KEYS[key]
    config = grid.merged_config(ROOT / "params.yaml", ROOT / "config" / "config.yaml")
    *parents, last = path
    node = config
    for part in parents:
        node = node[part]
    node[last] = maximum
    grid.validate_schema(config)
    node[last] = maximum + 1
    with pytest.raises(grid.ConfigError) as error:
        grid.validate_schema(config)
    first = str(error.value).splitlines()[0]
    assert first.startswith(
        f"config key {key}: {maximum + 1} is greater than the maximum of {maximum} ("
    ), first
    assert "2**" in first and first.endswith("(schema: workflow/schemas/config.schema.yaml)")


def test_the_data_seed_maximum_is_torchs_range() -> None:
    """Generated kinds seed a torch.Generator with data.<task>.seed, readers their n_train
    subsample: both take the schema's maximum, and refuse one more."""
    import torch

    from trainmap.data import make_sparse_parity
    from trainmap.data.task import stratified_subsample

    maximum = data_kind_seed_maximum(None)
    small = {"n_bits": 8, "k": 2, "n_train": 8, "n_test": 4}
    assert make_sparse_parity(seed=maximum, **small).meta["seed"] == maximum
    labels = torch.arange(10) % 2
    assert len(stratified_subsample(labels, 4, maximum)) == 4
    with pytest.raises(ValueError, match="Overflow"):
        make_sparse_parity(seed=maximum + 1, **small)
    with pytest.raises(ValueError, match="Overflow"):
        stratified_subsample(labels, 4, maximum + 1)


def test_the_numpy_seeded_kinds_maximum_is_randomstates_range() -> None:
    """digits and mnist_5k split with scikit-learn's train_test_split (_stratified_digits),
    mnist1d seeds numpy's legacy generator (mnist1d.utils.set_seed): each takes its schema
    maximum, and refuses one more."""
    import random

    import numpy as np
    from mnist1d.utils import set_seed

    from trainmap.data import make_digits

    maximum = data_kind_seed_maximum("digits")
    assert data_kind_seed_maximum("mnist_5k") == maximum  # the same split function
    assert make_digits(seed=maximum).meta["seed"] == maximum
    with pytest.raises(ValueError, match="random_state"):
        make_digits(seed=maximum + 1)
    saved = random.getstate(), np.random.get_state()
    try:
        set_seed(data_kind_seed_maximum("mnist1d"))
        with pytest.raises(ValueError, match="Seed must be between 0 and 2\\*\\*32 - 1"):
            set_seed(data_kind_seed_maximum("mnist1d") + 1)
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])


def test_the_analysis_seed_maximum_is_the_kmeans_baselines_range() -> None:
    """Every training map's k-means baseline (kmeans_selection, run by fit_group) passes
    analysis.seed to scikit-learn's KMeans as is: the schema's maximum is taken, one more
    refused; the HMM's own uses of the seed (restart seeds, splits) take the maximum too."""
    from types import SimpleNamespace

    import numpy as np

    from trainmap.dynamics.maps.hmm.baselines import kmeans_selection
    from trainmap.dynamics.maps.hmm.selection import restart_seed
    from trainmap.dynamics.maps.hmm.splits import fold_split

    maximum = section_schema("analysis")["properties"]["seed"]["maximum"]
    runs = {run: np.random.default_rng(i).normal(size=(6, 2)) for i, run in enumerate("abc")}
    hmm = SimpleNamespace(transform=lambda table: table, selection="holdout", k_max=2,
                          train_runs_=["a", "b"], heldout_runs_=["c"], restarts=1,
                          random_state=maximum)  # fmt: skip
    assert list(kmeans_selection(hmm, runs)["n_states"]) == [1, 2]
    assert restart_seed(maximum, 2, 0) >= 0 and len(fold_split(list(runs), 2, maximum)) == 2
    hmm.random_state = maximum + 1
    with pytest.raises(ValueError, match="random_state"):
        kmeans_selection(hmm, runs)


def test_a_grid_seed_at_its_maximum_builds_its_model() -> None:
    """A grid seed reaches torch only through derive_seed's hash, so the maximum (chosen to keep
    file names short, not by a generator's range) builds its cell's model, initialised apart from
    seed 0's."""
    import torch

    from trainmap.data import model_meta
    from trainmap.training.setup import build_cell_model

    maximum = config_schema()["properties"]["grid"]["items"]["properties"]["seeds"]["items"]
    maximum = maximum["maximum"]
    meta = model_meta("sparse_parity", {"n_bits": 8, "k": 2})
    first = next(build_cell_model("mlp", "kaiming", maximum, meta).parameters())
    assert not torch.equal(first, next(build_cell_model("mlp", "kaiming", 0, meta).parameters()))
