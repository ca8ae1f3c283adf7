"""The Student-t emission (``emission: student_t``): its density is the multivariate t, its EM step
is Peel & McLachlan's ECM (u-weighted means and scatter over sum gamma; the PX-EM's, over
sum gamma u, as an option), both reach one fixed point, PX-EM in fewer iterations, the fit
downweights outliers as they state, it fits in lockstep exactly as alone, a saved map predicts the
same after loading, and a bad number of degrees of freedom is refused naming the key."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy.stats import multivariate_t

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.dynamics.maps.hmm.factory import emission_model
from trainmap.dynamics.maps.hmm.gaussian import BatchedGaussianHMM, fit_together
from trainmap.dynamics.maps.hmm.student_t import StudentTHMM
from trainmap.dynamics.maps.synthetic import sample_runs


def two_state_model(covariance_type: str = "full", degrees: float = 3.0) -> StudentTHMM:
    """A fitted-looking two-state t model in 3 dimensions."""
    rng = np.random.default_rng(0)
    model = StudentTHMM(n_components=2, covariance_type=covariance_type, degrees=degrees)
    model.n_features = 3
    model.startprob_ = np.array([0.6, 0.4])
    model.transmat_ = np.array([[0.9, 0.1], [0.2, 0.8]])
    model.means_ = rng.normal(size=(2, 3))
    if covariance_type == "full":
        factors = rng.normal(size=(2, 3, 3))
        model.covars_ = factors @ factors.transpose(0, 2, 1) + np.eye(3)
    else:
        model.covars_ = rng.uniform(0.5, 2.0, size=(2, 3))
    return model


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_the_emission_density_is_the_multivariate_t(covariance_type: str) -> None:
    model = two_state_model(covariance_type)
    X = np.random.default_rng(1).normal(size=(40, 3)) * 3
    expected = np.column_stack([multivariate_t(model.means_[k], model.covars_[k],
                                               df=model.degrees).logpdf(X) for k in range(2)])  # fmt: skip
    np.testing.assert_allclose(model._compute_log_likelihood(X), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("expanded", [True, False])
def test_one_em_step_is_the_u_weighted_m_step(expanded: bool) -> None:
    """The M-step at fixed nu: mu_k = sum gamma u x / sum gamma u and
    Sigma_k = sum gamma u (x - mu)(x - mu)' / D_k, u = (nu + d) / (nu + delta), D_k = sum gamma
    (Peel & McLachlan's ECM, the default) or sum gamma u (PX-EM, ``expanded``); the posteriors
    gamma from the forward-backward pass over the t densities (hmmlearn's predict_proba)."""
    model = two_state_model()
    model.expanded = expanded
    X = np.random.default_rng(2).standard_t(3, size=(60, 3)) + model.means_[0]
    lengths = [30, 30]
    gamma = model.predict_proba(X, lengths)
    delta = np.stack([np.einsum("ti,ij,tj->t", X - model.means_[k],
                                np.linalg.inv(model.covars_[k]), X - model.means_[k])
                      for k in range(2)], axis=1)  # fmt: skip
    u = (model.degrees + 3) / (model.degrees + delta)
    means = (gamma * u).T @ X / (gamma * u).sum(axis=0)[:, None]
    denominator = (gamma * u if expanded else gamma).sum(axis=0)
    covars = np.stack([((X - means[k]) * (gamma[:, k] * u[:, k])[:, None]).T @ (X - means[k])
                       / denominator[k] for k in range(2)])  # fmt: skip
    covars_prior = model.covars_prior / denominator  # hmmlearn's prior, as the Gaussian's
    model.n_iter, model.init_params = 1, ""
    model.fit(X, lengths)
    np.testing.assert_allclose(model.means_, means, rtol=1e-9)
    np.testing.assert_allclose(model.covars_, covars + covars_prior[:, None, None], rtol=1e-9)


def test_px_em_and_the_ecm_reach_one_fixed_point_px_em_in_fewer_iterations() -> None:
    """Both M-steps have the same fixed points (module docstring; without hmmlearn's covariance
    prior): from the same start, run to convergence, they give one likelihood and one set of
    parameters, at which sum_t gamma_t(k) u_t(k) = sum_t gamma_t(k); PX-EM never lowers the
    likelihood and takes fewer iterations."""
    runs, _, _ = sample_runs(2, n_runs=8, length=60, seed=4, tails=3.0)
    X = np.concatenate([table.iloc[:, 1:8].to_numpy() for table in runs.values()])
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    lengths = [60] * 8
    fits = {}
    for expanded in (True, False):
        model = StudentTHMM(n_components=2, covariance_type="full", n_iter=5000, tol=1e-11,
                            random_state=0, covars_prior=0.0, expanded=expanded)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fits[expanded] = model.fit(X, lengths)
    px, ecm = fits[True], fits[False]
    assert px.monitor_.converged and ecm.monitor_.converged
    assert px.monitor_.iter < 0.8 * ecm.monitor_.iter, (px.monitor_.iter, ecm.monitor_.iter)
    history = np.asarray(px.monitor_.history)
    assert np.all(np.diff(history) > -1e-9 * np.abs(history[1:]))
    np.testing.assert_allclose(px.score(X, lengths), ecm.score(X, lengths), rtol=1e-9)
    np.testing.assert_allclose(px.means_, ecm.means_, atol=1e-6)
    np.testing.assert_allclose(px.covars_, ecm.covars_, atol=1e-6)
    stats, _ = px._do_estep(X, lengths)
    np.testing.assert_allclose(stats["post"], stats["post_unweighted"], rtol=1e-5)


def test_the_t_fit_downweights_an_outlier_that_moves_the_gaussian_mean() -> None:
    """Peel & McLachlan (sec. 5): an observation far from a component gets a small weight u, so
    gross outliers hardly move the t location, where they pull the Gaussian mean."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 2))
    X[:5] = 50.0  # five gross outliers
    fits = {}
    for name, cls in (("t", StudentTHMM), ("gaussian", BatchedGaussianHMM)):
        model = cls(n_components=1, covariance_type="full", n_iter=200, tol=1e-8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fits[name] = model.fit(X).means_[0]
    clean = X[5:].mean(axis=0)
    assert np.linalg.norm(fits["gaussian"] - clean) > 1.0
    assert np.linalg.norm(fits["t"] - clean) < 0.1


def test_the_t_models_fit_in_lockstep_exactly_as_alone_and_em_never_lowers_the_likelihood() -> None:
    runs, _, _ = sample_runs(3, n_runs=6, length=40, seed=1, tails=3.0)
    X = np.concatenate([table.iloc[:, 1:15].to_numpy() for table in runs.values()])
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    lengths = [40] * 6

    def fresh(k: int) -> StudentTHMM:
        return StudentTHMM(n_components=k, covariance_type="full", n_iter=30, tol=1e-9,
                           random_state=k)  # fmt: skip

    together = [fresh(2), fresh(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert fit_together(together, X, lengths) == [True, True]
        alone = [fresh(2).fit(X, lengths), fresh(3).fit(X, lengths)]
    for a, b in zip(together, alone, strict=True):
        np.testing.assert_allclose(a.means_, b.means_, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(a.covars_, b.covars_, rtol=1e-10, atol=1e-12)
        history = np.asarray(a.monitor_.history)
        assert np.all(np.diff(history) > -1e-6 * np.abs(history[1:]))


def test_a_saved_t_map_predicts_the_same_after_loading(tmp_path) -> None:
    runs, _, _ = sample_runs(2, n_runs=8, length=40, seed=0, tails=3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm = TrainingHMM(emission="student_t", degrees_of_freedom=5.0, k_max=3, restarts=1,
                          selection="holdout").fit(runs)  # fmt: skip
    hmm.save(tmp_path / "hmm.npz", tmp_path / "hmm.json")
    loaded = TrainingHMM.load(tmp_path / "hmm.npz", tmp_path / "hmm.json")
    assert isinstance(loaded.model_, StudentTHMM) and loaded.model_.degrees == 5.0
    table = next(iter(runs.values()))
    np.testing.assert_array_equal(loaded.predict(table), hmm.predict(table))
    z = hmm.transform(table)
    np.testing.assert_allclose(loaded.log_emissions(z), hmm.model_._compute_log_likelihood(z),
                               atol=1e-8)  # fmt: skip


def test_the_feature_importance_is_the_gradient_of_the_t_log_posterior() -> None:
    """Appendix A's gradient under t emissions: a central difference of log p(s_t = k | z_1:t)."""
    runs, _, _ = sample_runs(2, n_runs=8, length=30, seed=0, tails=3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm = TrainingHMM(emission="student_t", k_max=2, restarts=1, selection="holdout").fit(runs)
    z = hmm.transform(next(iter(runs.values())))
    t, state, step = 10, 0, 1e-6
    numeric = np.empty(z.shape[1])
    for i in range(z.shape[1]):
        up, down = z.copy(), z.copy()
        up[t, i] += step
        down[t, i] -= step
        numeric[i] = (math.log(hmm.filtered_posteriors(up[: t + 1])[t, state])
                      - math.log(hmm.filtered_posteriors(down[: t + 1])[t, state])) / (2 * step)  # fmt: skip
    np.testing.assert_allclose(hmm.log_posterior_gradient(z, state, t), numeric, rtol=1e-4,
                               atol=1e-6)  # fmt: skip


@pytest.mark.parametrize("degrees", [0, -1.0, 2000.0, math.nan, True])
def test_bad_degrees_of_freedom_are_refused_naming_the_key(degrees: float) -> None:
    with pytest.raises(ValueError, match="degrees_of_freedom"):
        TrainingHMM(emission="student_t", degrees_of_freedom=degrees)
    if not isinstance(degrees, bool) and not degrees > 0:
        with pytest.raises(ValueError, match="degrees_of_freedom"):
            emission_model(2, "student_t", degrees_of_freedom=degrees)


@pytest.mark.parametrize(("value", "words"), [(0, "less than or equal to the minimum of 0"),
                                              (1001, "greater than the maximum of 1000")])  # fmt: skip
def test_the_config_check_refuses_degrees_of_freedom_out_of_range_naming_the_key(
    value: float, words: str
) -> None:
    from pathlib import Path

    from trainmap import grid

    root = Path(__file__).resolve().parents[5]
    config = grid.merged_config(root / "params.yaml", root / "config" / "config.yaml")
    config["analysis"] |= {"emission": "student_t", "degrees_of_freedom": 3}
    grid.validate_schema(config)
    config["analysis"]["degrees_of_freedom"] = value
    with pytest.raises(grid.ConfigError) as error:
        grid.validate_schema(config)
    first = str(error.value).splitlines()[0]
    assert first.startswith(f"config key analysis.degrees_of_freedom: {value} is {words}"), first
