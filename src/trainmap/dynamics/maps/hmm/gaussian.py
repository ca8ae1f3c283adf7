"""The Gaussian emission model: hmmlearn's ``GaussianHMM`` on the engine, many models in lockstep.

Hu et al. (sec. 2.1) model a training run's standardised metrics z_t with a Gaussian HMM:
p(z_t | s_t = k) = N(z_t; mu_k, Sigma_k). :class:`BatchedGaussianHMM` is hmmlearn's model with its
E-step and score on the engine (:mod:`~trainmap.dynamics.maps.hmm.forward_backward`): the densities of
all observations in one call, the recursions for all runs of equal length at once, and the
sufficient statistics as matrix products (:func:`gaussian_statistics`, the one function for every
model with Gaussian emissions, the per-run terms of :mod:`~trainmap.dynamics.maps.hmm.run_terms`
included). For full covariances the log-density is two matrix products,

    -2 log N(x; mu_k, Sigma_k) = d log 2 pi + <x x', P_k> - 2 x' P_k mu_k + mu_k' P_k mu_k
                                 + log det Sigma_k,   P_k = Sigma_k^-1,

with every observation's x x' computed once per array; the same x x' give the M-step's second
moments. Initialisation, the M-step, priors, the convergence monitor and Viterbi are hmmlearn's
own, so a fit gives hmmlearn's result (tests/unit/dynamics/maps/hmm/test_training_hmm.py checks the
statistics against hmmlearn's E-step to 1e-9). A model EM leaves without mass (NaN parameters)
stops at once.

Several models of the same runs (a selection's every K) fit in lockstep (:func:`fit_together`):
their states side by side in one E-step (:func:`estep_together`), each model converging on its
own, each fit the one it has alone. Posteriors below the smallest normal number count as 0.
Runs may carry weights (:meth:`BatchedGaussianHMM.fit_weighted`,
:meth:`~BatchedGaussianHMM.score_weighted`): a run drawn three times contributes three times its
statistics, computed once. Design and timings: docs/decisions/hmm-engine.md.

The statistics follow hmmlearn's internal layout (``nobs``, ``start``, ``trans``, ``post``,
``obs``, ``obs**2`` / ``obs*obs.T``), pinned by uv.lock (hmmlearn 0.3.3).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from hmmlearn import _hmmc
from hmmlearn.hmm import GaussianHMM
from scipy.linalg import block_diag

from trainmap.dynamics.maps.hmm.forward_backward import (
    TINY,
    forward_backward_runs,
    remembered,
    run_log_likelihoods,
    state_blocks,
    time_major,
)


@functools.cache
def _upper_triangle(n_features: int) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Row and column indices of a d x d matrix's upper triangle (diagonal included), and which
    of them lie off the diagonal."""
    rows, columns = np.triu_indices(n_features)
    return (rows, columns), rows != columns


def outer_products(X: np.ndarray) -> np.ndarray:
    """x_t x_t' of every observation of ``X`` [T, d], its upper triangle row by row
    [T, d (d + 1) / 2] (:func:`_outer_products`), :func:`remembered`."""
    return remembered("outer", X, lambda: _outer_products(X))


def _outer_products(X: np.ndarray) -> np.ndarray:
    """x_t x_t' of every observation, upper triangle row by row [T, d (d + 1) / 2], computed
    feature-major (one product of a feature with the features from it on per row of the
    triangle: 3x faster than gathering both factors; the result is that array transposed)."""
    features = np.ascontiguousarray(X.T)
    d = len(features)
    products = np.empty((d * (d + 1) // 2, X.shape[0]))
    start = 0
    for i in range(d):
        np.multiply(features[i], features[i:], out=products[start : start + d - i])
        start += d - i
    return products.T


class BatchedGaussianHMM(GaussianHMM):
    """``hmmlearn.hmm.GaussianHMM`` whose E-step and score handle all runs together (module
    docstring). What model selection asks of a model (its fit, its training objective, its run
    parameters, whether it fits in lockstep) it answers as
    :class:`~trainmap.dynamics.maps.hmm.selection.SelectableHMM` says."""

    #: Several models of the same runs fit in lockstep (:func:`fit_together`).
    fits_in_lockstep = True
    _run_weights: np.ndarray | None = None

    def _compute_log_likelihood(self, X: np.ndarray) -> np.ndarray:
        """log N(x_t | mu_k, Sigma_k) for every observation and state [T, K]
        (:func:`log_densities_together` of this one model)."""
        return log_densities_together([self], X)

    def _full_density_terms(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """For full covariances: (x - mu_k)' P_k (x - mu_k) + log det Sigma_k =
        <x x', P_k> - 2 x' P_k mu_k + (mu_k' P_k mu_k + log det Sigma_k), as the terms
        (packed upper triangle of P_k with off-diagonal entries doubled [K, d (d + 1) / 2],
        P_k mu_k [K, d], the constants [K]); all states in one batched Cholesky (hmmlearn solves a
        triangular system per state). None where a Cholesky fails (hmmlearn's code then)."""
        cholesky = cholesky_factors(self._covars_)
        if cholesky is None:
            return None
        inverse = np.linalg.inv(cholesky)  # L_k^-1, [K, d, d]
        precision = inverse.transpose(0, 2, 1) @ inverse  # Sigma_k^-1 = L_k^-T L_k^-1
        pulled = (precision @ self.means_[:, :, None])[:, :, 0]  # Sigma_k^-1 mu_k, [K, d]
        upper, off_diagonal = _upper_triangle(self.means_.shape[1])
        packed = precision[:, upper[0], upper[1]] * np.where(off_diagonal, 2.0, 1.0)
        log_det = 2 * np.log(np.diagonal(cholesky, axis1=1, axis2=2)).sum(axis=1)
        return packed, pulled, np.einsum("kd,kd->k", self.means_, pulled) + log_det

    def emission_terms(self, gaussian: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """From the Gaussian log-densities log N(x_t; mu_k, Sigma_k) [T, K]: the emission
        log-densities [T, K] and the weights of the posteriors gamma_t(k) in the moments of the
        M-step [T, K]. Here the same array and None (every observation counts by its posterior);
        :class:`~trainmap.dynamics.maps.hmm.student_t.StudentTHMM` gives the t densities and
        weighs each observation by its latent scale's expectation."""
        return gaussian, None

    def emission_log_densities(self, gaussian: np.ndarray) -> np.ndarray:
        """The emission log-densities [T, K] of :meth:`emission_terms`."""
        return self.emission_terms(gaussian)[0]

    def posterior_weights(self, gaussian: np.ndarray) -> np.ndarray | None:
        """The posteriors' weights [T, K] (or None) of :meth:`emission_terms`."""
        return self.emission_terms(gaussian)[1]

    def n_run_parameters(self, n_runs: int) -> int:
        """Free parameters of ``n_runs`` runs' own terms, counted in a held-out BIC: none here
        (:class:`~trainmap.dynamics.maps.hmm.run_terms.RunOffsetHMM` has some)."""
        return 0

    def residuals(self, X: np.ndarray, lengths: Any = None) -> np.ndarray:
        """The runs as the emission model sees them: ``X`` itself (no run terms; a
        :class:`~trainmap.dynamics.maps.hmm.run_terms.RunOffsetHMM` removes each run's)."""
        return X

    def training_objective(self, X: np.ndarray, lengths: Any, weights: Any = None) -> float:
        """What EM maximised, at the fitted parameters: the log-likelihood of the training runs
        (run i counted ``weights[i]`` times). Raises ValueError where EM left a state without
        mass."""
        return self.score(X, lengths) if weights is None else self.score_weighted(X, lengths,
                                                                                  weights)  # fmt: skip

    def fit_iterations(self) -> int:
        """EM iterations of the last fit."""
        return int(self.monitor_.iter)

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
        if not usable(self):
            raise ValueError("EM left a state without mass (NaN parameters)")
        return estep_together([self], X, lengths, self._run_weights)[0]

    def predict_runs(self, sequences: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The Viterbi state sequence of each run (hmmlearn's ``predict`` of each, its C kernel),
        the log-densities of all runs in one call (``predict`` computes them run by run)."""
        self._check()
        log_frames = self._compute_log_likelihood(np.concatenate(sequences))
        ends = np.cumsum([len(sequence) for sequence in sequences])
        return [_hmmc.viterbi(self.startprob_, self.transmat_,
                              np.ascontiguousarray(log_frames[end - len(sequence) : end]))[1]
                for sequence, end in zip(sequences, ends, strict=True)]  # fmt: skip


def cholesky_factors(covars: np.ndarray) -> np.ndarray | None:
    """The lower Cholesky factors L_k of full covariances ``covars`` [K, d, d], all states in one
    batched call (the densities' and the Student-t emission's log-determinants); None where some
    state's factorisation fails (hmmlearn's per-state code then)."""
    try:
        return np.linalg.cholesky(covars)
    except np.linalg.LinAlgError:
        return None


def usable(model: BatchedGaussianHMM) -> bool:
    """Whether EM can go on from ``model``: hmmlearn's M-step gives a state that received no mass
    NaN parameters (0 / 0), after which EM would run to ``n_iter`` on NaN, a failed fit either
    way."""
    return bool(np.isfinite(model.means_).all() and np.isfinite(model.transmat_).all())


def log_densities_together(models: Sequence[BatchedGaussianHMM], X: np.ndarray) -> np.ndarray:
    """The emission log-densities of every observation under every state of several models, their
    states side by side [T, S]: :func:`emission_terms` of
    :func:`gaussian_log_densities_together`."""
    return emission_terms(models, gaussian_log_densities_together(models, X))[0]


def emission_terms(
    models: Sequence[BatchedGaussianHMM], gaussian: np.ndarray
) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Each model's :meth:`~BatchedGaussianHMM.emission_terms` of its block of the Gaussian
    log-densities ``gaussian`` [T, S]: the emission log-densities [T, S], written over
    ``gaussian``'s blocks of the models whose emissions are not Gaussian (``gaussian`` itself is
    returned), and, for each model whose posteriors are weighted, its weights [T, K] by its
    position in ``models``."""
    firsts, _ = state_blocks([model.n_components for model in models])
    weights = {}
    for b, model in enumerate(models):
        states = slice(firsts[b], firsts[b] + model.n_components)
        block, model_weights = model.emission_terms(gaussian[:, states])
        if not np.shares_memory(block, gaussian):  # a model whose emissions are not Gaussian
            gaussian[:, states] = block
        if model_weights is not None:
            weights[b] = model_weights
    return gaussian, weights


def gaussian_log_densities_together(
    models: Sequence[BatchedGaussianHMM], X: np.ndarray
) -> np.ndarray:
    """log N(x_t | mu_k, Sigma_k) of every observation under every state of several models, their
    states side by side [T, S]. Full covariances: two matrix products over all observations for
    all models (:meth:`BatchedGaussianHMM._full_density_terms`; x x' computed once per array,
    :func:`outer_products`, its upper triangle only, so P's off-diagonal entries count twice);
    other covariance types, and a model whose Cholesky fails, hmmlearn's code per model."""
    firsts, _ = state_blocks([model.n_components for model in models])
    terms = [model._full_density_terms() if model.covariance_type == "full" else None
             for model in models]  # fmt: skip
    modelled = [b for b, term in enumerate(terms) if term is not None]
    values = None
    if modelled:
        packed, pulled, constant = (np.concatenate([terms[b][i] for b in modelled])
                                    for i in range(3))  # fmt: skip
        # -1/2 (d log 2 pi + <x x', P> - 2 x' P mu + mu' P mu + log det Sigma)
        values = outer_products(X) @ (-0.5 * packed.T)
        values += X @ pulled.T
        values += -0.5 * (X.shape[1] * np.log(2 * np.pi) + constant)[None, :]
        if len(modelled) == len(models):  # the usual case: already side by side
            return values
    columns = np.empty((len(X), sum(model.n_components for model in models)))
    start = 0
    for b in modelled:
        size = models[b].n_components
        columns[:, firsts[b] : firsts[b] + size] = values[:, start : start + size]
        start += size
    for b, term in enumerate(terms):
        if term is None:
            states = slice(firsts[b], firsts[b] + models[b].n_components)
            columns[:, states] = GaussianHMM._compute_log_likelihood(models[b], X)
    return columns


def gaussian_statistics(
    models: Sequence[BatchedGaussianHMM], posteriors: np.ndarray, X: np.ndarray,
    start: np.ndarray, transitions: np.ndarray, nobs: float, packed: bool = True,
) -> list[dict]:  # fmt: skip
    """hmmlearn's sufficient statistics of Gaussian emissions, for several models side by side
    (states in blocks of their sizes): ``posteriors`` [N, S] (times the run weights) of the
    observations ``X`` [N, d], the first-step posteriors summed over runs ``start`` [S], the
    expected ``transitions`` [S, S] (block-diagonal) and the weighted number of runs ``nobs``.
    sum_t gamma_t(k), sum_t gamma_t(k) x_t and sum_t gamma_t(k) x_t x_t' (diagonal covariances:
    x_t**2) of all models in one product each. Full covariances: ``packed``, the moments from the
    packed x x' of every observation (:func:`outer_products`, shared by all models); otherwise
    each state's weighted Gram matrix (X * gamma_k)' X (the run-terms model's ECM)."""
    sizes = [model.n_components for model in models]
    firsts, _ = state_blocks(sizes)
    post, obs = posteriors.sum(axis=0), posteriors.T @ X
    diagonal = models[0].covariance_type in ("spherical", "diag")
    if diagonal:
        second = posteriors.T @ X**2
    elif packed:
        second = posteriors.T @ outer_products(X)
    else:
        second = np.stack([(X * posteriors[:, [k]]).T @ X for k in range(posteriors.shape[1])])
    upper, _ = _upper_triangle(X.shape[1])
    results = []
    for b, model in enumerate(models):
        states = slice(firsts[b], firsts[b] + sizes[b])
        model._estep_begin()
        stats = model._initialize_sufficient_statistics()
        stats["nobs"] = nobs
        stats["start"] += start[states]
        stats["trans"] += transitions[states, states]
        stats["post"], stats["obs"] = post[states], obs[states]
        if diagonal:
            stats["obs**2"] = second[states]
        elif packed:
            moments = np.empty((sizes[b], X.shape[1], X.shape[1]))
            moments[:, upper[0], upper[1]] = second[states]
            moments[:, upper[1], upper[0]] = second[states]
            stats["obs*obs.T"] = moments
        else:
            stats["obs*obs.T"] = second[states]
        results.append(stats)
    return results


def estep_together(
    models: Sequence[BatchedGaussianHMM], X: np.ndarray, lengths: Any, weights: Any = None
) -> list[tuple[dict, float]]:
    """The E-step of several models of the same runs (each model's hmmlearn statistics and
    log-likelihood, as its own E-step would give them): their states side by side in the engine's
    one recursion per step (:func:`~trainmap.dynamics.maps.hmm.forward_backward.forward_backward_runs`,
    each model scaled on its own), the observations time-major (:func:`time_major`, so that
    neither the densities nor the posteriors are transposed), the statistics of all models as
    matrix products (:func:`gaussian_statistics`). ``weights``: run i (in ``lengths`` order)
    counts that many times (None: once). Every model must be :func:`usable` (NaN parameters would
    reach every block; :func:`fit_together` drops such models, a model's own E-step raises).
    Raises ValueError where a model's densities cannot be computed."""
    if not models:
        return []
    sizes = [model.n_components for model in models]
    run_weights = np.ones(len(np.asarray(lengths))) if weights is None else np.asarray(weights)
    layout = time_major(X, lengths)
    log_frames, posterior_weights = emission_terms(
        models, gaussian_log_densities_together(models, layout.X)
    )
    startprob = np.concatenate([model.startprob_ for model in models])
    transmat = block_diag(*(model.transmat_ for model in models))
    batches = [(positions, log_frames[first : first + length * n_runs].reshape(length, n_runs, -1))
               for positions, first, length, n_runs in layout.batches]  # fmt: skip
    answer = forward_backward_runs(batches, startprob, transmat, sizes,
                                   None if weights is None else run_weights)  # fmt: skip
    parts, start, log_likelihood = [], np.zeros(len(startprob)), np.zeros(len(models))
    for (positions, _), gamma, run_log_likelihood in zip(
        batches, answer.posteriors, answer.log_likelihoods, strict=True
    ):
        w = run_weights[positions]
        if weights is not None:
            gamma *= w[None, :, None]
        # Posteriors below the smallest normal number (p < 2.2e-308) count as 0: subnormal
        # operands slow the moment products down for no visible change.
        np.copyto(gamma, 0.0, where=gamma < TINY)
        parts.append(gamma.reshape(-1, gamma.shape[-1]))
        start += gamma[0].sum(axis=0)
        log_likelihood += w @ run_log_likelihood
    posteriors = parts[0] if len(parts) == 1 else np.concatenate(parts)
    unweighted = _weigh_posteriors(models, posteriors, posterior_weights)
    statistics = gaussian_statistics(models, posteriors, layout.X, start, answer.transitions,
                                     float(run_weights.sum()))  # fmt: skip
    for b, post in unweighted.items():
        statistics[b]["post_unweighted"] = post
    return [(stats, float(log_likelihood[b])) for b, stats in enumerate(statistics)]


def _weigh_posteriors(
    models: Sequence[BatchedGaussianHMM], posteriors: np.ndarray, weights: dict[int, np.ndarray]
) -> dict[int, np.ndarray]:
    """Multiply, in place, the block of ``posteriors`` [N, S] of each model in ``weights`` (by its
    position in ``models``; :func:`emission_terms`, the same rows) by its weights; returns, for
    each model so weighted, its unweighted sum_t gamma_t(k) [K]."""
    firsts, _ = state_blocks([model.n_components for model in models])
    unweighted = {}
    for b, model_weights in weights.items():
        states = slice(firsts[b], firsts[b] + models[b].n_components)
        unweighted[b] = posteriors[:, states].sum(axis=0)
        posteriors[:, states] *= model_weights
    return unweighted


def _estep_works(model: BatchedGaussianHMM, X: np.ndarray, lengths: Any, weights: Any) -> bool:
    """Whether ``model``'s E-step runs (it raises ValueError where EM broke down)."""
    try:
        estep_together([model], X, lengths, weights)
    except ValueError:
        return False
    return True


def fit_together(
    models: Sequence[BatchedGaussianHMM], X: np.ndarray, lengths: Any, weights: Any = None
) -> list[bool]:
    """hmmlearn's ``fit`` of several models of the same runs (models of the same covariance
    type), their EM iterations in lockstep (:func:`estep_together`): each model initialises,
    steps, stops at its own convergence (its ``monitor_``) or ``n_iter``, exactly as its own
    ``fit`` (``fit_weighted`` with ``weights``) would. Returns, per model, whether EM completed; a
    model EM left without mass (:func:`usable`) or whose M-step failed is dropped at once."""
    from sklearn.utils import check_array

    X = check_array(X)
    lengths = np.asarray([len(X)] if lengths is None else lengths)
    completed = dict.fromkeys(range(len(models)), True)
    for b, model in enumerate(models):
        try:
            model._init(X, lengths)
            model._check()
        except ValueError:  # e.g. more states than distinct observations for k-means
            completed[b] = False
        model.monitor_._reset()
    active = list(range(len(models)))
    for iteration in range(max((model.n_iter for model in models), default=0)):
        for b in active:
            completed[b] = completed[b] and usable(models[b])
        active = [b for b in active if completed[b] and iteration < models[b].n_iter]
        if not active:
            break
        try:
            steps = estep_together([models[b] for b in active], X, lengths, weights)
        except ValueError:  # some model's E-step fails (e.g. a covariance no longer definite)
            for b in active:
                completed[b] = _estep_works(models[b], X, lengths, weights)
            active = [b for b in active if completed[b]]
            steps = estep_together([models[b] for b in active], X, lengths, weights)
        still = []
        for b, (stats, log_likelihood) in zip(active, steps, strict=True):
            try:
                models[b]._do_mstep(stats)
            except ValueError:
                completed[b] = False
                continue
            models[b].monitor_.report(log_likelihood)
            if not models[b].monitor_.converged:
                still.append(b)
        active = still
    return [completed[b] for b in range(len(models))]
