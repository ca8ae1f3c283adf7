"""One model selection: the full fit (:meth:`TrainingHMM.fit`) and every bootstrap refit
(:func:`trainmap.dynamics.verdicts.certainty.refit_resample`) standardise, fit every K and choose K through
the same functions (:func:`~trainmap.dynamics.maps.hmm.estimator.standardise_runs`,
:func:`~trainmap.dynamics.maps.hmm.selection.select_model`, :func:`~trainmap.dynamics.maps.hmm.curves.choose_k`), warm starts
being an option of that one path. So a "resample" that draws every run once, with the full fit's
held-out split, reproduces the full fit: exactly its selection when refitted as the full fit is
(fresh seeded restarts), and its K and likelihoods when warm-started from it (as the bootstrap
refits). The selection rule (one held-out split, or folds of the runs) is part of that
path: the stability curve's refits and the bootstrap's use the full fit's rule."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from trainmap.dynamics.maps.hmm import estimator
from trainmap.dynamics.maps.hmm import selection as selection_module
from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.dynamics.maps.synthetic import sample_runs
from trainmap.dynamics.verdicts import certainty
from trainmap.dynamics.verdicts.certainty import Refit, bootstrap_map, refit_resample

CURVE = ("train_log_likelihood", "heldout_log_likelihood", "bic", "aic")


@pytest.fixture(
    scope="module",
    params=[("pooled", "holdout"), ("per_run", "holdout"), ("pooled", "folds")],
    ids=["pooled-holdout", "per_run-holdout", "pooled-folds"],
)
def fitted(request):
    standardisation, selection = request.param
    runs, _, _ = sample_runs(3, n_runs=20, length=200, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = TrainingHMM(k_max=4, restarts=2, standardisation=standardisation,
                           selection=selection, folds=3).fit(runs)  # fmt: skip
    assert full.n_states_ == 3  # the true K: the selection has something to reproduce
    raw = {run: table[full.features_].to_numpy(dtype=float) for run, table in runs.items()}
    return full, raw, runs


def every_run_once(full: TrainingHMM) -> tuple[dict[str, float], dict[str, float]]:
    return dict.fromkeys(full.train_runs_, 1.0), dict.fromkeys(full.heldout_runs_, 1.0)


def test_refitting_the_original_runs_as_the_full_fit_reproduces_it(fitted):
    full, raw, _ = fitted
    refit = refit_resample(
        raw, *every_run_once(full), Refit.of(full, warm_start=False, reselect_k=True)
    )
    selection = refit.selection
    assert selection.n_states == full.n_states_
    # Round-off only: the pooled statistics sum the runs in another order (training runs, then
    # held-out ones, as a bootstrap draw lists them).
    for column in CURVE:
        np.testing.assert_allclose(selection.curve[column], full.selection_[column], rtol=1e-9)
    np.testing.assert_allclose(selection.model.means_, full.model_.means_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(refit.shift, 0.0, atol=1e-12)
    np.testing.assert_allclose(refit.scale, 1.0, rtol=1e-12)


def test_a_warm_started_refit_of_the_original_runs_keeps_the_full_fit(fitted):
    """The bootstrap's refit: every K continues EM from the full fit's model for at most 10 more
    iterations. The full fit stopped when EM gained less than ``tol`` per observation, so K stays
    and the held-out likelihood moves little (pooled: round-off up to the chosen K with Gaussian
    emissions, < 0.1 % with the default Student-t ones, whose EM, weighted by the latent scales,
    still creeps at the tolerance; per-run z-scores: < 1 %, EM still creeping)."""
    full, raw, _ = fitted
    refit = refit_resample(raw, *every_run_once(full), Refit.of(full, max_iter=10, reselect_k=True))
    assert refit.selection.n_states == full.n_states_
    curve = refit.selection.curve.set_index("n_states")["heldout_log_likelihood"]
    expected = full.selection_.set_index("n_states")["heldout_log_likelihood"]
    k = full.n_states_
    if full.standardisation == "pooled":
        np.testing.assert_allclose(curve.loc[:k], expected.loc[:k],
                                   rtol=1e-12 if full.emission == "plain" else 1e-3)  # fmt: skip
    else:  # within 1 % of each K's value, or 0.1 % of the curve's largest (a K near 0 nats)
        np.testing.assert_allclose(curve.loc[:k], expected.loc[:k], rtol=1e-2,
                                   atol=1e-3 * np.abs(expected.loc[:k]).max())  # fmt: skip


def test_the_full_fit_and_the_bootstrap_run_the_same_selection(fitted, monkeypatch):
    """Both go through the one standardisation, selection and choice of K (counted by spies)."""
    full, _, runs = fitted
    calls: list[str] = []

    def spy(name, original):
        def counted(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        return counted

    for name, module in (("standardise_runs", estimator), ("select_model", estimator),
                         ("choose_k", selection_module)):  # fmt: skip
        counted = spy(name, getattr(module, name))
        monkeypatch.setattr(module, name, counted)
        if hasattr(certainty, name):
            monkeypatch.setattr(certainty, name, counted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        TrainingHMM(**full.estimator_settings()).fit(runs)
        assert calls == ["standardise_runs", "select_model", "choose_k"]
        calls.clear()
        convergence = dict.fromkeys(runs)
        bootstrap_map(full, runs, convergence, {}, [], n_resamples=2, seed=1, reselect_k=True)
    assert calls == ["standardise_runs", "select_model", "choose_k"] * 2


def test_refits_of_the_bootstrap_and_the_stability_curve_use_the_full_fits_rule(
    fitted, monkeypatch
):
    """Every refit selects K by the full fit's rule; with folds, on folds of its own drawn runs
    (every distinct drawn run held out once, a run drawn twice in one fold)."""
    from trainmap.dynamics.verdicts.stability import stability_curve

    full, _, runs = fitted
    seen: list[tuple[str, int, list[list[str]], set[str]]] = []
    original = certainty.select_model

    def recorded(z, train, heldout, *args, **kwargs):
        selection = original(z, train, heldout, *args, **kwargs)
        seen.append(
            (kwargs["selection"], kwargs["folds"], selection.folds, set(train) | set(heldout))
        )
        return selection

    monkeypatch.setattr(certainty, "select_model", recorded)
    convergence = dict.fromkeys(runs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bootstrap_map(full, runs, convergence, {}, [], n_resamples=2, seed=1, reselect_k=True)
        stability_curve(
            full, runs, None, convergence, {}, [], ladder=[8], n_subsamples=2, reselect_k=True
        )
    assert len(seen) == 4
    for selection, folds, held, drawn in seen:
        assert (selection, folds) == (full.selection, full.folds)
        if full.selection == "folds":
            assert len(held) == min(folds, len(drawn))
            assert sorted(run for fold in held for run in fold) == sorted(drawn)
        else:
            assert len(held) == 1 and set(held[0]) < drawn
