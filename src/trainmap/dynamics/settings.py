"""The analysis settings (``params.yaml`` ``analysis:``, checked by the config schema), their
defaults, and the :class:`~trainmap.dynamics.hmm.estimator.TrainingHMM` they configure.

Its own module so that every analysis step (:mod:`~trainmap.dynamics.pipeline`,
:mod:`~trainmap.dynamics.joint`) reads the same defaults without importing another step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainmap.dynamics.hmm.curves import DEFAULT_REPRODUCE_ARI, DEFAULT_REPRODUCE_SHARE
from trainmap.dynamics.hmm.estimator import TrainingHMM
from trainmap.dynamics.hmm.selection import DEFAULT_FOLDS, DEFAULT_HALF_SIZE

HMM_SETTINGS = ("k_max", "restarts", "holdout", "selection", "folds", "halves", "reproduce_ari",
                "reproduce_share", "reproduce_k", "half_size", "covariance_type",
                "standardisation", "restart_rule", "init", "emission", "n_iter", "tol", "tol_scale", "min_covar",
                "n_jobs", "features")  # fmt: skip
#: The analysis settings and their defaults (params.yaml ``analysis`` documents each).
ANALYSIS_DEFAULTS = {
    "k_max": 8,
    "restarts": 5,
    "holdout": 0.2,
    "selection": "reproducible",
    "folds": DEFAULT_FOLDS,
    "halves": None,
    "reproduce_ari": DEFAULT_REPRODUCE_ARI,
    "reproduce_share": DEFAULT_REPRODUCE_SHARE,
    "reproduce_k": "largest",
    "half_size": DEFAULT_HALF_SIZE,
    "seed": 0,
    "covariance_type": "full",
    "standardisation": "pooled",
    "restart_rule": "best",
    "init": "sticky",
    "emission": "plain",
    "n_iter": 500,
    "tol": 1e-3,
    "tol_scale": "per_observation",
    "checkpoints_per_run": None,
    "first_n": None,
    "nan_runs": "features",
    "baseline_k_max": 16,
    "alpha": 0.05,
    "dissimilarity": "total_variation",
    "bootstrap": 200,
    "bootstrap_iter": 10,
    "permutations": 2000,
    "confidence": 0.95,
    "stability": 20,
    "stability_step": 8,
    "stability_max_fraction": 0.8,
    "stability_ari": 0.9,
    "stability_share": 0.9,
}


def with_defaults(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` completed with :data:`ANALYSIS_DEFAULTS`."""
    return ANALYSIS_DEFAULTS | dict(settings)


def make_hmm(settings: Mapping[str, Any]) -> TrainingHMM:
    """An unfitted :class:`TrainingHMM` from analysis settings (``seed`` is the random state)."""
    settings = with_defaults(settings)
    kwargs = {key: settings[key] for key in HMM_SETTINGS if key in settings}
    return TrainingHMM(random_state=settings["seed"], **kwargs)
