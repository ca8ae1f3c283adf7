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
(``excluded``), never dropped silently.

A detour state (sec. 2.3): positive coefficient, and not visited by every included run.

Trajectory dissimilarity, eq. (1): E[W(p, q)] = 2 / (N (N - 1)) sum_i sum_{j<i} W(p_i, p_j), the 1-D
Wasserstein distance between two runs' state distributions over the state indices 0..K-1
(``scipy.stats.wasserstein_distance``), averaged over all pairs of decoded runs.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import wasserstein_distance


def state_distribution(states: np.ndarray, n_states: int) -> np.ndarray:
    """The empirical distribution over states of one decoded run (unigram featurisation)."""
    return np.bincount(np.asarray(states), minlength=n_states) / len(states)


def trajectory_dissimilarity(distributions: Mapping[str, np.ndarray]) -> float:
    """E[W(p, q)] over all pairs of runs (eq. 1); NaN with fewer than two runs."""
    runs = list(distributions.values())
    if len(runs) < 2:
        return float("nan")
    support = np.arange(len(runs[0]))
    distances = [
        wasserstein_distance(support, support, u_weights=p, v_weights=q)
        for p, q in itertools.combinations(runs, 2)
    ]
    return float(np.mean(distances))


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

    @property
    def detour_states(self) -> list[int]:
        """States with a positive coefficient that some included run never visits."""
        return [int(s) for s in self.coefficients.loc[self.coefficients["detour"], "state"]]

    def to_dict(self) -> dict:
        """A JSON-ready summary."""
        return {
            "r2": self.r2,
            "f_pvalue": self.f_pvalue,
            "n_runs": self.n_runs,
            "intercept": self.intercept,
            "detour_states": self.detour_states,
            "excluded": self.excluded,
            "rank_deficient": self.rank_deficient,
            "coefficients": self.coefficients.to_dict(orient="records"),
        }


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
) -> DetourRegression:
    """OLS of convergence step on state distributions with effect coding (module docstring).

    ``extra`` (index = run ids) adds covariates, e.g. method indicators for a joint comparison;
    their coefficients are appended to the table with ``state`` = their column name.
    """
    import statsmodels.api as sm

    used, excluded = included_runs(convergence, status or {})
    n_states = len(next(iter(distributions.values())))
    shares = np.array([distributions[run] for run in used]) if used else np.zeros((0, n_states))
    visited = (shares > 0).sum(axis=0) if used else np.zeros(n_states, dtype=int)
    present = [k for k in range(n_states) if visited[k] > 0]
    y = np.array([convergence[run] for run in used], dtype=float)
    rows = [_state_row(k, visited[k], len(used)) for k in range(n_states)]
    result = DetourRegression(pd.DataFrame(rows), float("nan"), float("nan"), len(used),
                              float("nan"), excluded)  # fmt: skip
    n_covariates = len(present) - 1 + (0 if extra is None else extra.shape[1])
    if (len(present) < 2 and extra is None) or len(used) <= n_covariates + 1:
        return result  # nothing to regress on, or no residual degrees of freedom
    reference = present[-1]
    columns = [shares[:, k] - shares[:, reference] for k in present[:-1]]
    names = [f"state{k}" for k in present[:-1]]
    if extra is not None:
        columns += [extra.loc[used, column].to_numpy(dtype=float) for column in extra.columns]
        names += list(extra.columns)
    design = sm.add_constant(np.column_stack(columns), has_constant="add")
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
    contrast = np.zeros(design.shape[1])
    contrast[1 : 1 + n_state_terms] = -1.0
    last = fitted.t_test(contrast)
    _fill(rows[reference], float(np.squeeze(last.effect)), float(np.squeeze(last.sd)),
          float(np.squeeze(last.tvalue)), float(np.squeeze(last.pvalue)))  # fmt: skip
    for position, name in enumerate(names[n_state_terms:], start=1 + n_state_terms):
        rows.append({"state": name, "coefficient": fitted.params[position],
                     "std_error": fitted.bse[position], "t": fitted.tvalues[position],
                     "p_value": fitted.pvalues[position], "visited_by": None,
                     "visited_by_all": None, "detour": False})  # fmt: skip
    table = pd.DataFrame(rows)
    table["detour"] = [
        bool(isinstance(r["state"], int | np.integer) and r["coefficient"] > 0
             and not r["visited_by_all"] and r["visited_by"] > 0)
        for r in rows
    ]  # fmt: skip
    return DetourRegression(table, float(fitted.rsquared), float(fitted.f_pvalue), len(used),
                            float(fitted.params[0]), excluded, rank_deficient)  # fmt: skip


def _state_row(state: int, visited_by: int, n_runs: int) -> dict:
    return {"state": state, "coefficient": np.nan, "std_error": np.nan, "t": np.nan,
            "p_value": np.nan, "visited_by": int(visited_by),
            "visited_by_all": bool(n_runs > 0 and visited_by == n_runs), "detour": False}  # fmt: skip


def _fill(row: dict, coefficient: float, std_error: float, t: float, p_value: float) -> None:
    row.update(coefficient=float(coefficient), std_error=float(std_error), t=float(t),
               p_value=float(p_value))  # fmt: skip
