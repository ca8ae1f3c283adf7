"""Detour states and trajectory dissimilarity (Hu et al., sec. 2.3 and 3.4, eq. 1).

Each run is featurised by its empirical state distribution P^(s = k) = (1/T) sum_t 1(s_t = k)
(the "bag of states"), and convergence step is regressed on it by OLS (statsmodels).

The fractions sum to one, so an intercept plus all K fractions is collinear. trainmap uses effect
(deviation) coding: y = b_0 + sum_{k<K} b_k (P_k - P_K), and b_K = -sum_{k<K} b_k. Then b_0 is the
mean of the K state effects and b_k is how much later than that average a run converges if it
spends all its time in state k; b_K's standard error and test come from the fitted covariance
(statsmodels' ``t_test`` of the contrast). All p-values are two-sided from the t distribution (the
authors' code was wrong for negative t). States no included run visits have no coefficient.

Which runs the regression uses: runs that completed and converged (a convergence step exists).
Diverged runs and runs that never reached the threshold are counted and listed in the result
(``excluded``), never dropped silently. A run that never converged has no convergence step to
regress (OLS has no censoring), so it is left out here; the convergence comparison between methods
(:func:`~trainmap.dynamics.verdicts.compare.compare_methods`) counts it as censored at its last step
(log-rank test), and :data:`EXCLUDED_NOTE` says so in the written summary.

A detour state (sec. 2.3): positive coefficient and not visited by every included run, and, as
the paper recommends ("only interpreting the coefficients when they are statistically
significant"), a coefficient significant at ``alpha`` (default ``analysis.alpha``) after a Holm
correction across the states' tests (trainmap's own :func:`holm`; the same numbers as statsmodels'
``multipletests`` without its cost). The authors' criterion without the test marked states as
detours at p = 0.41.
The regression is not fitted when the runs leave fewer than three residual degrees of freedom
(runs <= regressors + 2): R^2 is then 1 or nearly so by construction (0.9996 on 7 runs and 6
regressors), so the result says why instead of giving numbers. Adjusted R^2 is reported beside
R^2.

Trajectory dissimilarity, eq. (1): E[W(p, q)] = 2 / (N (N - 1)) sum_i sum_{j<i} W(p_i, p_j), the
Wasserstein distance between two runs' state distributions, averaged over all pairs of decoded runs.
Its ground metric (``ground``) is ``"total_variation"`` by default: distance 1 between any two
different states, so W = (1/2) sum_k |p_k - q_k| and the value does not depend on how the HMM
happened to number its states. ``"state_index"`` is eq. (1) as the paper computes it, the 1-D
Wasserstein distance over the state indices 0..K-1 (from the cumulative distributions, all pairs at
once; the numbers of ``scipy.stats.wasserstein_distance``, tested): state
numbers are arbitrary, so swapping two labels changes it (1.333 -> 1.0 on a hand example).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trainmap.schema import section_defaults


def state_distribution(states: np.ndarray, n_states: int) -> np.ndarray:
    """The empirical distribution over states of one decoded run (unigram featurisation)."""
    return np.bincount(np.asarray(states), minlength=n_states) / len(states)


GROUND_METRICS = ("total_variation", "state_index")


def trajectory_dissimilarity(
    distributions: Mapping[str, np.ndarray], ground: str = "total_variation"
) -> float:
    """E[W(p, q)] over all pairs of runs (eq. 1) under the ``ground`` metric between states (module
    docstring); NaN with fewer than two runs."""
    if ground not in GROUND_METRICS:
        raise ValueError(f"analysis.dissimilarity: {ground!r} is not a ground metric; choose one "
                         f"of {', '.join(GROUND_METRICS)}")  # fmt: skip
    runs = np.array(list(distributions.values()), dtype=float)
    if len(runs) < 2:
        return float("nan")
    return float(pairwise_distances(runs, ground).mean())


def pairwise_distances(distributions: np.ndarray, ground: str = "total_variation") -> np.ndarray:
    """W(p_i, p_j) for every pair i < j of the rows of ``distributions`` [N, K] (the terms of eq. 1):
    under ``total_variation`` (1/2) sum_k |p_k - q_k|; under ``state_index`` the 1-D Wasserstein
    distance over the states 0..K-1, sum_k |F_p(k) - F_q(k)| for the cumulative distributions F
    (unit spacing; what ``scipy.stats.wasserstein_distance`` computes on that support)."""
    first, second = np.triu_indices(len(distributions), k=1)
    if ground == "total_variation":
        return 0.5 * np.abs(distributions[first] - distributions[second]).sum(axis=1)
    cumulative = np.cumsum(distributions, axis=1)[:, :-1]
    return np.abs(cumulative[first] - cumulative[second]).sum(axis=1)


#: The detours' significance level: the config schema's default of ``analysis.alpha``.
DEFAULT_ALPHA: float = section_defaults("analysis")["alpha"]
EXCLUDED_NOTE = (
    "runs that never converged are left out of the regression (OLS has no censoring); the "
    "convergence comparison between groups counts them as censored at their last step (log-rank "
    "test)"
)


@dataclass
class DetourRegression:
    """The OLS of convergence step on state distributions, and the detours it finds."""

    coefficients: pd.DataFrame
    r2: float
    f_pvalue: float
    n_runs: int
    intercept: float
    excluded: dict[str, list[str]] = field(default_factory=dict)
    rank_deficient: bool = False
    r2_adjusted: float = float("nan")
    alpha: float = DEFAULT_ALPHA
    not_fitted: str | None = None  # why there is no regression, when there is none
    one_state: bool = False  # every included run stays in one state (no state terms)

    @property
    def fitted(self) -> bool:
        """Whether the regression was fitted (:attr:`not_fitted` says why not)."""
        return self.not_fitted is None

    @property
    def explained(self) -> float | None:
        """The share of convergence variance the map explains: R^2 when fitted, 0 when the runs
        occupy one state (the regression is its intercept), else None."""
        if self.fitted and np.isfinite(self.r2):
            return self.r2
        return 0.0 if self.one_state else None

    @property
    def detour_states(self) -> list[int]:
        """Optional states with a positive coefficient significant after Holm's correction."""
        return [int(s) for s in self.coefficients.loc[self.coefficients["detour"], "state"]]

    def to_dict(self) -> dict:
        """A JSON-ready summary (NaN as null)."""
        return {
            "fitted": self.fitted,
            "not_fitted": self.not_fitted,
            "r2": _finite_or_none(self.r2),
            "r2_adjusted": _finite_or_none(self.r2_adjusted),
            "explained": self.explained,
            "f_pvalue": _finite_or_none(self.f_pvalue),
            "n_runs": self.n_runs,
            "intercept": _finite_or_none(self.intercept),
            "alpha": self.alpha,
            "correction": "holm",
            "detour_states": self.detour_states,
            "excluded": self.excluded,
            "excluded_note": EXCLUDED_NOTE if self.excluded else None,
            "rank_deficient": self.rank_deficient,
            "coefficients": [
                {key: _finite_or_none(value) for key, value in row.items()}
                for row in self.coefficients.to_dict(orient="records")
            ],
        }


def _finite_or_none(value: object) -> object:
    if isinstance(value, float | np.floating) and not np.isfinite(value):
        return None
    return value.item() if isinstance(value, np.generic) else value


def included_runs(
    convergence: Mapping[str, int | None], status: Mapping[str, str]
) -> tuple[list[str], dict[str, list[str]]]:
    """The runs a regression can use, and the excluded ones by reason."""
    diverged = sorted(run for run in convergence if status.get(run) == "diverged")
    never = sorted(run for run, step in convergence.items() if step is None and run not in diverged)
    used = sorted(run for run in convergence if run not in diverged and run not in never)
    return used, {"diverged": diverged, "never_converged": never}


def regress_detours(
    distributions: Mapping[str, np.ndarray],
    convergence: Mapping[str, int | None],
    status: Mapping[str, str] | None = None,
    extra: pd.DataFrame | None = None,
    alpha: float = DEFAULT_ALPHA,
    no_curve: str = "",
) -> DetourRegression:
    """OLS of convergence step on state distributions with effect coding (module docstring).

    ``extra`` (index = run ids) adds covariates, e.g. method indicators for a joint comparison;
    their coefficients are appended to the table with ``state`` = their column name. A detour's
    coefficient must be significant at ``alpha`` after Holm's correction across the states. Runs
    that never converged or diverged are left out and listed in ``excluded`` (:data:`EXCLUDED_NOTE`).
    ``no_curve``: why the runs have no convergence step at all (no curve or no threshold): then
    nothing is fitted and ``not_fitted`` says so (no run is listed as never converged).
    """
    import statsmodels.api as sm

    if not 0 < alpha < 1:
        raise ValueError(f"analysis.alpha: {alpha!r} is not allowed; it must be in (0, 1)")
    n_states = len(next(iter(distributions.values())))
    if no_curve:
        rows = [_state_row(k, 0, 0) for k in range(n_states)]
        return DetourRegression(pd.DataFrame(rows), float("nan"), float("nan"), 0, float("nan"),
                                alpha=alpha, not_fitted=f"no detour regression: {no_curve}")  # fmt: skip
    used, excluded = included_runs(convergence, status or {})
    shares = np.array([distributions[run] for run in used]) if used else np.zeros((0, n_states))
    visited = (shares > 0).sum(axis=0) if used else np.zeros(n_states, dtype=int)
    present = [k for k in range(n_states) if visited[k] > 0]
    y = np.array([convergence[run] for run in used], dtype=float)
    rows = [_state_row(k, visited[k], len(used)) for k in range(n_states)]
    n_regressors = len(present) - 1 + (0 if extra is None else extra.shape[1])
    reason = _not_fitted_reason(len(used), len(present), n_regressors, extra is not None, y)
    if reason is not None:
        return DetourRegression(pd.DataFrame(rows), float("nan"), float("nan"), len(used),
                                float("nan"), excluded, alpha=alpha, not_fitted=reason,
                                one_state=len(present) < 2 and extra is None)  # fmt: skip
    reference = present[-1]
    columns = [shares[:, k] - shares[:, reference] for k in present[:-1]]
    names = [f"state{k}" for k in present[:-1]]
    if extra is not None:
        columns += [extra.loc[used, column].to_numpy(dtype=float) for column in extra.columns]
        names += list(extra.columns)
    design = sm.add_constant(np.column_stack(columns) if columns else np.zeros((len(used), 0)),
                             has_constant="add")  # fmt: skip
    rank_deficient = bool(np.linalg.matrix_rank(design) < design.shape[1])
    if rank_deficient:
        warnings.warn(
            "the state distributions are collinear beyond summing to one (e.g. two states always "
            "take the same share); the coefficients are a minimum-norm solution and their "
            "p-values do not mean much",
            stacklevel=2,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # statsmodels repeats the rank warning
        fitted = sm.OLS(y, design).fit()
    n_state_terms = len(present) - 1
    for position, k in enumerate(present[:-1]):
        _fill(rows[k], fitted.params[1 + position], fitted.bse[1 + position],
              fitted.tvalues[1 + position], fitted.pvalues[1 + position])  # fmt: skip
    if len(present) > 1:
        contrast = np.zeros(design.shape[1])
        contrast[1 : 1 + n_state_terms] = -1.0
        last = fitted.t_test(contrast)
        _fill(rows[reference], float(np.squeeze(last.effect)), float(np.squeeze(last.sd)),
              float(np.squeeze(last.tvalue)), float(np.squeeze(last.pvalue)))  # fmt: skip
    fill_holm(rows)
    for position, name in enumerate(names[n_state_terms:], start=1 + n_state_terms):
        rows.append({"state": name, "coefficient": fitted.params[position],
                     "std_error": fitted.bse[position], "t": fitted.tvalues[position],
                     "p_value": fitted.pvalues[position], "p_holm": np.nan, "visited_by": None,
                     "visited_by_all": None, "detour": False})  # fmt: skip
    table = pd.DataFrame(rows)
    table["detour"] = [is_detour(r, alpha) for r in rows]
    return DetourRegression(table, float(fitted.rsquared), float(fitted.f_pvalue), len(used),
                            float(fitted.params[0]), excluded, rank_deficient,
                            float(fitted.rsquared_adj), alpha)  # fmt: skip


def is_detour(row: Mapping, alpha: float | None) -> bool:
    """Whether a coefficient row (a state's, as in ``coefficients``) marks a detour: the paper's
    rule (sec. 3.4: a positive coefficient, a state only some runs visit) and, unless ``alpha`` is
    None, trainmap's test (significant at ``alpha`` after Holm's correction)."""
    if not isinstance(row["state"], int | np.integer) or not (row["coefficient"] or 0) > 0:
        return False
    skipped = bool(row["visited_by"]) and not row["visited_by_all"]
    return skipped and (alpha is None or (row["p_holm"] is not None and row["p_holm"] < alpha))


def _not_fitted_reason(
    n_runs: int, n_present: int, n_regressors: int, has_extra: bool, steps: np.ndarray
) -> str | None:
    """Why the regression cannot be trusted, or None: it needs >= 3 residual degrees of freedom
    and convergence steps that differ between runs."""
    n_regressors = max(n_regressors, 0)
    if n_runs <= n_regressors + 2:
        return (f"{n_runs} included runs for {n_regressors} regressors and an intercept: a fit "
                f"needs at least {n_regressors + 3} runs (with fewer, R^2 is near 1 by "
                "construction); included runs are those that converged and did not diverge; "
                "add seeds")  # fmt: skip
    if n_present < 2 and not has_extra:
        return (f"every one of the {n_runs} included runs stays in a single state: there is "
                "nothing to regress convergence on")  # fmt: skip
    if np.ptp(steps) == 0:
        return (f"every one of the {n_runs} included runs converges at step {steps[0]:.0f}: "
                "there is no variation in convergence to explain")  # fmt: skip
    return None


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (Holm 1979): the i-th smallest of m is multiplied by
    m - i + 1, made non-decreasing in that order, and capped at 1. (statsmodels' ``multipletests``
    gives the same numbers, tests/unit/dynamics/verdicts/test_certainty.py checks, but runs a full garbage
    collection on every call: 105 ms per call on 8 p-values (timeit, statsmodels 0.15.0, with
    trainmap's modules loaded; it grows with the heap), against 7 us here, which the bootstrap
    cannot afford 200 times.)"""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    scaled = p[order] * (len(p) - np.arange(len(p)))
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(np.maximum.accumulate(scaled), 1.0)
    return adjusted


def fill_holm(rows: list[dict], key: str = "p_value") -> None:
    """Holm-adjusted p-values (``p_holm``) across the rows whose ``key`` p-value is finite (the
    states that have a coefficient)."""
    tested = [row for row in rows if np.isfinite(row[key])]
    for row, p in zip(tested, holm([row[key] for row in tested]), strict=True):
        row["p_holm"] = float(p)


def _state_row(state: int, visited_by: int, n_runs: int) -> dict:
    return {"state": state, "coefficient": np.nan, "std_error": np.nan, "t": np.nan,
            "p_value": np.nan, "p_holm": np.nan, "visited_by": int(visited_by),
            "visited_by_all": bool(n_runs > 0 and visited_by == n_runs), "detour": False}  # fmt: skip


def _fill(row: dict, coefficient: float, std_error: float, t: float, p_value: float) -> None:
    row.update(coefficient=float(coefficient), std_error=float(std_error), t=float(t),
               p_value=float(p_value))  # fmt: skip
