"""Convergence as time to an event: runs that never converge are right-censored, not dropped.

A run that reaches the accuracy threshold has its *event* at its convergence step; a run that
never reaches it within its budget is *right-censored* at its last checkpoint step: all that is
known is that it had not converged by then. Dropping such runs would discard the strongest
evidence a comparison can have ("never converged within the budget"), so two groups' convergence
is compared as survival data:

* the survival function of each group by the Kaplan-Meier estimator (Kaplan & Meier 1958):
  S(t) = prod over event times u <= t of (1 - d_u / n_u), d_u runs converging at u, n_u runs
  still unconverged and observed at u (a run censored at u counts as at risk at u);
* the effect: the difference of restricted mean survival times (Royston & Parmar 2013),
  RMST(tau) = integral_0^tau S(t) dt in steps, second group minus first, restricted to the common
  horizon tau up to which both curves are estimated: the smaller of the two groups' largest
  follow-up steps (event or censoring), where a group whose every run converged (its curve reaches
  0 at its last step) is known at every step and does not limit tau; when every run of both groups
  converged, tau is the largest step and the effect is the difference of mean convergence steps.
  RMST is always defined, unlike a median, which does not exist for a group where fewer than half
  the runs converged. Its interval is a bootstrap percentile interval (runs resampled within each
  group, tau held at the observed horizon, a resample's curve held flat after its last step);
* the p-value: the two-sided log-rank test (Mantel 1966; its statistic as
  :func:`scipy.stats.logrank` computes it), its p-value from random relabellings of the runs like
  the other quantities' tests (:func:`logrank_permutation_p`): the chi-square approximation is too
  optimistic at the few runs per method a comparison may have.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SurvivalComparison:
    """The comparison of two groups' convergence, censored runs included (module docstring).

    ``effect`` (RMST second minus first, in steps, at ``horizon``), its interval ``low``/``high``,
    the log-rank ``p`` (NaN where no run of either group had its event or a group has fewer than
    2 runs), the common ``horizon`` and the runs and censored runs of each group."""

    effect: float
    low: float
    high: float
    p: float
    horizon: float
    n_first: int
    n_second: int
    censored_first: int
    censored_second: int

    @property
    def no_events(self) -> bool:
        """Whether no run of either group converged: the log-rank test has nothing to compare."""
        return (self.n_first - self.censored_first) + (self.n_second - self.censored_second) == 0


def kaplan_meier(
    times: np.ndarray, events: np.ndarray, counts: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The Kaplan-Meier estimate: ``(event_times, survival)``, S just after each distinct event
    time of ``times`` (ascending; S = 1 before the first). A censoring at an event's step counts as
    at risk. ``counts`` [B, n] (optional): how often each run is drawn in each of B resamples; then
    ``survival`` is [B, len(event_times)] (an event time no drawn run has leaves S unchanged)."""
    times, events = np.asarray(times, float), np.asarray(events, bool)
    weights = np.ones((1, len(times))) if counts is None else np.asarray(counts, float)
    at = np.unique(times[events])
    at_risk = weights @ (times[:, None] >= at[None, :])
    converged = weights @ ((times[:, None] == at[None, :]) & events[:, None])
    with np.errstate(invalid="ignore", divide="ignore"):
        factor = np.where(at_risk > 0, 1.0 - converged / np.where(at_risk > 0, at_risk, 1), 1.0)
    survival = np.cumprod(factor, axis=1)
    return at, survival[0] if counts is None else survival


def restricted_mean(
    times: np.ndarray, events: np.ndarray, horizon: float, counts: np.ndarray | None = None
) -> float | np.ndarray:
    """RMST(horizon) = integral_0^horizon S(t) dt of the Kaplan-Meier curve, a step function held at
    its last value after the last observed step; with ``counts`` [B, n] one RMST per resample."""
    at, survival = kaplan_meier(times, events, counts)
    inside = at < horizon
    widths = np.diff(np.concatenate([[0.0], at[inside], [horizon]]))
    levels = np.concatenate([np.ones((*survival.shape[:-1], 1)), survival[..., inside]], axis=-1)
    area = levels @ widths
    return float(area) if counts is None else area


def logrank_statistic(times: np.ndarray, events: np.ndarray, in_first: np.ndarray) -> np.ndarray:
    """The log-rank statistic (Mantel 1966) of the first group against the rest, as
    :func:`scipy.stats.logrank` gives it for ``x`` = the first group: Z = (O - E) / sqrt(V), O the
    first group's events, E = sum_u d_u n1_u / n_u their expectation under no difference and V its
    hypergeometric variance, summed over the distinct event steps u. ``in_first`` is [n] or, for
    many relabellings at once, [P, n] (then Z is [P]). V = 0 gives Z = 0 (no information)."""
    times, events = np.asarray(times, float), np.asarray(events, bool)
    at = np.unique(times[events])
    at_risk = (times[:, None] >= at[None, :]).astype(float)
    converged = ((times[:, None] == at[None, :]) & events[:, None]).astype(float)
    n_u, d_u = at_risk.sum(axis=0), converged.sum(axis=0)
    first = np.asarray(in_first, float)
    n1_u, d1_u = first @ at_risk, first @ converged
    share = n1_u / n_u
    observed_minus_expected = (d1_u - d_u * share).sum(axis=-1)
    spread = np.where(n_u > 1, (n_u - d_u) / np.maximum(n_u - 1, 1), 0.0)
    variance = (d_u * share * (1 - share) * spread).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(variance > 0, observed_minus_expected / np.sqrt(variance), 0.0)


def logrank_permutation_p(
    times: np.ndarray, events: np.ndarray, in_first: np.ndarray, n_permutations: int,
    rng: np.random.Generator,
) -> float:  # fmt: skip
    """Two-sided p-value of the log-rank statistic from random relabellings of the runs,
    p = (1 + #{|Z*| >= |Z|}) / (1 + P), as the other quantities' permutation tests (the asymptotic
    chi-square p-value of :func:`scipy.stats.logrank` is too small at a few runs per group: at 4 vs
    4 it can fall below 2 / C(8, 4), the least any relabelling test can give). NaN when no run
    converged (nothing to compare)."""
    in_first = np.asarray(in_first, bool)
    if not np.any(events):
        return float("nan")
    observed = logrank_statistic(times, events, in_first)
    masks = np.zeros((n_permutations, len(times)), dtype=bool)
    n_first = int(in_first.sum())
    for row in range(n_permutations):
        masks[row, rng.permutation(len(times))[:n_first]] = True
    relabelled = logrank_statistic(times, events, masks)
    extreme = int((np.abs(relabelled) >= np.abs(observed) - 1e-12).sum())
    return (1 + extreme) / (1 + n_permutations)


def compare_survival(
    first: tuple[np.ndarray, np.ndarray],
    second: tuple[np.ndarray, np.ndarray],
    n_permutations: int,
    confidence: float,
    rng: np.random.Generator,
) -> SurvivalComparison:
    """Compare two groups' ``(times, events)`` (module docstring): RMST difference (second minus
    first) at the common horizon with its bootstrap percentile interval, and the log-rank
    permutation p-value (:func:`logrank_permutation_p`), ``n_permutations`` draws each from
    ``rng``. Groups with fewer than 2 runs get NaN bounds and p."""
    (t_a, e_a), (t_b, e_b) = (
        (np.asarray(t, float), np.asarray(e, bool)) for t, e in (first, second)
    )
    n_a, n_b = len(t_a), len(t_b)
    censored_a, censored_b = int((~e_a).sum()), int((~e_b).sum())
    nan = float("nan")
    if n_a == 0 or n_b == 0:
        return SurvivalComparison(nan, nan, nan, nan, nan, n_a, n_b, censored_a, censored_b)
    horizon = float(min(_known_until(t_a, e_a), _known_until(t_b, e_b)))
    if not np.isfinite(horizon):  # every run converged: the curves are known at every step
        horizon = float(max(t_a.max(), t_b.max()))
    effect = restricted_mean(t_b, e_b, horizon) - restricted_mean(t_a, e_a, horizon)
    if n_a < 2 or n_b < 2:
        return SurvivalComparison(effect, nan, nan, nan, horizon, n_a, n_b, censored_a,
                                  censored_b)  # fmt: skip
    times, events = np.concatenate([t_a, t_b]), np.concatenate([e_a, e_b])
    p = logrank_permutation_p(times, events, np.arange(n_a + n_b) < n_a, n_permutations, rng)
    draws_a = _counts(rng.integers(0, n_a, (n_permutations, n_a)), n_a)
    draws_b = _counts(rng.integers(0, n_b, (n_permutations, n_b)), n_b)
    draws = (restricted_mean(t_b, e_b, horizon, draws_b)
             - restricted_mean(t_a, e_a, horizon, draws_a))  # fmt: skip
    tail = (1 - confidence) / 2
    low, high = np.quantile(draws, [tail, 1 - tail])
    return SurvivalComparison(float(effect), float(low), float(high), p, horizon, n_a, n_b,
                              censored_a, censored_b)  # fmt: skip


def _known_until(times: np.ndarray, events: np.ndarray) -> float:
    """The last step where a group's Kaplan-Meier curve is estimated: its largest follow-up step,
    or infinity when the curve reaches 0 there (every run still at risk converged)."""
    survival = kaplan_meier(times, events)[1]
    return np.inf if len(survival) and survival[-1] == 0 else float(times.max())


def _counts(indices: np.ndarray, n: int) -> np.ndarray:
    """[B, n]: how often each of n runs is drawn in each row of ``indices`` [B, m]."""
    counts = np.zeros((len(indices), n))
    np.add.at(counts, (np.arange(len(indices))[:, None], indices), 1)
    return counts
