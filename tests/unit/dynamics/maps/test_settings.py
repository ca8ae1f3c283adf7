"""The analysis settings as one typed object (trainmap.dynamics.maps.settings.AnalysisSettings):
its fields are the schema's ``analysis`` keys, its defaults the schema's, an unknown key is
refused, and what the jobs record (MLflow's params, the settings hash, ``hmm.json``'s estimator)
reads exactly as the plain mapping did before the object existed (pinned below for the default
study)."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json

import pytest

# At module level: trainmap.grid imports torch, whose first import starts ldconfig, which a test
# outside the integration tier may not.
from trainmap import grid
from trainmap.dynamics.maps.hmm.estimator import EM_PARAMETERS, RULE_PARAMETERS, TrainingHMM
from trainmap.dynamics.maps.settings import (
    ANALYSIS_DEFAULTS,
    HMM_SETTINGS,
    AnalysisSettings,
    BootstrapSettings,
    StabilitySettings,
    VerdictSettings,
    make_hmm,
)
from trainmap.dynamics.paper import analysis_settings as paper_pass
from trainmap.grid.study import merged_config
from trainmap.jobs.common import settings_hash
from trainmap.schema import REPO_ROOT, section_schema
from trainmap.tracking import flatten_params

#: The default study's analysis settings (params.yaml + config/config.yaml, as the rules pass
#: them), serialised before AnalysisSettings existed: the settings hash of fit_hmm
#: ([settings, group]) and of each joint comparison ([settings, name]), the sha256 (first 16) of
#: the MLflow params (flatten_params, in order) and of json.dumps of the settings (key order).
#: Edit config/config.yaml's or params.yaml's analysis section and these change: recompute them
#: from the code of before the change you are testing, never from the code under test.
STUDY_RECORDS = {
    "sparse_parity/mlp/kaiming": ("71983e268f14", "9ef6bac07995148d"),
    "parity_init": ("f5e92b85c5e9", "36cf950ff5f460cd"),
    "parity_sparse": ("92265213e7ed", "18b4a12fba2acb27"),
    "digits_repvgg": ("15e282edcfdc", "f668dd5be14bc2e4"),
}
STUDY_DUMPS = "6bfc00cb72c8c553"
#: The paper's authors pass over the study's settings (jobs.paper records it): json.dumps' sha.
AUTHORS_PASS = {("sparse_parities", 601): "a68558b25d61a00f", ("mnist_5k", 101): "718a0e6b0b59ecc1"}
#: hmm.json's "estimator" entry of the default TrainingHMM and of the study's (json.dumps of it,
#: sorted keys, as save_json writes it).
ESTIMATOR = "f35fc7d128853736"


def sha(value: object, sort_keys: bool = False) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=sort_keys).encode()).hexdigest()[:16]


@pytest.fixture(scope="module")
def study() -> dict:
    return merged_config(REPO_ROOT / "params.yaml", REPO_ROOT / "config" / "config.yaml")


def test_the_fields_are_the_schemas_analysis_keys_in_its_order_without_defaults() -> None:
    fields = dataclasses.fields(AnalysisSettings)
    assert [field.name for field in fields] == list(section_schema("analysis")["properties"])
    assert all(field.default is dataclasses.MISSING for field in fields)
    assert all(field.default_factory is dataclasses.MISSING for field in fields)


def test_missing_keys_take_the_schemas_defaults_and_unknown_keys_are_refused() -> None:
    settings = AnalysisSettings.of({})
    assert {key: getattr(settings, key) for key in ANALYSIS_DEFAULTS} == ANALYSIS_DEFAULTS
    undefaulted = set(section_schema("analysis")["properties"]) - set(ANALYSIS_DEFAULTS)
    assert undefaulted == {"min_covar", "n_jobs", "features", "joint"}
    assert all(getattr(settings, key) is None for key in undefaulted)
    assert settings.as_dict() == {}
    with pytest.raises(ValueError, match=r"unknown analysis settings \['kmax', 'zeta'\]"):
        AnalysisSettings.of({"kmax": 3, "k_max": 3, "zeta": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.k_max = 3  # type: ignore[misc]


def test_as_dict_is_the_mapping_given_in_its_order_and_replace_orders_as_dict_or() -> None:
    given = {"seed": 3, "features": ["l1", "l2"], "k_max": 4, "tol": 1,
             "joint": [{"name": "j", "task": "t", "archs": ["a"], "methods": ["m", "n"]}]}  # fmt: skip
    settings = AnalysisSettings.of(given)
    assert settings.features == ("l1", "l2") and isinstance(settings.joint, tuple)
    assert settings.as_dict() == given and list(settings.as_dict()) == list(given)
    assert json.dumps(settings.as_dict()) == json.dumps(given)  # the values as given: tol 1
    assert flatten_params(settings.as_dict()) == flatten_params(given)
    settings.as_dict()["joint"][0]["archs"].append("b")  # a copy: the object stays as it was
    assert settings.as_dict() == given
    changed = settings.replace(k_max=6, first_n=10)
    assert changed.as_dict() == given | {"k_max": 6, "first_n": 10}
    assert list(changed.as_dict()) == list(given | {"k_max": 6, "first_n": 10})
    assert settings.k_max == 4 and changed.k_max == 6


def test_the_default_studys_records_read_as_before(study) -> None:
    """MLflow's params and the settings hash of every analysis job of the default study are what
    they were when the jobs recorded the plain mapping: no run of an existing study moves."""
    base = grid.analysis_settings(study)
    passed = {"sparse_parity/mlp/kaiming": (base, {"group": "sparse_parity/mlp/kaiming"})}
    for spec in study["analysis"]["joint"]:
        passed[spec["name"]] = (grid.joint_settings(study, spec["name"]), {"joint": spec["name"]})
    for name, (plain, extra) in passed.items():
        recorded = AnalysisSettings.of(plain).as_dict()
        assert recorded == plain and list(recorded) == list(plain)
        params = flatten_params({"analysis": recorded, **extra})
        assert (settings_hash([recorded, *extra.values()]), sha(params)) == (STUDY_RECORDS[name]), (
            name
        )
        assert sha(recorded) == STUDY_DUMPS
    for (setting, shortest), expected in AUTHORS_PASS.items():
        authors = paper_pass(AnalysisSettings.of(base), "authors", setting, shortest)
        assert sha(authors.as_dict()) == expected, setting


def test_the_hmm_view_is_training_hmms_keywords_and_hmm_json_reads_as_before(study) -> None:
    assert set(HMM_SETTINGS) | {"random_state"} == set(TrainingHMM.param_names())
    assert set(HMM_SETTINGS) <= set(ANALYSIS_DEFAULTS) | {"min_covar", "n_jobs", "features"}
    defaults = AnalysisSettings.of({})
    assert make_hmm(defaults).get_params() == TrainingHMM().get_params()
    assert sha(TrainingHMM().estimator_settings(), sort_keys=True) == ESTIMATOR
    studied = make_hmm(AnalysisSettings.of(grid.analysis_settings(study)))
    assert sha(studied.estimator_settings(), sort_keys=True) == ESTIMATOR
    # a setting without a schema default is passed on only when set
    assert "min_covar" not in defaults.hmm_settings
    view = AnalysisSettings.of({"min_covar": 0.01, "features": ["l2"], "seed": 4}).hmm_settings
    assert view["min_covar"] == 0.01 and view["features"] == ("l2",) and view["random_state"] == 4


def test_training_hmm_reads_its_parameter_list_from_its_signature() -> None:
    """The one list: the constructor's signature; every parameter is kept, the EM and rule
    settings are among them, and the saved settings rebuild the same estimator."""
    signature = [name for name in inspect.signature(TrainingHMM).parameters]
    assert list(TrainingHMM.param_names()) == signature
    assert set(EM_PARAMETERS) | set(RULE_PARAMETERS) <= set(signature)
    hmm = TrainingHMM(k_max=3, selection="reproducible", halves=4, tol_scale="total",
                      features=["l1", "l2"], emission="plain")  # fmt: skip
    assert hmm.get_params()["features"] == ("l1", "l2") and hmm.get_params()["halves"] == 4
    assert dataclasses.asdict(hmm.settings()) == {name: hmm.get_params()[name]
                                                  for name in EM_PARAMETERS}  # fmt: skip
    assert hmm.reproducibility() == {name: hmm.get_params()[name] for name in RULE_PARAMETERS}
    saved = hmm.estimator_settings()
    # degrees_of_freedom is read by the student_t emission only: saved with it alone
    assert list(saved) == [name for name in signature if name != "degrees_of_freedom"]
    assert saved["features"] == ["l1", "l2"]
    assert TrainingHMM(**saved).get_params() == hmm.get_params()
    t = TrainingHMM(emission="student_t", degrees_of_freedom=6.5)
    assert list(t.estimator_settings()) == signature
    assert TrainingHMM(**t.estimator_settings()).get_params() == t.get_params()


def test_the_views_carry_what_each_step_reads() -> None:
    settings = AnalysisSettings.of({"bootstrap": 7, "bootstrap_iter": 3, "alpha": 0.01, "seed": 5,
                                    "stability": 4, "stability_step": 6, "permutations": 300,
                                    "start_window": 50})  # fmt: skip
    assert settings.bootstrap_settings == BootstrapSettings(n_resamples=7, max_iter=3,
                                                            alpha=0.01, seed=5)  # fmt: skip
    stability = settings.stability_settings
    assert isinstance(stability, StabilitySettings)
    assert (stability.subsamples, stability.step, stability.max_iter, stability.permutations) == (
        4, 6, 3, 300)  # fmt: skip
    assert (stability.ari, stability.share, stability.max_fraction, stability.restarts) == (
        ANALYSIS_DEFAULTS["stability_ari"], ANALYSIS_DEFAULTS["stability_share"],
        ANALYSIS_DEFAULTS["stability_max_fraction"], ANALYSIS_DEFAULTS["stability_restarts"])  # fmt: skip
    verdicts = settings.verdict_settings
    assert isinstance(verdicts, VerdictSettings)
    assert {field.name for field in dataclasses.fields(VerdictSettings)} <= set(ANALYSIS_DEFAULTS)
    assert (verdicts.alpha, verdicts.permutations, verdicts.start_window) == (0.01, 300, 50)


def test_degrees_of_freedom_reach_the_jobs_only_with_the_student_t_emission(study) -> None:
    """A key only another setting's value reads (schema.READ_ONLY_WITH) is left out of the settings
    the jobs receive and record elsewhere: a study on the paper's Gaussian emission records no
    degrees of freedom (its records as before the key), the default emission's does, and a
    comparison that chooses its own emission gets its own."""
    assert study["analysis"]["degrees_of_freedom"] == 4.0  # params.yaml writes every default
    assert grid.analysis_settings(study)["degrees_of_freedom"] == 4.0  # student_t, the default
    plain = {**study, "analysis": {**study["analysis"], "emission": "plain"}}
    assert "degrees_of_freedom" not in grid.analysis_settings(plain)
    joint = dict(study["analysis"]["joint"][0])
    joint["analysis"] = {**joint.get("analysis", {}), "emission": "student_t",
                         "degrees_of_freedom": 3}  # fmt: skip
    mixed = {**plain, "analysis": {**plain["analysis"], "joint": [joint]}}
    assert grid.joint_settings(mixed, joint["name"])["degrees_of_freedom"] == 3
    assert "degrees_of_freedom" not in grid.analysis_settings(mixed)
    recorded = AnalysisSettings.of({"emission": "plain", "degrees_of_freedom": 3}).as_dict()
    assert recorded == {"emission": "plain"}
    assert AnalysisSettings.of({"degrees_of_freedom": 3}).as_dict() == {"degrees_of_freedom": 3}
