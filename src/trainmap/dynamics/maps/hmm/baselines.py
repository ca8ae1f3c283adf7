"""Appendix C's baselines of a training map: k-means and HMM-1, and table 4's form.

Hu et al., appendix C, compare the HMM with models of less structure, each choosing its number of
components by held-out BIC: k-means (no temporal structure; :func:`kmeans_selection`, with the
BIC of the equivalent hard-assignment spherical Gaussian mixture, :func:`kmeans_bic`) and HMM-1
(the same HMM selection on the L2 norm alone). :func:`baseline_table` gives table 4's form.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

import numpy as np
import pandas as pd

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM


def kmeans_bic(centres: np.ndarray, x: np.ndarray, weights: np.ndarray, variance: float) -> float:
    """BIC of k-means as a hard-assignment spherical Gaussian mixture with shared variance.

    log L = sum_i [log pi_c(i) + log N(x_i | mu_c(i), variance * I)] with c(i) the nearest centre;
    free parameters: K*d means, 1 variance, K-1 weights.
    """
    distances = ((x[:, None, :] - centres[None]) ** 2).sum(axis=2)
    nearest = distances.argmin(axis=1)
    n, d = x.shape
    log_likelihood = (
        np.log(weights[nearest]).sum()
        - 0.5 * distances[np.arange(n), nearest].sum() / variance
        - 0.5 * n * d * math.log(2 * math.pi * variance)
    )
    n_parameters = centres.size + 1 + (len(centres) - 1)
    return float(-2 * log_likelihood + n_parameters * math.log(n))


def kmeans_selection(
    hmm: TrainingHMM, runs: Mapping[str, pd.DataFrame], k_max: int | None = None
) -> pd.DataFrame:
    """k-means with K = 1..k_max (default the HMM's K_max) on the HMM's standardised runs, BIC
    on held-out runs by the HMM's selection rule: its training against its held-out runs
    (``holdout``), or the mean over its folds (``folds``)."""
    from sklearn.cluster import KMeans

    z = {run: hmm.transform(runs[run]) for run in hmm.train_runs_ + hmm.heldout_runs_}
    if hmm.selection == "holdout":
        splits = [(hmm.train_runs_, hmm.heldout_runs_)]
    else:
        splits = [
            ([run for run in hmm.train_runs_ if run not in fold], fold) for fold in hmm.folds_
        ]
    data = [(np.concatenate([z[run] for run in train]), np.concatenate([z[run] for run in held]))
            for train, held in splits]  # fmt: skip
    rows = []
    # k-means needs at least K training observations (a tiny smoke run can have fewer than 16).
    for k in range(1, min(k_max or hmm.k_max, min(len(train) for train, _ in data)) + 1):
        bics = []
        for train, heldout in data:
            kmeans = KMeans(n_clusters=k, n_init=hmm.restarts, random_state=hmm.random_state)
            labels = kmeans.fit_predict(train)
            weights = np.maximum(np.bincount(labels, minlength=k) / len(labels), 1e-12)
            variance = max(kmeans.inertia_ / train.size, 1e-12)
            bics.append(kmeans_bic(kmeans.cluster_centers_, heldout, weights, variance))
        rows.append({"n_states": k, "bic": float(np.mean(bics))})
    return pd.DataFrame(rows)


def baseline_table(
    hmm: TrainingHMM,
    runs: Mapping[str, pd.DataFrame],
    l2_feature: str = "l2",
    k_max: int | None = None,
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """Appendix C, table 4's form: components and held-out BIC chosen by k-means, HMM-1 and HMM.

    The baselines search K = 1..``k_max`` (default the HMM's K_max; the paper let them reach 16).
    Returns the table and the selection curves of the two baselines.
    """
    k_max = k_max or hmm.k_max
    curves = {"k-means": kmeans_selection(hmm, runs, k_max)}
    hmm1 = TrainingHMM(**(hmm.estimator_settings() | {"features": (l2_feature,), "k_max": k_max}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm1.fit(runs)
    curves["HMM-1"] = hmm1.selection_[["n_states", "bic"]]
    curves["HMM"] = hmm.selection_[["n_states", "bic"]]
    rows = []
    for name, curve in curves.items():
        best = curve.loc[curve["bic"].idxmin()]
        if name == "HMM":  # the map's own K, whatever its rule (reproducible: not a BIC minimum)
            best = curve.set_index("n_states", drop=False).loc[hmm.n_states_]
        rows.append({"model": name, "components": int(best["n_states"]), "bic": float(best["bic"])})
    return pd.DataFrame(rows), curves
