"""Label-free verdicts: whether two methods' training paths differ, without state numbers.

Occupancy and detour verdicts (:mod:`trainmap.dynamics.verdicts.compare`) mean something only within one
map's numbering of its states: another draw of seeds gives another map, and a verdict about
"state 4" may have no state 4 to hold again on. The verdicts here form a joint comparison's
*primary family*, with the convergence step; each is a statistic of the runs that does not
change when the map's states are renumbered (or, for the trajectory test, needs no map at all):

* **trajectories** (Szekely & Rizzo, "Energy statistics", 2013, eq. 6.1; :func:`energy_verdict`):
  each run is one point, its standardised metrics on a common step grid
  (:func:`trajectory_matrix`), and the two methods' point clouds are compared by the energy
  distance E = 2 E|X - Y| - E|X - X'| - E|Y - Y'| (its unbiased U-statistic, from scipy's
  Euclidean distances, float64 loops no CPU model changes); its p-value from relabelling runs
  (:func:`scipy.stats.permutation_test`), its interval a percentile
  bootstrap of E over runs resampled within each method. A joint comparison enters each run
  after the start window, its own level and scale removed
  (:func:`trainmap.dynamics.verdicts.timecourse.level_scale_free`), so a different start, level or scale
  is not a different trajectory; :mod:`trainmap.dynamics.verdicts.timecourse` says where in training and
  in which metrics the methods differ (the figure ``paths.png``);
* **first passage to the final state** (:func:`first_passage`): the state the most runs end in is
  a property of the pooled runs, not of its number; each run's first step in it is its event time,
  a run that never reaches it is right-censored at its last step, and the two methods are compared
  as the convergence step is (:func:`trainmap.dynamics.verdicts.survival.compare_survival`: restricted
  mean difference, log-rank permutation p);
* **states visited after the start window**: the number of distinct states of a run's decoded
  path after the start window (a start of its own is the start's; difference of means,
  relabelling p, as the occupancies);
* **transitions** (:func:`transition_lr`): H0, the same dynamics given the state: the
  likelihood-ratio statistic of method-specific against shared transition matrices,
  G = 2 sum_m sum_(i in V) sum_j n^m_ij log(p^m_ij / p_ij), with n^m_ij the method's expected
  transition counts under the shared map (:func:`expected_transitions`, self-transitions included),
  p the maximum-likelihood estimates and V the states both methods visit (a row one method never
  leaves carries no comparison); the initial distributions are per method in both models, so a
  different start adds nothing to G. Its p-value from relabelling runs with the map fixed (G's
  chi-square law assumes independent transitions, which runs' paths are not);
* **collapsed paths** (:func:`collapsed_paths_tv`): each run's path with repeated states collapsed
  (0 0 2 2 3 -> 0 2 3); the total variation between the methods' distributions of collapsed paths,
  0.5 sum_path |P_a(path) - P_b(path)|, with a relabelling p.

The unsigned statistics (energy distance, G, total variation) say *that* the methods differ, the
signed ones (first passage, states visited) also which way. Diverged runs are left out of every
verdict here, as they are of the convergence step's (their training failed: their metrics stop);
runs that never converged enter with their whole path (and are censored in the first passage).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

TRAJECTORIES = "trajectories (energy distance)"
FIRST_PASSAGE = "first passage to the final state"
STATES_VISITED = "states visited after the start window"
TRANSITIONS = "transitions (likelihood ratio)"
COLLAPSED_PATHS = "collapsed paths (total variation)"
#: The label-free quantities whose effect has no direction: a significant one says "differ".
UNSIGNED = (TRAJECTORIES, TRANSITIONS, COLLAPSED_PATHS)
#: Smallest share of the longest run's span of steps the common grid must cover.
MIN_GRID_SHARE = 0.5


def run_steps(table: pd.DataFrame) -> np.ndarray:
    """A metric table's checkpoint steps: its ``step`` column, or the checkpoint index 0, 1, ...
    when it has none."""
    if "step" in table:
        return table["step"].to_numpy(dtype=float)
    return np.arange(len(table), dtype=float)


def common_grid(runs: Mapping[str, pd.DataFrame], n_points: int) -> np.ndarray:
    """``n_points`` evenly spaced steps over the span every run covers (the latest first step to
    the earliest last step). Raises ValueError naming the shortest run when that span is under
    :data:`MIN_GRID_SHARE` of the longest run's (a run stopped early: leave it out or lower
    nothing; it cannot be compared on the others' steps), or ``n_points`` < 2."""
    if n_points < 2:
        raise ValueError(f"analysis.trajectory_points {n_points!r}: needs at least 2 steps")
    if not runs:
        raise ValueError("no runs to put on a common step grid")
    spans = {run: (float(run_steps(table).min()), float(run_steps(table).max()))
             for run, table in runs.items()}  # fmt: skip
    start = max(low for low, _ in spans.values())
    end = min(high for _, high in spans.values())
    longest = max(high - low for low, high in spans.values())
    if end - start < MIN_GRID_SHARE * longest or end <= start:
        shortest = min(spans, key=lambda run: spans[run][1])
        raise ValueError(
            f"run {shortest} ends at step {spans[shortest][1]:g}, before "
            f"{MIN_GRID_SHARE:.0%} of the longest run's {longest:g} steps: the runs have no common "
            "step grid to compare their trajectories on; give every run of a comparison the same "
            "step budget (train.<task>.steps), or leave the short run out"
        )  # fmt: skip
    return np.linspace(start, end, n_points)


def trajectory_matrix(
    runs: Mapping[str, pd.DataFrame], features: Sequence[str], grid: np.ndarray
) -> pd.DataFrame:
    """One row per run: each feature linearly interpolated onto the step ``grid``, z-scored by the
    feature's mean and standard deviation pooled over every run and grid step (a feature constant
    everywhere becomes 0), flattened feature-major. Columns: (feature, step) MultiIndex."""
    cube = np.stack([
        np.stack([np.interp(grid, run_steps(table), table[feature].to_numpy(dtype=float))
                  for feature in features])
        for table in runs.values()
    ])  # runs x features x grid  # fmt: skip
    mean = cube.mean(axis=(0, 2), keepdims=True)
    std = cube.std(axis=(0, 2), keepdims=True)
    z = (cube - mean) / np.where(std > 0, std, 1.0)
    columns = pd.MultiIndex.from_product([list(features), grid.tolist()], names=["feature", "step"])
    return pd.DataFrame(z.reshape(len(runs), -1), index=list(runs), columns=columns)


@dataclass(frozen=True)
class Verdict:
    """One label-free test: ``effect`` with its percentile interval, the relabelling ``p``."""

    effect: float
    low: float
    high: float
    p: float


def percentile_interval(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    return float(np.quantile(draws, tail)), float(np.quantile(draws, 1 - tail))


def _resample_within(n_first: int, n_second: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of one bootstrap resample: first's runs drawn among the first n_first, second's
    among the rest."""
    return np.concatenate([rng.integers(0, n_first, n_first),
                           n_first + rng.integers(0, n_second, n_second)])  # fmt: skip


def _energy_from_counts(distances: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The energy distance's U-statistic of bootstrap draws given as counts: ``first`` and
    ``second`` [draws, runs] say how often each run was drawn for each method. A run drawn twice
    is not paired with its own copy in a within-method mean (the U-statistic leaves out i = j;
    the zero diagonal of ``distances`` drops those pairs from the sums, the pair counts
    n^2 - sum c^2 from the denominators)."""

    def quadratic(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.einsum("pi,ij,pj->p", a, distances, b)

    def within(counts: np.ndarray) -> np.ndarray:
        pairs = counts.sum(axis=1) ** 2 - (counts**2).sum(axis=1)
        return np.divide(quadratic(counts, counts), pairs, out=np.zeros(len(counts)),
                         where=pairs > 0)  # fmt: skip

    between = quadratic(first, second) / (first.sum(axis=1) * second.sum(axis=1))
    return 2 * between - within(first) - within(second)


def energy_verdict(
    first: np.ndarray, second: np.ndarray, n_permutations: int, confidence: float,
    rng: np.random.Generator,
) -> Verdict:  # fmt: skip
    """The energy distance between two methods' runs (rows of :func:`trajectory_matrix`; the
    U-statistic, unbiased, so near 0 when the methods do not differ), its relabelling p-value
    (:func:`scipy.stats.permutation_test`, ``n_permutations`` relabellings, one-sided: a difference
    makes E larger) and its bootstrap percentile interval (module docstring)."""
    from scipy.spatial.distance import pdist, squareform
    from scipy.stats import permutation_test

    distances = squareform(pdist(np.concatenate([first, second])))
    n_first, n_second = len(first), len(second)

    def statistic(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        """E of runs ``a`` against runs ``b`` (indices into ``distances``; batched on axis 0)."""
        single = np.ndim(a) == 1
        a, b = np.atleast_2d(a).astype(int), np.atleast_2d(b).astype(int)
        size = n_first + n_second
        one_hot = np.zeros((len(a), size))
        rows = np.arange(len(a))[:, None]
        one_hot[rows, a] = 1.0
        other = np.zeros((len(b), size))
        other[rows, b] = 1.0
        values = _energy_from_counts(distances, one_hot, other)
        return values[0] if single else values

    runs = np.arange(n_first + n_second)
    test = permutation_test((runs[:n_first], runs[n_first:]), statistic, vectorized=True,
                            n_resamples=n_permutations, alternative="greater",
                            permutation_type="independent", rng=rng)  # fmt: skip
    effect = float(test.statistic)
    counts = np.zeros((n_permutations, n_first + n_second))
    rows = np.arange(n_permutations)[:, None]
    np.add.at(counts, (rows, rng.integers(0, n_first, (n_permutations, n_first))), 1.0)
    np.add.at(counts, (rows, n_first + rng.integers(0, n_second, (n_permutations, n_second))), 1.0)
    in_first = runs < n_first
    draws = _energy_from_counts(distances, counts * in_first, counts * ~in_first)
    return Verdict(effect, *percentile_interval(draws, confidence), float(test.pvalue))


def transition_counts(path: np.ndarray, n_states: int) -> np.ndarray:
    """The K x K counts of a decoded path's transitions, self-transitions included."""
    counts = np.zeros((n_states, n_states))
    np.add.at(counts, (path[:-1], path[1:]), 1.0)
    return counts


def expected_transitions(model, sequences: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each run's expected transition counts [K, K] under a fitted HMM ``model`` (the sum over t of
    p(s_t = i, s_t+1 = j | run), self-transitions included), from its forward-backward on the run's
    standardised observations ``sequences`` (its residuals where the model has run terms)."""
    from trainmap.dynamics.maps.hmm.forward_backward import log_forward_backward

    found = []
    for z in sequences:
        frames = model._compute_log_likelihood(model.residuals(np.asarray(z, dtype=float)))
        if len(frames) < 2:
            found.append(np.zeros((model.n_components, model.n_components)))
            continue
        _, counts, _ = log_forward_backward(frames[None], model.startprob_, model.transmat_)
        found.append(counts)
    return found


#: The smallest (expected) number of departures from a state for a method to count as visiting it.
VISITED = 1.0


def transition_g(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """G = 2 sum_m sum_(i in V) sum_j n^m_ij log(p^m_ij / p_ij) for two methods' summed counts
    [..., K, K] (batched over leading axes), over the states V both methods leave at least
    :data:`VISITED` times: per-method against shared transition rows. A state one method does not
    visit carries no comparison."""
    # expected counts below 1e-9 of a transition are rounding of a posterior, not evidence
    first, second = (np.where(counts > 1e-9, counts, 0.0) for counts in (first, second))
    both = (first.sum(axis=-1) >= VISITED) & (second.sum(axis=-1) >= VISITED)
    shared = first + second
    shared_p = shared / np.maximum(shared.sum(axis=-1, keepdims=True), 1e-300)
    total = np.zeros(first.shape[:-2])
    for counts in (first, second):
        own = counts / np.maximum(counts.sum(axis=-1, keepdims=True), 1e-300)
        used = (counts > 0) & both[..., None]
        ratio = np.where(used, own, 1.0) / np.where(used, shared_p, 1.0)
        total = total + np.where(used, counts * np.log(ratio), 0.0).sum(axis=(-1, -2))
    return 2.0 * total


def relabellings(in_first: np.ndarray, n_permutations: int, rng: np.random.Generator) -> np.ndarray:
    """[P, n] random relabellings of the runs (True: the first method), group sizes kept."""
    n_first = int(in_first.sum())
    masks = np.zeros((n_permutations, len(in_first)), dtype=bool)
    for row in range(n_permutations):
        masks[row, rng.permutation(len(in_first))[:n_first]] = True
    return masks


def bootstrap_counts(
    n_first: int, n_second: int, draws: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """How often each run is drawn [draws, n], per method, when each method's runs (the first
    ``n_first``, then the rest) are resampled within the method."""
    first = np.zeros((draws, n_first + n_second))
    second = np.zeros_like(first)
    rows = np.arange(draws)[:, None]
    np.add.at(first, (rows, rng.integers(0, n_first, (draws, n_first))), 1.0)
    np.add.at(second, (rows, n_first + rng.integers(0, n_second, (draws, n_second))), 1.0)
    return first, second


def transition_lr(
    counts: np.ndarray, in_first: np.ndarray, n_permutations: int, confidence: float,
    rng: np.random.Generator,
) -> Verdict:  # fmt: skip
    """The likelihood ratio G (:func:`transition_g`) of method-specific against shared transition
    matrices from each run's counts ``counts`` [runs, K, K] (expected under the shared map,
    :func:`expected_transitions`): the initial distributions are per method in both models, so
    they add nothing to G; each relabelling re-sums the runs' counts (one matrix product for all
    relabellings), the map and its emissions fixed, no refit. p from relabelling the runs, the
    interval a bootstrap within each method."""
    n, k = len(counts), counts.shape[-1]
    flat = counts.reshape(n, k * k)
    observed = float(transition_g(flat[in_first].sum(axis=0).reshape(k, k),
                                  flat[~in_first].sum(axis=0).reshape(k, k)))  # fmt: skip
    masks = relabellings(in_first, n_permutations, rng).astype(float)
    summed = masks @ flat
    relabelled = transition_g(summed.reshape(-1, k, k),
                              (flat.sum(axis=0) - summed).reshape(-1, k, k))  # fmt: skip
    tolerance = 1e-9 * max(abs(observed), 1.0)
    p = (1 + int((relabelled >= observed - tolerance).sum())) / (1 + n_permutations)
    ordered = np.concatenate([flat[in_first], flat[~in_first]])
    first, second = bootstrap_counts(int(in_first.sum()), int((~in_first).sum()), n_permutations,
                                     rng)  # fmt: skip
    draws = transition_g((first @ ordered).reshape(-1, k, k), (second @ ordered).reshape(-1, k, k))
    return Verdict(observed, *percentile_interval(draws, confidence), float(p))


def collapse(path: np.ndarray) -> tuple[int, ...]:
    """A decoded path with repeated states collapsed: 0 0 2 2 3 -> (0, 2, 3)."""
    path = np.asarray(path)
    keep = np.concatenate([[True], path[1:] != path[:-1]]) if len(path) else np.array([], bool)
    return tuple(int(state) for state in path[keep])


def _total_variation(codes: np.ndarray, mask: np.ndarray, n_codes: int) -> float:
    a = np.bincount(codes[mask], minlength=n_codes) / max(int(mask.sum()), 1)
    b = np.bincount(codes[~mask], minlength=n_codes) / max(int((~mask).sum()), 1)
    return float(0.5 * np.abs(a - b).sum())


def collapsed_paths_tv(
    paths: Sequence[tuple[int, ...]], in_first: np.ndarray, n_permutations: int,
    confidence: float, rng: np.random.Generator,
) -> Verdict:  # fmt: skip
    """The total variation between two methods' distributions of collapsed paths (module
    docstring); p from relabelling the runs, the interval a bootstrap within each method."""
    distinct = {path: code for code, path in enumerate(sorted(set(paths)))}
    codes = np.array([distinct[path] for path in paths])
    n_codes = len(distinct)
    observed = _total_variation(codes, in_first, n_codes)
    p = _relabelling_p(lambda mask: _total_variation(codes, mask, n_codes), observed, in_first,
                       n_permutations, rng)  # fmt: skip
    ordered = np.concatenate([codes[in_first], codes[~in_first]])
    n_first = int(in_first.sum())
    boundary = np.arange(len(codes)) < n_first
    draws = np.empty(n_permutations)
    for row in range(n_permutations):
        index = _resample_within(n_first, len(codes) - n_first, rng)
        draws[row] = _total_variation(ordered[index], boundary, n_codes)
    return Verdict(observed, *percentile_interval(draws, confidence), p)


def _relabelling_p(
    statistic, observed: float, in_first: np.ndarray, n_permutations: int,
    rng: np.random.Generator,
) -> float:  # fmt: skip
    """p = (1 + #{T(relabelled) >= T - 1e-12}) / (1 + P) for a statistic large under a difference."""
    n_first = int(in_first.sum())
    extreme = 0
    mask = np.zeros(len(in_first), dtype=bool)
    for _ in range(n_permutations):
        mask[:] = False
        mask[rng.permutation(len(in_first))[:n_first]] = True
        extreme += statistic(mask) >= observed - 1e-12
    return (1 + extreme) / (1 + n_permutations)


def final_state(states: Mapping[str, np.ndarray]) -> int:
    """The state the most runs end in (ties: the state with the most checkpoints over all runs,
    then the first of those in the first run's path): chosen from the pooled runs, so it does not
    depend on how the states are numbered or which method a run belongs to."""
    ends = Counter(int(path[-1]) for path in states.values() if len(path))
    top = max(ends.values())
    candidates = [state for state, count in ends.items() if count == top]
    if len(candidates) == 1:
        return candidates[0]
    time_in = Counter(int(s) for path in states.values() for s in path)
    most = max(time_in[state] for state in candidates)
    candidates = [state for state in candidates if time_in[state] == most]
    first_path = [int(s) for s in next(iter(states.values()))]
    return min(
        candidates, key=lambda s: first_path.index(s) if s in first_path else len(first_path)
    )


def first_passage(path: np.ndarray, steps: np.ndarray, target: int) -> tuple[float, bool]:
    """(step, reached): the first checkpoint step at which ``path`` is in ``target``, or its last
    step, censored, when it never is."""
    hits = np.flatnonzero(np.asarray(path) == target)
    if hits.size:
        return float(steps[hits[0]]), True
    return float(steps[-1]), False
