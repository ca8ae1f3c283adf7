"""The verdict table: permutation tests between methods that share one training map.

**Permutation tests between methods** (:func:`compare_methods`; Good 2005, ch. 3). In a joint
comparison all runs share one map, so each run's state occupancy (fraction of checkpoints in each
state), its time in detour states and its convergence step are numbers that can be compared
between two methods without refitting: the effect is the difference of the group means (second
method minus first), its interval a percentile bootstrap interval (runs resampled within each
method), its p-value two-sided from random relabellings of the two methods' runs,
p = (1 + #{|effect*| >= |effect|}) / (1 + P). p-values are Holm-corrected within each method pair.
A verdict is "not enough runs" when even a perfect separation of the two methods could not reach
significance: the smallest p-value any relabelling test can give, 1/C(n_A + n_B, n_A) (doubled for
equal sizes, whose mirror image is as extreme), exceeds Holm's first threshold alpha / m for the m
tests of the pair, or a method has fewer than 2 runs with the quantity.

**The convergence step is compared as time to an event** (:mod:`trainmap.dynamics.verdicts.survival`): a
run that never converged within its budget is right-censored at its last checkpoint step
(``censored_at``), not dropped, so "never converged" counts as the strongest evidence of slow
convergence it is. Its effect is the difference of restricted mean survival times of the
Kaplan-Meier curves (second method minus first, at the steps both curves cover; the difference of
means when every run converged), with a bootstrap percentile interval; its p-value the log-rank
test's, from random relabellings of the runs (as above), Holm-corrected with the pair's other
tests. Diverged runs are left out of it (their
training failed; ``joint.json`` counts them). It is "not enough runs" when a method has fewer than
2 runs (converged or censored), when even a perfect separation could not reach Holm's first
threshold (as above), or when no run of either method converged (every run censored:
no evidence can be had; the table's ``note`` says so).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from trainmap.dynamics.maps.regression import fill_holm, state_distribution
from trainmap.dynamics.maps.settings import ANALYSIS_DEFAULTS
from trainmap.dynamics.verdicts import paths as label_free
from trainmap.dynamics.verdicts import timecourse
from trainmap.dynamics.verdicts.survival import compare_survival
from trainmap.dynamics.verdicts.timecourse import START_FAMILY

NOT_ENOUGH_RUNS = "not enough runs"
NO_EVIDENCE = "no evidence of a difference"
CONVERGENCE_STEP = "convergence step"
#: The per-run quantities of :func:`run_quantities` besides the states visited: each state's
#: occupancy (``f"{OCCUPANCY} {k}"``) and the time in the map's detour states.
OCCUPANCY = "occupancy of state"
TIME_IN_DETOURS = "time in detour states"
NO_RUN_CONVERGED = "no run of either method converged: every run censored, no evidence can be had"
#: The verdict families, each Holm-corrected on its own within a method pair, assigned by what
#: each verdict does under planted nulls (bench/verdict_calibration.py; docs/decisions/): the start
#: (:mod:`trainmap.dynamics.verdicts.timecourse`: the intervention's direct effect, reported first, never the
#: finding), with the verdicts after the start window, which a start that outlasts the window also
#: triggers; the primary, the verdicts whose finding rate stays within alpha under a decaying
#: start, a slower start, a level, a scale, exchangeable labels and heavy tails: the path; the
#: secondary, the state-level ones (occupancies, time in detours) and the verdicts that read which
#: state a run is in, which a level or scale difference triggers (it gives a method states of its
#: own, or splits a shared one): where in one map a difference lies.
START, PRIMARY, SECONDARY = START_FAMILY, "primary", "secondary"
FAMILIES = (START, PRIMARY, SECONDARY)
#: A significant unsigned verdict (an energy distance, a likelihood ratio, a total variation).
DIFFER = "paths differ"
#: The verdicts whose effect has no direction: a significant one says "differ".
UNSIGNED = (*label_free.UNSIGNED, timecourse.START, timecourse.DYNAMICS)
#: A significant start verdict.
STARTS_DIFFER = "starts differ"
#: The start family: the start, and the verdicts after the start window (a start that outlasts
#: the window fires them).
START_VERDICTS = (timecourse.START, timecourse.DYNAMICS, label_free.TRAJECTORIES)
#: The label-free verdicts that read which state a run is in (fired by a level or a scale).
STATE_IDENTITY = (label_free.TRANSITIONS, label_free.STATES_VISITED, label_free.COLLAPSED_PATHS,
                  label_free.FIRST_PASSAGE)  # fmt: skip


def family(quantity: str) -> str:
    """The family of a verdict's quantity (:data:`FAMILIES`): start for :data:`START_VERDICTS`,
    secondary for the state-level quantities and :data:`STATE_IDENTITY`, primary for every
    other (the convergence step)."""
    if quantity in START_VERDICTS:
        return START
    return SECONDARY if _state_level(quantity) or quantity in STATE_IDENTITY else PRIMARY


def _state_level(quantity: str) -> bool:
    return quantity.startswith(OCCUPANCY) or quantity == TIME_IN_DETOURS


def per_run_quantity(quantity: str) -> bool:
    """Whether ``quantity`` is one :func:`run_quantities` computes per run (so a subsample's runs
    can give it again): a state's occupancy, the states visited, the time in detour states, the
    convergence step."""
    return _state_level(quantity) or quantity in (label_free.STATES_VISITED, CONVERGENCE_STEP)


@dataclass
class PathEvidence:
    """What the label-free verdicts of :mod:`trainmap.dynamics.verdicts.paths` and
    :mod:`trainmap.dynamics.verdicts.timecourse` read, per run: its trajectory on the common step grid
    (:func:`~trainmap.dynamics.verdicts.paths.trajectory_matrix`), its decoded path and checkpoint steps,
    its expected transition counts under the map (``counts``), the map's number of states, its
    metrics at the runs' shared checkpoints (``values``: run -> [features, checkpoints]) and the
    last step of the start window (``window_end``). Diverged runs are left out by
    :func:`path_evidence`; a comparison reads only the runs of its pair."""

    trajectories: pd.DataFrame
    states: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    n_states: int
    final_state: int
    counts: dict[str, np.ndarray]
    checkpoints: np.ndarray
    values: dict[str, np.ndarray]
    window_end: float
    features: list[str]

    def after_window(self) -> dict[str, np.ndarray]:
        """Run -> which of its checkpoints lie after the start window (``steps`` > ``window_end``):
        the states visited are counted there (:func:`run_quantities`)."""
        return {run: steps > self.window_end for run, steps in self.steps.items()}

    def subset(self, runs: Sequence[str], states: Mapping[str, np.ndarray], n_states: int,
               counts: Mapping[str, np.ndarray]) -> PathEvidence:  # fmt: skip
        """The evidence of ``runs`` with their paths decoded, and their expected transitions
        counted, by another map (a subsample's) of ``n_states`` states."""
        kept = list(runs)
        return PathEvidence(self.trajectories.loc[kept], {r: np.asarray(states[r]) for r in kept},
                            {r: self.steps[r] for r in kept}, n_states,
                            label_free.final_state({r: states[r] for r in kept}),
                            {r: np.asarray(counts[r]) for r in kept}, self.checkpoints,
                            {r: self.values[r] for r in kept}, self.window_end,
                            list(self.features))  # fmt: skip


def path_evidence(
    runs: Mapping[str, pd.DataFrame], states: Mapping[str, np.ndarray], n_states: int,
    features: Sequence[str], status: Mapping[str, str], grid_points: int,
    start_window: int | str = ANALYSIS_DEFAULTS["start_window"],
    counts: Mapping[str, np.ndarray] | None = None,
) -> PathEvidence:  # fmt: skip
    """The :class:`PathEvidence` of a joint comparison's runs: diverged runs (``status``) left
    out, every other run's ``features`` on a common grid of ``grid_points`` steps and at the runs'
    shared checkpoints (:func:`~trainmap.dynamics.verdicts.timecourse.shared_checkpoints`), its decoded
    path (``states``, from the shared map of ``n_states`` states), its transition counts
    (``counts``: run -> [K, K], the expected counts under the map,
    :func:`map_transitions`; None: its decoded path's) and the start window's end
    (``start_window``: :func:`~trainmap.dynamics.verdicts.timecourse.window_end`)."""
    kept = [run for run in runs if status.get(run, "completed") != "diverged"]
    tables = {run: runs[run] for run in kept}
    grid = label_free.common_grid(tables, grid_points)
    trajectories = label_free.trajectory_matrix(tables, features, grid)
    checkpoints = timecourse.shared_checkpoints(tables)
    if counts is None:
        counts = {run: label_free.transition_counts(np.asarray(states[run]), n_states)
                  for run in kept}  # fmt: skip
    return PathEvidence(trajectories, {run: np.asarray(states[run]) for run in kept},
                        {run: label_free.run_steps(runs[run]) for run in kept}, n_states,
                        label_free.final_state({run: states[run] for run in kept}),
                        {run: np.asarray(counts[run]) for run in kept}, checkpoints,
                        timecourse.metric_cube(tables, features, checkpoints),
                        timecourse.window_end(start_window, checkpoints), list(features))  # fmt: skip


def map_transitions(hmm: Any, runs: Mapping[str, pd.DataFrame]) -> dict[str, np.ndarray]:
    """Run -> its expected transition counts [K, K] under the fitted shared map ``hmm`` (a
    :class:`~trainmap.dynamics.maps.hmm.estimator.TrainingHMM`;
    :func:`~trainmap.dynamics.verdicts.paths.expected_transitions`)."""
    counts = label_free.expected_transitions(hmm.model_, [hmm.transform(t) for t in runs.values()])
    return dict(zip(runs, counts, strict=True))


def _permutation_test(
    values: np.ndarray, in_first: np.ndarray, n_permutations: int, rng: np.random.Generator
) -> tuple[float, np.ndarray]:
    """Two-sided p-values of mean(second) - mean(first) for each column of ``values`` [n, q]."""
    n_first = int(in_first.sum())
    observed = values[~in_first].mean(axis=0) - values[in_first].mean(axis=0)
    masks = label_free.relabellings(in_first, n_permutations, rng)  # the same draws as before
    first = masks.astype(float) @ values / n_first
    second = (~masks).astype(float) @ values / (len(values) - n_first)
    extreme = (np.abs(second - first) >= np.abs(observed) - 1e-12).sum(axis=0)
    return observed, (1 + extreme) / (1 + n_permutations)


def _bootstrap_interval(
    first: np.ndarray, second: np.ndarray, n_resamples: int, confidence: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Percentile interval of mean(second) - mean(first), runs resampled within each group."""
    a = first[rng.integers(0, len(first), (n_resamples, len(first)))].mean(axis=1)
    b = second[rng.integers(0, len(second), (n_resamples, len(second)))].mean(axis=1)
    tail = (1 - confidence) / 2
    return np.quantile(b - a, tail, axis=0), np.quantile(b - a, 1 - tail, axis=0)


def smallest_p(n_first: int, n_second: int, n_permutations: int) -> float:
    """The smallest p-value a two-sided relabelling test of these group sizes can give."""
    assignments = math.comb(n_first + n_second, n_first)
    exact = (2 if n_first == n_second else 1) / assignments
    return max(exact, 1 / (1 + n_permutations))


def compare_methods(
    quantities: pd.DataFrame,
    groups: Mapping[str, str],
    n_permutations: int = ANALYSIS_DEFAULTS["permutations"],
    confidence: float = ANALYSIS_DEFAULTS["confidence"],
    alpha: float = ANALYSIS_DEFAULTS["alpha"],
    seed: int = ANALYSIS_DEFAULTS["seed"],
    censored_at: Mapping[str, float] | None = None,
    paths: PathEvidence | None = None,
) -> pd.DataFrame:
    """The verdict table: every pair of methods x every quantity (module docstring).

    ``quantities`` has one row per run (index = run ids) and one column per quantity (NaN where a
    run has none, e.g. the convergence step of a run that never converged); ``groups`` maps runs to
    methods, in the order the methods should be compared (the first is the reference).
    ``censored_at``: run -> the step at which a run without a convergence step is right-censored
    (its last checkpoint step; :func:`censoring_steps`); a run with neither is left out of the
    convergence comparison. The table's columns: first, second, quantity, effect, low, high, p,
    p_holm, n_first, n_second (runs compared; censored runs included), verdict, n_censored_first,
    n_censored_second (runs censored, convergence step only; 0 elsewhere), note and family
    (:func:`family`: Holm's correction runs within each family of a pair). ``paths``: the
    label-free evidence (:func:`path_evidence`); with it, each pair's primary family gains the
    label-free verdicts of :mod:`trainmap.dynamics.verdicts.paths` (first, after the convergence step).
    """
    if n_permutations < 1 / alpha:
        raise ValueError(
            f"analysis.permutations {n_permutations}: a relabelling test's smallest p-value is "
            f"1/(1 + permutations), which cannot reach alpha {alpha:g} with fewer than "
            f"{math.ceil(1 / alpha)}; set analysis.permutations >= {math.ceil(1 / alpha)} "
            f"(default {ANALYSIS_DEFAULTS['permutations']})"
        )  # fmt: skip
    order = list(dict.fromkeys(groups[run] for run in groups))
    rows = []
    for i, first in enumerate(order):
        for second in order[i + 1 :]:
            pair = _compare_pair(quantities, groups, first, second, n_permutations, confidence,
                                 seed + 1000 * len(rows), censored_at or {})  # fmt: skip
            if paths is not None:
                pair = _with_paths(pair, paths, groups, first, second, n_permutations, confidence,
                                   seed + 1000 * len(rows) + 500)  # fmt: skip
            for name in FAMILIES:
                members = [row for row in pair if row["family"] == name]
                fill_holm(members, key="p")
                threshold = alpha / max(len(members), 1)
                for row in members:
                    row["verdict"] = _verdict(row, threshold, alpha, n_permutations)
            rows += pair
    columns = ["first", "second", "quantity", "effect", "low", "high", "p", "p_holm", "n_first",
               "n_second", "verdict", "n_censored_first", "n_censored_second", "note",
               "family"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


#: The order of a pair's label-free verdicts in the table (within each family).
PRIMARY_ORDER = (
    timecourse.START,
    "convergence step",
    timecourse.DYNAMICS,
    label_free.TRAJECTORIES,
    label_free.TRANSITIONS,
    label_free.STATES_VISITED,
    label_free.FIRST_PASSAGE,
    label_free.COLLAPSED_PATHS,
)


def _row(first: str, second: str, quantity: str, effect: float, low: float, high: float,
         p: float, n_first: int, n_second: int, n_permutations: int, **extra: Any) -> dict:  # fmt: skip
    return {"first": first, "second": second, "family": family(quantity), "quantity": quantity,
            "effect": float(effect), "low": float(low), "high": float(high), "p": float(p),
            "p_holm": float("nan"), "n_first": n_first, "n_second": n_second,
            "n_censored_first": 0, "n_censored_second": 0, "note": "",
            "smallest_p": smallest_p(n_first, n_second, n_permutations)} | extra  # fmt: skip


def _with_paths(
    pair: list[dict[str, Any]], paths: PathEvidence, groups: Mapping[str, str], first: str,
    second: str, n_permutations: int, confidence: float, seed: int,
) -> list[dict[str, Any]]:  # fmt: skip
    """The pair's rows with the label-free verdicts (:mod:`trainmap.dynamics.verdicts.paths`) added, the
    primary family first in :data:`PRIMARY_ORDER`. Methods with fewer than 2 runs get NaN
    statistics ("not enough runs")."""
    rng = np.random.default_rng(seed)
    members = [run for run in paths.states if groups.get(run) in (first, second)]
    members.sort(key=lambda run: groups[run] != first)  # first's runs, then second's
    in_first = np.array([groups[run] == first for run in members], dtype=bool)
    n_first, n_second = int(in_first.sum()), int((~in_first).sum())
    nan = float("nan")
    added = []
    enough = n_first >= 2 and n_second >= 2
    args = (n_permutations, confidence, rng)
    if enough:
        cube = np.stack([paths.values[run] for run in members])  # runs x features x checkpoints
        start = timecourse.start_verdict(cube[:, :, 0], in_first, *args)
        after = paths.checkpoints > paths.window_end
        dynamics = timecourse.dynamics_verdict(timecourse.level_scale_free(cube[:, :, after]),
                                               in_first, *args)  # fmt: skip
        grid = paths.trajectories.loc[members]
        late = grid.columns.get_level_values("step").to_numpy() > paths.window_end
        values = _level_scale_free_grid(grid.loc[:, late])
        energy = label_free.energy_verdict(values[in_first], values[~in_first], *args)
        counts = np.stack([paths.counts[run] for run in members])
        lr = label_free.transition_lr(counts, in_first, *args)
        tv = label_free.collapsed_paths_tv([label_free.collapse(paths.states[r]) for r in members],
                                           in_first, *args)  # fmt: skip
    else:
        start = dynamics = energy = lr = tv = label_free.Verdict(nan, nan, nan, nan)
    after_window = f"after step {paths.window_end:,.0f}, each run's own level and scale removed"
    for quantity, verdict, note in (
        (timecourse.START, start, f"at step {paths.checkpoints[0]:,.0f}"),
        (timecourse.DYNAMICS, dynamics, after_window),
        (label_free.TRAJECTORIES, energy, after_window),
        (label_free.TRANSITIONS, lr, "expected transitions under the map"),
        (label_free.COLLAPSED_PATHS, tv, ""),
    ):
        added.append(_row(first, second, quantity, verdict.effect, verdict.low, verdict.high,
                          verdict.p, n_first, n_second, n_permutations, note=note))  # fmt: skip
    samples = []
    for group in (first, second):
        passages = [label_free.first_passage(paths.states[r], paths.steps[r], paths.final_state)
                    for r in members if groups[r] == group]  # fmt: skip
        samples.append((np.array([t for t, _ in passages]),
                        np.array([reached for _, reached in passages], dtype=bool)))  # fmt: skip
    result = compare_survival(samples[0], samples[1], n_permutations, confidence, rng)
    added.append(_row(first, second, label_free.FIRST_PASSAGE, result.effect, result.low,
                      result.high, result.p, result.n_first, result.n_second, n_permutations,
                      n_censored_first=result.censored_first,
                      n_censored_second=result.censored_second,
                      note=(f"state {paths.final_state}, the state most runs end in"
                            if not result.no_events else "no run reached the final state")))  # fmt: skip
    rows = pair + added
    order = {quantity: index for index, quantity in enumerate(PRIMARY_ORDER)}
    return sorted(rows, key=lambda row: (FAMILIES.index(row["family"]),
                                         order.get(row["quantity"], len(order))))  # fmt: skip


def _level_scale_free_grid(grid: pd.DataFrame) -> np.ndarray:
    """Rows of a trajectory matrix's (feature, step) columns with each run's each feature centred
    and scaled over its steps (:func:`~trainmap.dynamics.verdicts.timecourse.level_scale_free`), flat."""
    features = grid.columns.get_level_values("feature")
    names = list(dict.fromkeys(features))
    cube = np.stack([grid.loc[:, features == name].to_numpy(dtype=float) for name in names], axis=1)
    return timecourse.level_scale_free(cube).reshape(len(grid), -1)


def _compare_pair(
    quantities: pd.DataFrame, groups: Mapping[str, str], first: str, second: str,
    n_permutations: int, confidence: float, seed: int, censored_at: Mapping[str, float],
) -> list[dict[str, Any]]:  # fmt: skip
    rng = np.random.default_rng(seed)
    rows = []
    tested = quantities.drop(columns=[CONVERGENCE_STEP], errors="ignore")
    # Columns with the same missing runs are tested together (one matrix product for all).
    for mask, columns in _columns_by_availability(tested, groups, first, second):
        subset = tested.loc[mask, columns]
        in_first = np.array([groups[run] == first for run in subset.index], dtype=bool)
        n_first, n_second = int(in_first.sum()), int((~in_first).sum())
        values = subset.to_numpy(dtype=float)
        if n_first < 2 or n_second < 2:
            effect = p = low = high = np.full(len(columns), np.nan)
            if n_first and n_second:
                effect = values[~in_first].mean(axis=0) - values[in_first].mean(axis=0)
        else:
            effect, p = _permutation_test(values, in_first, n_permutations, rng)
            low, high = _bootstrap_interval(values[in_first], values[~in_first], n_permutations,
                                            confidence, rng)  # fmt: skip
        smallest = smallest_p(n_first, n_second, n_permutations)
        for j, column in enumerate(columns):
            rows.append({"first": first, "second": second, "quantity": column,
                         "effect": float(effect[j]), "low": float(low[j]), "high": float(high[j]),
                         "p": float(p[j]), "p_holm": float("nan"), "n_first": n_first,
                         "n_second": n_second, "n_censored_first": 0, "n_censored_second": 0,
                         "note": "", "smallest_p": smallest, "family": family(column)})  # fmt: skip
    if CONVERGENCE_STEP in quantities:
        rows.append(_compare_convergence(quantities[CONVERGENCE_STEP], groups, first, second,
                                         n_permutations, confidence, rng, censored_at))  # fmt: skip
    order = list(quantities.columns)
    return sorted(rows, key=lambda row: order.index(row["quantity"]))


def _compare_convergence(
    steps: pd.Series, groups: Mapping[str, str], first: str, second: str, n_permutations: int,
    confidence: float, rng: np.random.Generator, censored_at: Mapping[str, float],
) -> dict[str, Any]:  # fmt: skip
    """The convergence-step row of a pair: converged runs have their event at their step, runs
    in ``censored_at`` without a step are censored there (:func:`compare_survival`)."""
    samples = []
    for group in (first, second):
        runs = [run for run in steps.index if groups[run] == group]
        times, events = [], []
        for run in runs:
            if np.isfinite(steps[run]):
                times.append(float(steps[run]))
                events.append(True)
            elif run in censored_at:
                times.append(float(censored_at[run]))
                events.append(False)
        samples.append((np.array(times), np.array(events, dtype=bool)))
    result = compare_survival(samples[0], samples[1], n_permutations, confidence, rng)
    return {"first": first, "second": second, "quantity": CONVERGENCE_STEP,
            "effect": result.effect, "low": result.low, "high": result.high, "p": result.p,
            "p_holm": float("nan"), "n_first": result.n_first, "n_second": result.n_second,
            "n_censored_first": result.censored_first,
            "n_censored_second": result.censored_second,
            "note": NO_RUN_CONVERGED if result.no_events and result.n_first else "",
            "smallest_p": smallest_p(result.n_first, result.n_second, n_permutations),
            "family": PRIMARY}  # fmt: skip


def _columns_by_availability(
    quantities: pd.DataFrame, groups: Mapping[str, str], first: str, second: str
) -> list[tuple[pd.Series, list[str]]]:
    in_pair = np.array([groups[run] in (first, second) for run in quantities.index])
    found: dict[tuple, list[str]] = {}
    for column in quantities.columns:
        available = tuple(in_pair & quantities[column].notna().to_numpy())
        found.setdefault(available, []).append(column)
    return [(pd.Series(mask, index=quantities.index).to_numpy(), columns)
            for mask, columns in found.items()]  # fmt: skip


def _verdict(row: dict[str, Any], threshold: float, alpha: float, n_permutations: int) -> str:
    n_first, n_second = row["n_first"], row["n_second"]
    if n_first < 2 or n_second < 2 or row["smallest_p"] > threshold or not np.isfinite(row["p"]):
        return NOT_ENOUGH_RUNS
    if row["p_holm"] < alpha:
        if row["quantity"] == timecourse.START:
            return STARTS_DIFFER
        if row["quantity"] in UNSIGNED:
            return DIFFER
        return f"{row['second']} {'higher' if row['effect'] > 0 else 'lower'}"
    return NO_EVIDENCE


def run_quantities(
    states: Mapping[str, np.ndarray],
    n_states: int,
    convergence: Mapping[str, int | None],
    status: Mapping[str, str],
    detour_states: Sequence[int],
    counted: Mapping[str, np.ndarray] | None = None,
    with_convergence: bool = True,
) -> pd.DataFrame:
    """Per run: occupancy of each state, the number of states it visits (NaN for a diverged run;
    ``counted``: run -> which of its checkpoints count, those after the start window,
    :meth:`PathEvidence.after_window`; a run not in it counts every checkpoint), time in detour
    states (when there are detours) and the convergence step (NaN for runs that never converged or
    diverged; :func:`compare_methods` counts the runs that never converged as censored at
    :func:`censoring_steps`); ``with_convergence=False`` (runs without a curve): no convergence
    step column, so the comparison has no convergence verdict."""
    rows = {}
    counted = counted or {}
    for run, sequence in states.items():
        occupancy = state_distribution(sequence, n_states)
        row = {f"{OCCUPANCY} {k}": occupancy[k] for k in range(n_states)}
        diverged = status.get(run, "completed") == "diverged"
        late = np.asarray(sequence)[counted[run]] if run in counted else np.asarray(sequence)
        row[label_free.STATES_VISITED] = np.nan if diverged else float(len(np.unique(late)))
        if detour_states:
            row[TIME_IN_DETOURS] = float(occupancy[list(detour_states)].sum())
        step = convergence.get(run)
        converged = step is not None and status.get(run, "completed") != "diverged"
        if with_convergence:
            row[CONVERGENCE_STEP] = float(step) if converged else np.nan
        rows[run] = row
    return pd.DataFrame.from_dict(rows, orient="index")


def censoring_steps(
    runs: Mapping[str, pd.DataFrame],
    convergence: Mapping[str, int | None],
    status: Mapping[str, str],
) -> dict[str, float]:
    """Run -> the step at which a run that never converged is right-censored: its last checkpoint
    step (the largest ``step`` of its metric table), the last step known not to have converged.
    Diverged runs and runs whose table has no ``step`` column are not censored (left out)."""
    return {run: float(table["step"].max()) for run, table in runs.items()
            if convergence.get(run) is None and status.get(run, "completed") != "diverged"
            and "step" in table and len(table)}  # fmt: skip


def verdict_text(row: Mapping[str, Any], emphasis: str = "") -> str:
    """A verdict row's words wherever it is shown (``verdicts.md``, ``verdicts.html``, MLflow's
    tags): the label where the table has one (:func:`trainmap.dynamics.verdicts.labels.label_verdicts`),
    else the verdict; ``finding:`` first for a finding (between ``emphasis`` marks, e.g. ``**``
    in Markdown); then the row's note in parentheses (e.g. no run converged at all)."""
    text = str(row.get("label") or row["verdict"])
    if row.get("finding"):
        text = f"{emphasis}finding:{emphasis} {text}"
    note = row.get("note")
    return f"{text} ({note})" if isinstance(note, str) and note else text


def verdict_markdown(verdicts: pd.DataFrame, confidence: float) -> str:
    """The verdict table as Markdown, one line per method pair and quantity, a heading per family
    (each Holm-corrected on its own): the start (the intervention's direct effect, with the steps
    at which the metrics differ in its note), the primary (the path: the study's answer), the
    secondary (state-level: where in this map a difference lies). The runs column counts the runs
    right-censored in a survival comparison (convergence step, first passage); the verdict column
    holds the verdict's label where the table has one
    (:func:`trainmap.dynamics.verdicts.labels.label_verdicts`: findings marked), then a note. Notes under
    the tables say what each test compares and how it treats diverged and unconverged runs."""
    families = verdicts["family"] if "family" in verdicts else verdicts["quantity"].map(family)
    parts = []
    headings = {START: "The start (family `start`: the intervention's direct effect and the course "
                       "after the start window, which a start that outlasts the window also "
                       "changes; never the finding; where the metrics differ in the start's note; "
                       "Holm within it)",
                PRIMARY: "The path (primary family: the verdicts no planted start, level or scale "
                         "triggers; the answer; Holm within it)",
                SECONDARY: "State-level verdicts (secondary family: where in this map the "
                           "difference lies; a level or scale difference triggers them; Holm "
                           "within it)"}  # fmt: skip
    split = families.nunique() > 1  # headings only where several families are there
    for name in FAMILIES:
        rows = verdicts[families == name]
        if rows.empty:
            continue
        heading = f"**{headings[name]}**\n\n" if split else ""
        parts.append(heading + _table(rows, confidence))
    text = "\n".join(parts)
    quantities = set(verdicts["quantity"])
    if CONVERGENCE_STEP in quantities:
        text += ("\nConvergence step: log-rank test; effect = difference of restricted mean "
                 "convergence steps (Kaplan-Meier); runs that never converged are censored at "
                 "their last step, diverged runs left out.\n")  # fmt: skip
    if timecourse.START in quantities:
        text += ("\nStart: energy distance between the methods' runs at their first shared "
                 "checkpoint (H0: the same distribution of metrics there). Where the metrics "
                 "differ: per shared checkpoint and metric a t statistic scaled by that step's "
                 "pooled within-method SD, max-T adjusted over all checkpoints x metrics (strong "
                 "family-wise control, so each step named is licensed on its own; levels count; "
                 "no evidence after a step is not equivalence). Dynamics after the start window: "
                 "H0, after the start window (analysis.start_window) the methods' runs follow the "
                 "same course up to each run's own level and scale (each run's metrics centred "
                 "and scaled over those checkpoints: a start that has decayed, a constant level "
                 "and a constant scale are inside H0); max-T p, effect = the largest standardised "
                 "difference. Trajectories: energy distance between the methods' runs on the same "
                 "representation, on the common step grid after the window. Transitions: H0, the "
                 "same transition matrix given the state (initial distributions per method in "
                 "both models), likelihood ratio of expected transition counts under the map over "
                 "the states both methods visit. First passage = steps to the state most runs end "
                 "in (log-rank, runs that never reach it censored at their last step); states "
                 "visited = distinct states per run; collapsed paths = total variation between the "
                 "methods' distributions of paths with repeats collapsed. p-values from "
                 "relabelling runs; diverged runs left out of each, runs that never converged "
                 "kept.\n")  # fmt: skip
    return text


def _table(verdicts: pd.DataFrame, confidence: float) -> str:
    lines = [f"| pair | quantity | effect | {confidence:.0%} interval | p (Holm) | runs | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for row in verdicts.to_dict(orient="records"):
        low, high = row["low"], row["high"]
        interval = "" if not np.isfinite(low) else f"[{_number(low)}, {_number(high)}]"
        p = "" if not np.isfinite(row["p_holm"]) else f"{row['p_holm']:.3g}"
        runs = f"{row['n_second']} vs {row['n_first']}"
        censored = (int(row.get("n_censored_second", 0) or 0),
                    int(row.get("n_censored_first", 0) or 0))  # fmt: skip
        if row["quantity"] in (CONVERGENCE_STEP, label_free.FIRST_PASSAGE) and any(censored):
            runs += f" ({censored[0]} vs {censored[1]} censored)"
        cells = [f"{row['second']} vs {row['first']}", row["quantity"], _number(row["effect"]),
                 interval, p, runs, verdict_text(row, emphasis="**")]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    if not np.isfinite(value):
        return ""
    return f"{value:+.0f}" if abs(value) >= 100 else f"{value:+.3f}"


def answer_lines(verdicts: pd.DataFrame) -> list[str]:
    """The answer of each method pair in words, in the order that keeps it honest: the start
    (the intervention's direct effect, never the finding), the steps at which the metrics differ
    (the start row's note, from the max-T band), then the path (the primary family: its findings,
    its significant verdicts that are not reproducible, or no evidence). ``verdicts``: a labelled
    verdict table (:func:`trainmap.dynamics.verdicts.labels.label_verdicts`; unlabelled rows read as their
    verdict). One line per pair, in Markdown."""
    lines = []
    for (first, second), rows in verdicts.groupby(["first", "second"], sort=False):
        rows = rows.to_dict(orient="records")
        start = next((r for r in rows if r["quantity"] == timecourse.START), None)
        parts = []
        if start is not None:
            step, _, where = str(start.get("note") or "").partition("; ")
            said = ("the runs start apart" if start["verdict"] == STARTS_DIFFER
                    else "no evidence that the runs start apart")  # fmt: skip
            parts.append(f"start: {said} ({step}, p = {_p(start)}): the intervention's direct "
                         "effect, not a finding about the path")  # fmt: skip
            if where:
                parts.append(f"where: {where}")
            later = [r for r in rows if r["quantity"] in START_VERDICTS[1:]]
            window = str(later[0].get("note") or "").partition(", each run")[0] if later else ""
            after = f"after the start window ({window})" if window else "after the start window"
            moved = [r for r in later if r["verdict"] not in (NO_EVIDENCE, NOT_ENOUGH_RUNS)]
            held = [r for r in moved if r.get("finding", True)]
            if held:
                said = "; ".join(f"{r['quantity']} p = {_p(r)}" for r in held)
                parts.append(f"{after} the course still differs ({said}), which a start that "
                             "outlasts the window also gives")  # fmt: skip
            elif moved:
                said = "; ".join(f"{r['quantity']} p = {_p(r)}" for r in moved)
                parts.append(f"{after} the course differs in these runs but not reproducibly "
                             f"({said}: not held again on subsamples of the seeds)")  # fmt: skip
            elif later:
                parts.append(f"{after} no evidence that the course differs")
        primary = [r for r in rows if r.get("family", family(r["quantity"])) == PRIMARY]
        findings = [r for r in primary if r.get("finding")]
        unsure = [r for r in primary if not r.get("finding")
                  and r["verdict"] not in (NO_EVIDENCE, NOT_ENOUGH_RUNS)]  # fmt: skip
        if not primary:
            parts.append("path: no verdict of the primary family (the convergence step needs a "
                         "convergence criterion, which these runs lack); the state-level verdicts "
                         "say where their paths differ, if they do")  # fmt: skip
        elif findings:
            said = "; ".join(f"{r['quantity']}: {r['verdict']} (p = {_p(r)})" for r in findings)
            parts.append(f"path: a reproducible difference: {said}")
        elif unsure:
            said = "; ".join(f"{r['quantity']}: {r.get('label') or r['verdict']}" for r in unsure)
            parts.append(f"path: no reproducible difference ({said})")
        elif all(r["verdict"] == NOT_ENOUGH_RUNS for r in primary):
            parts.append("path: not enough runs to tell")
        else:
            tested = ", ".join(f"{r['quantity']} p = {_p(r)}" for r in primary
                               if r["verdict"] != NOT_ENOUGH_RUNS)  # fmt: skip
            parts.append(f"path: no evidence of a difference ({tested}); no evidence is not "
                         "equivalence")  # fmt: skip
        lines.append(f"**{second} vs {first}**: " + ". ".join(parts) + ".")
    return lines


def _p(row: Mapping[str, Any]) -> str:
    """A row's Holm p, three significant digits."""
    return f"{row['p_holm']:.3g}" if np.isfinite(row["p_holm"]) else "n/a"
