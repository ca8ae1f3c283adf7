"""The analysis steps on files: what the workflow's rules and the command line both run.

Each step reads per-run metric tables (the format of :mod:`trainmap.dynamics.metrics`) and writes a
fixed set of files into one directory:

``fit_group`` (rule ``fit_hmm``)
    ``hmm.npz`` + ``hmm.json`` (the fitted model; ``selection_at_ceiling`` when the BIC was still
    falling at K_max), ``selection.csv`` (per K: train/held-out log-likelihood, BIC of the best
    restart, mean and SD over restarts, AIC), ``baselines.csv`` (appendix C, table 4 form:
    k-means, HMM-1, HMM), ``selection.png``, ``states.csv`` (run, step, state: every run's Viterbi
    sequence), ``state_means.csv`` (per state, z-units and original units), ``states.png``, and the
    bootstrap over runs (:mod:`trainmap.dynamics.certainty`): ``bootstrap.json``, ``bootstrap.png``.
``map_group`` (rule ``training_map``)
    ``map.json``, ``map.png``, ``map.svg``.
``regress_group`` (rule ``regress_detours``)
    ``detours.json`` (R^2 and adjusted R^2, F-test p, or why no regression was fitted; detour
    states with how often the bootstrap finds each again; dissimilarity and its ground metric;
    excluded runs), ``coefficients.csv``, ``coefficients.png``, ``convergence.png``.
``joint_group`` (rule ``joint_comparison``)
    ``verdicts.csv`` / ``verdicts.md`` / ``verdicts.png`` (per method pair: effect, interval, p,
    verdict), ``joint.json``, ``occupancy.png``, ``convergence.png``, ``map.png``, ``map.svg``,
    ``regression.csv``, ``bootstrap.json`` and the shared model (``hmm.npz``, ``hmm.json``,
    ``states.csv``).

Every step returns the captions of the figures it drew (figure name -> caption). A feature the HMM
leaves out (a model without biases has no bias metrics) is named with the reason in ``hmm.json`` and
``joint.json`` (``dropped_features``), in ``verdicts.md`` and in the captions of the selection
figure and the maps. The steps take metric tables as read by
:func:`trainmap.dynamics.tables.read_metric_table`, which stops at a damaged one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainmap.dynamics import plots
from trainmap.dynamics.certainty import BootstrapResult, bootstrap_map
from trainmap.dynamics.hmm import TrainingHMM, baseline_table
from trainmap.dynamics.joint import compare_groups
from trainmap.dynamics.regression import (
    DetourRegression,
    regress_detours,
    state_distribution,
    trajectory_dissimilarity,
)
from trainmap.dynamics.training_map import build_training_map, draw_training_map
from trainmap.io import load_json, save_json, write_atomic

HMM_SETTINGS = ("k_max", "restarts", "holdout", "covariance_type", "standardisation",
                "restart_rule", "init", "n_iter", "tol", "min_covar", "n_jobs", "features")  # fmt: skip
#: The analysis settings and their defaults (params.yaml ``analysis`` documents each).
ANALYSIS_DEFAULTS = {
    "k_max": 8,
    "restarts": 5,
    "holdout": 0.2,
    "seed": 0,
    "covariance_type": "full",
    "standardisation": "pooled",
    "restart_rule": "best",
    "init": "sticky",
    "n_iter": 500,
    "tol": 1e-3,
    "baseline_k_max": 16,
    "alpha": 0.05,
    "dissimilarity": "total_variation",
    "bootstrap": 200,
    "bootstrap_iter": 10,
    "permutations": 2000,
    "confidence": 0.95,
}


@dataclass
class Outcomes:
    """What the regression and the map need to know about each run."""

    convergence: dict[str, int | None]
    status: dict[str, str]


def with_defaults(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` completed with :data:`ANALYSIS_DEFAULTS`."""
    return ANALYSIS_DEFAULTS | dict(settings)


def make_hmm(settings: Mapping[str, Any]) -> TrainingHMM:
    """An unfitted :class:`TrainingHMM` from analysis settings (``seed`` is the random state)."""
    settings = with_defaults(settings)
    kwargs = {key: settings[key] for key in HMM_SETTINGS if key in settings}
    return TrainingHMM(random_state=settings["seed"], **kwargs)


def convergence_from_tables(
    runs: Mapping[str, pd.DataFrame], threshold: float
) -> dict[str, int | None]:
    """First step whose ``test_acc`` reaches ``threshold``, per run (None: never)."""
    from trainmap.evaluation import convergence_step

    return {run: convergence_step(table, threshold) for run, table in runs.items()}


def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    write_atomic(path, lambda tmp: frame.to_csv(tmp, index=False))


def states_table(
    states: Mapping[str, np.ndarray], runs: Mapping[str, pd.DataFrame]
) -> pd.DataFrame:
    """Long format: run, step, state."""
    return pd.concat(
        [pd.DataFrame({"run": run, "step": runs[run]["step"].to_numpy(), "state": s})
         for run, s in states.items()],
        ignore_index=True,
    )  # fmt: skip


def read_states(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Inverse of :func:`states_table` (as written to ``states.csv``)."""
    frame = pd.read_csv(path, dtype={"run": str})
    return {run: group["state"].to_numpy() for run, group in frame.groupby("run", sort=False)}


def fit_group(
    runs: Mapping[str, pd.DataFrame], outcomes: Outcomes, settings: Mapping[str, Any],
    out_dir: str | os.PathLike, title: str = "", n_jobs: int = 1,
) -> dict[str, str]:  # fmt: skip
    """Fit the training-map HMM of one group, its baselines and its bootstrap (module docstring)."""
    settings = with_defaults(settings)
    out = Path(out_dir)
    hmm = make_hmm(settings | {"n_jobs": n_jobs}).fit(runs)
    hmm.save(out / "hmm.npz", out / "hmm.json")
    _write_csv(hmm.selection_, out / "selection.csv")
    table, curves = baseline_table(hmm, runs, k_max=settings["baseline_k_max"])
    curves["HMM"] = hmm.selection_
    _write_csv(table, out / "baselines.csv")
    states = hmm.decode(runs)
    _write_csv(states_table(states, runs), out / "states.csv")
    z_means = hmm.state_means().add_suffix("_z")
    raw_means = hmm.state_means_original(runs, states)
    _write_csv(pd.concat([z_means, raw_means], axis=1).reset_index(), out / "state_means.csv")
    detours = _regression(hmm, states, outcomes, settings)
    bootstrap = run_bootstrap(hmm, runs, outcomes, detours, settings, n_jobs)
    save_json(bootstrap.to_dict(), out / "bootstrap.json")
    steps = {run: table["step"].to_numpy() for run, table in runs.items()}
    selection = plots.plot_selection(curves, hmm.n_states_, out / "selection.png", title=title,
                                     at_ceiling=hmm.at_ceiling_)  # fmt: skip
    return {
        "selection.png": _with_note(selection, hmm),
        "states.png": plots.plot_state_sequences(
            states, steps, outcomes.convergence, hmm.n_states_, out / "states.png", title=title
        ),  # fmt: skip
        "bootstrap.png": plots.plot_bootstrap(bootstrap, out / "bootstrap.png", title=title),
    }


def _regression(
    hmm: TrainingHMM, states: Mapping[str, np.ndarray], outcomes: Outcomes,
    settings: Mapping[str, Any],
) -> DetourRegression:  # fmt: skip
    distributions = {run: state_distribution(s, hmm.n_states_) for run, s in states.items()}
    return regress_detours(distributions, outcomes.convergence, outcomes.status,
                           alpha=settings["alpha"])  # fmt: skip


def run_bootstrap(
    hmm: TrainingHMM, runs: Mapping[str, pd.DataFrame], outcomes: Outcomes,
    detours: DetourRegression, settings: Mapping[str, Any], n_jobs: int,
) -> BootstrapResult:  # fmt: skip
    """The bootstrap over runs with the analysis settings (``bootstrap`` resamples, 0 = none)."""
    return bootstrap_map(hmm, runs, outcomes.convergence, outcomes.status, detours.detour_states,
                         n_resamples=settings["bootstrap"], alpha=settings["alpha"],
                         seed=settings["seed"], n_jobs=n_jobs,
                         max_iter=settings["bootstrap_iter"])  # fmt: skip


def load_fit(directory: str | os.PathLike) -> tuple[TrainingHMM, dict[str, np.ndarray]]:
    """The fitted HMM and the decoded states written by :func:`fit_group`."""
    directory = Path(directory)
    hmm = TrainingHMM.load(directory / "hmm.npz", directory / "hmm.json")
    return hmm, read_states(directory / "states.csv")


def map_group(
    runs: Mapping[str, pd.DataFrame], outcomes: Outcomes, fit_dir: str | os.PathLike,
    out_dir: str | os.PathLike, title: str = "", detour_states: list[int] | None = None,
) -> dict[str, str]:  # fmt: skip
    """Build and draw the training map of a fitted group."""
    out = Path(out_dir)
    hmm, states = load_fit(fit_dir)
    training_map = build_training_map(hmm, runs, states, outcomes.convergence)
    training_map.save(out / "map.json")
    caption = draw_training_map(training_map, out / "map.png", out / "map.svg", title=title,
                                detour_states=detour_states)  # fmt: skip
    return {"map.png": _with_note(caption, hmm)}


def _with_note(caption: str, hmm: TrainingHMM) -> str:
    """``caption`` and the sentence naming the features the HMM left out, if any."""
    return f"{caption} {hmm.dropped_note()}".rstrip()


def regress_group(
    outcomes: Outcomes, fit_dir: str | os.PathLike, out_dir: str | os.PathLike, title: str = "",
    settings: Mapping[str, Any] | None = None,
) -> dict[str, str]:  # fmt: skip
    """Detour regression and trajectory dissimilarity of a fitted group; each detour carries how
    often the bootstrap (``bootstrap.json`` beside the fit) finds it again."""
    settings = with_defaults(settings or {})
    out = Path(out_dir)
    hmm, states = load_fit(fit_dir)
    result = _regression(hmm, states, outcomes, settings)
    distributions = {run: state_distribution(s, hmm.n_states_) for run, s in states.items()}
    bootstrap_path = Path(fit_dir) / "bootstrap.json"
    found_again = {}
    if bootstrap_path.exists():
        found = load_json(bootstrap_path)["detour_found"]
        found_again = {str(d): found.get(str(d)) for d in result.detour_states}
    summary = result.to_dict() | {
        "n_states": hmm.n_states_,
        "selection_at_ceiling": bool(getattr(hmm, "at_ceiling_", False)),
        "detours_found_again": found_again,
        "dissimilarity": trajectory_dissimilarity(distributions, settings["dissimilarity"]),
        "dissimilarity_ground_metric": settings["dissimilarity"],
        "forking": bool(result.detour_states) or _forks(states),
    }
    save_json(summary, out / "detours.json")
    _write_csv(result.coefficients, out / "coefficients.csv")
    return {
        "coefficients.png": plots.plot_coefficients(
            result.coefficients,
            out / "coefficients.png",
            title=title,
            note=result.not_fitted,
        ),  # fmt: skip
        "convergence.png": plots.plot_convergence_histogram(
            outcomes.convergence, outcomes.status, out / "convergence.png", title=title
        ),
    }


def _forks(states: Mapping[str, np.ndarray]) -> bool:
    """Whether the map branches: some state is left towards two different states."""
    successors: dict[int, set[int]] = {}
    for sequence in states.values():
        changes = np.flatnonzero(sequence[1:] != sequence[:-1]) + 1
        for t in changes:
            successors.setdefault(int(sequence[t - 1]), set()).add(int(sequence[t]))
    return any(len(targets) > 1 for targets in successors.values())


def joint_group(
    runs: Mapping[str, pd.DataFrame], groups: Mapping[str, str], outcomes: Outcomes,
    settings: Mapping[str, Any], out_dir: str | os.PathLike, title: str = "", n_jobs: int = 1,
) -> dict[str, str]:  # fmt: skip
    """One shared HMM over several groups' runs, the comparison of the groups and its verdicts."""
    settings = with_defaults(settings)
    out = Path(out_dir)
    result = compare_groups(runs, groups, outcomes.convergence, outcomes.status,
                            make_hmm(settings | {"n_jobs": n_jobs}), settings)  # fmt: skip
    result.hmm.save(out / "hmm.npz", out / "hmm.json")
    _write_csv(states_table(result.states, runs), out / "states.csv")
    bootstrap = run_bootstrap(result.hmm, runs, outcomes, result.detours, settings, n_jobs)
    save_json(bootstrap.to_dict(), out / "bootstrap.json")
    _write_csv(result.verdicts, out / "verdicts.csv")
    write_atomic(out / "verdicts.md", lambda tmp: tmp.write_text(result.verdict_markdown()))
    save_json(result.summary() | {"bootstrap": bootstrap.to_dict()}, out / "joint.json")
    _write_csv(result.with_groups.coefficients, out / "regression.csv")
    training_map = build_training_map(result.hmm, runs, result.states, outcomes.convergence)
    map_caption = draw_training_map(training_map, out / "map.png", out / "map.svg", title=title,
                                    detour_states=result.detours.detour_states)  # fmt: skip
    return {
        "verdicts.png": plots.plot_verdicts(
            result.verdicts, settings["confidence"], out / "verdicts.png", title=title
        ),  # fmt: skip
        "occupancy.png": plots.plot_occupancy(
            result.occupancy, result.detours.detour_states, out / "occupancy.png", title=title
        ),  # fmt: skip
        "convergence.png": plots.plot_group_convergence(
            result.convergence, result.visit_rates, out / "convergence.png", title=title
        ),
        "map.png": _with_note(map_caption, result.hmm),
    }
