"""The analysis steps: what the workflow's rules and the command line both run.

Each step takes per-run metric tables (the format of :mod:`trainmap.dynamics.metrics.weights`, read by
:func:`trainmap.dynamics.metrics.tables.read_metric_table`, which stops at a damaged one) and returns one
result object (after statsmodels' results classes). Its ``write(out_dir, title)`` writes a fixed set
of files into one directory, draws the figures and keeps their captions (``captions``: figure name
-> caption); a step given ``out_dir`` writes its result there. Jobs log from the result, never from
the files it just wrote.

:func:`fit_group` -> :class:`GroupFit` (rule ``fit_hmm``)
    the fitted HMM and every run's decoded states, the appendix C baselines, the detour regression
    of the full map and the bootstrap over runs (:mod:`trainmap.dynamics.verdicts.certainty`). Writes
    ``hmm.npz`` + ``hmm.json`` (the fitted model; ``selection_at_ceiling`` when the BIC was still
    falling at K_max), ``selection.csv`` (per K: train/held-out log-likelihood, BIC of the best
    restart, mean and SD over restarts, AIC), ``baselines.csv`` (appendix C, table 4 form: k-means,
    HMM-1, HMM), ``selection.png``, ``states.csv`` (run, step, state: every run's Viterbi sequence),
    ``state_means.csv`` (per state, z-units and original units), ``states.png``,
    ``bootstrap.json``, ``bootstrap.png``.
:func:`regress_group` -> :class:`GroupRegression` (rule ``regress_detours``)
    ``detours.json`` (R^2 and adjusted R^2, F-test p, or why no regression was fitted; detour
    states with how often the bootstrap finds each again; dissimilarity and its ground metric;
    excluded runs), ``coefficients.csv``, ``coefficients.png``, ``convergence.png``.
:func:`map_group` -> :class:`GroupMap` (rule ``training_map``)
    ``map.json``, ``map.png``, ``map.svg``.
:func:`joint_group` -> :class:`JointResult` (rule ``joint_comparison``)
    ``verdicts.csv`` / ``verdicts.md`` / ``verdicts.png`` / ``paths.png`` (per method pair: effect, interval, p,
    verdict and its label, a finding only when it also holds again on subsamples:
    :mod:`trainmap.dynamics.verdicts.labels`), ``joint.json``, ``occupancy.png``, ``convergence.png``, ``map.png``, ``map.svg``,
    ``regression.csv``, ``bootstrap.json`` and the shared model (``hmm.npz``, ``hmm.json``,
    ``states.csv``).

The later steps of a group build on its fit: the command line passes :func:`fit_group`'s result on
in memory (its regression and bootstrap included); a workflow rule reads what the fit rule wrote
(:meth:`FittedMap.load`, :meth:`~trainmap.dynamics.verdicts.certainty.BootstrapResult.load`). A feature the
HMM leaves out (a model without biases has no bias metrics) is named with the reason in ``hmm.json``
and ``joint.json`` (``dropped_features``), in ``verdicts.md`` and in the captions of the selection
figure and the maps.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainmap.dynamics import plots
from trainmap.dynamics.maps.hmm.baselines import baseline_table
from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.dynamics.maps.regression import (
    DetourRegression,
    regress_detours,
    state_distribution,
    trajectory_dissimilarity,
)
from trainmap.dynamics.maps.settings import (
    ANALYSIS_DEFAULTS,
    HMM_SETTINGS,
    AnalysisSettings,
    BootstrapSettings,
    make_hmm,
)
from trainmap.dynamics.maps.training_map import TrainingMap, build_training_map, draw_training_map
from trainmap.dynamics.metrics.columns import METRIC_NAMES
from trainmap.dynamics.verdicts.certainty import BootstrapResult, bootstrap_map
from trainmap.dynamics.verdicts.compare import answer_lines
from trainmap.dynamics.verdicts.joint import JointComparison, compare_groups, detour_visit_rates
from trainmap.dynamics.verdicts.labels import label_verdicts, supported_detours, write_verdicts
from trainmap.dynamics.verdicts.stability import map_stability
from trainmap.dynamics.verdicts.stability_results import MapStability
from trainmap.io import save_json, write_atomic

__all__ = [
    "ANALYSIS_DEFAULTS",
    "HMM_SETTINGS",
    "AnalysisSettings",
    "FittedMap",
    "GroupFit",
    "GroupMap",
    "GroupRegression",
    "JointResult",
    "Outcomes",
    "analysis_runs",
    "convergence_from_tables",
    "fit_group",
    "joint_group",
    "make_hmm",
    "map_group",
    "read_states",
    "regress_group",
    "states_table",
]


@dataclass
class Outcomes:
    """What the regression and the map need to know about each run. ``no_curve``: why the runs
    have no convergence step at all ("" when they have one: a curve and a threshold); the results
    that need one (the detour regression, the convergence verdict and its stability line, the
    convergence figures) are then left out, each with this reason."""

    convergence: dict[str, int | None]
    status: dict[str, str]
    no_curve: str = ""


def analysis_runs(
    runs: Mapping[str, pd.DataFrame], outcomes: Outcomes, settings: AnalysisSettings
) -> tuple[dict[str, pd.DataFrame], Outcomes]:
    """The runs and outcomes a map is made from under the analysis settings: each run's
    checkpoints cut by ``checkpoints_per_run`` and ``first_n``, and with ``nan_runs: runs`` the runs
    with a non-finite metric left out (:func:`trainmap.dynamics.metrics.tables.analysis_tables`; a warning
    names them). Every analysis entry point (the workflow's jobs, ``python -m trainmap.dynamics``)
    calls it before :func:`fit_group` or :func:`joint_group`; the convergence step stays the run's
    own (its whole evaluation history)."""
    import warnings

    from trainmap.dynamics.metrics.tables import analysis_tables

    tables, left_out = analysis_tables(dict(runs), settings.features or METRIC_NAMES,
                                       settings.checkpoints_per_run, settings.first_n,
                                       settings.nan_runs)  # fmt: skip
    if left_out:
        shown = ", ".join(list(left_out)[:5]) + (" ..." if len(left_out) > 5 else "")
        warnings.warn(f"{len(left_out)} of {len(runs)} runs left out of the map (nan_runs: runs): "
                      f"{shown}", stacklevel=2)  # fmt: skip
    kept = Outcomes({run: outcomes.convergence.get(run) for run in tables},
                    {run: outcomes.status.get(run, "completed") for run in tables},
                    outcomes.no_curve)  # fmt: skip
    return tables, kept


def convergence_from_tables(
    runs: Mapping[str, pd.DataFrame], threshold: float, direction: str = "rising",
    curve: str = "test_acc",
) -> dict[str, int | None]:  # fmt: skip
    """First step whose ``curve`` column reaches ``threshold`` (at or above it for a ``rising``
    curve, at or below it for a ``falling`` one), per run (None: never)."""
    from trainmap.evaluation import convergence_step

    return {run: convergence_step(table, threshold, direction, curve)
            for run, table in runs.items()}  # fmt: skip


def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    write_atomic(path, lambda tmp: frame.to_csv(tmp, index=False))


def states_table(states: Mapping[str, np.ndarray], steps: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """Long format: run, step, state (``steps``: run -> its checkpoints' steps)."""
    return pd.concat(
        [pd.DataFrame({"run": run, "step": steps[run], "state": s}) for run, s in states.items()],
        ignore_index=True,
    )


def read_states(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Inverse of :func:`states_table` (as written to ``states.csv``)."""
    frame = pd.read_csv(path, dtype={"run": str})
    return {run: group["state"].to_numpy() for run, group in frame.groupby("run", sort=False)}


def _steps(runs: Mapping[str, pd.DataFrame]) -> dict[str, np.ndarray]:
    return {run: table["step"].to_numpy() for run, table in runs.items()}


def _with_note(caption: str, hmm: TrainingHMM) -> str:
    """``caption`` and the sentence naming the features the HMM left out, if any."""
    return f"{caption} {hmm.dropped_note()}".rstrip()


def _detour_regression(
    hmm: TrainingHMM, states: Mapping[str, np.ndarray], outcomes: Outcomes, alpha: float
) -> DetourRegression:
    distributions = {run: state_distribution(s, hmm.n_states_) for run, s in states.items()}
    return regress_detours(distributions, outcomes.convergence, outcomes.status, alpha=alpha,
                           no_curve=outcomes.no_curve)  # fmt: skip


# --- one group: fit, regression, map ----------------------------------------------------------


@dataclass
class FittedMap:
    """A group's fitted HMM and every run's decoded states: what its later steps build on."""

    hmm: TrainingHMM
    states: dict[str, np.ndarray]

    @classmethod
    def load(cls, directory: str | os.PathLike) -> FittedMap:
        """The fit :class:`GroupFit` wrote to ``directory`` (``hmm.npz``, ``hmm.json``,
        ``states.csv``): a later rule's input."""
        directory = Path(directory)
        hmm = TrainingHMM.load(directory / "hmm.npz", directory / "hmm.json")
        return cls(hmm, read_states(directory / "states.csv"))


@dataclass(kw_only=True)
class GroupFit(FittedMap):
    """:func:`fit_group`'s result: the fitted map, its baselines, the detour regression of the full
    map (whose detours the bootstrap looks for) and the bootstrap over runs."""

    steps: dict[str, np.ndarray]  # run -> its checkpoints' steps
    convergence: dict[str, int | None]
    baselines: pd.DataFrame  # appendix C, table 4 form
    baseline_curves: dict[str, pd.DataFrame]  # model -> its selection curve
    state_means: pd.DataFrame  # per state, z-units and original units
    regression: DetourRegression
    bootstrap: BootstrapResult
    stability: MapStability
    captions: dict[str, str] = field(default_factory=dict)

    def write(self, out_dir: str | os.PathLike, title: str = "") -> dict[str, str]:
        """Write the fit's files and figures to ``out_dir`` (module docstring); the captions."""
        out, hmm = Path(out_dir), self.hmm
        save_json(self.stability.to_dict(), out / "stability.json")
        hmm.save(out / "hmm.npz", out / "hmm.json")
        _write_csv(hmm.selection_, out / "selection.csv")
        _write_csv(self.baselines, out / "baselines.csv")
        _write_csv(states_table(self.states, self.steps), out / "states.csv")
        _write_csv(self.state_means, out / "state_means.csv")
        save_json(self.bootstrap.to_dict(), out / "bootstrap.json")
        selection = plots.plot_selection(self.baseline_curves, hmm.n_states_, out / "selection.png",
                                         title=title, at_ceiling=hmm.at_ceiling_)  # fmt: skip
        self.captions = {
            "selection.png": _with_note(selection, hmm),
            "states.png": plots.plot_state_sequences(
                self.states,
                self.steps,
                self.convergence,
                hmm.n_states_,
                out / "states.png",
                title=title,
            ),
            "bootstrap.png": plots.plot_bootstrap(
                self.bootstrap, out / "bootstrap.png", title=title
            ),
            "stability.png": plots.plot_stability(self.stability, out / "stability.png", title),
        }
        return self.captions


def fit_group(
    runs: Mapping[str, pd.DataFrame], outcomes: Outcomes, settings: AnalysisSettings,
    out_dir: str | os.PathLike | None = None, title: str = "", n_jobs: int = 1,
) -> GroupFit:  # fmt: skip
    """Fit the training-map HMM of one group, its baselines, its detour regression and its
    bootstrap (module docstring); written to ``out_dir`` when given."""
    hmm = make_hmm(settings.replace(n_jobs=n_jobs)).fit(runs)
    baselines, curves = baseline_table(hmm, runs, k_max=settings.baseline_k_max)
    curves["HMM"] = hmm.selection_
    states = hmm.decode(runs)
    z_means = hmm.state_means().add_suffix("_z")
    raw_means = hmm.state_means_original(runs, states)
    state_means = pd.concat([z_means, raw_means], axis=1).reset_index()
    regression = _detour_regression(hmm, states, outcomes, settings.alpha)
    bootstrap = run_bootstrap(hmm, runs, outcomes, regression, settings.bootstrap_settings,
                              n_jobs)  # fmt: skip
    stability = map_stability(hmm, runs, None, outcomes.convergence, outcomes.status,
                              regression.detour_states, settings.stability_settings,
                              n_jobs)  # fmt: skip
    result = GroupFit(hmm, states, steps=_steps(runs), convergence=dict(outcomes.convergence),
                      baselines=baselines, baseline_curves=curves, state_means=state_means,
                      regression=regression, bootstrap=bootstrap, stability=stability)  # fmt: skip
    if out_dir is not None:
        result.write(out_dir, title)
    return result


def run_bootstrap(
    hmm: TrainingHMM, runs: Mapping[str, pd.DataFrame], outcomes: Outcomes,
    detours: DetourRegression, settings: BootstrapSettings, n_jobs: int,
) -> BootstrapResult:  # fmt: skip
    """The bootstrap over runs with the analysis settings' bootstrap view
    (:attr:`~trainmap.dynamics.maps.settings.AnalysisSettings.bootstrap_settings`: ``n_resamples``,
    0 = none)."""
    return bootstrap_map(hmm, runs, outcomes.convergence, outcomes.status, detours.detour_states,
                         n_resamples=settings.n_resamples, alpha=settings.alpha,
                         seed=settings.seed, n_jobs=n_jobs, max_iter=settings.max_iter)  # fmt: skip


@dataclass
class GroupRegression:
    """:func:`regress_group`'s result: the detour regression, and ``summary`` (``detours.json``:
    the regression with K, the detours the bootstrap finds again, the dissimilarity, forking)."""

    regression: DetourRegression
    summary: dict[str, Any]
    outcomes: Outcomes
    captions: dict[str, str] = field(default_factory=dict)

    @property
    def detour_states(self) -> list[int]:
        """The detour states of the group's map."""
        return self.regression.detour_states

    def write(self, out_dir: str | os.PathLike, title: str = "") -> dict[str, str]:
        """Write ``detours.json``, ``coefficients.csv`` and the figures; the captions."""
        out = Path(out_dir)
        save_json(self.summary, out / "detours.json")
        _write_csv(self.regression.coefficients, out / "coefficients.csv")
        self.captions = {
            "coefficients.png": plots.plot_coefficients(
                self.regression.coefficients,
                out / "coefficients.png",
                title=title,
                note=self.regression.not_fitted,
            ),
            "convergence.png": plots.plot_convergence_histogram(
                self.outcomes.convergence,
                self.outcomes.status,
                out / "convergence.png",
                title=title,
                no_curve=self.outcomes.no_curve,
            ),
        }
        return self.captions


def regress_group(
    fit: FittedMap, outcomes: Outcomes, settings: AnalysisSettings, *,
    regression: DetourRegression | None = None, bootstrap: BootstrapResult | None = None,
    out_dir: str | os.PathLike | None = None, title: str = "",
) -> GroupRegression:  # fmt: skip
    """Detour regression and trajectory dissimilarity of a fitted group; each detour carries how
    often ``bootstrap`` finds it again. ``regression``: the fit's own (:attr:`GroupFit.regression`),
    else it is fitted here on the decoded states (a workflow rule after the fit's)."""
    hmm, states = fit.hmm, fit.states
    if regression is None:
        regression = _detour_regression(hmm, states, outcomes, settings.alpha)
    distributions = {run: state_distribution(s, hmm.n_states_) for run, s in states.items()}
    found_again = {}
    if bootstrap is not None:
        found_again = {str(d): bootstrap.detour_found.get(d) for d in regression.detour_states}
    summary = regression.to_dict() | {
        "n_states": hmm.n_states_,
        "selection_at_ceiling": bool(getattr(hmm, "at_ceiling_", False)),
        "detours_found_again": found_again,
        "dissimilarity": trajectory_dissimilarity(distributions, settings.dissimilarity),
        "dissimilarity_ground_metric": settings.dissimilarity,
        "forking": bool(regression.detour_states) or _forks(states),
    }
    result = GroupRegression(regression, summary, outcomes)
    if out_dir is not None:
        result.write(out_dir, title)
    return result


def _forks(states: Mapping[str, np.ndarray]) -> bool:
    """Whether the map branches: some state is left towards two different states."""
    successors: dict[int, set[int]] = {}
    for sequence in states.values():
        changes = np.flatnonzero(sequence[1:] != sequence[:-1]) + 1
        for t in changes:
            successors.setdefault(int(sequence[t - 1]), set()).add(int(sequence[t]))
    return any(len(targets) > 1 for targets in successors.values())


@dataclass
class GroupMap:
    """:func:`map_group`'s result: the training map and the detour states it highlights."""

    training_map: TrainingMap
    detour_states: list[int] | None
    dropped_note: str  # the features the HMM left out, and why ("" when none was)
    captions: dict[str, str] = field(default_factory=dict)

    def write(self, out_dir: str | os.PathLike, title: str = "") -> dict[str, str]:
        """Write ``map.json`` and draw ``map.png`` / ``map.svg``; the captions."""
        out = Path(out_dir)
        self.training_map.save(out / "map.json")
        caption = draw_training_map(self.training_map, out / "map.png", out / "map.svg",
                                    title=title, detour_states=self.detour_states)  # fmt: skip
        self.captions = {"map.png": f"{caption} {self.dropped_note}".rstrip()}
        return self.captions


def map_group(
    fit: FittedMap, runs: Mapping[str, pd.DataFrame], outcomes: Outcomes,
    detour_states: list[int] | None = None, out_dir: str | os.PathLike | None = None,
    title: str = "",
) -> GroupMap:  # fmt: skip
    """The training map of a fitted group, ``detour_states`` highlighted."""
    training_map = build_training_map(fit.hmm, runs, fit.states, outcomes.convergence)
    result = GroupMap(training_map, detour_states, fit.hmm.dropped_note())
    if out_dir is not None:
        result.write(out_dir, title)
    return result


# --- joint comparison --------------------------------------------------------------------------


def map_runs(
    runs: Mapping[str, pd.DataFrame], outcomes: Outcomes, settings: AnalysisSettings,
    out_dir: str | os.PathLike | None = None, title: str = "", n_jobs: int = 1,
) -> tuple[GroupFit, GroupRegression, GroupMap]:  # fmt: skip
    """One group's analysis in one step (``python -m trainmap.dynamics``, an external run set):
    :func:`fit_group`, :func:`regress_group` on the fit's own regression and bootstrap, and
    :func:`map_group` with its detours highlighted; the workflow runs the three as rules."""
    fit = fit_group(runs, outcomes, settings, out_dir, title=title, n_jobs=n_jobs)
    regression = regress_group(fit, outcomes, settings, regression=fit.regression,
                               bootstrap=fit.bootstrap, out_dir=out_dir, title=title)  # fmt: skip
    training_map = map_group(fit, runs, outcomes, detour_states=regression.detour_states,
                             out_dir=out_dir, title=title)  # fmt: skip
    return fit, regression, training_map


@dataclass
class JointResult:
    """:func:`joint_group`'s result: the comparison on the shared map (fit, states, regressions,
    verdicts), its bootstrap and the shared training map."""

    comparison: JointComparison
    bootstrap: BootstrapResult
    stability: MapStability
    training_map: TrainingMap
    steps: dict[str, np.ndarray]  # run -> its checkpoints' steps
    notes: list[str] = field(default_factory=list)  # verdicts.md's sentences after the answer
    captions: dict[str, str] = field(default_factory=dict)

    @property
    def hmm(self) -> TrainingHMM:
        """The shared HMM."""
        return self.comparison.hmm

    @property
    def states(self) -> dict[str, np.ndarray]:
        """Every run's decoded states on the shared map."""
        return self.comparison.states

    @property
    def detour_states(self) -> list[int]:
        """The detour states of the pooled regression."""
        return self.comparison.detours.detour_states

    @property
    def supported_detours(self) -> list[int]:
        """The detour states the map and convergence.png show as detours: those the regression
        with the group indicators keeps (:func:`trainmap.dynamics.verdicts.labels.supported_detours`)."""
        return supported_detours(self.detour_states, self.comparison.detours_explained_by_group)

    def summary(self) -> dict[str, Any]:
        """``joint.json``: the comparison's summary, the bootstrap and the stability curve."""
        return self.comparison.summary() | {"bootstrap": self.bootstrap.to_dict(),
                                            "stability": self.stability.to_dict()}  # fmt: skip

    def verdict_markdown(self) -> str:
        """``verdicts.md``: the answer of each pair (:func:`~trainmap.dynamics.verdicts.compare.answer_lines`:
        start, where the metrics differ, path), the stability line (and from which n each verdict
        holds again), then the verdict table and its notes."""
        curve = self.stability.curve
        per_verdict = "".join(f"- {line}\n" for line in curve.verdict_lines()) if curve else ""
        per_verdict = f"Each verdict on subsamples:\n\n{per_verdict}\n" if per_verdict else ""
        answer = "".join(f"{line}\n\n" for line in [*answer_lines(self.comparison.verdicts),
                                                     *self.notes])  # fmt: skip
        return (f"**Answer** (start, where the metrics differ, path):\n\n{answer}"
                f"**Stability:** {self.stability.line}.\n\n{per_verdict}"
                f"{self.comparison.verdict_markdown()}")  # fmt: skip

    def write(self, out_dir: str | os.PathLike, title: str = "") -> dict[str, str]:
        """Write the comparison's files and figures to ``out_dir`` (module docstring); the
        captions."""
        out, comparison = Path(out_dir), self.comparison
        comparison.hmm.save(out / "hmm.npz", out / "hmm.json")
        _write_csv(states_table(comparison.states, self.steps), out / "states.csv")
        save_json(self.bootstrap.to_dict(), out / "bootstrap.json")
        save_json(self.stability.to_dict(), out / "stability.json")
        _write_csv(comparison.verdicts, out / "verdicts.csv")
        write_verdicts(out, self.verdict_markdown(), title or out.name)
        save_json(self.summary(), out / "joint.json")
        _write_csv(comparison.with_groups.coefficients, out / "regression.csv")
        map_caption = draw_training_map(self.training_map, out / "map.png", out / "map.svg",
                                        title=title, detour_states=self.supported_detours)  # fmt: skip
        self.captions = {
            "verdicts.png": plots.plot_verdicts(
                comparison.verdicts,
                comparison.settings.confidence,
                out / "verdicts.png",
                title=title,
                alpha=comparison.settings.alpha,
            ),
            "paths.png": plots.plot_path_difference(
                comparison.time_resolved(), out / "paths.png", title=title
            ),  # fmt: skip
            "occupancy.png": plots.plot_occupancy(
                comparison.occupancy, self.detour_states, out / "occupancy.png", title=title
            ),
            "convergence.png": plots.plot_group_convergence(
                comparison.convergence,
                detour_visit_rates(comparison.states, comparison.groups, self.supported_detours)
                if self.supported_detours
                else {},  # no rate of a detour the map does not draw
                out / "convergence.png",
                title=title,
                no_curve=comparison.no_curve,
            ),
            "map.png": _with_note(map_caption, comparison.hmm),
            "stability.png": plots.plot_stability(self.stability, out / "stability.png", title),
        }
        return self.captions


def joint_group(
    runs: Mapping[str, pd.DataFrame], groups: Mapping[str, str], outcomes: Outcomes,
    settings: AnalysisSettings, out_dir: str | os.PathLike | None = None, title: str = "",
    n_jobs: int = 1, notes: Sequence[str] = (),
) -> JointResult:  # fmt: skip
    """One shared HMM over several groups' runs (``groups``: run id -> group label), the comparison
    of the groups, its verdicts, its bootstrap and its map; written to ``out_dir`` when given.
    ``notes``: sentences ``verdicts.md`` gives after the answer (e.g. what compares across
    architectures, :func:`~trainmap.dynamics.verdicts.timecourse.architecture_note`)."""
    comparison = compare_groups(runs, groups, outcomes.convergence, outcomes.status,
                                make_hmm(settings.replace(n_jobs=n_jobs)),
                                settings.verdict_settings, no_curve=outcomes.no_curve)  # fmt: skip
    bootstrap = run_bootstrap(comparison.hmm, runs, outcomes, comparison.detours,
                              settings.bootstrap_settings, n_jobs)  # fmt: skip
    stability = map_stability(comparison.hmm, runs, groups, outcomes.convergence, outcomes.status,
                              comparison.detours.detour_states, settings.stability_settings,
                              n_jobs, verdicts=comparison.verdicts, paths=comparison.paths,
                              no_curve=outcomes.no_curve)  # fmt: skip
    comparison.verdicts = label_verdicts(comparison.verdicts, stability,
                                         comparison.detours_explained_by_group)  # fmt: skip
    training_map = build_training_map(comparison.hmm, runs, comparison.states,
                                      outcomes.convergence, groups=groups)  # fmt: skip
    result = JointResult(comparison, bootstrap, stability, training_map, _steps(runs),
                         [note for note in notes if note])  # fmt: skip
    if out_dir is not None:
        result.write(out_dir, title)
    return result
