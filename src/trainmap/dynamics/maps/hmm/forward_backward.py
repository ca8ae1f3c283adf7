"""The HMM engine: forward-backward over many runs, for any emission model.

An emission model supplies log p(z_t | s_t = k) for every observation; the engine knows nothing
else of it. For runs of equal length at once it runs the scaled forward and backward recursions
(Rabiner 1989, eqs. 91-93) in probability space, scaled per run, and gives the posteriors
gamma_t(k) = p(s_t = k | z_1:T), the expected transition counts sum_t xi_t(j, k) (Rabiner eq. 37,
scaled) and every run's log-likelihood log p(z_1:T) = sum_t log c_t. Several models of the same
runs can sit side by side on one state axis (their states in blocks, a block-diagonal transition
matrix): one recursion per time step serves them all and every quantity is scaled per model, so
each model's numbers are the ones it has alone. A (run, model) whose scaled recursion underflows
or overflows (a run the model finds impossible) is redone in log space with hmmlearn's C kernels.

:func:`forward_backward_runs` is the one E-step driver every emission model calls: each batch of
runs of equal length, time-major (the order the recursions read; :func:`time_major` lays out a
model's observations so). Runs may carry weights (a bootstrap draw counts a run drawn three times
three times). The emission models are :mod:`~trainmap.dynamics.maps.hmm.gaussian` and
:mod:`~trainmap.dynamics.maps.hmm.run_terms`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hmmlearn import _hmmc

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
    """The batches of equal-length runs, one per distinct length (its length class): the
    positions of its runs in ``lengths`` and their row indices [n, T] in ``X`` (the runs
    concatenated in the order of ``lengths``)."""
    lengths = np.asarray(lengths)
    starts = run_starts(lengths)
    batches = []
    for length in np.unique(lengths):
        positions = np.flatnonzero(lengths == length)
        batches.append((positions, starts[positions][:, None] + np.arange(length)[None, :]))
    return batches


def run_log_likelihoods(
    log_frames: np.ndarray, startprob: np.ndarray, transmat: np.ndarray, lengths: Any
) -> np.ndarray:
    """log p(run) of every run [R] (``log_frames`` [N, K] of the runs concatenated in the order
    of ``lengths``): the scaled forward pass of each batch of equal-length runs (gathered
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


@dataclass(frozen=True)
class TimeMajor:
    """Observations of runs reordered time-major within each batch of equal-length runs (the
    order the forward-backward recursions read): ``X`` [N, d] and, per batch, the positions of its
    runs in ``lengths``, its first row, its length T and its number of runs n (rows ``first`` to
    ``first + T n``, as [T, n] in C order)."""

    X: np.ndarray
    batches: list[tuple[np.ndarray, int, int, int]]


def time_major(X: np.ndarray, lengths: Any) -> TimeMajor:
    """:class:`TimeMajor` of the runs ``X`` (concatenated in the order of ``lengths``),
    :func:`remembered` for the same array and lengths."""
    lengths = np.asarray(lengths)

    def layout() -> TimeMajor:
        order, batches, first = [], [], 0
        for positions, rows in runs_of_equal_length(lengths):
            order.append(rows.T.ravel())
            batches.append((positions, first, rows.shape[1], rows.shape[0]))
            first += rows.size
        return TimeMajor(np.ascontiguousarray(X[np.concatenate(order)]), batches)

    return remembered("layout", X, layout, tuple(lengths.tolist()))


@dataclass
class ForwardBackward:
    """The E-step of runs under one or several models side by side (states in blocks), per batch
    of equal-length runs."""

    posteriors: list[np.ndarray]  # p(s_t = k | z_1:T) of each batch [T, n, S]
    log_likelihoods: list[np.ndarray]  # log p(z_1:T) of each batch's runs under each model [n, B]
    transitions: np.ndarray  # expected transition counts, times the run weights, summed [S, S]


def forward_backward_runs(
    batches: Sequence[tuple[np.ndarray, np.ndarray]],
    startprob: np.ndarray,
    transmat: np.ndarray,
    sizes: Sequence[int],
    weights: np.ndarray | None = None,
) -> ForwardBackward:
    """Forward-backward of every run: for each batch of equal-length runs, the positions of its
    runs (in ``lengths`` order) and its log p(z_t | s_t = k) [T, n, S] time-major
    (:func:`forward_backward_time_major`), the models' states in blocks of ``sizes``,
    ``startprob`` theirs one after the other and ``transmat`` [S, S] block-diagonal. ``weights``:
    run i (in ``lengths`` order) counts that many times in the transitions (None: once)."""
    posteriors, log_likelihoods = [], []
    transitions = np.zeros(transmat.shape)
    for positions, frames in batches:
        gamma, batch_transitions, batch_log_likelihood = forward_backward_time_major(
            frames, startprob, transmat, sizes, None if weights is None else weights[positions]
        )
        posteriors.append(gamma)
        log_likelihoods.append(batch_log_likelihood)
        transitions += batch_transitions
    return ForwardBackward(posteriors, log_likelihoods, transitions)
