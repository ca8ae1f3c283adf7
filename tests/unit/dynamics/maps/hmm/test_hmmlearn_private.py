"""hmmlearn's private code that trainmap.dynamics.maps.hmm calls, checked against the installed release:
an hmmlearn outside the range pyproject.toml allows (tested: 0.3.3) fails here by name, before a
fit fails in some other way. The range is bounded because a release may change any of these."""

from __future__ import annotations

import inspect

import hmmlearn
import numpy as np
from hmmlearn import _hmmc
from hmmlearn.base import BaseHMM
from hmmlearn.hmm import GaussianHMM

#: ``_hmmc``'s functions and their positional arguments, as trainmap calls them.
HMMC = {"forward_log": 3, "backward_log": 3, "compute_log_xi_sum": 4, "viterbi": 3}
#: The private methods of hmmlearn's estimators trainmap overrides or calls.
METHODS = ("_do_estep", "_do_mstep", "_compute_log_likelihood", "_initialize_sufficient_statistics",
           "_accumulate_sufficient_statistics", "_init", "_check", "_get_n_fit_scalars_per_param")  # fmt: skip


def test_the_installed_hmmlearn_is_in_the_tested_range():
    major, minor, patch = (int(part) for part in hmmlearn.__version__.split(".")[:3])
    assert (major, minor) == (0, 3) and patch >= 3, hmmlearn.__version__


def test_every_private_function_and_method_trainmap_uses_exists():
    for name in HMMC:
        assert callable(getattr(_hmmc, name, None)), f"hmmlearn._hmmc.{name}"
    for name in METHODS:
        assert callable(getattr(GaussianHMM, name, None)), f"GaussianHMM.{name}"
    assert "lengths" in inspect.signature(BaseHMM._do_estep).parameters


def test_the_compiled_recursions_take_trainmaps_arguments_and_agree():
    """forward_log and backward_log on a two-state chain give the same log-likelihood, and viterbi
    the path a hand computation gives (the calling convention trainmap relies on)."""
    startprob = np.array([0.6, 0.4])
    transmat = np.array([[0.9, 0.1], [0.2, 0.8]])
    frames = np.log(np.array([[0.7, 0.1], [0.6, 0.2], [0.01, 0.9]]))
    log_likelihood, log_alpha = _hmmc.forward_log(startprob, transmat, frames)
    log_beta = _hmmc.backward_log(startprob, transmat, frames)
    np.testing.assert_allclose(np.logaddexp.reduce(log_alpha[0] + log_beta[0]), log_likelihood)
    xi = np.exp(_hmmc.compute_log_xi_sum(log_alpha, transmat, log_beta, frames))
    np.testing.assert_allclose(xi.sum(), len(frames) - 1)
    _, path = _hmmc.viterbi(startprob, transmat, frames)
    assert list(path) == [0, 0, 1]
