"""Every exit of every emission model's fit leaves what the selection reads: a row with the fit's
iterations and convergence, its scores or the failed-fit marker, never an AttributeError (which
path a fit takes can hang on the CPU's arithmetic)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainmap.dynamics.maps.hmm.estimator import standardise_runs
from trainmap.dynamics.maps.hmm.factory import (
    EMISSIONS,
    emission_model,
    model_parameters,
    quietly,
    start_from,
)
from trainmap.dynamics.maps.hmm.gaussian import BatchedGaussianHMM
from trainmap.dynamics.maps.hmm.selection import _fit_alone, _scored_fit
from trainmap.dynamics.maps.hmm.splits import stack
from trainmap.dynamics.maps.synthetic import sample_runs
from trainmap.dynamics.metrics.columns import METRIC_NAMES


@pytest.fixture(scope="module")
def data() -> tuple[tuple[np.ndarray, list[int]], dict]:
    """Six standardised known-answer runs (3 states, 4 metrics) and a plain K = 3 fit's
    parameters."""
    runs, _, _ = sample_runs(3, n_runs=6, length=60, seed=0, nuisance=1.0)
    names = list(METRIC_NAMES[:4])
    z, _ = standardise_runs({run: table[names].to_numpy(float) for run, table in runs.items()},
                            "pooled")  # fmt: skip
    train = stack([z[run] for run in sorted(z)])
    with quietly():
        plain = BatchedGaussianHMM(3, "full", n_iter=30, random_state=0).fit(*train)
    return train, model_parameters(plain)


def _model(emission: str, n_iter: int):
    return emission_model(3, emission, covariance_type="full", n_iter=n_iter, tol=1e-3,
                          random_state=0)  # fmt: skip


def _row(model, train) -> tuple[bool, dict]:
    completed = _fit_alone(model, train, None)
    return completed, _scored_fit(model, 0, train, train, (None, None), True, completed)


@pytest.mark.parametrize("emission", EMISSIONS)
def test_a_fit_that_converges_or_stops_at_its_iteration_cap_is_scored(emission, data) -> None:
    train, _ = data
    completed, row = _row(_model(emission, 300), train)
    assert completed and row["converged"] and row["iterations"] >= 1
    assert math.isfinite(row["train_log_likelihood"]) and math.isfinite(row["bic"])
    completed, row = _row(_model(emission, 1), train)  # stopped early: one EM step a round
    assert completed and not row["converged"] and row["iterations"] >= 1
    assert math.isfinite(row["train_log_likelihood"])


@pytest.mark.parametrize("emission", EMISSIONS)
def test_a_fit_that_leaves_a_state_without_mass_is_a_failed_fit(emission, data) -> None:
    """A state started 50 standard units away from every checkpoint gets no mass: EM's M-step
    gives it NaN parameters. The fit is scored as failed (no likelihood), with its iterations."""
    train, parameters = data
    far = dict(parameters, means=parameters["means"].copy())
    far["means"][2] = 50.0
    model = start_from(emission_model(3, emission, covariance_type="full", n_iter=20,
                                      init_params="", random_state=0), far)  # fmt: skip
    completed, row = _row(model, train)
    assert not completed
    assert isinstance(row["iterations"], int) and row["iterations"] >= 0
    assert not math.isfinite(row["train_log_likelihood"])
