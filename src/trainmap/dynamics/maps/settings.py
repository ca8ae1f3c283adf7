"""The analysis settings (``params.yaml`` ``analysis:``), their defaults, and the
:class:`~trainmap.dynamics.maps.hmm.estimator.TrainingHMM` they configure.

Each setting's type, allowed values and default are declared once, in the config schema
(``workflow/schemas/config.schema.yaml``, section ``analysis``): :data:`ANALYSIS_DEFAULTS` is read
from it, and so are :class:`TrainingHMM`'s keyword defaults and ``python -m trainmap.dynamics``'s
options. ``params.yaml`` repeats every default (DVC sets a key only where it is written), and
tests/unit/test_defaults.py checks that it repeats them exactly. Its own module so that every
analysis step (:mod:`~trainmap.dynamics.pipeline`, :mod:`~trainmap.dynamics.verdicts.joint`) reads the same
defaults without importing another step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.schema import section_defaults

HMM_SETTINGS = ("k_max", "restarts", "holdout", "selection", "folds", "min_gain", "halves",
                "reproduce_ari",
                "reproduce_share", "reproduce_k", "half_size", "covariance_type",
                "standardisation", "restart_rule", "init", "emission", "n_iter", "tol", "tol_scale", "min_covar",
                "n_jobs", "features")  # fmt: skip
#: The analysis settings and their defaults: the schema's, in its order. ``min_covar``, ``n_jobs``
#: and ``features`` have none there (nor in params.yaml): they take :class:`TrainingHMM`'s.
ANALYSIS_DEFAULTS: dict[str, Any] = section_defaults("analysis")


def with_defaults(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` completed with :data:`ANALYSIS_DEFAULTS`."""
    return ANALYSIS_DEFAULTS | dict(settings)


def make_hmm(settings: Mapping[str, Any]) -> TrainingHMM:
    """An unfitted :class:`TrainingHMM` from analysis settings (``seed`` is the random state)."""
    settings = with_defaults(settings)
    kwargs = {key: settings[key] for key in HMM_SETTINGS if key in settings}
    return TrainingHMM(random_state=settings["seed"], **kwargs)
