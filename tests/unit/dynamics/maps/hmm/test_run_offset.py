"""The run-offset emission model as an option of trainmap's one selection.

:class:`~trainmap.dynamics.maps.hmm.run_terms.RunOffsetHMM` (a per-run offset, and drift, of the emission
means, and with ``run_affine`` a per-run scale, fitted by ECM) is the analysis setting
``emission``: run weights equal duplicated runs, ECM does not decrease eq. 0, on known-answer runs
with run-to-run nuisance it recovers K where the plain model does not (with a per-run scale:
``run_affine`` where ``run_offset_drift`` does not), the scale's density and closed-form update
are right, ``plain`` is today's model exactly, the bootstrap refits and save/load keep the
emission, and a bad value is refused by name.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import minimize_scalar
from scipy.stats import multivariate_normal

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM, standardise_runs
from trainmap.dynamics.maps.hmm.factory import emission_model, model_parameters, quietly, start_from
from trainmap.dynamics.maps.hmm.gaussian import BatchedGaussianHMM
from trainmap.dynamics.maps.hmm.run_term_updates import run_time, scale_sums, solve_scales
from trainmap.dynamics.maps.hmm.run_terms import RunOffsetHMM
from trainmap.dynamics.maps.hmm.selection import n_free_parameters, score_heldout, select_model
from trainmap.dynamics.maps.hmm.splits import stack
from trainmap.dynamics.maps.settings import AnalysisSettings, make_hmm
from trainmap.dynamics.maps.synthetic import known_answer_scores, left_to_right_hmm, sample_runs
from trainmap.dynamics.maps.training_map import build_training_map
from trainmap.dynamics.metrics.columns import METRIC_NAMES
from trainmap.dynamics.verdicts.certainty import bootstrap_map

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


#: The emission models with run terms as RunOffsetHMM options (``run_affine``: drift and scale).
RUN_TERMS = [{"drift": False}, {"drift": True}, {"drift": True, "scale": True}]
RUN_TERM_IDS = ["offset", "offset+drift", "affine"]


def started(parameters: dict, drift: bool, **options) -> RunOffsetHMM:
    """An offset model set to ``parameters`` (a warm start), EM for exactly 15 iterations."""
    model = RunOffsetHMM(3, "full", drift=drift, n_iter=15, tol=-np.inf, init_params="", **options)
    return start_from(model, parameters)


@pytest.mark.parametrize("options", RUN_TERMS, ids=RUN_TERM_IDS)
def test_a_run_weight_of_two_fits_the_run_duplicated(options):
    """Weights are draws: weight 2 on run 1 is run 1 listed twice (weighted centring, weighted
    drift constraint, weighted geometric mean of the scales), for theta, the run's terms and
    eq. 0, to round-off."""
    sequences, parameters = small_data()
    weights = np.ones(len(sequences))
    weights[1] = 2.0
    with quietly():
        weighted = started(parameters, **options).fit_weighted(*stack(sequences), weights)
        duplicated = started(parameters, **options).fit(*stack([*sequences, sequences[1]]))
    for key in ("startprob_", "transmat_", "means_", "covars_"):
        np.testing.assert_allclose(getattr(weighted, key), getattr(duplicated, key), atol=1e-8)
    n = len(sequences)
    np.testing.assert_allclose(weighted.offsets_, duplicated.offsets_[:n], atol=1e-8)
    np.testing.assert_allclose(weighted.drifts_, duplicated.drifts_[:n], atol=1e-8)
    np.testing.assert_allclose(duplicated.offsets_[n], duplicated.offsets_[1], atol=1e-8)
    np.testing.assert_allclose(weighted.scales_, duplicated.scales_[:n], atol=1e-8)
    np.testing.assert_allclose(duplicated.scales_[n], duplicated.scales_[1], atol=1e-8)
    if options.get("scale"):  # normalised to weighted geometric mean 1, and not all 1; the
        # offsets centred so that the penalty is least: sum_r w_r a_r b_r = 0
        assert weights @ np.log(weighted.scales_) == pytest.approx(0.0, abs=1e-12)
        assert np.ptp(weighted.scales_) > 0.01
        centring = (weights * weighted.scales_) @ weighted.offsets_
        np.testing.assert_allclose(centring, 0.0, atol=1e-10)
    assert weighted.objective_ == pytest.approx(duplicated.objective_, rel=1e-10)
    # Scoring too: a run scored with weight 2 is the run scored twice.
    assert weighted.score_weighted(*stack(sequences), weights) == pytest.approx(
        weighted.score(*stack([*sequences, sequences[1]])), rel=1e-10)  # fmt: skip
    # ... and not the unweighted fit (the weights matter).
    with quietly():
        once = started(parameters, **options).fit(*stack(sequences))
    assert np.abs(once.means_ - weighted.means_).max() > 1e-3


@pytest.mark.parametrize("options", RUN_TERMS, ids=RUN_TERM_IDS)
def test_ecm_does_not_decrease_the_penalised_likelihood(options):
    """Eq. 0 at every E-step of each ECM run never falls (CM-steps each raise Q; the centring and,
    with scale, the scales' normalisation are reparametrisations that only lower the penalty).
    Offsets only: over the whole fit as well, the searches between ECM runs included (they start
    from the current terms)."""
    sequences, parameters = small_data()
    drift = options["drift"]
    with quietly():
        model = started(parameters, search_rounds=3, **options).fit(*stack(sequences))
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


@pytest.mark.parametrize("scale", [False, True], ids=["offset+drift", "affine"])
def test_the_heldout_bic_counts_the_scored_runs_terms(scale):
    """The held-out BIC of a model with run terms counts d (2d with drift, 2d + 1 with drift and
    scale) per scored run, a run drawn twice twice: -2 log L + (hmmlearn's count + terms) log n."""
    sequences, parameters = small_data()
    with quietly():
        model = started(parameters, True, scale=scale).fit(*stack(sequences[:4]))
    heldout = stack(sequences[4:])
    scores = score_heldout(model, heldout, np.array([1.0, 2.0]))
    n_parameters = n_free_parameters(model) + 3 * (2 * model.n_features + scale)
    n_observations = 60 * 3
    expected = -2 * scores["heldout_log_likelihood"] + n_parameters * math.log(n_observations)
    assert scores["bic"] == pytest.approx(expected, rel=1e-12)
    plain = score_heldout(model, heldout)
    assert plain["bic"] == pytest.approx(model.bic(*heldout), rel=1e-12)


def fitted_map(emission: str) -> TrainingHMM:
    runs, _, _ = sample_runs(**NUISANCE_CASE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TrainingHMM(k_max=5, restarts=2, emission=emission, selection="holdout").fit(runs)


@pytest.fixture(scope="module")
def nuisance_maps() -> dict[str, TrainingHMM]:
    return {emission: fitted_map(emission) for emission in ("plain", "run_offset_drift")}


def test_offsets_and_drift_recover_k_under_nuisance_where_plain_does_not(nuisance_maps):
    """Known answer with run-to-run nuisance, K by held-out BIC (holdout): the plain model gets K
    wrong, the offset + drift model finds the 3 states and decodes (nearly) every checkpoint
    right. The default rule (gain) finds K with the plain model too."""
    runs, states, truth = sample_runs(**NUISANCE_CASE)
    plain, offset = nuisance_maps["plain"], nuisance_maps["run_offset_drift"]
    assert isinstance(offset.model_, RunOffsetHMM) and offset.model_.drift
    assert plain.n_states_ != truth.n_states
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert TrainingHMM(k_max=5, restarts=2).fit(runs).n_states_ == truth.n_states
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


def test_plain_emission_is_the_papers_model():
    """``emission="plain"`` fits the paper's Gaussian HMM (hmmlearn's GaussianHMM on the engine),
    the runs as they are; the one selection path, given the fit's EM settings and rule, selects
    the same."""
    runs, _, _ = sample_runs(3, n_runs=12, length=100, seed=2, nuisance=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = TrainingHMM(k_max=4, restarts=2, emission="plain", selection="holdout").fit(runs)
    assert type(default.model_) is BatchedGaussianHMM
    z = default.transform(runs["run00"])
    assert default.residuals(z) is z
    raw = {run: table[default.features_].to_numpy(float) for run, table in runs.items()}
    standardised, _ = standardise_runs(raw, "pooled")
    train = dict.fromkeys(default.train_runs_, 1.0)
    heldout = dict.fromkeys(default.heldout_runs_, 1.0)
    selection = select_model(standardised, train, heldout, default.settings(), range(1, 5),
                             selection="holdout", restarts=2)  # fmt: skip
    np.testing.assert_array_equal(selection.curve["bic"], default.selection_["bic"])


def test_bootstrap_refits_and_save_load_keep_the_emission(nuisance_maps, tmp_path, monkeypatch):
    """The bootstrap refits run with the offset emission: every K warm-started from the full fit's
    offset model (its theta; the draw's run terms searched afresh), the draws as run weights; they
    find K = 3 again. A saved map reloads as the same model type and decodes alike."""
    runs, _, _ = sample_runs(**NUISANCE_CASE)
    hmm = nuisance_maps["run_offset_drift"]
    assert hmm.settings().emission == "run_offset_drift"
    fits: list[tuple[str, bool]] = []
    fit_runs = RunOffsetHMM._fit_runs

    def spy(model, X, lengths, weights):
        fits.append((model.init_params, weights is not None))
        return fit_runs(model, X, lengths, weights)

    monkeypatch.setattr(RunOffsetHMM, "_fit_runs", spy)
    status = dict.fromkeys(runs, "completed")
    result = bootstrap_map(hmm, runs, dict.fromkeys(runs), status, [], n_resamples=3, seed=1,
                           max_iter=5, reselect_k=True)  # fmt: skip
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
    allowed = "plain, run_offset, run_offset_drift, run_affine, student_t"
    with pytest.raises(ValueError, match=f"emission: 'offset' is not allowed.*{allowed}"):
        TrainingHMM(emission="offset")
    with pytest.raises(ValueError, match="emission: 'affine' is not allowed"):
        TrainingHMM(emission="affine")
    with pytest.raises(ValueError, match="emission"):
        make_hmm(AnalysisSettings.of({"emission": "drift"}))
    assert make_hmm(AnalysisSettings.of({})).emission == "student_t"
    assert make_hmm(AnalysisSettings.of({"emission": "run_offset"})).emission == "run_offset"
    assert make_hmm(AnalysisSettings.of({"emission": "run_affine"})).emission == "run_affine"
    affine = emission_model(3, "run_affine")
    assert affine.drift and affine.scale and affine.n_terms(14) == 2 * 14 + 1
    assert not emission_model(3, "run_offset_drift").scale


# --- the per-run scale (emission run_affine, eq. 3) ---------------------------------------------


def random_case(seed: int, n_states: int = 3, d: int = 4, lengths=(30, 20)) -> dict:
    """Random theta (full covariances), run terms (offset, drift, scale) and posteriors."""
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(n_states, d, d))
    covars = mixing @ mixing.transpose(0, 2, 1) + 0.5 * np.eye(d)
    model = RunOffsetHMM(n_states, "full", drift=True, scale=True)
    model.startprob_ = np.full(n_states, 1.0 / n_states)
    model.transmat_ = np.full((n_states, n_states), 1.0 / n_states)
    model.means_ = rng.normal(size=(n_states, d))
    model.covars_ = covars
    model.n_features = d
    terms = np.column_stack([rng.normal(size=(len(lengths), 2 * d)),
                             np.exp(rng.normal(0.0, 0.5, len(lengths)))])  # fmt: skip
    X = rng.normal(size=(sum(lengths), d)) * 2.0
    posteriors = rng.dirichlet(np.ones(n_states), sum(lengths))
    return {"model": model, "terms": terms, "X": X, "lengths": list(lengths),
            "posteriors": posteriors}  # fmt: skip


def test_the_scaled_density_and_the_closed_form_scale_update():
    """Eq. 3: the model's log-density of x_t in state k is N(x_t; a mu_k + b + c u_t, a^2 Sigma_k)
    (the residuals' density minus d log a). CM-step 3: for each run, the closed-form a maximises
    Q(a) = sum_t sum_k gamma_tk log N(x_t; a mu_k + b + c u_t, a^2 Sigma_k) (evaluated directly,
    not through A and B) as scipy's bounded search finds it, and beats a = 1."""
    case = random_case(0)
    model, terms, X, lengths = case["model"], case["terms"], case["X"], case["lengths"]
    d, u = X.shape[1], run_time(lengths)
    run = np.repeat(np.arange(len(lengths)), lengths)
    log_frames = model._log_frames(X, terms, lengths)[0]

    def direct(scales: np.ndarray, t: int, k: int) -> float:
        a = scales[run[t]]
        mean = a * model.means_[k] + terms[run[t], :d] + terms[run[t], d : 2 * d] * u[t]
        return multivariate_normal(mean, a**2 * model.covars_[k]).logpdf(X[t])

    for t in (0, 7, 35):
        for k in range(model.n_components):
            assert log_frames[t, k] == pytest.approx(direct(terms[:, -1], t, k), rel=1e-10)

    shifted = X - model.run_shift(terms, lengths)
    A, B = scale_sums(shifted, case["posteriors"], lengths, model.means_, model.precisions())
    closed = solve_scales(A, B, lengths, d)
    rows = np.split(np.arange(len(X)), np.cumsum(lengths)[:-1])
    for r, mine in enumerate(rows):

        def q(a: float, mine=mine, r=r) -> float:  # run r's part of Q at scale a
            scales = terms[:, -1].copy()
            scales[r] = a
            return sum(case["posteriors"][t, k] * direct(scales, t, k)
                       for t in mine for k in range(model.n_components))  # fmt: skip

        found = minimize_scalar(lambda log_a, q=q: -q(np.exp(log_a)), bounds=(-5, 5),
                                method="bounded", options={"xatol": 1e-9})  # fmt: skip
        assert closed[r] == pytest.approx(np.exp(found.x), rel=1e-6)
        assert q(closed[r]) >= max(q(np.exp(found.x)), q(closed[r] * 1.001), q(closed[r] / 1.001))
        assert q(closed[r]) > q(1.0)
    # The stable form agrees with the textbook root for either sign of B.
    n = np.array(lengths) * d
    for sign in (1.0, -1.0):
        textbook = (-sign * B + np.sqrt(B**2 + 4 * n * A)) / (2 * n)
        np.testing.assert_allclose(solve_scales(A, sign * B, lengths, d), textbook, rtol=1e-12)


def test_the_scaled_cm_step_of_the_offsets_and_drifts_is_the_constrained_maximum():
    """CM-step 2 with scale (eq. 3's system, run weights, sum_r w_r c_r = 0): at its (b, c), given
    a, theta and gamma, the gradient of Q minus the penalty (computed here by direct sums) is zero
    in every b_r and the same vector nu in every c_r (the Lagrange condition of the weighted
    constraint), with scales far from 1."""
    case = random_case(1, lengths=(30, 20, 25))
    model, terms, X, lengths = case["model"], case["terms"], case["X"], case["lengths"]
    gamma, d, u = case["posteriors"], X.shape[1], run_time(lengths)
    weights = np.array([1.0, 2.0, 1.0])
    updated = model._update_terms(X, lengths, gamma, terms, weights)
    np.testing.assert_allclose(weights @ updated[:, d : 2 * d], 0.0, atol=1e-10)
    precisions = model.precisions()
    rows = np.split(np.arange(len(X)), np.cumsum(lengths)[:-1])
    gradients = []
    for r, mine in enumerate(rows):
        a, b, c = terms[r, -1], updated[r, :d], updated[r, d : 2 * d]
        grad_b, grad_c = -model.ridge[0] * b, -model.ridge[1] * c
        for t in mine:
            for k in range(model.n_components):
                pull = gamma[t, k] * precisions[k] @ (X[t] - a * model.means_[k] - b - c * u[t])
                grad_b, grad_c = grad_b + pull / a**2, grad_c + u[t] * pull / a**2
        gradients.append((grad_b, grad_c))
    scale_of = np.abs(X).sum()
    for grad_b, grad_c in gradients:
        np.testing.assert_allclose(grad_b, 0.0, atol=1e-9 * scale_of)
        np.testing.assert_allclose(grad_c, gradients[0][1], atol=1e-9 * scale_of)
    assert np.abs(gradients[0][1]).max() > 1e-3  # the constraint binds


def scaled_runs(n_states: int, n_runs: int, length: int, seed: int, spread: float) -> tuple:
    """:func:`sample_runs`-like tables (raw units) with a per-run scale s_i = exp(N(0, spread^2))
    of the standard-unit values (about the first state's mean) and no offset or drift; also the
    true scales."""
    truth = left_to_right_hmm(n_states, length=length, seed=seed)
    scales = np.exp(np.random.default_rng(seed + 100).normal(0.0, spread, n_runs))
    runs, states = {}, {}
    for index in range(n_runs):
        values, hidden = truth.model.sample(length, random_state=seed * 1000 + index + 1)
        table = pd.DataFrame(scales[index] * values * truth.scale + truth.offset,
                             columns=list(METRIC_NAMES))  # fmt: skip
        table.insert(0, "step", np.arange(length) * 10)
        runs[f"run{index:02d}"], states[f"run{index:02d}"] = table, hidden
    return runs, states, truth, scales


def test_a_per_run_scale_is_recovered_where_offset_and_drift_are_not_enough():
    """Known answer (true K = 3) whose runs differ only by a large scale (log s ~ N(0, 0.4^2),
    s from 0.46 to 2.45): offset + drift cannot absorb it (K wrong, decoding poor), the affine model
    finds K, decodes >= 98 % and estimates every fitted run's scale up to the common factor."""
    runs, states, truth, scales = scaled_runs(3, n_runs=30, length=150, seed=0, spread=0.4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        maps = {emission: TrainingHMM(k_max=4, restarts=2, emission=emission).fit(runs)
                for emission in ("run_offset_drift", "run_affine")}  # fmt: skip
    accuracy = {name: known_answer_scores(hmm.decode(runs), set(), states, truth)["accuracy"]
                for name, hmm in maps.items()}  # fmt: skip
    affine = maps["run_affine"]
    assert affine.model_.scale and affine.n_states_ == truth.n_states
    assert accuracy["run_affine"] >= 0.98, accuracy
    assert maps["run_offset_drift"].n_states_ != truth.n_states
    assert accuracy["run_offset_drift"] <= accuracy["run_affine"] - 0.1, accuracy
    fitted = np.log(affine.model_.scales_)
    true = np.log(scales[[sorted(runs).index(run) for run in affine.train_runs_]])
    # (within 0.2 in log: the ridge on b shrinks the offset a scale about another point needs)
    np.testing.assert_allclose(fitted - fitted.mean(), true - true.mean(), atol=0.2)
    assert np.corrcoef(fitted, true)[0, 1] > 0.98


@pytest.mark.parametrize("failure", [ValueError, np.linalg.LinAlgError])
def test_a_fit_that_raises_still_sets_its_results(failure, monkeypatch):
    """Every exit of the ECM fit leaves the attributes the selection reads (iterations, run terms),
    a fit whose EM raised included; the selection then scores that K as a failed fit instead of
    crashing (the exit some CPUs' arithmetic reaches on the scaled known answer)."""
    from hmmlearn.hmm import GaussianHMM

    sequences, _ = small_data()
    X, lengths = stack(sequences)

    def raising(self, *args, **kwargs):
        raise failure("degenerate restart")

    model = RunOffsetHMM(3, "full", drift=True, scale=True, n_iter=5, random_state=0)
    monkeypatch.setattr(GaussianHMM, "fit", raising)
    with pytest.raises(failure):
        model.fit(X, lengths)
    assert model.fit_iterations() == 0
    assert model.offsets_.shape == (len(lengths), X.shape[1])
    assert model.drifts_.shape == model.offsets_.shape and model.scales_.shape == (len(lengths),)
    from trainmap.dynamics.maps.hmm.selection import _fit_alone, _scored_fit

    failed = RunOffsetHMM(3, "full", drift=True, scale=True, n_iter=5, random_state=0)
    assert _fit_alone(failed, (X, lengths), None) is False
    row = _scored_fit(failed, 0, (X, lengths), None, (None, None), True, False)
    assert row["iterations"] == 0 and not np.isfinite(row["train_log_likelihood"])
