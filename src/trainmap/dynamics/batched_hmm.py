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
1e-9). Where the scaled recursion underflows (a run the model finds impossible), the call falls back
to hmmlearn's log-space code.

Runs may carry integer weights (:meth:`BatchedGaussianHMM.fit_weighted`,
:meth:`~BatchedGaussianHMM.score_weighted`): a bootstrap resample draws runs with replacement, and a
run drawn three times contributes three times its statistics, computed once.

The override relies on hmmlearn's internal statistics layout (``nobs``, ``start``, ``trans``,
``post``, ``obs``, ``obs**2`` / ``obs*obs.T``), pinned by uv.lock (hmmlearn 0.3.3).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from hmmlearn.hmm import GaussianHMM


def forward(
    log_frames: np.ndarray, startprob: np.ndarray, transmat: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Scaled forward pass of ``n`` runs of equal length at once (Rabiner 1989, eqs. 91-92).

    ``log_frames`` [n, T, K] holds log p(z_t | s_t = k). Returns, time-major, the normalised
    forward variables p(s_t | z_1:t) [T, n, K], the scaling factors [T, n], the per-step shifts of
    the log-densities [T, n] and their exponentials [T, n, K]; ``None`` when a scaling factor
    underflows to zero. The log-likelihood of run i is ``log(scale[:, i]).sum() + shift[:, i].sum()``.
    """
    frames = np.ascontiguousarray(log_frames.transpose(1, 0, 2))  # time-major: one slab per step
    shift = frames.max(axis=2)
    emission = np.exp(frames - shift[:, :, None])
    alpha = np.empty_like(emission)
    scale = np.empty(shift.shape)
    current = startprob * emission[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        for t in range(len(frames)):
            if t:
                np.matmul(alpha[t - 1], transmat, out=current)
                current *= emission[t]
            np.add.reduce(current, axis=1, out=scale[t])
            np.divide(current, scale[t][:, None], out=alpha[t])
    if not (scale > 0).all():
        return None
    return alpha, scale, shift, emission


def forward_backward(
    log_frames: np.ndarray,
    startprob: np.ndarray,
    transmat: np.ndarray,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Scaled forward-backward of ``n`` runs of equal length at once.

    ``log_frames`` [n, T, K] holds log p(z_t | s_t = k). Returns the posteriors p(s_t | z_1:T)
    [n, T, K], the expected transition counts summed over runs (times their ``weights``) and time
    [K, K], and each run's log-likelihood [n]; ``None`` when a scaling factor underflows to zero.
    """
    result = forward(log_frames, startprob, transmat)
    if result is None:
        return None
    alpha, scale, shift, emission = result
    length, _, n_states = emission.shape
    beta = np.empty_like(emission)
    beta[-1] = 1.0
    step = np.empty_like(emission[0])
    transposed = np.ascontiguousarray(transmat.T)
    for t in range(length - 2, -1, -1):
        np.multiply(beta[t + 1], emission[t + 1], out=step)
        np.matmul(step, transposed, out=beta[t])
        beta[t] /= scale[t + 1][:, None]
    posteriors = (alpha * beta).transpose(1, 0, 2)
    log_likelihood = np.log(scale).sum(axis=0) + shift.sum(axis=0)
    transitions = np.zeros((n_states, n_states))
    if length > 1:
        arrivals = emission[1:] * beta[1:] / scale[1:, :, None]
        if weights is not None:
            arrivals *= weights[None, :, None]
        transitions = transmat * np.tensordot(alpha[:-1], arrivals, axes=([0, 1], [0, 1]))
    return posteriors, transitions, log_likelihood


def _runs_of_equal_length(lengths: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each distinct length: the positions of its runs in ``lengths`` and their row indices
    [n, T] in ``X`` (the runs concatenated in the order of ``lengths``)."""
    lengths = np.asarray(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    groups = []
    for length in np.unique(lengths):
        positions = np.flatnonzero(lengths == length)
        groups.append((positions, starts[positions][:, None] + np.arange(length)[None, :]))
    return groups


def _repeat_runs(X: np.ndarray, lengths: Any, weights: np.ndarray | None) -> tuple:
    """``X, lengths`` with run i repeated ``weights[i]`` times (unchanged without weights)."""
    if weights is None:
        return X, lengths
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    runs = [(start, length) for start, length, w in zip(starts, lengths, weights, strict=True)
            for _ in range(int(w))]  # fmt: skip
    return np.concatenate([X[a : a + n] for a, n in runs]), [n for _, n in runs]


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
        whitening = np.linalg.inv(cholesky).transpose(0, 2, 1)  # L_k^-T, [K, d, d]
        solved = X[None] @ whitening - (self.means_[:, None, :] @ whitening)  # [K, T, d]
        log_det = 2 * np.log(np.diagonal(cholesky, axis1=1, axis2=2)).sum(axis=1)
        squared = np.einsum("ktd,ktd->tk", solved, solved)
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
        total = 0.0
        for positions, rows in _runs_of_equal_length(lengths):
            result = forward(log_frames[rows], self.startprob_, self.transmat_)
            if result is None:  # underflow: hmmlearn's log-space code on the runs repeated
                return super().score(*_repeat_runs(X, lengths, self._run_weights))
            _, scale, shift, _ = result
            per_run = np.log(scale).sum(axis=0) + shift.sum(axis=0)
            total += float(weights[positions] @ per_run)
        return total

    def _do_estep(self, X: np.ndarray, lengths: Any) -> tuple[dict, float]:
        stats = self._initialize_sufficient_statistics()
        self._estep_begin()
        weights = self._weights(lengths)
        log_frames = self._compute_log_likelihood(X)
        posteriors = np.empty_like(log_frames)
        log_likelihood = 0.0
        for positions, rows in _runs_of_equal_length(lengths):
            w = weights[positions]
            result = forward_backward(log_frames[rows], self.startprob_, self.transmat_,
                                      None if self._run_weights is None else w)  # fmt: skip
            if result is None:  # underflow: hmmlearn's log-space code on the runs repeated
                return super()._do_estep(*_repeat_runs(X, lengths, self._run_weights))
            gamma, transitions, run_log_likelihood = result
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
            stats["obs*obs.T"] = np.stack(
                [(X * posteriors[:, [k]]).T @ X for k in range(self.n_components)]
            )
        return stats, log_likelihood
