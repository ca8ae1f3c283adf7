"""Runs that never converge are censored in the convergence comparison; a one-state map's line."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.duration.survfunc import SurvfuncRight

from trainmap.dynamics.verdicts.compare import (
    NO_EVIDENCE,
    NOT_ENOUGH_RUNS,
    censoring_steps,
    compare_methods,
    verdict_markdown,
)
from trainmap.dynamics.verdicts.stability_results import (
    StabilityCurve,
    StabilityPoint,
    StabilityTargets,
)
from trainmap.dynamics.verdicts.survival import (
    kaplan_meier,
    logrank_permutation_p,
    logrank_statistic,
    restricted_mean,
)


def lr_sweep(n: int = 8, seed: int = 0) -> tuple[pd.DataFrame, dict[str, str], dict[str, float]]:
    """lr 0.1 converges at steps 100-300; lr 0.01 never reaches the threshold in 1000 steps."""
    rng = np.random.default_rng(seed)
    rows, groups, censored = {}, {}, {}
    for index in range(n):
        rows[f"fast{index}"] = {"occupancy of state 0": rng.normal(),
                                "convergence step": float(rng.integers(100, 301))}  # fmt: skip
        groups[f"fast{index}"] = "lr 0.1"
    for index in range(n):
        rows[f"slow{index}"] = {"occupancy of state 0": rng.normal(), "convergence step": np.nan}
        groups[f"slow{index}"] = "lr 0.01"
        censored[f"slow{index}"] = 1000.0
    return pd.DataFrame.from_dict(rows, orient="index"), groups, censored


def test_a_group_that_never_converges_is_slower_not_unknown():
    quantities, groups, censored = lr_sweep()
    # Without censoring the never-converged runs are dropped: 0 vs 8 runs, no verdict possible.
    before = compare_methods(quantities, groups, n_permutations=1000).set_index("quantity")
    assert before.loc["convergence step", "verdict"] == NOT_ENOUGH_RUNS
    verdicts = compare_methods(quantities, groups, n_permutations=1000, censored_at=censored)
    row = verdicts.set_index("quantity").loc["convergence step"]
    assert (row["first"], row["second"]) == ("lr 0.1", "lr 0.01")
    assert row["verdict"] == "lr 0.01 higher" and row["p_holm"] < 0.05
    assert (row["n_first"], row["n_second"]) == (8, 8)
    assert (row["n_censored_first"], row["n_censored_second"]) == (0, 8)
    # Every lr 0.1 run converged, so the horizon is lr 0.01's budget: 1000 minus the mean step.
    fast = quantities.loc[[r for r in groups if groups[r] == "lr 0.1"], "convergence step"]
    assert row["effect"] == pytest.approx(1000 - fast.mean())
    assert row["low"] <= row["effect"] <= row["high"]
    # The existing columns come first, in their order; the new ones at the end.
    old = ["first", "second", "quantity", "effect", "low", "high", "p", "p_holm", "n_first",
           "n_second", "verdict"]  # fmt: skip
    assert list(verdicts.columns[: len(old)]) == old


def test_the_same_distribution_gives_no_evidence():
    rng = np.random.default_rng(3)
    steps = rng.integers(100, 900, 24).astype(float)
    steps[rng.random(24) < 0.3] = np.nan  # some runs of each group never converge
    quantities = pd.DataFrame({"convergence step": steps}, index=[f"r{i}" for i in range(24)])
    groups = {f"r{i}": "a" if i % 2 else "b" for i in range(24)}
    censored = {f"r{i}": 1000.0 for i in range(24) if np.isnan(steps[i])}
    row = compare_methods(quantities, groups, n_permutations=1000, censored_at=censored).iloc[0]
    assert row["verdict"] == NO_EVIDENCE and row["p"] > 0.05


def test_no_run_converged_gives_no_evidence_and_says_so():
    quantities = pd.DataFrame({"convergence step": [np.nan] * 8}, index=[f"r{i}" for i in range(8)])
    groups = {f"r{i}": "a" if i < 4 else "b" for i in range(8)}
    censored = dict.fromkeys(quantities.index, 500.0)
    verdicts = compare_methods(quantities, groups, n_permutations=200, censored_at=censored)
    row = verdicts.iloc[0]
    assert row["verdict"] == NOT_ENOUGH_RUNS and math.isnan(row["p"])
    assert "no run of either method converged" in row["note"]
    assert "no run of either method converged" in verdict_markdown(verdicts, 0.95)


def test_restricted_mean_is_the_area_under_the_kaplan_meier_steps():
    times = np.array([2.0, 3.0, 3.0, 5.0, 8.0, 9.0])
    events = np.array([True, True, False, True, False, True])
    # At risk 6, 5, 3, 1 at steps 2, 3, 5, 9: S = 5/6, 5/6 * 4/5, 2/3 * 2/3, 0.
    at, survival = kaplan_meier(times, events)
    np.testing.assert_allclose(at, [2, 3, 5, 9])
    np.testing.assert_allclose(survival, [5 / 6, 2 / 3, 4 / 9, 0])
    library = SurvfuncRight(times, events.astype(int))
    np.testing.assert_allclose(survival, library.surv_prob)
    # Area to step 7: 1 x 2 + 5/6 x 1 + 2/3 x 2 + 4/9 x 2.
    assert restricted_mean(times, events, 7.0) == pytest.approx(2 + 5 / 6 + 4 / 3 + 8 / 9)
    # Resampled weights: counts of ones are the plain curve; a run drawn twice weighs twice.
    counts = np.array([[1, 1, 1, 1, 1, 1], [2, 0, 1, 1, 1, 1]])
    areas = restricted_mean(times, events, 7.0, counts)
    assert areas[0] == pytest.approx(restricted_mean(times, events, 7.0))
    drawn = np.r_[0, 0, 2, 3, 4, 5]  # run 0 twice, run 1 not at all
    assert areas[1] == pytest.approx(restricted_mean(times[drawn], events[drawn], 7.0))


def test_the_log_rank_statistic_is_the_library_s_and_its_p_value_close():
    rng = np.random.default_rng(5)
    times = np.r_[rng.integers(100, 400, 30), rng.integers(150, 600, 30)].astype(float)
    events = rng.random(60) < 0.7
    in_first = np.arange(60) < 30
    library = stats.logrank(*[stats.CensoredData(uncensored=times[mask & events],
                                                 right=times[mask & ~events])
                              for mask in (in_first, ~in_first)])  # fmt: skip
    assert logrank_statistic(times, events, in_first) == pytest.approx(library.statistic)
    p = logrank_permutation_p(times, events, in_first, 4000, np.random.default_rng(0))
    assert p == pytest.approx(library.pvalue, abs=0.01)


def test_the_markdown_counts_the_censored_runs():
    quantities, groups, censored = lr_sweep()
    verdicts = compare_methods(quantities, groups, n_permutations=500, censored_at=censored)
    text = verdict_markdown(verdicts, 0.95)
    line = next(line for line in text.splitlines() if "| convergence step |" in line)
    assert "8 vs 8 (8 vs 0 censored)" in line and "lr 0.01 higher" in line
    assert "log-rank" in text


def test_the_runs_censored_are_the_never_converged_at_their_last_step():
    tables = {run: pd.DataFrame({"step": [0, 50, 400]}) for run in ("a", "b", "c")}
    steps = censoring_steps(tables, {"a": 50, "b": None, "c": None}, {"c": "diverged"})
    assert steps == {"b": 400.0}


def one_state_curve(verdicts: list[str], held: float = 1.0) -> StabilityCurve:
    points = [StabilityPoint(n, 1, [1] * 10, [1.0] * 10, {}, 0.9, dict.fromkeys(verdicts, held))
              for n in (4, 8)]  # fmt: skip
    return StabilityCurve(points, StabilityTargets(), 10, 1, [], groups=["a", "b"],
                          group_sizes={"a": 10, "b": 10}, verdicts=verdicts)  # fmt: skip


def test_a_one_state_map_is_not_called_stable():
    curve = one_state_curve([])
    assert curve.one_state and curve.sufficient_n is None
    assert "one state" in curve.line() and "stable from" not in curve.line()
    assert curve.to_dict()["one_state"] is True
    # Its verdicts can still be stable, and the line says from which n.
    followed = one_state_curve(["b vs a, convergence step: b higher"])
    assert followed.sufficient_n == 4
    assert "one state" in followed.line() and "verdicts hold again from n = 4" in followed.line()
    failing = one_state_curve(["b vs a, convergence step: b higher"], held=0.5)
    assert failing.sufficient_n is None and "do not all hold again at n = 8" in failing.line()
    assert StabilityCurve.from_dict(curve.to_dict()).to_dict() == curve.to_dict()


def test_paper_and_adaptive_do_not_call_a_one_state_map_stable():
    from trainmap.dynamics.paper import _stable_from
    from trainmap.dynamics.verdicts.adaptive import round_decision
    from trainmap.dynamics.verdicts.stability_results import MapStability

    summary = {"measured": True} | one_state_curve([]).to_dict()
    row = {"stability_measured": True, "stable_from": summary["sufficient_n"],
           "stability_one_state": summary["one_state"]}  # fmt: skip
    assert _stable_from(row) == "one state"
    decision = round_decision(MapStability(one_state_curve([])),
                              {"round": 0, "rounds": 2, "step": 8, "max": 40,
                               "seeds_per_method": 10, "first_seed": 0})  # fmt: skip
    assert not decision["stop"] and decision["reason"].startswith("one state at 10 seeds")
