"""The models a selection fits: the emission setting's model with the estimator's EM settings, and
where its EM starts.

An emission model (setting ``emission``, :data:`EMISSIONS`) is a class:
``plain``, the paper's Gaussian HMM (Hu et al., sec. 2.1;
:class:`~trainmap.dynamics.maps.hmm.gaussian.BatchedGaussianHMM`), or ``run_offset``,
``run_offset_drift`` and ``run_affine``, the same with per-run terms
(:class:`~trainmap.dynamics.maps.hmm.run_terms.RunOffsetHMM`), or ``student_t``, Student-t
emissions (:class:`~trainmap.dynamics.maps.hmm.student_t.StudentTHMM`). :func:`make_model` is the one place
that name becomes a model; model selection then asks the model, never the name. EM starts from
:func:`initialise` (the sticky start, appendix C's k-means means) or from a fitted model's
parameters (:func:`start_from`; :func:`in_units` re-expresses them in another standardisation's
units, as a bootstrap resample's).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainmap.schema import section_defaults

COVARIANCE_TYPES = ("full", "diag")
INITIALISATIONS = ("sticky", "hmmlearn")
#: What EM's ``tol`` is measured on: the training log-likelihood per observation
#: (``per_observation``, trainmap's: one tolerance whatever the number of runs) or in total
#: (``total``, hmmlearn's own ``tol``, which the training-maps authors' script left at 0.01).
TOL_SCALES = ("per_observation", "total")
#: Emission models (setting ``emission``): the paper's Gaussian HMM (``plain``), and the Gaussian
#: HMM with a per-run offset (``run_offset``), a per-run offset and linear drift
#: (``run_offset_drift``) and a per-run offset, linear drift and scale (``run_affine``) of
#: :mod:`trainmap.dynamics.maps.hmm.run_terms`, and the HMM with multivariate Student-t emissions
#: (``student_t``, :mod:`trainmap.dynamics.maps.hmm.student_t`).
EMISSIONS = ("plain", "run_offset", "run_offset_drift", "run_affine", "student_t")
#: The Student-t emission's degrees of freedom nu (``emission: student_t``): the config schema's
#: default of ``analysis.degrees_of_freedom`` (bench/selection_growth.py;
#: docs/decisions/hmm-selection.md).
DEFAULT_DEGREES: float = section_defaults("analysis")["degrees_of_freedom"]


@dataclass(frozen=True)
class EMSettings:
    """The settings every EM fit of every K uses: the emission model and its EM (:func:`make_model`),
    where EM starts (``init``) and the seed the restarts' seeds derive from (``random_state``).
    :meth:`~trainmap.dynamics.maps.hmm.estimator.TrainingHMM.settings` makes it from the
    estimator's parameters of these names; plain values, so it travels to worker processes."""

    covariance_type: str
    init: str
    emission: str
    n_iter: int
    tol: float
    tol_scale: str
    min_covar: float
    random_state: int
    degrees_of_freedom: float = DEFAULT_DEGREES


def check_choice(key: str, value: Any, allowed: Sequence[str]) -> None:
    """Raise ValueError naming ``key``, the bad ``value`` and the allowed values."""
    if value not in allowed:
        raise ValueError(f"{key}: {value!r} is not allowed; choose one of {', '.join(allowed)}")


def emission_model(
    n_states: int, emission: str, degrees_of_freedom: float = DEFAULT_DEGREES, **kw: Any
) -> Any:
    """An unfitted model of the emission model ``emission`` (:data:`EMISSIONS`): a
    :class:`~trainmap.dynamics.maps.hmm.gaussian.BatchedGaussianHMM` (``plain``), a
    :class:`~trainmap.dynamics.maps.hmm.student_t.StudentTHMM` of ``degrees_of_freedom``
    (``student_t``) or a :class:`~trainmap.dynamics.maps.hmm.run_terms.RunOffsetHMM` (its other
    options at their defaults)."""
    # Imported here: hmmlearn imports scipy.stats and scikit-learn, which the refits' worker
    # processes would otherwise load at start (tests/unit/project/test_import_graph.py).
    from trainmap.dynamics.maps.hmm.gaussian import BatchedGaussianHMM
    from trainmap.dynamics.maps.hmm.run_terms import RunOffsetHMM

    check_choice("emission", emission, EMISSIONS)
    if emission == "plain":
        return BatchedGaussianHMM(n_components=n_states, **kw)
    if emission == "student_t":
        from trainmap.dynamics.maps.hmm.student_t import StudentTHMM

        return StudentTHMM(n_components=n_states, degrees=degrees_of_freedom, **kw)
    return RunOffsetHMM(n_components=n_states, drift=emission in ("run_offset_drift", "run_affine"),
                        scale=emission == "run_affine", **kw)  # fmt: skip


def make_model(n_states: int, settings: EMSettings, n_observations: int, **kw: Any) -> Any:
    """An unfitted model of the settings' emission model (:func:`emission_model`) with the
    estimator's EM settings."""
    per_observation = settings.tol_scale == "per_observation"
    return emission_model(
        n_states,
        settings.emission,
        degrees_of_freedom=settings.degrees_of_freedom,
        covariance_type=settings.covariance_type,
        n_iter=settings.n_iter,
        # hmmlearn's tol is on the total log-likelihood; ours is per observation by default.
        tol=settings.tol * (n_observations if per_observation else 1),
        min_covar=settings.min_covar,
        **kw,
    )


@contextmanager
def quietly() -> Iterator[None]:
    """hmmlearn without its chatter: it logs every EM step that lowers the likelihood by rounding
    (fits are judged by their final likelihood instead) and warns about convergence and
    degenerate fits (judged by :func:`~trainmap.dynamics.maps.hmm.selection.training_score`)."""
    logging.getLogger("hmmlearn").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def initialise(model: Any, train: tuple[np.ndarray, list[int]], seed: int) -> Any:
    """Start EM from k-means means (one seeded k-means run per restart), the pooled covariance,
    uniform start probabilities and a *sticky* transition matrix.

    hmmlearn's default draws the transition matrix from Dirichlet(1/K), which is nearly one-hot:
    a run then "must" jump every step, and EM often stays in that basin. Training runs stay in a
    state for many checkpoints, so each state starts with self-transition 1 - K / T (T: the mean
    run length, i.e. K states visited per run) and the rest spread evenly. hmmlearn's k-means takes
    the best of 10 inits by inertia, which makes every restart start from nearly the same means; one
    k-means run per restart, seeded by the restart, makes the restarts differ.
    """
    from sklearn.cluster import KMeans

    x, lengths = train
    n_states = model.n_components
    model.means_ = KMeans(n_clusters=n_states, n_init=1, random_state=seed).fit(x).cluster_centers_
    model.startprob_ = np.full(n_states, 1.0 / n_states)
    if n_states == 1:
        model.transmat_ = np.ones((1, 1))
    else:
        stay = max(0.5, 1.0 - n_states / float(np.mean(lengths)))
        model.transmat_ = np.full((n_states, n_states), (1.0 - stay) / (n_states - 1))
        np.fill_diagonal(model.transmat_, stay)
    model.init_params = "c"  # hmmlearn sets the covariances from the data; the rest is set here
    return model


def model_parameters(model: Any) -> dict[str, np.ndarray]:
    """A fitted model's parameters as plain arrays (covariances in their own shape)."""
    return {"startprob": model.startprob_, "transmat": model.transmat_, "means": model.means_,
            "covars": covars_in_own_shape(model)}  # fmt: skip


def in_units(
    parameters: Mapping[str, np.ndarray], shift: np.ndarray, scale: np.ndarray, covariance_type: str
) -> dict[str, np.ndarray]:
    """``parameters`` re-expressed in other standard units, z = (z_reference - shift) / scale
    (:func:`~trainmap.dynamics.maps.hmm.estimator.unit_change`)."""
    covars = parameters["covars"]
    if covariance_type == "full":
        covars = covars / scale[None, :, None] / scale[None, None, :]
    else:
        covars = covars / scale[None, :] ** 2
    return {"startprob": parameters["startprob"].copy(), "transmat": parameters["transmat"].copy(),
            "means": (parameters["means"] - shift) / scale, "covars": covars}  # fmt: skip


def start_from(model: Any, parameters: Mapping[str, np.ndarray]) -> Any:
    """``model`` (made with ``init_params=""``) set to ``parameters``, ready to continue EM."""
    model.startprob_ = parameters["startprob"]
    model.transmat_ = parameters["transmat"]
    model.means_ = parameters["means"]
    # As hmmlearn's M-step does: a fitted model's covariances may be singular to rounding (a state
    # of K_max holding a handful of checkpoints), which the public setter would refuse.
    model._covars_ = parameters["covars"]
    model.n_features = parameters["covars"].shape[-1]
    return model


def covars_in_own_shape(model: Any) -> np.ndarray:
    """The covariances in the shape the ``covars_`` setter of the covariance type takes."""
    full = model.covars_  # hmmlearn's getter always returns [K, d, d]
    kind = model.covariance_type
    if kind == "full":
        return full
    if kind == "diag":
        return np.diagonal(full, axis1=1, axis2=2).copy()
    if kind == "spherical":
        return full[:, 0, 0].copy()
    return full[0]  # tied
