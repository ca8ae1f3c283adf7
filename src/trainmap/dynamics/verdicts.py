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

**The convergence step is compared as time to an event** (:mod:`trainmap.dynamics.survival`): a
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

from trainmap.dynamics import paths as label_free
from trainmap.dynamics.regression import fill_holm, state_distribution
from trainmap.dynamics.survival import compare_survival

NOT_ENOUGH_RUNS = "not enough runs"
NO_EVIDENCE = "no evidence of a difference"
CONVERGENCE_STEP = "convergence step"
#: The per-run quantities of :func:`run_quantities` besides the states visited: each state's
#: occupancy (``f"{OCCUPANCY} {k}"``) and the time in the map's detour states.
OCCUPANCY = "occupancy of state"
TIME_IN_DETOURS = "time in detour states"
NO_RUN_CONVERGED = "no run of either method converged: every run censored, no evidence can be had"
#: The verdict families, each Holm-corrected on its own within a method pair: the label-free
#: verdicts (:mod:`trainmap.dynamics.paths`) and the convergence step answer the study's question;
#: the state-level ones (occupancies, time in detours) say where in one map a difference lies.
PRIMARY, SECONDARY = "primary", "secondary"
#: A significant unsigned verdict (an energy distance, a likelihood ratio, a total variation).
DIFFER = "paths differ"


def family(quantity: str) -> str:
    """The family of a verdict's quantity: secondary for the state-level quantities (whose meaning
    depends on the map's state numbering), primary for every other."""
    return SECONDARY if _state_level(quantity) else PRIMARY


def _state_level(quantity: str) -> bool:
    return quantity.startswith(OCCUPANCY) or quantity == TIME_IN_DETOURS


def per_run_quantity(quantity: str) -> bool:
    """Whether ``quantity`` is one :func:`run_quantities` computes per run (so a subsample's runs
    can give it again): a state's occupancy, the states visited, the time in detour states, the
    convergence step."""
    return _state_level(quantity) or quantity in (label_free.STATES_VISITED, CONVERGENCE_STEP)


@dataclass
class PathEvidence:
    """What the label-free verdicts of :mod:`trainmap.dynamics.paths` read, per run: its
    trajectory on the common step grid (:func:`~trainmap.dynamics.paths.trajectory_matrix`), its
    decoded path and checkpoint steps, and the map's number of states. Diverged runs are left out
    by :func:`path_evidence`; a comparison reads only the runs of its pair."""

    trajectories: pd.DataFrame
    states: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    n_states: int
    final_state: int


def path_evidence(
    runs: Mapping[str, pd.DataFrame], states: Mapping[str, np.ndarray], n_states: int,
    features: Sequence[str], status: Mapping[str, str], grid_points: int,
) -> PathEvidence:  # fmt: skip
    """The :class:`PathEvidence` of a joint comparison's runs: diverged runs (``status``) left out,
    every other run's ``features`` on a common grid of ``grid_points`` steps and its decoded path
    (``states``, from the shared map of ``n_states`` states)."""
    kept = [run for run in runs if status.get(run, "completed") != "diverged"]
    grid = label_free.common_grid({run: runs[run] for run in kept}, grid_points)
    trajectories = label_free.trajectory_matrix({run: runs[run] for run in kept}, features, grid)
    return PathEvidence(trajectories, {run: np.asarray(states[run]) for run in kept},
                        {run: label_free.run_steps(runs[run]) for run in kept}, n_states,
                        label_free.final_state({run: states[run] for run in kept}))  # fmt: skip


def _permutation_test(
    values: np.ndarray, in_first: np.ndarray, n_permutations: int, rng: np.random.Generator
) -> tuple[float, np.ndarray]:
    """Two-sided p-values of mean(second) - mean(first) for each column of ``values`` [n, q]."""
    n_first = int(in_first.sum())
    observed = values[~in_first].mean(axis=0) - values[in_first].mean(axis=0)
    masks = np.zeros((n_permutations, len(values)), dtype=bool)
    for row in range(n_permutations):
        masks[row, rng.permutation(len(values))[:n_first]] = True
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
    n_permutations: int = 2000,
    confidence: float = 0.95,
    alpha: float = 0.05,
    seed: int = 0,
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
    label-free verdicts of :mod:`trainmap.dynamics.paths` (first, after the convergence step).
    """
    if n_permutations < 1 / alpha:
        raise ValueError(
            f"analysis.permutations {n_permutations}: a relabelling test's smallest p-value is "
            f"1/(1 + permutations), which cannot reach alpha {alpha:g} with fewer than "
            f"{math.ceil(1 / alpha)}; set analysis.permutations >= {math.ceil(1 / alpha)} "
            "(default 2000)"
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
            for name in (PRIMARY, SECONDARY):
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


#: The order of a pair's primary verdicts in the table.
PRIMARY_ORDER = (
    "convergence step",
    label_free.TRAJECTORIES,
    label_free.FIRST_PASSAGE,
    label_free.STATES_VISITED,
    label_free.TRANSITIONS,
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
    """The pair's rows with the label-free verdicts (:mod:`trainmap.dynamics.paths`) added, the
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
        values = paths.trajectories.loc[members].to_numpy(dtype=float)
        energy = label_free.energy_verdict(values[in_first], values[~in_first], *args)
        counts = np.stack([label_free.transition_counts(paths.states[r], paths.n_states)
                           for r in members])  # fmt: skip
        lr = label_free.transition_lr(counts, in_first, *args)
        tv = label_free.collapsed_paths_tv([label_free.collapse(paths.states[r]) for r in members],
                                           in_first, *args)  # fmt: skip
    else:
        energy = lr = tv = label_free.Verdict(nan, nan, nan, nan)
    for quantity, verdict in ((label_free.TRAJECTORIES, energy), (label_free.TRANSITIONS, lr),
                              (label_free.COLLAPSED_PATHS, tv)):  # fmt: skip
        added.append(_row(first, second, quantity, verdict.effect, verdict.low, verdict.high,
                          verdict.p, n_first, n_second, n_permutations))  # fmt: skip
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
    return sorted(rows, key=lambda row: (row["family"] != PRIMARY,
                                         order.get(row["quantity"], len(order))))  # fmt: skip


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
        if row["quantity"] in label_free.UNSIGNED:
            return DIFFER
        return f"{row['second']} {'higher' if row['effect'] > 0 else 'lower'}"
    return NO_EVIDENCE


def run_quantities(
    states: Mapping[str, np.ndarray],
    n_states: int,
    convergence: Mapping[str, int | None],
    status: Mapping[str, str],
    detour_states: Sequence[int],
) -> pd.DataFrame:
    """Per run: occupancy of each state, the number of states it visits (NaN for a diverged run),
    time in detour states (when there are detours) and the convergence step (NaN for runs that
    never converged or diverged; :func:`compare_methods` counts the runs that never converged as
    censored at :func:`censoring_steps`)."""
    rows = {}
    for run, sequence in states.items():
        occupancy = state_distribution(sequence, n_states)
        row = {f"{OCCUPANCY} {k}": occupancy[k] for k in range(n_states)}
        diverged = status.get(run, "completed") == "diverged"
        row[label_free.STATES_VISITED] = np.nan if diverged else float(len(np.unique(sequence)))
        if detour_states:
            row[TIME_IN_DETOURS] = float(occupancy[list(detour_states)].sum())
        step = convergence.get(run)
        converged = step is not None and status.get(run, "completed") != "diverged"
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
    tags): the label where the table has one (:func:`trainmap.dynamics.labels.label_verdicts`),
    else the verdict; ``finding:`` first for a finding (between ``emphasis`` marks, e.g. ``**``
    in Markdown); then the row's note in parentheses (e.g. no run converged at all)."""
    text = str(row.get("label") or row["verdict"])
    if row.get("finding"):
        text = f"{emphasis}finding:{emphasis} {text}"
    note = row.get("note")
    return f"{text} ({note})" if isinstance(note, str) and note else text


def verdict_markdown(verdicts: pd.DataFrame, confidence: float) -> str:
    """The verdict table as Markdown, one line per method pair and quantity: the primary family
    (convergence and the label-free verdicts, the study's answer) under its own heading first,
    then the secondary (state-level: where in this map a difference lies), each family
    Holm-corrected on its own. The runs column counts the runs right-censored in a survival
    comparison (convergence step, first passage); the verdict column holds the verdict's label
    where the table has one (:func:`trainmap.dynamics.labels.label_verdicts`: findings marked),
    then a note. Notes under the tables say how each test treats diverged and unconverged runs."""
    families = verdicts["family"] if "family" in verdicts else verdicts["quantity"].map(family)
    parts = []
    headings = {PRIMARY: "Label-free verdicts (primary family: the answer; Holm within it)",
                SECONDARY: "State-level verdicts (secondary family: where in this map the "
                           "difference lies; Holm within it)"}  # fmt: skip
    split = families.nunique() > 1  # headings only where both families are there
    for name in (PRIMARY, SECONDARY):
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
    if label_free.TRAJECTORIES in quantities:
        text += ("\nLabel-free verdicts (they do not depend on how the map numbers its states): "
                 "trajectories = energy distance between the methods' runs, each run its "
                 "standardised metrics on a common step grid (paths.png: where they differ); "
                 "first passage = steps to the state most runs end in (log-rank, runs that never "
                 "reach it censored at their last step; effect = difference of restricted means); "
                 "states visited = distinct states per run; transitions = likelihood ratio of "
                 "method-specific against shared transition matrices; collapsed paths = total "
                 "variation between the methods' distributions of paths with repeats collapsed. "
                 "p-values from relabelling runs; diverged runs left out of each, runs that never "
                 "converged kept.\n")  # fmt: skip
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
