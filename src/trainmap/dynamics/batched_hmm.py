"""hmmlearn's ``GaussianHMM`` with its E-step vectorised over runs (same numbers, ~4x faster).

hmmlearn's Baum-Welch E-step loops over the sequences in Python and, for each one, recomputes
every state's Cholesky factor, the log-densities, the forward and backward lattices and the
sufficient statistics (for full covariances an ``einsum`` per sequence). A training map fits many
short sequences (40 runs x 200-300 checkpoints), so that per-sequence overhead dominates:
bench/hmm_select.py measures hmmlearn's E-step against this one side by side.

:class:`BatchedGaussianHMM` overrides only ``_do_estep`` and ``score``: the emission log-densities
of all observations in one call per iteration, the forward-backward recursions for all runs of
equal length at once (scaled, in probability space; Rabiner 1989, eqs. 91-93), and the statistics
as matrix products; ``score`` (hence ``bic``/``aic``) uses the same forward pass. Initialisation,
the M-step, priors, the convergence monitor and Viterbi are hmmlearn's own, so a fit gives
hmmlearn's result (tests/test_dynamics_hmm.py checks the statistics against hmmlearn's E-step to
1e-9). For full covariances the log-densities are two matrix products, <x x', P_k> - 2 x' P_k mu_k +
mu_k' P_k mu_k, with every observation's x x' computed once per fit; the same x x' give the
M-step's second moments in one product. Where the scaled recursion of a group of runs underflows
(a run the model finds impossible), that group runs in log space, run by run, with hmmlearn's C
kernels (hmmlearn itself would redo every run of the E-step in Python).

Runs may carry integer weights (:meth:`BatchedGaussianHMM.fit_weighted`,
:meth:`~BatchedGaussianHMM.score_weighted`): a bootstrap resample draws runs with replacement, and a
run drawn three times contributes three times its statistics, computed once.

The override relies on hmmlearn's internal statistics layout (``nobs``, ``start``, ``trans``,
``post``, ``obs``, ``obs**2`` / ``obs*obs.T``), pinned by uv.lock (hmmlearn 0.3.3).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from hmmlearn import _hmmc
from hmmlearn.hmm import GaussianHMM


def scaled_forward(
    log_frames: np.ndarray, startprob: np.ndarray, transmat: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Scaled forward pass of ``n`` runs of equal length at once (Rabiner 1989, eqs. 91-92).

    ``log_frames`` [n, T, K] holds log p(z_t | s_t = k). Returns, time-major, the normalised
    forward variables p(s_t | z_1:t) [T, n, K], the scaling factors [T, n], the per-step shifts of
    the log-densities [T, n] (the first step's shift includes log pi), their exponentials
    [T, n, K] (the first step's unused by the recursions), and which runs failed [n]: a scaling
    factor underflowed to zero (their other results are meaningless; every run is computed on
    its own rows, so the others are exact). The log-likelihood of run i is
    ``log(scale[:, i]).sum() + shift[:, i].sum()``.
    """
    frames = np.ascontiguousarray(log_frames.transpose(1, 0, 2))  # time-major: one slab per step
    shift = frames.max(axis=2)
    with np.errstate(divide="ignore"):
        # The first step is shifted by its largest term log pi_k + log p(z_0 | k), not by the
        # largest density alone: a run whose likeliest first state the model rarely starts in
        # would underflow there (measured: nearly every underflow of a fit from k-means starts).
        first = np.log(startprob)[None, :] + frames[0]
        shift[0] = first.max(axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        emission = np.exp(frames - shift[:, :, None])
    alpha = np.empty_like(emission)
    scale = np.empty(shift.shape)
    current = np.exp(first - shift[0][:, None])  # pi_k p(z_0 | k), scaled
    with np.errstate(divide="ignore", invalid="ignore"):
        for t in range(len(frames)):
            if t:
                np.matmul(alpha[t - 1], transmat, out=current)
                current *= emission[t]
            np.add.reduce(current, axis=1, out=scale[t])
            np.divide(current, scale[t][:, None], out=alpha[t])
    failed = ~(scale > 0).all(axis=0)
    return alpha, scale, shift, emission, failed


def forward_backward(
    log_frames: np.ndarray,
    startprob: np.ndarray,
    transmat: np.ndarray,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scaled forward-backward of ``n`` runs of equal length at once (Rabiner 1989, eqs. 91-93).

    ``log_frames`` [n, T, K] holds log p(z_t | s_t = k). Returns the posteriors p(s_t | z_1:T)
    [n, T, K], the expected transition counts summed over runs (times their ``weights``) and time
    [K, K], and each run's log-likelihood [n]. Runs whose scaled recursion underflows (a run the
    model finds impossible) are redone in log space (:func:`log_forward_backward`).
    """
    alpha, scale, shift, emission, failed = scaled_forward(log_frames, startprob, transmat)
    if failed.all():
        return log_forward_backward(log_frames, startprob, transmat, weights)
    length, _, n_states = emission.shape
    beta = np.empty_like(emission)
    beta[-1] = 1.0
    step = np.empty_like(emission[0])
    transposed = np.ascontiguousarray(transmat.T)
    with np.errstate(divide="ignore", invalid="ignore"):
        for t in range(length - 2, -1, -1):
            np.multiply(beta[t + 1], emission[t + 1], out=step)
            np.matmul(step, transposed, out=beta[t])
            beta[t] /= scale[t + 1][:, None]
        posteriors = (alpha * beta).transpose(1, 0, 2)
        log_likelihood = np.log(scale).sum(axis=0) + shift.sum(axis=0)
    transitions = np.zeros((n_states, n_states))
    counted = np.where(failed, 0.0, 1.0) if weights is None else np.where(failed, 0.0, weights)
    if length > 1:
        with np.errstate(invalid="ignore"):
            arrivals = emission[1:] * beta[1:] / scale[1:, :, None]
        arrivals[:, failed] = 0.0
        arrivals *= counted[None, :, None]
        alpha[:, failed] = 0.0
        transitions = transmat * np.tensordot(alpha[:-1], arrivals, axes=([0, 1], [0, 1]))
    if failed.any():
        redone = log_forward_backward(log_frames[failed], startprob, transmat,
                                      None if weights is None else weights[failed])  # fmt: skip
        posteriors[failed], log_likelihood[failed] = redone[0], redone[2]
        transitions = transitions + redone[1]
    return posteriors, transitions, log_likelihood


def log_forward(
    log_frames: np.ndarray, startprob: np.ndarray, transmat: np.ndarray
) -> tuple[float, np.ndarray]:
    """One run's forward pass in log space (hmmlearn's C kernel): its log-likelihood and
    log alpha [T, K]. For runs whose scaled recursion underflows (:func:`scaled_forward`)."""
    return _hmmc.forward_log(startprob, transmat, np.ascontiguousarray(log_frames))


def log_forward_backward(
    log_frames: np.ndarray,
    startprob: np.ndarray,
    transmat: np.ndarray,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`forward_backward` in log space, run by run (hmmlearn's C kernels, as its own
    ``_fit_log``): the same three results, for runs whose scaled recursion underflows."""
    n_runs, _, n_states = log_frames.shape
    posteriors = np.empty_like(log_frames)
    transitions = np.zeros((n_states, n_states))
    log_likelihood = np.empty(n_runs)
    for i, frames in enumerate(log_frames):
        frames = np.ascontiguousarray(frames)
        log_likelihood[i], log_alpha = _hmmc.forward_log(startprob, transmat, frames)
        log_beta = _hmmc.backward_log(startprob, transmat, frames)
        log_gamma = log_alpha + log_beta
        log_gamma -= log_gamma.max(axis=1, keepdims=True)
        gamma = np.exp(log_gamma)
        posteriors[i] = gamma / gamma.sum(axis=1, keepdims=True)
        if len(frames) > 1:
            with np.errstate(under="ignore"):
                xi = np.exp(_hmmc.compute_log_xi_sum(log_alpha, transmat, log_beta, frames))
            transitions += xi * (1.0 if weights is None else weights[i])
    return posteriors, transitions, log_likelihood


def runs_of_equal_length(lengths: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each distinct length: the positions of its runs in ``lengths`` and their row indices
    [n, T] in ``X`` (the runs concatenated in the order of ``lengths``)."""
    lengths = np.asarray(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    groups = []
    for length in np.unique(lengths):
        positions = np.flatnonzero(lengths == length)
        groups.append((positions, starts[positions][:, None] + np.arange(length)[None, :]))
    return groups


def run_log_likelihoods(
    log_frames: np.ndarray, startprob: np.ndarray, transmat: np.ndarray, lengths: Any
) -> np.ndarray:
    """log p(run) of every run [R] (``log_frames`` [N, K] of the runs concatenated in the order
    of ``lengths``): the scaled forward pass of each group of equal-length runs, the runs it
    cannot hold in log space."""
    log_likelihood = np.empty(len(np.asarray(lengths)))
    for positions, rows in runs_of_equal_length(lengths):
        _, scale, shift, _, failed = scaled_forward(log_frames[rows], startprob, transmat)
        with np.errstate(divide="ignore"):
            per_run = np.log(scale).sum(axis=0) + shift.sum(axis=0)
        for i in np.flatnonzero(failed):  # underflow: these runs in log space
            per_run[i] = log_forward(log_frames[rows][i], startprob, transmat)[0]
        log_likelihood[positions] = per_run
    return log_likelihood


@functools.cache
def _upper_triangle(n_features: int) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Row and column indices of a d x d matrix's upper triangle (diagonal included), and which
    of them lie off the diagonal."""
    rows, columns = np.triu_indices(n_features)
    return (rows, columns), rows != columns


# The last few arrays' outer products (weak reference to the array, its products): EM passes the
# same array to every E-step of a fit, and a selection fits every K on the same stacked runs.
_OUTER_CACHE: list[tuple[weakref.ref, np.ndarray]] = []
_OUTER_CACHE_SIZE = 2  # a split's training and held-out runs


def outer_products(X: np.ndarray) -> np.ndarray:
    """x_t x_t' of every observation of ``X`` [T, d], its upper triangle row by row
    [T, d (d + 1) / 2]; remembered for the last :data:`_OUTER_CACHE_SIZE` arrays while they live."""
    for reference, outer in _OUTER_CACHE:
        if reference() is X:
            return outer
    upper, _ = _upper_triangle(X.shape[1])
    outer = X[:, upper[0]] * X[:, upper[1]]
    _OUTER_CACHE[:] = [entry for entry in _OUTER_CACHE if entry[0]() is not None]
    _OUTER_CACHE.insert(0, (weakref.ref(X), outer))
    del _OUTER_CACHE[_OUTER_CACHE_SIZE:]
    return outer


class BatchedGaussianHMM(GaussianHMM):
    """``hmmlearn.hmm.GaussianHMM`` whose E-step and score handle all runs together (module
    docstring)."""

    _run_weights: np.ndarray | None = None

    def _compute_log_likelihood(self, X: np.ndarray) -> np.ndarray:
        """log N(x_t | mu_k, Sigma_k) for every observation and state [T, K]; for full
        covariances all states in one batched Cholesky and one matrix product (hmmlearn solves a
        triangular system per state), falling back to hmmlearn where a Cholesky fails."""
        if self.covariance_type != "full":
            return super()._compute_log_likelihood(X)
        try:
            cholesky = np.linalg.cholesky(self._covars_)
        except np.linalg.LinAlgError:
            return super()._compute_log_likelihood(X)
        inverse = np.linalg.inv(cholesky)  # L_k^-1, [K, d, d]
        precision = inverse.transpose(0, 2, 1) @ inverse  # Sigma_k^-1 = L_k^-T L_k^-1
        pulled = precision @ self.means_[:, :, None]  # Sigma_k^-1 mu_k, [K, d, 1]
        # (x - mu)' P (x - mu) = <x x', P> - 2 x' P mu + mu' P mu: two matrix products over all
        # observations, x x' computed once per array (outer_products, upper triangle only, so
        # the off-diagonal entries of P count twice).
        upper, off_diagonal = _upper_triangle(X.shape[1])
        packed = precision[:, upper[0], upper[1]] * np.where(off_diagonal, 2.0, 1.0)
        squared = (outer_products(X) @ packed.T
                   - 2 * X @ pulled[:, :, 0].T
                   + (self.means_[:, None, :] @ pulled)[:, 0, 0][None, :])  # fmt: skip
        log_det = 2 * np.log(np.diagonal(cholesky, axis1=1, axis2=2)).sum(axis=1)
        return -0.5 * (X.shape[1] * np.log(2 * np.pi) + log_det[None, :] + squared)

    def fit_weighted(self, X: np.ndarray, lengths: Any, weights: Any) -> BatchedGaussianHMM:
        """``fit`` where run i (in ``lengths`` order) counts ``weights[i]`` times."""
        with self._weighted_runs(weights):
            return self.fit(X, lengths)

    def score_weighted(self, X: np.ndarray, lengths: Any, weights: Any) -> float:
        """``score`` where run i (in ``lengths`` order) counts ``weights[i]`` times."""
        with self._weighted_runs(weights):
            return self.score(X, lengths)

    @contextmanager
    def _weighted_runs(self, weights: Any) -> Iterator[None]:
        """Run weights for the E- and M-steps inside the block; none after it."""
        self._run_weights = np.asarray(weights, dtype=float)
        try:
            yield
        finally:
            self._run_weights = None

    def _weights(self, lengths: Any) -> np.ndarray:
        n_runs = len(np.asarray(lengths))
        return np.ones(n_runs) if self._run_weights is None else self._run_weights

    def score(self, X: np.ndarray, lengths: Any = None) -> float:
        """log p(X) under the model, by the forward pass of all runs at once (hmmlearn's
        ``score``, which ``bic`` and ``aic`` call, loops over the runs)."""
        from sklearn.utils import check_array

        self._check()
        X = check_array(X)
        lengths = [len(X)] if lengths is None else lengths
        weights = self._weights(lengths)
        log_frames = self._compute_log_likelihood(X)
        per_run = run_log_likelihoods(log_frames, self.startprob_, self.transmat_, lengths)
        return float(weights @ per_run)

    def _do_estep(self, X: np.ndarray, lengths: Any) -> tuple[dict, float]:
        if not (np.isfinite(self.means_).all() and np.isfinite(self.transmat_).all()):
            # hmmlearn's M-step gave a state no mass (0 / 0): EM would go on with NaN
            # parameters to n_iter, a failed fit either way (measured: 970 of a default-study
            # map's 2,276 E-steps, 30 % of its fit time).
            raise ValueError("EM left a state without mass (NaN parameters)")
        stats = self._initialize_sufficient_statistics()
        self._estep_begin()
        weights = self._weights(lengths)
        log_frames = self._compute_log_likelihood(X)
        posteriors = np.empty_like(log_frames)
        log_likelihood = 0.0
        for positions, rows in runs_of_equal_length(lengths):
            w = weights[positions]
            weighted = None if self._run_weights is None else w
            gamma, transitions, run_log_likelihood = forward_backward(
                log_frames[rows], self.startprob_, self.transmat_, weighted
            )
            if self._run_weights is not None:
                gamma = gamma * w[:, None, None]
            posteriors[rows] = gamma
            stats["start"] += gamma[:, 0].sum(axis=0)
            stats["trans"] += transitions
            log_likelihood += float(w @ run_log_likelihood)
        stats["nobs"] = float(weights.sum())
        stats["post"] = posteriors.sum(axis=0)
        stats["obs"] = posteriors.T @ X
        if self.covariance_type in ("spherical", "diag"):
            stats["obs**2"] = posteriors.T @ X**2
        else:
            upper, _ = _upper_triangle(X.shape[1])
            second = np.empty((self.n_components, X.shape[1], X.shape[1]))
            second[:, upper[0], upper[1]] = posteriors.T @ outer_products(X)
            second[:, upper[1], upper[0]] = second[:, upper[0], upper[1]]
            stats["obs*obs.T"] = second
        return stats, log_likelihood
