"""How sure a training map is: the bootstrap over runs, and the refits the stability curve reuses.

None of the anchor papers states its uncertainty. A training map rests on a sample of seeds, so
trainmap asks what another draw of seeds would have said:

**Bootstrap over runs** (:func:`bootstrap_map`; Efron & Tibshirani 1993, ch. 6). Each resample
draws runs with replacement *within each method* of a joint comparison (strata: the full fit's
``strata_``, run -> group; one stratum for one method's map), so every method keeps its number of
runs (:func:`draw_within_groups`). It re-standardises (pooled statistics of the drawn runs) and
refits the map **at the full map's K**: one EM fit of every drawn run, each weighted by how often
it was drawn (:func:`refit_resample` through :func:`~trainmap.dynamics.maps.hmm.selection.select_model`
with ``fixed=True``), started from the full fit's model at K (its parameters re-expressed in the
resample's standard units) and capped at ``max_iter`` EM iterations (a k-step bootstrap, Andrews
2002; why the cap: docs/decisions/certainty.md). Nothing is reselected: a resample's states match
the full map's one to one, and a resample cannot collapse to K = 1 (reselecting under the
``reproducible`` rule, 13-16 runs per half, did in 200 of 200 resamples of one study).
``reselect_k=True`` keeps the older path as an option: each resample draws a fresh split of the
run ids into training and held-out runs (within each method, in the full fit's sizes), draws runs
with replacement within each part, refits every K = 1..K_max and selects K by the full fit's own
rule (:func:`~trainmap.dynamics.maps.hmm.selection.select_model`; a full fit scored on folds has no
held-out runs, so its resamples draw all runs and score K on folds of the runs drawn).

Reported, per state of the full map, its **cluster-wise stability** (Hennig 2007, "Cluster-wise
assessment of cluster stability", CSDA 52): the refit's states are matched to the full map's by
emission means (:func:`match_by_means`: Hungarian matching, a pair kept when closer than half the
distance to the nearest other state of the full map; the stability curve matches the same way),
and the state's agreement in that refit is the Jaccard index between the checkpoints the full map
assigns to it and those the refit assigns to its matched state, over the decodings of every run
(:func:`state_jaccard`). A refit that splits or merges one state lowers that state's index only.
A state *reproduces* when its mean Jaccard over the refits reaches 0.75
(:data:`~trainmap.dynamics.verdicts.stability_results.STATE_JACCARD`; Hennig's rule of thumb: a mean
<= 0.5 means the cluster dissolved, >= 0.75 that it is stable). Also reported: how often each
state is matched at all (``state_found``); per detour state how often that state is found again
*as a detour* (the drawn runs decoded and regressed); per resample its regression's R^2, its
number of detours and eq. 1's dissimilarity (both ground metrics), so that two maps' numbers can be
compared with intervals; the K of each resample (informative only with ``reselect_k``). Resamples
are seeded (``SeedSequence([seed, b])``) and run in parallel; the result does not depend on
``n_jobs``.

The permutation tests between methods that share one map, and their verdict table, are
:mod:`trainmap.dynamics.verdicts.compare`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM, standardise_runs, unit_change
from trainmap.dynamics.maps.hmm.factory import EMSettings, in_units, model_parameters
from trainmap.dynamics.maps.hmm.selection import ModelSelection, select_model
from trainmap.dynamics.maps.hmm.splits import SelectionFailed
from trainmap.dynamics.maps.regression import (
    GROUND_METRICS,
    regress_detours,
    state_distribution,
    trajectory_dissimilarity,
)
from trainmap.dynamics.maps.settings import ANALYSIS_DEFAULTS
from trainmap.dynamics.verdicts.stability_results import (
    STATE_JACCARD,
    dissolved_shares,
    mean_jaccard,
    reproduced_states,
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
    """What the resamples say about the full map (module docstring). ``jaccards``: per resample,
    per state of the full map, its Jaccard agreement (:func:`state_jaccard`; 0 where the refit
    failed); ``state_jaccard`` their mean per state."""

    n_resamples: int
    n_states: int
    k_counts: dict[int, int]
    state_found: list[float]  # per full state: share of resamples with a state matched to it
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
    # per state of the full map, its mean Jaccard agreement over the resamples (state_jaccard)
    state_jaccard: list[float] = field(default_factory=list)
    jaccards: list[list[float]] = field(default_factory=list)
    reselect_k: bool = False  # whether the resamples reselected K (else: the full map's K)

    @property
    def k_same(self) -> float:
        """Fraction of resamples that select the full map's K (1 without ``reselect_k`` unless a
        refit failed)."""
        return self.k_counts.get(self.n_states, 0) / max(self.n_resamples, 1)

    def states_reproduced(self, threshold: float = STATE_JACCARD) -> list[int]:
        """The full map's states whose mean Jaccard over the resamples reaches ``threshold``
        (Hennig 2007: >= 0.75 stable, <= 0.5 dissolved)."""
        return reproduced_states(self.state_jaccard, threshold)

    @property
    def state_dissolved(self) -> list[float]:
        """Per state of the full map, the share of resamples in which it dissolved (Jaccard
        < 0.5, Hennig's dissolution point); empty without per-resample values."""
        return dissolved_shares(self.jaccards)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        summary = asdict(self)
        summary["k_counts"] = {str(k): v for k, v in sorted(self.k_counts.items())}
        summary["detour_found"] = {str(k): v for k, v in self.detour_found.items()}
        summary["k_same"] = self.k_same
        summary["states_reproduced"] = self.states_reproduced()
        summary["state_dissolved"] = self.state_dissolved
        return summary

    @classmethod
    def from_dict(cls, summary: Mapping[str, Any]) -> BootstrapResult:
        """The result :meth:`to_dict` describes (``seconds`` NaN when the times are not there; a
        file written before refits kept K reads as ``reselect_k``, without per-state values)."""
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
            state_jaccard=list(summary.get("state_jaccard", [])),
            jaccards=[list(v) for v in summary.get("jaccards", [])],
            reselect_k=bool(summary.get("reselect_k", True)),
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
    n_resamples: int = ANALYSIS_DEFAULTS["bootstrap"],
    alpha: float = ANALYSIS_DEFAULTS["alpha"],
    seed: int = ANALYSIS_DEFAULTS["seed"],
    n_jobs: int = 1,
    max_iter: int | None = None,
    warm_start: bool = True,
    reselect_k: bool = False,
) -> BootstrapResult:
    """Refit the map on ``n_resamples`` bootstrap resamples of the runs (module docstring).

    ``hmm`` is the fitted full map (with ``models_`` for every K; ``strata_``, run -> method, for
    a joint map: runs are drawn within each method); ``detour_states`` its detours; ``max_iter``
    caps the EM iterations of each warm-started refit (default: the fit's ``n_iter``).
    ``warm_start=False`` refits every resample from fresh seeded starts with the full fit's
    restarts: slower, for checking what the warm starts change. ``reselect_k=True`` refits every
    K and reselects K by the full fit's rule instead of keeping the full map's K.
    """
    started = time.perf_counter()
    payload = refit_payload(hmm, runs, convergence, status, alpha, seed, max_iter, warm_start,
                            reselect_k)  # fmt: skip
    payload["heldout"] = sorted(hmm.heldout_runs_)
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
    jaccards = [[round(value, 6) for value in o["jaccard"]] for o in outcomes]
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
        state_jaccard=mean_jaccard(jaccards),
        jaccards=jaccards,
        reselect_k=reselect_k,
    )  # fmt: skip


@dataclass
class Refit:
    """How a resample is refitted: the full fit's standardisation, EM settings and selection, and
    (warm starts) its model of every K refitted. Plain values and arrays: it travels to worker
    processes."""

    standardisation: dict[str, Any]  # the full fit's statistics (TrainingHMM.standardisation_)
    settings: EMSettings  # EM settings (TrainingHMM.settings(), n_iter capped for warm starts)
    ks: list[int]
    restarts: int
    restart_rule: str
    starts: dict[int, dict[str, np.ndarray]] | None  # K -> the full fit's parameters, or None
    selection: str  # the full fit's selection rule (TrainingHMM.selection)
    folds: int  # the full fit's folds (TrainingHMM.folds)
    # the reproducible rule's settings (TrainingHMM.reproducibility()), the runs' groups (run ->
    # group: runs are drawn, and halves split, per group) and, warm-started, the full fit's half
    # maps (split -> K -> parameters): each half of a refit continues from the full fit's half
    reproducibility: dict[str, Any] = field(default_factory=dict)
    strata: dict[str, str] | None = None
    half_starts: dict[int, dict[int, dict[str, np.ndarray]]] | None = None
    # reselect K by the full fit's rule; False: one fit at the full map's K, nothing scored
    reselect_k: bool = False

    @classmethod
    def of(cls, hmm: TrainingHMM, max_iter: int | None = None, warm_start: bool = True,
           reselect_k: bool = False, restarts: int | None = None) -> Refit:  # fmt: skip
        """The refit of ``hmm``'s resamples. By default only the full map's K is refitted, once,
        on every drawn run (nothing reselected, so a refit's states match the full map's one to
        one and a resample of few runs cannot collapse to K = 1), warm-started from the full
        map's model for at most ``max_iter`` EM iterations, or (``warm_start=False``) with
        ``restarts`` fresh seeded starts (default: the full fit's restarts). ``reselect_k=True``:
        every K is refitted (warm-started from the full fit's model of that K, or fresh) and K
        chosen by the full fit's rule."""
        rule = {"selection": hmm.selection, "folds": hmm.folds,
                "reproducibility": hmm.reproducibility(),
                "strata": getattr(hmm, "strata_", None)}  # fmt: skip
        capped = {"n_iter": max_iter} if max_iter and warm_start else {}
        em = dataclasses.replace(hmm.settings(), **capped)
        if not reselect_k:
            k = hmm.n_states_
            starts = {k: model_parameters(hmm.model_)} if warm_start else None
            return cls(hmm.standardisation_, em, [k],
                       1 if warm_start else restarts or hmm.restarts, hmm.restart_rule, starts,
                       **rule)  # fmt: skip
        if not warm_start:
            return cls(hmm.standardisation_, hmm.settings(), list(range(1, hmm.k_max + 1)),
                       hmm.restarts, hmm.restart_rule, None, **rule, reselect_k=True)  # fmt: skip
        starts = {k: model_parameters(model) for k, model in hmm.models_.items()}
        halves = {split: {k: model_parameters(model) for k, model in models.items()}
                  for split, models in getattr(hmm, "half_models_", {}).items()}  # fmt: skip
        ks = sorted(set(starts).intersection(*halves.values()) if halves else starts)
        return cls(hmm.standardisation_, em, ks, 1, hmm.restart_rule, starts,
                   **rule, half_starts=halves or None, reselect_k=True)  # fmt: skip


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
    """Refit a resample of the runs as the full fit fits its model: standardise
    (:func:`~trainmap.dynamics.maps.hmm.estimator.standardise_runs`, pooled over the runs as drawn),
    then (``refit.reselect_k`` False) fit the full map's K once on every run of ``train`` and
    ``heldout`` together, nothing scored, or (True) fit every K and choose K
    (:func:`~trainmap.dynamics.maps.hmm.selection.select_model`, with the full fit's selection rule:
    ``holdout`` scores on ``heldout``; ``folds`` pools both parts and scores on folds of the
    drawn runs), each run (run -> times drawn) weighted by how often it was drawn. Raises
    :class:`~trainmap.dynamics.maps.hmm.splits.SelectionFailed` when no K fits."""
    drawn = [run for part in (train, heldout) for run, count in part.items()
             for _ in range(int(count))]  # fmt: skip
    full = refit.standardisation
    fallback = np.asarray(full["std"]) if full["kind"] == "pooled" else None
    z, statistics = standardise_runs({run: raw[run] for run in set(drawn)}, full["kind"],
                                     pooled_over=drawn, fallback_std=fallback)  # fmt: skip
    shift, scale = unit_change(full, statistics)
    starts, half_starts = None, None
    covariance_type = refit.settings.covariance_type
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
        half_starts=half_starts, cap_halves=True, fixed=not refit.reselect_k,
    )  # fmt: skip
    return RefitResult(selection, drawn, z, shift, scale)


def refit_payload(
    hmm: TrainingHMM, runs: Mapping[str, pd.DataFrame], convergence: Mapping[str, int | None],
    status: Mapping[str, str], alpha: float, seed: int, max_iter: int | None, warm_start: bool,
    reselect_k: bool = False, restarts: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """What every refit of ``hmm``'s runs needs (the bootstrap's and the stability curve's): the
    runs' raw features, how to refit (:class:`Refit`), the outcomes the detour regression reads
    and the full map's emission means the refit's states are matched to. Plain values: it travels
    to worker processes."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):  # the full map's decoding, as the refits decode
        z_full = {run: hmm.transform(runs[run]) for run in sorted(runs)}
        full_labels = np.concatenate(hmm.model_.predict_runs(list(z_full.values())))
    return {
        "raw": {run: table[hmm.features_].to_numpy(dtype=float) for run, table in runs.items()},
        "refit": Refit.of(hmm, max_iter, warm_start, reselect_k, restarts),
        "convergence": dict(convergence),
        "status": dict(status),
        "alpha": alpha,
        "seed": seed,
        "full_means": hmm.model_.means_,
        "z_full": z_full,
        "full_labels": full_labels,
        "n_states": hmm.n_states_,
    }


def refit_labels(refit: RefitResult, payload: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every run of the full map decoded by a refit's model (the full fit's units re-expressed
    in the refit's), run -> states."""
    model = refit.selection.model
    in_units = [(z - refit.shift) / refit.scale for z in payload["z_full"].values()]
    return dict(zip(payload["z_full"], model.predict_runs(in_units), strict=True))


def state_jaccard(
    full_labels: np.ndarray, labels: np.ndarray, matched: Mapping[int, int], n_states: int
) -> list[float]:
    """Per state s of the full map, the Jaccard index |A ∩ B| / |A ∪ B| of the checkpoints the
    full map puts in s (A, over every run) and those a refit puts in its state matched to s (B;
    0 when no refit state is matched to s): Hennig's (2007) cluster-wise stability. A refit that
    splits or merges one state lowers that state's index, not the others'."""
    values = []
    for state in range(n_states):
        inside = full_labels == state
        if state not in matched:
            values.append(0.0)
            continue
        other = labels == matched[state]
        union = int((inside | other).sum())
        values.append(float((inside & other).sum() / union) if union else 0.0)
    return values


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
    regressed: :func:`~trainmap.dynamics.maps.regression.regress_detours`), its states matched to the
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


def runs_by_group(run_ids: Sequence[str], groups: Mapping[str, str] | None) -> dict[str, list[str]]:
    """Group -> its runs, both sorted (so draws depend on the seed only); ``groups`` None: one
    group ``"all"``. Raises ValueError for a run without a group."""
    if groups is None:
        return {"all": sorted(run_ids)}
    missing = sorted(set(run_ids) - set(groups))
    if missing:
        raise ValueError(f"groups: runs {missing[:3]} have no group")
    by_group: dict[str, list[str]] = {}
    for run in sorted(run_ids):
        by_group.setdefault(groups[run], []).append(run)
    return dict(sorted(by_group.items()))


def draw_within_groups(
    ids_by_group: Mapping[str, Sequence[str]], rng: np.random.Generator
) -> dict[str, float]:
    """A stratified bootstrap draw: each group's runs drawn with replacement, as many as the group
    has (so every method of a joint comparison keeps its number of runs); run -> times drawn."""
    counts: dict[str, float] = {}
    for group in sorted(ids_by_group):
        members = sorted(ids_by_group[group])
        counts |= draw_counts(members, len(members), rng)
    return counts


def split_within_groups(
    ids_by_group: Mapping[str, Sequence[str]], heldout: Sequence[str], rng: np.random.Generator
) -> tuple[dict[str, float], dict[str, float]]:
    """A reselecting resample's draw: within each group a fresh split of its runs into training
    and held-out runs (as many held out as the full fit held out of that group), then each part
    drawn with replacement at its size; (training runs, held-out runs), run -> times drawn."""
    held = set(heldout)
    train_counts: dict[str, float] = {}
    heldout_counts: dict[str, float] = {}
    for group in sorted(ids_by_group):
        members = sorted(ids_by_group[group])
        train, held_out = split_runs(members, sum(run in held for run in members), rng)
        train_counts |= draw_counts(train, len(train), rng)
        heldout_counts |= draw_counts(held_out, len(held_out), rng)
    return train_counts, heldout_counts


def _one_resample(b: int, payload: dict[str, Any]) -> dict[str, Any]:
    rng = np.random.default_rng(np.random.SeedSequence([payload["seed"], b]))
    refit_settings: Refit = payload["refit"]
    ids_by_group = runs_by_group(list(payload["raw"]), refit_settings.strata)
    if refit_settings.reselect_k:
        train_counts, heldout_counts = split_within_groups(ids_by_group, payload["heldout"], rng)
    else:  # nothing is scored: every run drawn, within each method
        train_counts, heldout_counts = draw_within_groups(ids_by_group, rng), {}
    try:
        refit = refit_resample(payload["raw"], train_counts, heldout_counts, refit_settings)
    except SelectionFailed:
        return {"k": -1, "matched": {}, "detours": [], "jaccard": [0.0] * payload["n_states"]}
    labels = refit_labels(refit, payload)
    found = refit_detours(refit, payload, {run: labels[run] for run in set(refit.drawn)})
    jaccard = state_jaccard(payload["full_labels"], np.concatenate(list(labels.values())),
                            found.matched, payload["n_states"])  # fmt: skip
    return {"k": int(refit.selection.n_states), "detours": found.detour_states,
            "matched": found.matched, "r2": found.r2, "dissimilarity": found.dissimilarity,
            "jaccard": jaccard}  # fmt: skip


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
