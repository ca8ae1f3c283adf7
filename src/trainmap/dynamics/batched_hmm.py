"""hmmlearn's ``GaussianHMM`` with its E-step vectorised over runs and over models (same numbers).

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
mu_k' P_k mu_k, with every observation's x x' computed once per array; the same x x' give the
M-step's second moments in one product. A (run, model) whose scaled recursion underflows or
overflows (a run the model finds impossible) is redone in log space with hmmlearn's C kernels
(hmmlearn itself would redo every run of the E-step in Python; before, an overflow of the
backward pass went unnoticed and EM failed on NaN), and a model EM leaves without mass (NaN)
stops at once instead of iterating to ``n_iter``.

Several models of the same runs (a selection's every K, warm-started or from one restart's
seeds) fit in lockstep (:func:`fit_together`): their states side by side, one recursion per time
step for all of them (:func:`forward_backward_time_major`), each model scaled on its own, so
each model's fit is the one it has alone (to round-off) while the per-step cost is shared. The
E-step reads the runs time-major (:func:`time_major`, reordered once per array): the densities
come out in the order the recursions read them and the posteriors in the order the moment
products read them, with no transposed copy. Posteriors below the smallest normal number count as
0: subnormal operands made the moment products 2.4x slower. Measured on the default study's
largest map (80 runs x 321 checkpoints, 14 metrics, K = 1..8, one process): the full selection
81 s before these changes, 18 s single-model, 15 s in lockstep, 10.8 s time-major; 10 bootstrap
refits 11.4 s, 6.0 s, 5.2 s, 3.5 s (the same K and BIC to 1e-10). Normalising the forward
variables every other step only saved 4.5 % more (CPU time), not kept.

Runs may carry integer weights (:meth:`BatchedGaussianHMM.fit_weighted`,
:meth:`~BatchedGaussianHMM.score_weighted`): a bootstrap resample draws runs with replacement, and a
run drawn three times contributes three times its statistics, computed once.

The override relies on hmmlearn's internal statistics layout (``nobs``, ``start``, ``trans``,
``post``, ``obs``, ``obs**2`` / ``obs*obs.T``), pinned by uv.lock (hmmlearn 0.3.3).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from hmmlearn import _hmmc
from hmmlearn.hmm import GaussianHMM
from scipy.linalg import block_diag

TINY = np.finfo(float).tiny  # a scaling factor below this has underflowed
HUGE = 1e300  # a backward variable above this has (nearly) overflowed


def state_blocks(sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Several models side by side on one state axis, model b's states a block of ``sizes[b]``:
    each block's first state and each state's block."""
    sizes = np.asarray(sizes, dtype=int)
    return np.concatenate([[0], np.cumsum(sizes)[:-1]]), np.repeat(np.arange(len(sizes)), sizes)


def block_sums(sizes: Sequence[int]) -> np.ndarray:
    """[S, S] ones where two states belong to the same model (states in blocks of ``sizes``):
    ``values @ block_sums(sizes)`` gives each state its block's sum."""
    _, owner = state_blocks(sizes)
    return (owner[:, None] == owner[None, :]).astype(float)


def forward_time_major(
    frames: np.ndarray,
    startprob: np.ndarray,
    transmat: np.ndarray,
    sizes: Sequence[int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Scaled forward pass of ``n`` runs of equal length at once (Rabiner 1989, eqs. 91-92), of
    several models side by side, time-major: ``frames`` [T, n, S] holds log p(z_t | s_t = k), the
    models' states in blocks of ``sizes``, ``startprob`` their start probabilities one after the
    other and ``transmat`` [S, S] block-diagonal. Every quantity is scaled per run and block, so
    each model's numbers are its own (one matrix product per step serves all models).

    Returns the normalised forward variables p(s_t | z_1:t) [T, n, S], the scaling factors, each
    state given its block's [T, n, S] (one matrix product per step sums the blocks:
    :func:`block_sums`), the per-step shifts of the log-densities [T, n, B] (the first step's
    include log pi), their exponentials [T, n, S] (the first step's unused by the recursions),
    and which (run, block) failed [n, B]: a scaling factor underflowed below the smallest normal
    number (their other results are meaningless but finite, 0 from there on; the others are
    exact). The log-likelihood of run i under model b is ``log(scale[:, i, first_b]).sum() +
    shift[:, i, b].sum()``.
    """
    firsts, owner = state_blocks(sizes)
    shift = np.maximum.reduceat(frames, firsts, axis=2)
    with np.errstate(divide="ignore"):
        # The first step is shifted by its largest term log pi_k + log p(z_0 | k), not by the
        # largest density alone: a run whose likeliest first state the model rarely starts in
        # would underflow there.
        first = np.log(startprob)[None, :] + frames[0]
        shift[0] = np.maximum.reduceat(first, firsts, axis=1)
    # A block with no finite density at a step would give NaN (-inf - -inf); NaN in one block
    # would reach every other through the shared matrix product (0 * NaN), so it gives 0 instead
    # (that block fails, below).
    shift[~np.isfinite(shift)] = 0.0
    emission = np.empty_like(frames)
    with np.errstate(over="ignore", invalid="ignore"):
        np.subtract(frames, shift[:, :, owner], out=emission)
        np.exp(emission, out=emission)
        current = np.exp(first - shift[0][:, owner])  # pi_k p(z_0 | k), scaled
    summing = block_sums(sizes)
    alpha = np.empty_like(emission)
    scale = np.empty_like(emission)
    for t in range(len(frames)):
        if t:
            np.matmul(alpha[t - 1], transmat, out=current)
            current *= emission[t]
        np.matmul(current, summing, out=scale[t])
        # Divided by at least the smallest normal number: a failed block's alpha stays 0, not NaN.
        np.maximum(scale[t], TINY, out=scale[t])
        np.divide(current, scale[t], out=alpha[t])
    failed = (scale[:, :, firsts] <= TINY).any(axis=0)
    return alpha, scale, shift, emission, failed


def forward_backward_time_major(
    frames: np.ndarray,
    startprob: np.ndarray,
    transmat: np.ndarray,
    sizes: Sequence[int],
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scaled forward-backward (Rabiner 1989, eqs. 91-93) of ``n`` runs of equal length under
    several models side by side, time-major (:func:`forward_time_major`: ``frames`` [T, n, S],
    states in blocks of ``sizes``, block-diagonal ``transmat``).

    Returns the posteriors p(s_t | z_1:T) [T, n, S], the expected transition counts summed over
    runs (times their ``weights``) and time [S, S] (block-diagonal), and each run's
    log-likelihood under each model [n, B]. A (run, model) whose scaled recursion underflows or
    overflows (a run the model finds impossible) is redone in log space
    (:func:`log_forward_backward`); every other's numbers are its own, whatever the other blocks.
    """
    alpha, scale, shift, emission, failed = forward_time_major(frames, startprob, transmat, sizes)
    firsts, owner = state_blocks(sizes)
    length = len(frames)
    emission[:, failed[:, owner]] = 0.0  # their beta stays 0 (finite): redone in log space below
    # arrivals[t] = p(z_t | s_t) beta_t / c_t, the backward pass's step (eq. 93) and xi's right
    # factor: xi_t(i, j) = alpha_t(i) a_ij arrivals_{t+1}(j) (Rabiner eq. 37, scaled).
    beta, arrivals = np.empty_like(emission), emission
    beta[-1] = 1.0
    transposed = np.ascontiguousarray(transmat.T)
    with np.errstate(over="ignore"):
        for t in range(length - 1, 0, -1):
            np.multiply(beta[t], emission[t], out=arrivals[t])
            arrivals[t] /= scale[t]
            # Capped, so that one block's overflow cannot reach the others (inf * 0 in the
            # shared product); a block that reaches the cap has failed (below).
            np.minimum(arrivals[t], HUGE, out=arrivals[t])
            np.matmul(arrivals[t], transposed, out=beta[t - 1])
    if length > 1:
        reached = (arrivals[1:] >= HUGE).any(axis=0)  # [n, S]
        failed |= np.logical_or.reduceat(reached, firsts, axis=1)
    failed_states = failed[:, owner]
    log_likelihood = np.log(scale[:, :, firsts]).sum(axis=0) + shift.sum(axis=0)
    transitions = np.zeros(transmat.shape)
    if length > 1:
        arrivals[:, failed_states] = 0.0
        if weights is not None:
            arrivals[1:] *= weights[None, :, None]
        alpha[:, failed_states] = 0.0
        for b, size in enumerate(sizes):
            states = slice(firsts[b], firsts[b] + size)
            before = alpha[:-1, :, states].reshape(-1, size)
            after = arrivals[1:, :, states].reshape(-1, size)
            transitions[states, states] = transmat[states, states] * (before.T @ after)
    posteriors = np.multiply(alpha, beta, out=beta)
    for run, block in zip(*np.nonzero(failed), strict=True):
        states = slice(firsts[block], firsts[block] + sizes[block])
        redone = log_forward_backward(
            np.ascontiguousarray(frames[:, run, states])[None], startprob[states],
            transmat[states, states], None if weights is None else weights[run : run + 1],
        )  # fmt: skip
        posteriors[:, run, states], log_likelihood[run, block] = redone[0][0], redone[2][0]
        transitions[states, states] += redone[1]
    return posteriors, transitions, log_likelihood


def log_forward(
    log_frames: np.ndarray, startprob: np.ndarray, transmat: np.ndarray
) -> tuple[float, np.ndarray]:
    """One run's forward pass in log space (hmmlearn's C kernel): its log-likelihood and
    log alpha [T, K]. For runs whose scaled recursion underflows (:func:`forward_time_major`)."""
    return _hmmc.forward_log(startprob, transmat, np.ascontiguousarray(log_frames))


def log_forward_backward(
    log_frames: np.ndarray,
    startprob: np.ndarray,
    transmat: np.ndarray,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scaled forward-backward's results in log space, run by run (hmmlearn's C kernels, as
    its own ``_fit_log``), ``log_frames`` [n, T, K] run-major: posteriors [n, T, K], expected
    transitions (times the runs' ``weights``) [K, K] and each run's log-likelihood [n]; for runs
    whose scaled recursion (:func:`forward_backward_time_major`) underflows or overflows."""
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


def run_starts(lengths: Any) -> np.ndarray:
    """The first row of every run in ``X`` (the runs concatenated in the order of ``lengths``)."""
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int)


def runs_of_equal_length(lengths: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each distinct length: the positions of its runs in ``lengths`` and their row indices
    [n, T] in ``X`` (the runs concatenated in the order of ``lengths``)."""
    lengths = np.asarray(lengths)
    starts = run_starts(lengths)
    groups = []
    for length in np.unique(lengths):
        positions = np.flatnonzero(lengths == length)
        groups.append((positions, starts[positions][:, None] + np.arange(length)[None, :]))
    return groups


def run_log_likelihoods(
    log_frames: np.ndarray, startprob: np.ndarray, transmat: np.ndarray, lengths: Any
) -> np.ndarray:
    """log p(run) of every run [R] (``log_frames`` [N, K] of the runs concatenated in the order
    of ``lengths``): the scaled forward pass of each group of equal-length runs (gathered
    time-major, :func:`forward_time_major`), the runs it cannot hold in log space."""
    log_likelihood = np.empty(len(np.asarray(lengths)))
    for positions, rows in runs_of_equal_length(lengths):
        _, scale, shift, _, failed = forward_time_major(log_frames[rows.T], startprob, transmat,
                                                        [log_frames.shape[1]])  # fmt: skip
        with np.errstate(divide="ignore"):
            per_run = np.log(scale[:, :, 0]).sum(axis=0) + shift[:, :, 0].sum(axis=0)
        for i in np.flatnonzero(failed[:, 0]):  # underflow: these runs in log space
            per_run[i] = log_forward(log_frames[rows[i]], startprob, transmat)[0]
        log_likelihood[positions] = per_run
    return log_likelihood


@functools.cache
def _upper_triangle(n_features: int) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Row and column indices of a d x d matrix's upper triangle (diagonal included), and which
    of them lie off the diagonal."""
    rows, columns = np.triu_indices(n_features)
    return (rows, columns), rows != columns


# The last few arrays' derived arrays, per kind (outer products, time-major layouts): a weak
# reference to the array, its fingerprint (shape, sum and any extra key: an array changed in
# place is computed again), the derived value. EM passes the same array to every E-step of a fit,
# and a selection fits every K on the same stacked runs.
_REMEMBERED: dict[str, list[tuple[weakref.ref, tuple, Any]]] = {"outer": [], "layout": []}
#: Arrays remembered per kind: a split's training and held-out runs, as given and time-major.
_REMEMBERED_SIZE = 4


def remembered(kind: str, X: np.ndarray, compute: Callable[[], Any], key: tuple = ()) -> Any:
    """``compute()``, remembered for the last :data:`_REMEMBERED_SIZE` arrays ``X`` of ``kind``
    while they live and keep their shape, sum and ``key``."""
    cache = _REMEMBERED[kind]
    fingerprint = (X.shape, float(X.sum()), key)
    for reference, seen, value in cache:
        if reference() is X and seen == fingerprint:
            return value
    value = compute()
    cache[:] = [entry for entry in cache if entry[0]() is not None]
    cache.insert(0, (weakref.ref(X), fingerprint, value))
    del cache[_REMEMBERED_SIZE:]
    return value


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
    docstring)."""

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
        try:
            cholesky = np.linalg.cholesky(self._covars_)
        except np.linalg.LinAlgError:
            return None
        inverse = np.linalg.inv(cholesky)  # L_k^-1, [K, d, d]
        precision = inverse.transpose(0, 2, 1) @ inverse  # Sigma_k^-1 = L_k^-T L_k^-1
        pulled = (precision @ self.means_[:, :, None])[:, :, 0]  # Sigma_k^-1 mu_k, [K, d]
        upper, off_diagonal = _upper_triangle(self.means_.shape[1])
        packed = precision[:, upper[0], upper[1]] * np.where(off_diagonal, 2.0, 1.0)
        log_det = 2 * np.log(np.diagonal(cholesky, axis1=1, axis2=2)).sum(axis=1)
        return packed, pulled, np.einsum("kd,kd->k", self.means_, pulled) + log_det

    def n_run_parameters(self, n_runs: int) -> int:
        """Free parameters of ``n_runs`` runs' own terms, counted in a held-out BIC: none here
        (:class:`~trainmap.dynamics.run_offset.RunOffsetHMM` has some)."""
        return 0

    def residuals(self, X: np.ndarray, lengths: Any = None) -> np.ndarray:
        """The runs as the emission model sees them: ``X`` itself (no run terms; a
        :class:`~trainmap.dynamics.run_offset.RunOffsetHMM` removes each run's)."""
        return X

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


def usable(model: BatchedGaussianHMM) -> bool:
    """Whether EM can go on from ``model``: hmmlearn's M-step gives a state that received no mass
    NaN parameters (0 / 0), after which EM would run to ``n_iter`` on NaN, a failed fit either
    way (measured: 970 of a default-study map's 2,276 E-steps, 30 % of its fit time)."""
    return bool(np.isfinite(model.means_).all() and np.isfinite(model.transmat_).all())


def log_densities_together(models: Sequence[BatchedGaussianHMM], X: np.ndarray) -> np.ndarray:
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


@dataclass(frozen=True)
class TimeMajor:
    """Observations of runs reordered time-major within each group of runs of equal length (the
    order the forward-backward recursions read): ``X`` [N, d] and, per group, the positions of its
    runs in ``lengths``, its first row, its length T and its number of runs n (rows ``first`` to
    ``first + T n``, as [T, n] in C order)."""

    X: np.ndarray
    groups: list[tuple[np.ndarray, int, int, int]]


def time_major(X: np.ndarray, lengths: Any) -> TimeMajor:
    """:class:`TimeMajor` of the runs ``X`` (concatenated in the order of ``lengths``),
    :func:`remembered` for the same array and lengths."""
    lengths = np.asarray(lengths)

    def layout() -> TimeMajor:
        order, groups, first = [], [], 0
        for positions, rows in runs_of_equal_length(lengths):
            order.append(rows.T.ravel())
            groups.append((positions, first, rows.shape[1], rows.shape[0]))
            first += rows.size
        return TimeMajor(np.ascontiguousarray(X[np.concatenate(order)]), groups)

    return remembered("layout", X, layout, tuple(lengths.tolist()))


def estep_together(
    models: Sequence[BatchedGaussianHMM], X: np.ndarray, lengths: Any, weights: Any = None
) -> list[tuple[dict, float]]:
    """The E-step of several models of the same runs (each model's hmmlearn statistics and
    log-likelihood, as its own E-step would give them): their states side by side
    (:func:`forward_backward_time_major`: one recursion per step for all models, each scaled on
    its own), the observations time-major (:func:`time_major`, so that neither the densities nor
    the posteriors are transposed), the statistics of all models as matrix products. ``weights``:
    run i (in ``lengths`` order) counts that many times (None: once). Every model must be
    :func:`usable` (NaN parameters would reach every block; :func:`fit_together` drops such
    models, a model's own E-step raises). Raises ValueError where a model's densities cannot be
    computed."""
    if not models:
        return []
    sizes = [model.n_components for model in models]
    firsts, _ = state_blocks(sizes)
    run_weights = np.ones(len(np.asarray(lengths))) if weights is None else np.asarray(weights)
    layout = time_major(X, lengths)
    log_frames = log_densities_together(models, layout.X)
    startprob = np.concatenate([model.startprob_ for model in models])
    transmat = block_diag(*(model.transmat_ for model in models))
    parts, start = [], np.zeros(len(startprob))
    transitions, log_likelihood = np.zeros(transmat.shape), np.zeros(len(models))
    for positions, first, length, n_runs in layout.groups:
        w = run_weights[positions]
        frames = log_frames[first : first + length * n_runs].reshape(length, n_runs, -1)
        gamma, group_transitions, run_log_likelihood = forward_backward_time_major(
            frames, startprob, transmat, sizes, None if weights is None else w
        )
        if weights is not None:
            gamma *= w[None, :, None]
        # Posteriors below the smallest normal number (p < 2.2e-308) count as 0: subnormal
        # operands slow the moment products down 2.4x (measured) for no visible change.
        np.copyto(gamma, 0.0, where=gamma < TINY)
        parts.append(gamma.reshape(length * n_runs, -1))
        start += gamma[0].sum(axis=0)
        transitions += group_transitions
        log_likelihood += w @ run_log_likelihood
    posteriors = parts[0] if len(parts) == 1 else np.concatenate(parts)
    post, obs = posteriors.sum(axis=0), posteriors.T @ layout.X
    diagonal = models[0].covariance_type in ("spherical", "diag")
    second = posteriors.T @ (layout.X**2 if diagonal else outer_products(layout.X))
    upper, _ = _upper_triangle(X.shape[1])
    results = []
    for b, model in enumerate(models):
        states = slice(firsts[b], firsts[b] + sizes[b])
        model._estep_begin()
        stats = model._initialize_sufficient_statistics()
        stats["nobs"] = float(run_weights.sum())
        stats["start"] += start[states]
        stats["trans"] += transitions[states, states]
        stats["post"], stats["obs"] = post[states], obs[states]
        if diagonal:
            stats["obs**2"] = second[states]
        else:
            moments = np.empty((sizes[b], X.shape[1], X.shape[1]))
            moments[:, upper[0], upper[1]] = second[states]
            moments[:, upper[1], upper[0]] = second[states]
            stats["obs*obs.T"] = moments
        results.append((stats, float(log_likelihood[b])))
    return results


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
