"""The run-offset emission model as an option of trainmap's one selection (issue 22, item 2).

:class:`~trainmap.dynamics.run_offset.RunOffsetHMM` (a per-run offset, and drift, of the emission
means, fitted by ECM) is the analysis setting ``emission``: run weights equal duplicated runs,
ECM does not decrease eq. 0, on known-answer runs with run-to-run nuisance it recovers K where the
plain model does not, ``plain`` is today's model exactly, the bootstrap refits and save/load keep
the emission, and a bad value is refused by name.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from trainmap.dynamics.batched_hmm import BatchedGaussianHMM
from trainmap.dynamics.certainty import bootstrap_map
from trainmap.dynamics.hmm import (
    TrainingHMM,
    model_parameters,
    quietly,
    score_heldout,
    select_model,
    stack,
    standardise_runs,
    start_from,
)
from trainmap.dynamics.metrics import METRIC_NAMES
from trainmap.dynamics.run_offset import RunOffsetHMM
from trainmap.dynamics.settings import make_hmm
from trainmap.dynamics.synthetic import known_answer_scores, sample_runs
from trainmap.dynamics.training_map import build_training_map

# Known-answer runs with nuisance (true K = 3, 20 runs x 150 checkpoints, sampler seed 3) on which
# the plain model merges two states (K = 2) and the offset + drift model finds the three.
NUISANCE_CASE = {"n_states": 3, "n_runs": 20, "length": 150, "seed": 3, "nuisance": 1.0}


def small_data(n_features: int = 4) -> tuple[list[np.ndarray], dict]:
    """Six standardised nuisance runs of 60 checkpoints (4 features) and a plain model's
    parameters (K = 3) to start from."""
    runs, _, _ = sample_runs(3, n_runs=6, length=60, seed=0, nuisance=1.0)
    names = list(METRIC_NAMES[:n_features])
    z, _ = standardise_runs({run: table[names].to_numpy(float) for run, table in runs.items()},
                            "pooled")  # fmt: skip
    sequences = [z[run] for run in sorted(z)]
    with quietly():
        plain = BatchedGaussianHMM(3, "full", n_iter=20, random_state=0).fit(*stack(sequences))
    return sequences, model_parameters(plain)


def started(parameters: dict, drift: bool, **options) -> RunOffsetHMM:
    """An offset model set to ``parameters`` (a warm start), EM for exactly 15 iterations."""
    model = RunOffsetHMM(3, "full", drift=drift, n_iter=15, tol=-np.inf, init_params="", **options)
    return start_from(model, parameters)


@pytest.mark.parametrize("drift", [False, True], ids=["offset", "offset+drift"])
def test_a_run_weight_of_two_fits_the_run_duplicated(drift):
    """Weights are draws: weight 2 on run 1 is run 1 listed twice (weighted centring, weighted
    drift constraint), for theta, the run's terms and eq. 0, to round-off."""
    sequences, parameters = small_data()
    weights = np.ones(len(sequences))
    weights[1] = 2.0
    with quietly():
        weighted = started(parameters, drift).fit_weighted(*stack(sequences), weights)
        duplicated = started(parameters, drift).fit(*stack([*sequences, sequences[1]]))
    for key in ("startprob_", "transmat_", "means_", "covars_"):
        np.testing.assert_allclose(getattr(weighted, key), getattr(duplicated, key), atol=1e-8)
    n = len(sequences)
    np.testing.assert_allclose(weighted.offsets_, duplicated.offsets_[:n], atol=1e-8)
    np.testing.assert_allclose(weighted.drifts_, duplicated.drifts_[:n], atol=1e-8)
    np.testing.assert_allclose(duplicated.offsets_[n], duplicated.offsets_[1], atol=1e-8)
    assert weighted.objective_ == pytest.approx(duplicated.objective_, rel=1e-10)
    # Scoring too: a run scored with weight 2 is the run scored twice.
    assert weighted.score_weighted(*stack(sequences), weights) == pytest.approx(
        weighted.score(*stack([*sequences, sequences[1]])), rel=1e-10)  # fmt: skip
    # ... and not the unweighted fit (the weights matter).
    with quietly():
        once = started(parameters, drift).fit(*stack(sequences))
    assert np.abs(once.means_ - weighted.means_).max() > 1e-3


@pytest.mark.parametrize("drift", [False, True], ids=["offset", "offset+drift"])
def test_ecm_does_not_decrease_the_penalised_likelihood(drift):
    """Eq. 0 at every E-step of each ECM run never falls (CM-steps each raise Q; the centring is
    a reparametrisation that only lowers the penalty). Offsets only: over the whole fit as well,
    the searches between ECM runs included (they start from the current terms)."""
    sequences, parameters = small_data()
    with quietly():
        model = started(parameters, drift, search_rounds=3).fit(*stack(sequences))
    assert (
        sum(len(history) for history in model.objective_history_)
        == model.n_iterations_
        == 15 * len(model.objective_history_)
    )
    for history in model.objective_history_:
        steps = np.diff(history)
        assert steps.min() >= -1e-9 * abs(history[-1]), steps
        assert history[-1] > history[0]  # it moved
    if not drift:
        steps = np.diff(np.concatenate(model.objective_history_))
        assert steps.min() >= -1e-9 * abs(model.objective_), steps


def test_the_heldout_bic_counts_the_scored_runs_terms():
    """The held-out BIC of a model with run terms counts d (2d with drift) per scored run, a run
    drawn twice twice: -2 log L + (hmmlearn's count + terms) log n."""
    sequences, parameters = small_data()
    with quietly():
        model = started(parameters, True).fit(*stack(sequences[:4]))
    heldout = stack(sequences[4:])
    scores = score_heldout(model, heldout, np.array([1.0, 2.0]))
    n_parameters = model.n_hmm_parameters() + 3 * 2 * model.n_features
    n_observations = 60 * 3
    expected = -2 * scores["heldout_log_likelihood"] + n_parameters * math.log(n_observations)
    assert scores["bic"] == pytest.approx(expected, rel=1e-12)
    plain = score_heldout(model, heldout)
    assert plain["bic"] == pytest.approx(model.bic(*heldout), rel=1e-12)


def fitted_map(emission: str) -> TrainingHMM:
    runs, _, _ = sample_runs(**NUISANCE_CASE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TrainingHMM(k_max=5, restarts=2, emission=emission).fit(runs)


@pytest.fixture(scope="module")
def nuisance_maps() -> dict[str, TrainingHMM]:
    return {emission: fitted_map(emission) for emission in ("plain", "run_offset_drift")}


def test_offsets_and_drift_recover_k_under_nuisance_where_plain_does_not(nuisance_maps):
    """Known answer with run-to-run nuisance: the plain model merges two of the 3 states, the
    offset + drift model finds them and decodes (nearly) every checkpoint right."""
    runs, states, truth = sample_runs(**NUISANCE_CASE)
    plain, offset = nuisance_maps["plain"], nuisance_maps["run_offset_drift"]
    assert isinstance(offset.model_, RunOffsetHMM) and offset.model_.drift
    assert plain.n_states_ != truth.n_states
    assert offset.n_states_ == truth.n_states
    accuracy = {name: known_answer_scores(hmm.decode(runs), set(), states, truth)["accuracy"]
                for name, hmm in nuisance_maps.items()}  # fmt: skip
    assert accuracy["run_offset_drift"] >= 0.98 and accuracy["plain"] < 0.9, accuracy
    # The map reads the residuals: its edges are exactly the true transitions.
    decoded = offset.decode(runs)
    training_map = build_training_map(offset, runs, decoded, dict.fromkeys(runs))
    edges = {(edge.source, edge.target) for edge in training_map.edges}
    assert known_answer_scores(decoded, edges, states, truth)["edges_match"]


def test_decoding_and_the_posteriors_use_the_runs_residuals(nuisance_maps):
    """A run decoded alone, in a batch or by ``predict`` gets the same states, from its residuals
    (terms estimated first); the filtered posteriors and the gradient read the residuals too."""
    runs, _, _ = sample_runs(**NUISANCE_CASE)
    hmm = nuisance_maps["run_offset_drift"]
    names = sorted(runs)[:3]
    batch = hmm.decode({run: runs[run] for run in names})
    z = hmm.transform(runs[names[0]])
    residual = hmm.residuals(z)
    assert np.abs(residual - z).max() > 0.1  # the run has an offset to remove
    np.testing.assert_array_equal(hmm.predict(runs[names[0]]), batch[names[0]])
    np.testing.assert_array_equal(hmm.model_.predict(residual, [len(residual)]), batch[names[0]])
    filtered = hmm.filtered_posteriors(z)
    np.testing.assert_allclose(filtered, hmm.filtered_posteriors(residual, residualised=True))
    assert not np.allclose(filtered, hmm.filtered_posteriors(z, residualised=True))
    t = len(z) // 2
    state = int(batch[names[0]][t])
    pulls = np.einsum("kij,kj->ki", hmm.precisions(), hmm.model_.means_ - residual[t])
    expected = pulls[state] - filtered[t] @ pulls
    np.testing.assert_allclose(hmm.log_posterior_gradient(z, state, t), expected, rtol=1e-6)


def test_plain_emission_is_todays_model():
    """``emission="plain"`` (the default) fits exactly what the estimator fitted before the
    setting existed; a settings dict without ``emission`` (an older refit's) selects the same."""
    runs, _, _ = sample_runs(3, n_runs=12, length=100, seed=2, nuisance=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = TrainingHMM(k_max=4, restarts=2).fit(runs)
        plain = TrainingHMM(k_max=4, restarts=2, emission="plain").fit(runs)
    assert default.emission == "plain" and type(default.model_) is BatchedGaussianHMM
    assert plain.n_states_ == default.n_states_
    np.testing.assert_array_equal(plain.selection_["bic"], default.selection_["bic"])
    np.testing.assert_array_equal(plain.model_.means_, default.model_.means_)
    z = default.transform(runs["run00"])
    assert default.residuals(z) is z
    raw = {run: table[default.features_].to_numpy(float) for run, table in runs.items()}
    standardised, _ = standardise_runs(raw, "pooled")
    train = dict.fromkeys(default.train_runs_, 1.0)
    heldout = dict.fromkeys(default.heldout_runs_, 1.0)
    older = {key: value for key, value in default.settings().items() if key != "emission"}
    selection = select_model(standardised, train, heldout, older, range(1, 5), restarts=2)
    np.testing.assert_array_equal(selection.curve["bic"], default.selection_["bic"])


def test_bootstrap_refits_and_save_load_keep_the_emission(nuisance_maps, tmp_path, monkeypatch):
    """The bootstrap refits run with the offset emission: every K warm-started from the full fit's
    offset model (its theta; the draw's run terms searched afresh), the draws as run weights; they
    find K = 3 again. A saved map reloads as the same model type and decodes alike."""
    runs, _, _ = sample_runs(**NUISANCE_CASE)
    hmm = nuisance_maps["run_offset_drift"]
    assert hmm.settings()["emission"] == "run_offset_drift"
    fits: list[tuple[str, bool]] = []
    fit_runs = RunOffsetHMM._fit_runs

    def spy(model, X, lengths, weights):
        fits.append((model.init_params, weights is not None))
        return fit_runs(model, X, lengths, weights)

    monkeypatch.setattr(RunOffsetHMM, "_fit_runs", spy)
    status = dict.fromkeys(runs, "completed")
    result = bootstrap_map(hmm, runs, dict.fromkeys(runs), status, [], n_resamples=3, seed=1,
                           max_iter=5)  # fmt: skip
    assert result.n_resamples == 3 and result.k_counts.get(3, 0) >= 2, result.ks
    assert len(fits) == 3 * hmm.k_max and {init for init, _ in fits} == {""}  # warm, every K
    assert any(weighted for _, weighted in fits)  # some run drawn twice
    monkeypatch.undo()
    hmm.save(tmp_path / "hmm.npz", tmp_path / "hmm.json")
    loaded = TrainingHMM.load(tmp_path / "hmm.npz", tmp_path / "hmm.json")
    assert loaded.emission == "run_offset_drift"
    assert isinstance(loaded.model_, RunOffsetHMM) and loaded.model_.drift
    some = {run: runs[run] for run in sorted(runs)[:4]}
    decoded, again = hmm.decode(some), loaded.decode(some)
    for run in some:
        np.testing.assert_array_equal(decoded[run], again[run])


def test_a_bad_emission_is_refused_by_name():
    with pytest.raises(ValueError, match="emission: 'offset' is not allowed.*plain, run_offset"):
        TrainingHMM(emission="offset")
    with pytest.raises(ValueError, match="emission"):
        make_hmm({"emission": "drift"})
    assert make_hmm({}).emission == "plain"
    assert make_hmm({"emission": "run_offset"}).emission == "run_offset"
