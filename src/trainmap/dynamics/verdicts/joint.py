"""Joint comparison: one training map shared by several methods (or architectures) of one task.

The paper fits one HMM per setting, so the states of two settings cannot be compared. Here the runs
of several groups (e.g. kaiming, gradinit and metainit on the same task and architecture) are
pooled into one :class:`~trainmap.dynamics.maps.hmm.estimator.TrainingHMM`, so every group is described in the same
states, and the study's question can be read off directly:

* per group, the mean state occupancy (fraction of checkpoints in each state);
* the detour states of the pooled regression (:mod:`trainmap.dynamics.maps.regression`) and, per group,
  the detour visit rate: the fraction of its runs that visit any detour state;
* per group, the convergence-step distribution (and diverged / never-converged counts);
* a regression of convergence step on the state distribution plus group indicators (the first group
  is the reference): a group's coefficient is the shift in convergence step the states alone do
  not explain;
* the verdict table (:func:`trainmap.dynamics.verdicts.compare.compare_methods`): for every pair of groups,
  first the label-free verdicts (:mod:`trainmap.dynamics.verdicts.paths`: trajectories, first passage,
  states visited, transitions, collapsed paths; the primary family with the convergence step),
  then the effect on each state's occupancy and on the time in detour states (the secondary
  family), each family Holm-corrected on its own; every row with a bootstrap interval, a
  permutation p-value and a verdict in words, "not enough runs" included; the convergence step by the log-rank test, runs that never converged
  censored at their last checkpoint step. The runs are not refitted: their decoded states are
  relabelled.

Groups are compared in the order they first appear in ``groups`` (the grid's order: the first
method listed is the reference).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.dynamics.maps.regression import (
    DetourRegression,
    regress_detours,
    state_distribution,
    trajectory_dissimilarity,
)
from trainmap.dynamics.maps.settings import ANALYSIS_DEFAULTS, AnalysisSettings, VerdictSettings
from trainmap.dynamics.verdicts.compare import (
    PathEvidence,
    censoring_steps,
    compare_methods,
    map_transitions,
    path_evidence,
    run_quantities,
    verdict_markdown,
)
from trainmap.dynamics.verdicts.paths import common_grid
from trainmap.dynamics.verdicts.timecourse import (
    START,
    TimeResolved,
    shared_checkpoints,
    time_resolved,
    window_end,
)


@dataclass
class JointComparison:
    """What the shared training map says about each group."""

    hmm: TrainingHMM
    states: dict[str, np.ndarray]
    groups: dict[str, str]
    detours: DetourRegression
    with_groups: DetourRegression
    occupancy: pd.DataFrame  # groups x states
    visit_rates: dict[str, float]
    convergence: pd.DataFrame  # run, group, convergence_step, status
    dissimilarity: dict[str, float]
    verdicts: pd.DataFrame
    settings: VerdictSettings
    paths: PathEvidence | None = None  # the label-free verdicts' runs (diverged left out)
    bands: dict[tuple[str, str], TimeResolved] = field(default_factory=dict)
    no_curve: str = ""  # why the runs have no convergence step ("" when they have one)

    def time_resolved(self) -> dict[tuple[str, str], TimeResolved]:
        """Per pair of groups (first, second): where their metrics differ, feature x shared
        checkpoint, with max-T adjusted p-values (:func:`trainmap.dynamics.verdicts.timecourse.time_resolved`;
        computed with the comparison)."""
        return dict(self.bands)

    @property
    def detours_explained_by_group(self) -> list[int]:
        """Detour states of the pooled regression that are no detours once the group indicators
        enter it: the group (method or architecture) predicts the slower convergence as well as
        the state does, so the state may be the group's own version of a shared phase."""
        if not self.with_groups.fitted:
            return []
        return [d for d in self.detours.detour_states if d not in self.with_groups.detour_states]

    def left_out(self) -> list[str]:
        """One line per result left out because the runs have no convergence step (empty when
        they have one)."""
        if not self.no_curve:
            return []
        return [
            f"Left out: the convergence step verdict ({self.no_curve}).",
            f"Left out: the detour regression, pooled and with the groups ({self.no_curve}).",
            f"Left out: the convergence step's line in the stability curve ({self.no_curve}).",
        ]

    def verdict_markdown(self) -> str:
        """The verdict table as Markdown, the lines on what the runs' lack of a convergence step
        leaves out (:meth:`left_out`), a line naming the features the shared map leaves out
        (and why), and a line on detours the group explains as well."""
        text = verdict_markdown(self.verdicts, self.settings.confidence)
        text += "".join(f"\n{line}\n" for line in self.left_out())
        if self.hmm.dropped_features_:
            text += f"\n{self.hmm.dropped_note()}\n"
        explained = self.detours_explained_by_group
        if explained:
            text += (f"\nDetour state(s) {', '.join(map(str, explained))}: not a detour once the "
                     "group indicators enter the regression (regression_with_groups in joint.json): "
                     "the group predicts the slower convergence as well as the state does, so read "
                     "the state as that group's own version of a phase, not as a path it avoids.\n")  # fmt: skip
        return text

    def summary(self) -> dict:
        """JSON-ready: per-group occupancy, detour visit rates, convergence and the regressions."""
        per_group = {}
        for group in self.occupancy.index:
            rows = self.convergence[self.convergence["group"] == group]
            steps = rows["convergence_step"].dropna()
            per_group[group] = {
                "runs": int(len(rows)),
                "occupancy": self.occupancy.loc[group].round(6).tolist(),
                "detour_visit_rate": self.visit_rates[group],
                "convergence_step_mean": float(steps.mean()) if len(steps) else None,
                "convergence_step_median": float(steps.median()) if len(steps) else None,
                "convergence_step_std": float(steps.std(ddof=1)) if len(steps) > 1 else None,
                "never_converged": None
                if self.no_curve
                else int(
                    (rows["convergence_step"].isna() & (rows["status"] != "diverged")).sum()
                ),  # fmt: skip
                "diverged": int((rows["status"] == "diverged").sum()),
                "dissimilarity": self.dissimilarity[group],
            }
        found = {"no_curve": self.no_curve} if self.no_curve else {}
        return found | {
            "n_states": self.hmm.n_states_,
            "selection_at_ceiling": self.hmm.at_ceiling_,
            "features": list(self.hmm.features_),
            "dropped_features": dict(self.hmm.dropped_features_),
            "groups": per_group,
            "detour_states": self.detours.detour_states,
            "detours_explained_by_group": self.detours_explained_by_group,
            "dissimilarity_ground_metric": self.settings.dissimilarity,
            "verdicts": self.verdicts.to_dict(orient="records"),
            "regression": self.detours.to_dict(),
            "regression_with_groups": self.with_groups.to_dict(),
        }


def detour_visit_rates(
    states: Mapping[str, np.ndarray], groups: Mapping[str, str], detour_states: Sequence[int]
) -> dict[str, float]:
    """Per group (in the order of ``groups``), the share of its decoded runs that visit any of
    ``detour_states`` (0 for every group when there are none)."""
    detour_set = set(detour_states)
    order = list(dict.fromkeys(groups[run] for run in groups))
    return {g: float(np.mean([bool(detour_set & set(states[r].tolist()))
                              for r in states if groups[r] == g]))
            for g in order}  # fmt: skip


def check_comparable(
    runs: Mapping[str, pd.DataFrame], groups: Mapping[str, str], status: Mapping[str, str],
    grid_points: int, start_window: int | str = ANALYSIS_DEFAULTS["start_window"],
) -> None:  # fmt: skip
    """Bad input a comparison cannot answer, raised before any fit: a group with fewer than 2
    runs (a relabelling test has nothing to relabel; the ValueError names the group and its run),
    runs without a common step grid (:func:`trainmap.dynamics.verdicts.paths.common_grid` names the
    short run), runs whose checkpoint schedules differ over the span they all cover
    (:func:`~trainmap.dynamics.verdicts.timecourse.shared_checkpoints` names two of them) or a start
    window that leaves fewer than 2 shared checkpoints after it
    (:func:`~trainmap.dynamics.verdicts.timecourse.window_end`)."""
    order = list(dict.fromkeys(groups[run] for run in groups))
    if len(order) < 2:
        raise ValueError(f"a joint comparison needs at least 2 groups; got {order}")
    for group in order:
        members = [run for run in groups if groups[run] == group]
        if len(members) < 2:
            raise ValueError(
                f"group {group!r} has {len(members)} run ({', '.join(members)}): every method or "
                "architecture of a joint comparison needs at least 2 runs (give it more seeds in "
                "the grid, or leave it out of analysis.joint)"
            )  # fmt: skip
    kept = {run: runs[run] for run in runs if status.get(run, "completed") != "diverged"}
    if kept:
        common_grid(kept, grid_points)
        window_end(start_window, shared_checkpoints(kept, groups))


def compare_groups(
    runs: Mapping[str, pd.DataFrame],
    groups: Mapping[str, str],
    convergence: Mapping[str, int | None],
    status: Mapping[str, str],
    hmm: TrainingHMM,
    settings: VerdictSettings | None = None,
    no_curve: str = "",
) -> JointComparison:
    """Fit ``hmm`` (unfitted, configured) on the pooled runs and compare the groups (``groups``:
    run id -> group label).

    ``settings``: the analysis settings' verdict view
    (:attr:`~trainmap.dynamics.maps.settings.AnalysisSettings.verdict_settings`; None: the
    schema's defaults). ``no_curve``: why the runs have no convergence step
    (:class:`~trainmap.dynamics.pipeline.Outcomes`): then neither regression is fitted and the
    convergence step is no verdict.
    """
    if settings is None:
        settings = AnalysisSettings.of({}).verdict_settings
    check_comparable(runs, groups, status, settings.trajectory_points, settings.start_window)
    hmm.fit(runs, strata=groups)
    states = hmm.decode(runs)
    distributions = {run: state_distribution(s, hmm.n_states_) for run, s in states.items()}
    detours = regress_detours(distributions, convergence, status, alpha=settings.alpha,
                              no_curve=no_curve)  # fmt: skip
    order = list(dict.fromkeys(groups[run] for run in groups))
    indicators = pd.DataFrame(
        {f"group:{g}": [float(groups[run] == g) for run in runs] for g in order[1:]},
        index=list(runs),
    )
    with_groups = regress_detours(distributions, convergence, status, extra=indicators,
                                  alpha=settings.alpha, no_curve=no_curve)  # fmt: skip
    occupancy = pd.DataFrame(
        [np.mean([distributions[r] for r in runs if groups[r] == g], axis=0) for g in order],
        index=order,
        columns=range(hmm.n_states_),
    )
    visit_rates = detour_visit_rates(states, groups, detours.detour_states)
    table = pd.DataFrame(
        {
            "run": list(runs),
            "group": [groups[r] for r in runs],
            "convergence_step": [convergence.get(r) for r in runs],
            "status": [status.get(r, "completed") for r in runs],
        }
    )
    dissimilarity = {
        g: trajectory_dissimilarity(
            {r: distributions[r] for r in runs if groups[r] == g}, settings.dissimilarity
        )  # fmt: skip
        for g in order
    }
    evidence = path_evidence(runs, states, hmm.n_states_, hmm.features_, status,
                             settings.trajectory_points, settings.start_window,
                             map_transitions(hmm, runs))  # fmt: skip
    quantities = run_quantities(states, hmm.n_states_, convergence, status, detours.detour_states,
                                evidence.after_window(), with_convergence=not no_curve)  # fmt: skip
    ordered_groups = {run: groups[run] for g in order for run in groups if groups[run] == g}
    verdicts = compare_methods(quantities.loc[list(ordered_groups)], ordered_groups,
                               n_permutations=settings.permutations,
                               confidence=settings.confidence, alpha=settings.alpha,
                               seed=settings.seed,
                               censored_at=censoring_steps(runs, convergence, status),
                               paths=evidence)  # fmt: skip
    bands = metric_bands(evidence, ordered_groups, settings)
    verdicts = with_band_notes(verdicts, bands)
    return JointComparison(hmm, states, dict(groups), detours, with_groups, occupancy,
                           visit_rates, table, dissimilarity, verdicts, settings, evidence,
                           bands, no_curve)  # fmt: skip


def metric_bands(evidence: PathEvidence, groups: Mapping[str, str], settings: VerdictSettings
                 ) -> dict[tuple[str, str], TimeResolved]:  # fmt: skip
    """Per pair of groups with 2 runs each: where their metrics differ at the shared checkpoints
    (:func:`~trainmap.dynamics.verdicts.timecourse.time_resolved`, ``settings``' permutations and
    alpha, seeded by the analysis seed and the pair's position)."""
    order = list(dict.fromkeys(groups[run] for run in groups))
    found = {}
    for i, first in enumerate(order):
        for j, second in enumerate(order[i + 1 :], start=i + 1):
            members = [r for r in evidence.values if groups.get(r) in (first, second)]
            members.sort(key=lambda run: groups[run] != first)
            in_first = np.array([groups[r] == first for r in members], dtype=bool)
            if in_first.sum() < 2 or (~in_first).sum() < 2:
                continue
            rng = np.random.default_rng(np.random.SeedSequence([settings.seed, i, j, 59]))
            band = time_resolved({r: evidence.values[r] for r in members}, in_first,
                                 evidence.features, evidence.checkpoints,
                                 settings.permutations, settings.alpha, rng)  # fmt: skip
            if settings.trajectory_points > len(evidence.checkpoints):
                band.notes.append(
                    f"the runs share {len(evidence.checkpoints)} checkpoints, fewer than "
                    f"trajectory_points {settings.trajectory_points}: every checkpoint is "
                    "compared")  # fmt: skip
            found[first, second] = band
    return found


def with_band_notes(verdicts: pd.DataFrame, bands: Mapping[tuple[str, str], TimeResolved]
                    ) -> pd.DataFrame:  # fmt: skip
    """``verdicts`` with each pair's start row's note saying where in training the pair's metrics
    differ (:meth:`~trainmap.dynamics.verdicts.timecourse.TimeResolved.sentence`), after the step it reads."""
    verdicts = verdicts.copy()
    for (first, second), band in bands.items():
        rows = ((verdicts["first"] == first) & (verdicts["second"] == second)
                & (verdicts["quantity"] == START))  # fmt: skip
        for index in verdicts.index[rows]:
            note = verdicts.at[index, "note"]
            verdicts.at[index, "note"] = "; ".join(part for part in (note, band.sentence(),
                                                                     *band.notes) if part)  # fmt: skip
    return verdicts
