"""How sure a training map is: the bootstrap over runs, and the refits the stability curve reuses.

None of the anchor papers states its uncertainty. A training map rests on a sample of seeds, so
trainmap asks what another draw of seeds would have said:

**Bootstrap over runs** (:func:`bootstrap_map`; Efron & Tibshirani 1993, ch. 6). Each resample
draws a fresh 80/20 split of the run ids, then draws runs with replacement within each part (a
held-out copy of a training run would flatter the fit), re-standardises (pooled statistics of the
drawn runs), refits every K = 1..K_max and selects K by held-out BIC with the full fit's own
functions (:func:`refit_resample`: :func:`~trainmap.dynamics.hmm.estimator.standardise_runs`,
:func:`~trainmap.dynamics.hmm.selection.select_model`, each run weighted by how often it was drawn; with the
full fit's selection rule: a full fit scored on folds has no held-out runs, so its resamples draw
all runs with replacement and score K on folds of the runs drawn, each run's copies in one fold);
it then decodes the drawn runs and reruns the detour regression. Each refit starts from the full
fit's model at that K (its parameters re-expressed in the resample's standard units) with one EM
run instead of R fresh restarts: the full fit already found the basin, and a resample's optimum
lies close to it. The refit runs at most ``max_iter`` EM iterations (a k-step bootstrap, Andrews
2002; why the cap: docs/decisions/certainty.md). Reported: the distribution of
the selected K; per state of the full map how often
a state with nearly the same emission mean is found again (Hungarian matching of emission means,
accepted when closer than half the distance to the nearest other state of the full map); per
detour state how often that state is found again *as a detour*; per resample its regression's R^2,
its number of detours and eq. 1's dissimilarity (both ground metrics), so that two maps' numbers
can be compared with intervals. Resamples are seeded
(``SeedSequence([seed, b])``) and run in parallel; the result does not depend on ``n_jobs``.

The permutation tests between methods that share one map, and their verdict table, are
:mod:`trainmap.dynamics.verdicts`.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from trainmap.dynamics.hmm.estimator import TrainingHMM, standardise_runs, unit_change
from trainmap.dynamics.hmm.factory import in_units, model_parameters
from trainmap.dynamics.hmm.selection import DEFAULT_FOLDS, ModelSelection, select_model
from trainmap.dynamics.hmm.splits import SelectionFailed
from trainmap.dynamics.regression import (
    GROUND_METRICS,
    regress_detours,
    state_distribution,
    trajectory_dissimilarity,
)
from trainmap.io import load_json

# --- bootstrap over runs -----------------------------------------------------------------------

#: Resamples selecting K = 1 at least this often, while the full map has more states, make a
#: collapsed bootstrap (:func:`collapsed_to_one_state`).
COLLAPSED_SHARE = 0.9


def collapsed_to_one_state(
    k_counts: Mapping[int, int], n_states: int, share: float = COLLAPSED_SHARE
) -> bool:
    """Whether a bootstrap collapsed: at least ``share`` of its resamples (``k_counts``: K -> how
    many resamples selected it) selected K = 1 while the full map has ``n_states`` > 1. Its
    intervals then describe a one-state map, not the full one: each resample reselects K from
    fewer distinct runs (measured under ``selection: reproducible``; docs: training-maps.md)."""
    total = sum(k_counts.values())
    return n_states > 1 and total > 0 and k_counts.get(1, 0) >= share * total


@dataclass
class BootstrapResult:
    """What the resamples say about the full map (module docstring)."""

    n_resamples: int
    n_states: int
    k_counts: dict[int, int]
    state_found: list[float]
    detour_states: list[int]
    detour_found: dict[int, float]
    seconds: float
    ks: list[int] = field(default_factory=list)
    # Per resample, over the runs as drawn (None where no K fitted, or no regression could be):
    # the detour regression's R^2, the number of detour states, eq. 1's dissimilarity under each
    # ground metric (the paper's table compares settings with them: trainmap.dynamics.paper).
    r2s: list[float | None] = field(default_factory=list)
    n_detours: list[int] = field(default_factory=list)
    dissimilarities: dict[str, list[float | None]] = field(default_factory=dict)

    @property
    def k_same(self) -> float:
        """Fraction of resamples that select the full map's K."""
        return self.k_counts.get(self.n_states, 0) / max(self.n_resamples, 1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        summary = asdict(self)
        summary["k_counts"] = {str(k): v for k, v in sorted(self.k_counts.items())}
        summary["detour_found"] = {str(k): v for k, v in self.detour_found.items()}
        summary["k_same"] = self.k_same
        return summary

    @classmethod
    def from_dict(cls, summary: Mapping[str, Any]) -> BootstrapResult:
        """The result :meth:`to_dict` describes (``seconds`` NaN when the times are not there)."""
        return cls(
            n_resamples=summary["n_resamples"],
            n_states=summary["n_states"],
            k_counts={int(k): v for k, v in summary["k_counts"].items()},
            state_found=list(summary["state_found"]),
            detour_states=list(summary["detour_states"]),
            detour_found={int(k): v for k, v in summary["detour_found"].items()},
            seconds=summary.get("seconds", math.nan),
            ks=list(summary.get("ks", [])),
            r2s=list(summary.get("r2s", [])),
            n_detours=list(summary.get("n_detours", [])),
            dissimilarities={g: list(v) for g, v in summary.get("dissimilarities", {}).items()},
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> BootstrapResult:
        """The result saved as ``bootstrap.json`` (with its timing sidecar, when there)."""
        return cls.from_dict(load_json(path))


def bootstrap_map(
    hmm: TrainingHMM,
    runs: Mapping[str, pd.DataFrame],
    convergence: Mapping[str, int | None],
    status: Mapping[str, str],
    detour_states: Sequence[int],
    n_resamples: int = 200,
    alpha: float = 0.05,
    seed: int = 0,
    n_jobs: int = 1,
    max_iter: int | None = None,
    warm_start: bool = True,
) -> BootstrapResult:
    """Refit the map on ``n_resamples`` bootstrap resamples of the runs (module docstring).

    ``hmm`` is the fitted full map (with ``models_`` for every K); ``detour_states`` its detours;
    ``max_iter`` caps the EM iterations of each warm-started refit (default: the fit's ``n_iter``).
    ``warm_start=False`` refits every resample as the full fit does (its restarts, from fresh
    seeded starts): slower, for checking what the warm starts change.
    """
    started = time.perf_counter()
    payload = refit_payload(hmm, runs, convergence, status, alpha, seed, max_iter, warm_start)
    payload["n_heldout"] = len(hmm.heldout_runs_)
    outcomes = run_refits(_one_resample, list(range(n_resamples)), payload, n_jobs)
    ks = [r["k"] for r in outcomes]
    n_states = hmm.n_states_
    found = np.zeros(n_states)
    detour_found = dict.fromkeys(detour_states, 0)
    for outcome in outcomes:
        for full_state, state in outcome["matched"].items():
            found[full_state] += 1
            if full_state in detour_found and state in outcome["detours"]:
                detour_found[full_state] += 1
    total = max(len(outcomes), 1)
    return BootstrapResult(
        n_resamples=len(outcomes),
        n_states=n_states,
        k_counts={int(k): ks.count(k) for k in sorted(set(ks))},
        state_found=(found / total).tolist(),
        detour_states=[int(d) for d in detour_states],
        detour_found={int(d): count / total for d, count in detour_found.items()},
        seconds=time.perf_counter() - started,
        ks=ks,
        r2s=[outcome.get("r2") for outcome in outcomes],
        n_detours=[len(outcome["detours"]) for outcome in outcomes],
        dissimilarities={ground: [outcome.get("dissimilarity", {}).get(ground)
                                  for outcome in outcomes] for ground in GROUND_METRICS},
    )  # fmt: skip


@dataclass
class Refit:
    """How a resample is refitted: the full fit's standardisation, EM settings and selection, and
    (warm starts) its model of every K. Plain values and arrays: it travels to worker processes."""

    standardisation: dict[str, Any]  # the full fit's statistics (TrainingHMM.standardisation_)
    settings: dict[str, Any]  # EM settings (TrainingHMM.settings(), n_iter capped for warm starts)
    ks: list[int]
    restarts: int
    restart_rule: str
    starts: dict[int, dict[str, np.ndarray]] | None  # K -> the full fit's parameters, or None
    selection: str = "holdout"  # the full fit's selection rule (TrainingHMM.selection)
    folds: int = DEFAULT_FOLDS
    # the reproducible rule's settings (TrainingHMM.reproducibility()), the runs' groups (run ->
    # group: halves are drawn per group) and, warm-started, the full fit's half maps (split -> K
    # -> parameters): each half of a refit continues from the full fit's half of that split
    reproducibility: dict[str, Any] = field(default_factory=dict)
    strata: dict[str, str] | None = None
    half_starts: dict[int, dict[int, dict[str, np.ndarray]]] | None = None

    @classmethod
    def of(cls, hmm: TrainingHMM, max_iter: int | None = None, warm_start: bool = True) -> Refit:
        """The refit of ``hmm``'s resamples: warm-started from its model of every K for at most
        ``max_iter`` EM iterations, or (``warm_start=False``) its own restarts from fresh starts."""
        rule = {"selection": hmm.selection, "folds": hmm.folds,
                "reproducibility": hmm.reproducibility(),
                "strata": getattr(hmm, "strata_", None)}  # fmt: skip
        if not warm_start:
            return cls(hmm.standardisation_, hmm.settings(), list(range(1, hmm.k_max + 1)),
                       hmm.restarts, hmm.restart_rule, None, **rule)  # fmt: skip
        starts = {k: model_parameters(model) for k, model in hmm.models_.items()}
        halves = {split: {k: model_parameters(model) for k, model in models.items()}
                  for split, models in getattr(hmm, "half_models_", {}).items()}  # fmt: skip
        settings = hmm.settings() | ({"n_iter": max_iter} if max_iter else {})
        ks = sorted(set(starts).intersection(*halves.values()) if halves else starts)
        return cls(hmm.standardisation_, settings, ks, 1, hmm.restart_rule, starts, **rule,
                   half_starts=halves or None)  # fmt: skip


@dataclass
class RefitResult:
    """One refitted resample: its selection and its units relative to the full fit's."""

    selection: ModelSelection
    drawn: list[str]  # the runs as drawn (training, then held-out), each as often as drawn
    z: dict[str, np.ndarray]  # the drawn runs, standardised as the resample is
    shift: np.ndarray  # z_resample = (z_full - shift) / scale
    scale: np.ndarray


def refit_resample(
    raw: Mapping[str, np.ndarray],
    train: Mapping[str, float],
    heldout: Mapping[str, float],
    refit: Refit,
) -> RefitResult:
    """Refit a resample of the runs exactly as the full fit selects its model: standardise
    (:func:`~trainmap.dynamics.hmm.estimator.standardise_runs`, pooled over the runs as drawn), fit every K
    and choose K (:func:`~trainmap.dynamics.hmm.selection.select_model`, with the full fit's selection rule:
    ``holdout`` scores on ``heldout``; ``folds`` pools both parts and scores on folds of the
    drawn runs), each run of ``train`` and ``heldout`` (run -> times drawn) weighted by how often
    it was drawn. Raises :class:`~trainmap.dynamics.hmm.splits.SelectionFailed` when no K fits."""
    drawn = [run for part in (train, heldout) for run, count in part.items()
             for _ in range(int(count))]  # fmt: skip
    full = refit.standardisation
    fallback = np.asarray(full["std"]) if full["kind"] == "pooled" else None
    z, statistics = standardise_runs({run: raw[run] for run in set(drawn)}, full["kind"],
                                     pooled_over=drawn, fallback_std=fallback)  # fmt: skip
    shift, scale = unit_change(full, statistics)
    starts, half_starts = None, None
    covariance_type = refit.settings["covariance_type"]
    if refit.starts is not None:
        starts = {k: in_units(parameters, shift, scale, covariance_type)
                  for k, parameters in refit.starts.items() if k in refit.ks}  # fmt: skip
    if refit.starts is not None and refit.half_starts:
        half_starts = {split: {k: in_units(parameters, shift, scale, covariance_type)
                               for k, parameters in models.items() if k in refit.ks}
                       for split, models in refit.half_starts.items()}  # fmt: skip
    selection = select_model(
        z, train, heldout, refit.settings, refit.ks, selection=refit.selection, folds=refit.folds,
        restarts=refit.restarts, restart_rule=refit.restart_rule, starts=starts,
        score_train=starts is None, **refit.reproducibility, strata=refit.strata,
        half_starts=half_starts, cap_halves=True,
    )  # fmt: skip
    return RefitResult(selection, drawn, z, shift, scale)


def refit_payload(
    hmm: TrainingHMM, runs: Mapping[str, pd.DataFrame], convergence: Mapping[str, int | None],
    status: Mapping[str, str], alpha: float, seed: int, max_iter: int | None, warm_start: bool,
) -> dict[str, Any]:  # fmt: skip
    """What every refit of ``hmm``'s runs needs (the bootstrap's and the stability curve's): the
    runs' raw features, how to refit (:class:`Refit`), the outcomes the detour regression reads
    and the full map's emission means the refit's states are matched to. Plain values: it travels
    to worker processes."""
    return {
        "raw": {run: table[hmm.features_].to_numpy(dtype=float) for run, table in runs.items()},
        "refit": Refit.of(hmm, max_iter, warm_start),
        "convergence": dict(convergence),
        "status": dict(status),
        "alpha": alpha,
        "seed": seed,
        "full_means": hmm.model_.means_,
    }


def run_refits(
    one: Callable[[Any, dict[str, Any]], dict[str, Any]], tasks: Sequence[Any],
    payload: dict[str, Any], n_jobs: int = 1,
) -> list[dict[str, Any]]:  # fmt: skip
    """``one(task, payload)`` for every task, in ``n_jobs`` processes (joblib; ``one`` a module-level
    function), BLAS single-threaded; the results in task order, independent of ``n_jobs``."""
    workers = max(n_jobs, 1)
    indexed = list(enumerate(tasks))
    chunks = [indexed[i::workers] for i in range(workers)]
    if workers == 1:
        results = [_refit_chunk(one, chunks[0], payload)]
    else:
        from joblib import Parallel, delayed

        results = Parallel(n_jobs=workers)(
            delayed(_refit_chunk)(one, chunk, payload) for chunk in chunks if chunk
        )
    return [result for _, result in sorted(item for chunk in results for item in chunk)]


def _refit_chunk(
    one: Callable[[Any, dict[str, Any]], dict[str, Any]], indexed: list[tuple[int, Any]],
    payload: dict[str, Any],
) -> list[tuple[int, dict[str, Any]]]:  # fmt: skip
    from threadpoolctl import threadpool_limits

    # Small matrices: BLAS threads only add synchronisation (and the result must not depend on
    # how many there are).
    with threadpool_limits(limits=1):
        return [(index, one(task, payload)) for index, task in indexed]


@dataclass
class RefitDetours:
    """What a refit's decoded runs say: its detour states, its states matched to the full map's
    (full state -> refit state), its regression's R^2 (0 when the runs occupy one state, None when
    no regression can be fitted otherwise) and eq. 1's dissimilarity under each ground metric,
    over the runs as drawn (each draw a run)."""

    detour_states: list[int]
    matched: dict[int, int]
    r2: float | None
    dissimilarity: dict[str, float]


def refit_detours(
    refit: RefitResult, payload: dict[str, Any], decoded: Mapping[str, np.ndarray] | None = None
) -> RefitDetours:
    """The refit's detour states (its drawn runs decoded by its model, each draw once, and
    regressed: :func:`~trainmap.dynamics.regression.regress_detours`), its states matched to the
    full map's (:func:`match_by_means`), its R^2 and dissimilarities. ``decoded``: the drawn runs'
    states when the caller has decoded them already."""
    k, model, drawn = refit.selection.n_states, refit.selection.model, refit.drawn
    if decoded is None:
        distinct = sorted(set(drawn))
        decoded = dict(zip(distinct, model.predict_runs([refit.z[run] for run in distinct]),
                           strict=True))  # fmt: skip
    keys = [f"{run}#{i}" for i, run in enumerate(drawn)]
    distributions = {key: state_distribution(decoded[run], k)
                     for key, run in zip(keys, drawn, strict=True)}  # fmt: skip
    convergence = {key: payload["convergence"].get(run) for key, run in zip(keys, drawn,
                                                                             strict=True)}  # fmt: skip
    status = {key: payload["status"].get(run, "completed") for key, run in zip(keys, drawn,
                                                                                strict=True)}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. statsmodels on a refit whose runs converge alike
        detours = regress_detours(distributions, convergence, status, alpha=payload["alpha"])
    matched = match_by_means(payload["full_means"], model.means_ * refit.scale + refit.shift)
    dissimilarity = {ground: trajectory_dissimilarity(distributions, ground)
                     for ground in GROUND_METRICS}  # fmt: skip
    return RefitDetours(detours.detour_states, matched, detours.explained, dissimilarity)


def draw_counts(ids: Sequence[str], size: int, rng: np.random.Generator) -> dict[str, float]:
    """``size`` runs drawn with replacement: each distinct run drawn and how often it was."""
    drawn = rng.choice(np.asarray(ids, dtype=object), size=size, replace=True)
    unique, counts = np.unique(drawn.astype(str), return_counts=True)
    return dict(zip(unique.tolist(), counts.astype(float).tolist(), strict=True))


def split_runs(
    ids: Sequence[str], n_heldout: int, rng: np.random.Generator
) -> tuple[list[str], list[str]]:
    """``ids`` in a random order, split as a resample splits them: (training runs, the first
    ``n_heldout`` held out)."""
    order = rng.permutation(len(ids))
    return [ids[i] for i in order[n_heldout:]], [ids[i] for i in order[:n_heldout]]


def _one_resample(b: int, payload: dict[str, Any]) -> dict[str, Any]:
    rng = np.random.default_rng(np.random.SeedSequence([payload["seed"], b]))
    train, heldout = split_runs(sorted(payload["raw"]), payload["n_heldout"], rng)
    train_counts = draw_counts(train, len(train), rng)
    heldout_counts = draw_counts(heldout, len(heldout), rng)
    try:
        refit = refit_resample(payload["raw"], train_counts, heldout_counts, payload["refit"])
    except SelectionFailed:
        return {"k": -1, "matched": {}, "detours": []}
    found = refit_detours(refit, payload)
    return {"k": int(refit.selection.n_states), "detours": found.detour_states,
            "matched": found.matched, "r2": found.r2, "dissimilarity": found.dissimilarity}  # fmt: skip


def match_by_means(full_means: np.ndarray, means: np.ndarray) -> dict[int, int]:
    """Full-map state -> resample state with nearly the same emission mean: the Hungarian matching
    of Euclidean distances, a pair kept when closer than half the distance from the full state to
    its nearest other full state."""
    from scipy.optimize import linear_sum_assignment
    from scipy.spatial.distance import cdist

    distances = cdist(full_means, means)
    rows, columns = linear_sum_assignment(distances)
    between = cdist(full_means, full_means)
    np.fill_diagonal(between, np.inf)
    radius = 0.5 * between.min(axis=1)
    return {int(r): int(c) for r, c in zip(rows, columns, strict=True)
            if distances[r, c] < radius[r]}  # fmt: skip
