"""The training-map HMM: model selection, reproducibility, persistence, feature importance."""

from __future__ import annotations

import json
import warnings
from itertools import permutations

import numpy as np
import pandas as pd
import pytest
from hmmlearn.hmm import GaussianHMM

from trainmap.dynamics.maps.hmm.baselines import baseline_table
from trainmap.dynamics.maps.hmm.curves import RESTART_TIE
from trainmap.dynamics.maps.hmm.estimator import TrainingHMM, standardise
from trainmap.dynamics.maps.hmm.splits import fold_split

FEATURES = ("f0", "f1", "f2", "f3")


def sample_runs(n_runs: int = 40, length: int = 200, seed: int = 0):
    """Runs from a known 3-state Gaussian HMM, in raw units (offset and scaled).

    The paper standardises every run with its own statistics, so a state maps to the same z-values
    in every run only if runs spend similar fractions of time in each state. A quickly mixing chain
    gives that; with long dwell times per-run occupancy varies, the standardisation shifts each
    run's states differently, and BIC (rightly, for the standardised data) wants extra states.
    """
    truth = GaussianHMM(n_components=3, covariance_type="diag", random_state=seed)
    truth.startprob_ = np.full(3, 1 / 3)
    truth.transmat_ = np.array([[0.6, 0.2, 0.2], [0.2, 0.6, 0.2], [0.2, 0.2, 0.6]])
    truth.means_ = np.array([[0.0, 0.0, 0.0, 0.0], [3.0, -2.0, 1.0, 0.0], [6.0, 1.0, -2.0, 2.0]])
    truth.covars_ = np.full((3, 4), 0.5)
    truth.n_features = 4
    runs, states = {}, {}
    for index in range(n_runs):
        x, z = truth.sample(length, random_state=seed * 1000 + index)
        runs[f"run{index:02d}"] = pd.DataFrame(x * 10 + 100, columns=FEATURES)
        states[f"run{index:02d}"] = z
    return runs, states


def best_relabelled_accuracy(decoded: dict, truth: dict, k: int) -> float:
    predicted = np.concatenate([decoded[r] for r in sorted(truth)])
    actual = np.concatenate([truth[r] for r in sorted(truth)])
    return max(np.mean(np.array(p)[predicted] == actual) for p in permutations(range(k)))


@pytest.fixture(scope="module")
def synthetic():
    return sample_runs()


@pytest.fixture(scope="module")
def fitted(synthetic):
    runs, _ = synthetic
    return TrainingHMM(
        k_max=4, restarts=2, random_state=7, features=FEATURES, selection="holdout"
    ).fit(runs)


def test_bic_selects_the_true_number_of_states_and_decodes_them(fitted, synthetic):
    runs, truth = synthetic
    assert fitted.n_states_ == 3, fitted.selection_
    assert list(fitted.selection_["n_states"]) == [1, 2, 3, 4]
    assert fitted.selection_.loc[fitted.selection_["bic"].idxmin(), "n_states"] == 3
    assert best_relabelled_accuracy(fitted.decode(runs), truth, 3) >= 0.95


def test_holdout_split_is_seeded_and_independent_of_input_order(synthetic, fitted):
    runs, _ = synthetic
    assert len(fitted.heldout_runs_) == 8 and len(fitted.train_runs_) == 32
    assert not set(fitted.heldout_runs_) & set(fitted.train_runs_)
    shuffled = dict(reversed(list(runs.items())))
    again = TrainingHMM(
        k_max=3, restarts=1, random_state=7, features=FEATURES, selection="holdout"
    ).fit(shuffled)
    assert again.heldout_runs_ == fitted.heldout_runs_
    other = TrainingHMM(
        k_max=3, restarts=1, random_state=8, features=FEATURES, selection="holdout"
    ).fit(runs)
    assert other.heldout_runs_ != fitted.heldout_runs_


def test_same_inputs_and_seed_give_identical_results(synthetic, fitted):
    runs, _ = synthetic
    again = TrainingHMM(
        k_max=4, restarts=2, random_state=7, features=FEATURES, selection="holdout"
    ).fit(runs)
    assert again.n_states_ == fitted.n_states_
    pd.testing.assert_frame_equal(again.selection_, fitted.selection_)
    np.testing.assert_array_equal(again.model_.means_, fitted.model_.means_)
    np.testing.assert_array_equal(again.model_.transmat_, fitted.model_.transmat_)
    for run, states in fitted.decode(runs).items():
        np.testing.assert_array_equal(again.predict(runs[run]), states)


def test_parallel_selection_equals_serial(synthetic, fitted):
    """Parallel processes choose the same K and restarts; numbers agree to rounding (BLAS and
    numpy's SIMD sums may round differently on differently aligned copies of the data)."""
    runs, _ = synthetic
    parallel = TrainingHMM(
        k_max=4, restarts=2, random_state=7, features=FEATURES, n_jobs=2, selection="holdout"
    )
    parallel.fit(runs)
    assert parallel.n_states_ == fitted.n_states_
    assert list(parallel.selection_["restart"]) == list(fitted.selection_["restart"])
    np.testing.assert_allclose(parallel.selection_["bic"], fitted.selection_["bic"], rtol=1e-10)
    np.testing.assert_allclose(parallel.model_.means_, fitted.model_.means_, rtol=1e-10)


def test_save_and_load_give_identical_predictions(tmp_path, synthetic, fitted):
    runs, _ = synthetic
    fitted.save(tmp_path / "hmm.npz", tmp_path / "hmm.json")
    loaded = TrainingHMM.load(tmp_path / "hmm.npz", tmp_path / "hmm.json")
    assert loaded.n_states_ == fitted.n_states_ and loaded.features_ == fitted.features_
    for table in list(runs.values())[:5]:
        np.testing.assert_array_equal(loaded.predict(table), fitted.predict(table))
    np.testing.assert_allclose(
        loaded.filtered_posteriors(loaded.transform(runs["run00"])),
        fitted.filtered_posteriors(fitted.transform(runs["run00"])),
    )
    assert b"pickle" not in (tmp_path / "hmm.npz").read_bytes()[:200]
    with np.load(tmp_path / "hmm.npz", allow_pickle=False) as arrays:
        assert set(arrays.files) == {"startprob", "transmat", "means", "covars"}


def test_constant_feature_is_dropped_with_a_warning(synthetic):
    runs, _ = synthetic
    with_constant = {run: table.assign(flat=3.0) for run, table in list(runs.items())[:10]}
    with pytest.warns(UserWarning, match="'flat' is constant"):
        hmm = TrainingHMM(k_max=2, restarts=1, features=(*FEATURES, "flat")).fit(with_constant)
    assert hmm.dropped_features_ == {
        "flat": "constant over the first 1000 checkpoints of every run (pooled standardisation)"
    }
    assert "flat" not in hmm.features_
    assert np.isfinite(hmm.model_.means_).all()


def test_standardise_uses_only_the_first_checkpoints():
    values = np.concatenate([np.arange(1000.0), np.full(500, 1e6)])[:, None]
    z, mean, std = standardise(values)
    assert mean[0] == pytest.approx(499.5) and std[0] == pytest.approx(np.arange(1000.0).std())
    assert z[0, 0] == pytest.approx(-499.5 / np.arange(1000.0).std())


def test_filtered_posteriors_are_the_forward_algorithm(fitted, synthetic):
    """p(s_t | z_1:t) equals the normalised forward variable, computed here by brute force."""
    runs, _ = synthetic
    z = fitted.transform(runs["run03"])[:6]
    emission = np.exp(fitted.log_emissions(z))
    alpha = fitted.model_.startprob_ * emission[0]
    expected = [alpha / alpha.sum()]
    for t in range(1, len(z)):
        alpha = (alpha @ fitted.model_.transmat_) * emission[t]
        expected.append(alpha / alpha.sum())
    np.testing.assert_allclose(fitted.filtered_posteriors(z), np.array(expected), atol=1e-10)


def test_importance_is_the_derivative_of_the_log_filtered_posterior(fitted, synthetic):
    """Appendix A's closed form equals a finite-difference derivative of log p(s_t = k | z_1:t)."""
    runs, _ = synthetic
    z = fitted.transform(runs["run05"])[:30].copy()
    t = 20
    for state in range(fitted.n_states_):
        analytic = fitted.log_posterior_gradient(z, state, t)
        numeric = np.zeros(z.shape[1])
        for i in range(z.shape[1]):
            step = 1e-6
            plus, minus = z.copy(), z.copy()
            plus[t, i] += step
            minus[t, i] -= step
            log_p = [np.log(fitted.filtered_posteriors(x)[t, state]) for x in (plus, minus)]
            numeric[i] = (log_p[0] - log_p[1]) / (2 * step)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(fitted.feature_importance(z, state, t), np.abs(analytic))


def test_baselines_table_has_the_paper_form(fitted, synthetic):
    runs, _ = synthetic
    subset = {run: runs[run] for run in list(runs)[:12]}
    hmm = TrainingHMM(
        k_max=4, restarts=1, random_state=1, features=FEATURES, selection="holdout"
    ).fit(subset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table, curves = baseline_table(hmm, subset, l2_feature="f0")
    assert list(table["model"]) == ["k-means", "HMM-1", "HMM"]
    assert table.loc[2, "components"] == hmm.n_states_
    assert set(curves) == {"k-means", "HMM-1", "HMM"}
    assert all(len(curve) == 4 and np.isfinite(curve["bic"]).all() for curve in curves.values())


def test_too_few_runs_is_refused():
    runs, _ = sample_runs(n_runs=1, length=30)
    with pytest.raises(ValueError, match="at least 2 runs"):
        TrainingHMM(k_max=2, restarts=1, features=FEATURES).fit(runs)


def test_batched_e_step_equals_hmmlearns(synthetic):
    """The vectorised E-step (and its run weights) give hmmlearn's statistics and likelihood."""
    from hmmlearn.base import BaseHMM

    from trainmap.dynamics.maps.hmm.gaussian import BatchedGaussianHMM

    runs, _ = synthetic
    tables = [table.to_numpy(dtype=float)[:, :4] / 10 - 10 for table in list(runs.values())[:9]]
    tables[-1] = tables[-1][:-37]  # runs of different lengths
    x, lengths = np.concatenate(tables), [len(t) for t in tables]
    weights = np.array([0, 1, 2, 1, 3, 1, 0, 1, 2], dtype=float)
    repeated = [t for t, w in zip(tables, weights, strict=True) for _ in range(int(w))]
    for covariance_type in ("full", "diag"):
        model = BatchedGaussianHMM(3, covariance_type=covariance_type, n_iter=4, random_state=1)
        model.fit(x, lengths)
        ours, ll = model._do_estep(x, lengths)
        ours = {key: np.array(value, copy=True) for key, value in ours.items()}
        theirs, expected_ll = BaseHMM._do_estep(model, x, lengths)
        assert ll == pytest.approx(expected_ll, rel=1e-12)
        for key in theirs:
            np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-9, atol=1e-9)
        assert model.score(x, lengths) == pytest.approx(BaseHMM.score(model, x, lengths), rel=1e-12)
        model._run_weights = weights
        weighted, weighted_ll = model._do_estep(x, lengths)
        model._run_weights = None
        copies, copies_ll = BaseHMM._do_estep(model, np.concatenate(repeated),
                                              [len(t) for t in repeated])  # fmt: skip
        assert weighted_ll == pytest.approx(copies_ll, rel=1e-12)
        np.testing.assert_allclose(weighted["obs"], copies["obs"], rtol=1e-9)
        np.testing.assert_allclose(weighted["trans"], copies["trans"], rtol=1e-9)


def test_runs_the_scaled_recursion_cannot_hold_are_redone_in_log_space():
    """A run the model finds (nearly) impossible underflows the scaled forward pass: that run, and
    only it, is redone in log space, and the E-step and score still equal hmmlearn's log-space code
    (which redoes every run). A model EM left without mass (NaN) stops at once, a failed fit."""
    from hmmlearn.base import BaseHMM

    from trainmap.dynamics.maps.hmm.forward_backward import forward_time_major
    from trainmap.dynamics.maps.hmm.gaussian import BatchedGaussianHMM, estep_together, fit_together
    from trainmap.dynamics.maps.hmm.selection import training_score

    rng = np.random.default_rng(3)
    model = BatchedGaussianHMM(3, covariance_type="full", init_params="", random_state=0)
    model.startprob_ = np.array([1.0, 0.0, 0.0])
    model.transmat_ = np.array([[0.9, 0.1, 0.0], [0.0, 0.9, 0.1], [0.0, 0.0, 1.0]])
    model.means_ = np.array([[0.0, 0.0], [5.0, 0.0], [10.0, 0.0]])
    model.n_features = 2
    model.covars_ = np.stack([np.eye(2) * 0.01] * 3)
    ordinary = [np.repeat(model.means_, [20, 20, 20], axis=0) + rng.normal(0, 0.1, (60, 2))
                for _ in range(3)]  # fmt: skip
    jumps = ordinary[0].copy()
    jumps[1:10] = model.means_[2]  # state 0 -> state 2 is forbidden: log p ~ -1e4 via state 1
    runs = [*ordinary, jumps]
    x, lengths = np.concatenate(runs), [len(run) for run in runs]
    frames = model._compute_log_likelihood(x).reshape(4, 60, 3).transpose(1, 0, 2)
    *_, failed = forward_time_major(frames, model.startprob_, model.transmat_, [3])
    assert failed[:, 0].tolist() == [False, False, False, True]
    ours, ll = model._do_estep(x, lengths)
    theirs, expected_ll = BaseHMM._do_estep(model, x, lengths)
    assert np.isfinite(ll) and ll == pytest.approx(expected_ll, rel=1e-12)
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-9, atol=1e-9)
    assert model.score(x, lengths) == pytest.approx(BaseHMM.score(model, x, lengths), rel=1e-12)
    # Beside a model that holds every run, the failing run stays this model's: neither model's
    # numbers change (a shared matrix product would carry one block's 0 * inf to the other).
    other = BatchedGaussianHMM(2, covariance_type="full", random_state=0).fit(x, lengths)
    together = estep_together([model, other], x, lengths)
    for (stats, _), alone in zip(together, (ours, other._do_estep(x, lengths)[0]), strict=True):
        for key in ("start", "trans", "post", "obs", "obs*obs.T"):
            np.testing.assert_allclose(stats[key], alone[key], rtol=1e-9, atol=1e-9)
    assert together[0][1] == pytest.approx(ll, rel=1e-12)

    model.means_ = np.full((3, 2), np.nan)
    with pytest.raises(ValueError, match="without mass"):
        model._do_estep(x, lengths)
    completed = fit_together([model], x, lengths)[0]
    assert (training_score(model, (x, lengths)) if completed else None) is None


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_models_fitted_together_are_the_models_fitted_alone(synthetic, covariance_type):
    """EM of several models of the same runs in lockstep (one recursion per step for all of them)
    gives each model its own fit: the same parameters, iterations and convergence, with and
    without run weights; a model EM leaves without mass is dropped without touching the others."""
    from trainmap.dynamics.maps.hmm.gaussian import BatchedGaussianHMM, fit_together

    runs, _ = synthetic
    tables = [table.to_numpy(dtype=float)[:, :4] / 10 - 10 for table in list(runs.values())[:9]]
    tables[-1] = tables[-1][:-37]  # runs of different lengths
    x, lengths = np.concatenate(tables), [len(t) for t in tables]
    weights = np.array([1, 1, 2, 1, 3, 1, 1, 1, 2], dtype=float)

    def models():
        return [BatchedGaussianHMM(k, covariance_type=covariance_type, n_iter=25, tol=1e-4,
                                   random_state=k) for k in (1, 2, 3, 5)]  # fmt: skip

    for w in (None, weights):
        alone = models()
        for model in alone:
            model.fit(x, lengths) if w is None else model.fit_weighted(x, lengths, w)
        together = models()
        assert fit_together(together, x, lengths, w) == [True] * 4
        for a, b in zip(alone, together, strict=True):
            assert (a.monitor_.iter, a.monitor_.converged) == (
                b.monitor_.iter,
                b.monitor_.converged,
            )
            for name in ("startprob_", "transmat_", "means_", "covars_"):
                np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-9,
                                           atol=1e-12)  # fmt: skip
    broken = models()
    broken[1]._init(x, lengths)
    broken[1].init_params = ""
    broken[1].means_ = np.full_like(broken[1].means_, np.nan)
    broken[3]._init(x, lengths)
    broken[3].init_params = ""
    broken[3]._covars_ = -broken[3]._covars_  # not definite: its densities cannot be computed
    assert fit_together(broken, x, lengths) == [True, False, True, False]
    np.testing.assert_allclose(broken[2].means_, models()[2].fit(x, lengths).means_, rtol=1e-9)


def test_decoding_many_runs_at_once_is_hmmlearns_viterbi_of_each(fitted, synthetic):
    runs, _ = synthetic
    tables = dict(list(runs.items())[:7])
    together = fitted.decode(tables)
    for run, table in tables.items():
        alone = GaussianHMM.predict(fitted.model_, fitted.transform(table))
        np.testing.assert_array_equal(together[run], alone)


def test_outer_products_follow_an_array_changed_in_place():
    from trainmap.dynamics.maps.hmm.gaussian import outer_products

    x = np.arange(12.0).reshape(4, 3)
    first = outer_products(x).copy()
    assert outer_products(x) is outer_products(x)  # kept while the array lives unchanged
    x[1, 2] += 5.0
    np.testing.assert_array_equal(outer_products(x)[1], [9.0, 12.0, 30.0, 16.0, 40.0, 100.0])
    assert not np.array_equal(outer_products(x), first)


def test_held_out_bic_is_hmmlearns(fitted, synthetic):
    from trainmap.dynamics.maps.hmm.selection import score_heldout
    from trainmap.dynamics.maps.hmm.splits import stack

    runs, _ = synthetic
    heldout = stack([fitted.transform(runs[run]) for run in fitted.heldout_runs_])
    scores = score_heldout(fitted.model_, heldout)
    assert scores["bic"] == pytest.approx(fitted.model_.bic(*heldout), rel=1e-12)
    assert scores["aic"] == pytest.approx(fitted.model_.aic(*heldout), rel=1e-12)
    assert fitted.selection_.loc[fitted.n_states_ - 1, "bic"] == pytest.approx(scores["bic"])


def test_pooled_standardisation_and_settings_are_saved(tmp_path, synthetic, fitted):
    runs, _ = synthetic
    assert fitted.standardisation_["kind"] == "pooled"
    pooled = pd.concat([table[list(FEATURES)] for table in runs.values()])
    np.testing.assert_allclose(fitted.standardisation_["mean"], pooled.mean().to_numpy())
    np.testing.assert_allclose(fitted.standardisation_["std"], pooled.std(ddof=0).to_numpy())
    fitted.save(tmp_path / "hmm.npz", tmp_path / "hmm.json")
    meta = json.loads((tmp_path / "hmm.json").read_text())
    assert meta["estimator"]["covariance_type"] == "full"
    assert meta["estimator"]["standardisation"] == "pooled"
    assert meta["selection_at_ceiling"] is False and meta["selection_note"] is None
    per_run = TrainingHMM(k_max=2, restarts=1, standardisation="per_run", features=FEATURES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_run.fit(runs)
    z, _, _ = standardise(runs["run00"][list(FEATURES)].to_numpy(dtype=float))
    np.testing.assert_allclose(per_run.transform(runs["run00"]), z)


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("covariance_type", "fulll", "covariance_type: 'fulll' is not allowed; choose one of full"),
        ("standardisation", "zscore", "standardisation: 'zscore' is not allowed; choose one of"),
        ("restart_rule", "median", "restart_rule: 'median' is not allowed; choose one of best"),
        ("tol", 0.0, "tol: 0.0 is not allowed; it must be > 0"),
        ("selection", "kfold", "selection: 'kfold' is not allowed; choose one of holdout, folds"),
        ("folds", 1, "folds: 1 is not allowed; it must be an integer >= 2"),
        ("folds", 2.0, "folds: 2.0 is not allowed; it must be an integer >= 2"),
    ],
)
def test_bad_settings_name_key_value_and_choices(setting, value, message):
    with pytest.raises(ValueError, match=message):
        TrainingHMM(**{setting: value})


def test_folds_hold_out_every_run_once_seeded_and_independent_of_input_order():
    runs = [f"run{i:02d}" for i in range(11)]
    folds = fold_split(runs, 3, random_state=7)
    assert sorted(run for fold in folds for run in fold) == runs
    assert sorted(len(fold) for fold in folds) == [3, 4, 4]
    assert fold_split(list(reversed(runs)) + runs[:2], 3, random_state=7) == folds
    assert fold_split(runs, 3, random_state=8) != folds
    assert sorted(fold_split(runs[:2], 5, random_state=0)) == [[runs[0]], [runs[1]]]


def test_folds_selection_fits_all_runs_and_saves_its_rule(tmp_path, synthetic):
    """selection="folds": K by the mean held-out BIC over the folds, the model fitted on all runs
    (no held-out runs), the rule and the folds saved and loaded with the map."""
    runs, truth = synthetic
    hmm = TrainingHMM(k_max=4, restarts=2, random_state=7, features=FEATURES, selection="folds",
                      folds=3).fit(runs)  # fmt: skip
    assert hmm.n_states_ == 3
    assert best_relabelled_accuracy(hmm.decode(runs), truth, 3) >= 0.95
    assert hmm.train_runs_ == sorted(runs) and hmm.heldout_runs_ == []
    assert len(hmm.folds_) == 3 and sorted(sum(hmm.folds_, [])) == sorted(runs)
    fits = hmm.restarts_[hmm.restarts_["split"] < 3]
    # each K's best restart per fold: the first within RESTART_TIE of the highest likelihood
    top = fits.groupby(["n_states", "split"])["train_log_likelihood"].transform("max")
    tied = fits[fits["train_log_likelihood"] >= top - RESTART_TIE * top.abs()]
    best = tied.groupby(["n_states", "split"]).head(1)
    fold_bics = best.pivot(index="n_states", columns="split", values="bic")
    curve = hmm.selection_.set_index("n_states")
    np.testing.assert_allclose(curve["bic"], fold_bics.mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(curve["bic_fold_sd"], fold_bics.std(axis=1, ddof=0), rtol=1e-9)
    hmm.save(tmp_path / "hmm.npz", tmp_path / "hmm.json")
    meta = json.loads((tmp_path / "hmm.json").read_text())
    assert meta["estimator"]["selection"] == "folds" and meta["estimator"]["folds"] == 3
    loaded = TrainingHMM.load(tmp_path / "hmm.npz", tmp_path / "hmm.json")
    assert (loaded.selection, loaded.folds, loaded.folds_) == ("folds", 3, hmm.folds_)
    np.testing.assert_array_equal(loaded.predict(runs["run00"]), hmm.predict(runs["run00"]))


def test_a_map_saved_before_the_selection_setting_loads_as_holdout(tmp_path, fitted):
    fitted.save(tmp_path / "hmm.npz", tmp_path / "hmm.json")
    meta = json.loads((tmp_path / "hmm.json").read_text())
    for key in ("selection", "folds"):
        del meta["estimator"][key]
    del meta["folds"]
    (tmp_path / "hmm.json").write_text(json.dumps(meta))
    loaded = TrainingHMM.load(tmp_path / "hmm.npz", tmp_path / "hmm.json")
    assert loaded.selection == "holdout" and loaded.folds_ == [fitted.heldout_runs_]
