"""How many seeds a training map needs: the stability curve over a ladder of seed counts.

A map fitted on N runs says nothing by itself about whether N was enough. :func:`stability_curve`
asks what the map would have been with fewer: for each n of a ladder (8, 16, 24, ... runs; per
method in a joint comparison, where n runs are drawn from *each* method) it draws
``n_subsamples`` subsamples of n runs without replacement and refits each
(:func:`~trainmap.dynamics.verdicts.certainty.refit_resample`, the bootstrap's refit: the full fit's
standardisation; by default one fit **at the full map's K**, nothing reselected, so a refit's
states match the full map's one to one and few runs cannot collapse the map to K = 1;
``reselect_k=True``: every K, chosen by the full fit's own rule on the drawn runs split into
training and held-out runs within each method, or on folds of them) and records

* the agreement of the subsample's map with the full map, per state of the full map: the
  subsample's states matched to the full map's by emission means
  (:func:`~trainmap.dynamics.verdicts.certainty.match_by_means`, as the bootstrap matches), and each full
  state's Jaccard index between the checkpoints the full map assigns to it and those the
  subsample's map assigns to its matched state (:func:`~trainmap.dynamics.verdicts.certainty.state_jaccard`;
  Hennig 2007, cluster-wise stability), over the Viterbi decodings of *all* runs (each run in the
  subsample's standard units, z_sub = (z_full - shift) / scale), so the runs left out of the
  subsample count as well; a split or a merge lowers the states it touches, not the others;
* the adjusted Rand index (Hubert & Arabie 1985) between the two decodings of all runs, a
  secondary number (it weights states by their time);
* the selected K (the full map's, unless ``reselect_k``);
* whether each detour of the full map is found again: a state of the subsample's model matched
  to it that is a detour of the subsample's own regression (its runs decoded,
  :func:`~trainmap.dynamics.maps.regression.regress_detours`);
* in a joint comparison, whether each *verdict* of the full map holds again (same direction, still
  significant after Holm): the subsample's drawn runs, decoded by its own model, give each run's
  occupancy of every state matched to a full state, its time in the subsample's own detour states,
  the states it visits and its convergence step (and, with the comparison's path evidence, its
  trajectory and path for the label-free verdicts), and
  :func:`~trainmap.dynamics.verdicts.compare.compare_methods` tests them between the methods as the full
  comparison does. A verdict about a state the subsample's model does not have (no state matched
  to it) does not hold again. Only verdicts that found a difference, about a quantity a
  subsample can recompute, are followed (:func:`followed_verdicts`): "no evidence" at n runs says
  nothing about fewer. A comparison whose every verdict is "not enough runs" has no answer to be
  stable: it is "not stable" whatever its map does.

**Keeping K changes the question.** With the full map's K kept, the curve asks whether n seeds
place the map's K states alike, not whether n seeds would *select* K: on weakly separated states
(tests/unit/dynamics/verdicts/test_stability_montecarlo.py) the kept-K curve calls 8 seeds enough where
fresh sets of 16 seeds, with selection, mostly merge two states; ``reselect_k=True`` answers the
second question (docs/decisions/certainty.md).

What the curve reports, and when a map counts as stable, is
:mod:`trainmap.dynamics.verdicts.stability_results`.

**Why the ladder stops at ``max_fraction`` of the runs (default 0.8).** A subsample is compared
with a map fitted on a superset of its runs. Near n = N the subsample *is* most of the full fit's
data (at n = N it is all of it), so its agreement with the full map is inflated by overlap, not
earned by stability: any procedure looks stable there. The ladder therefore only goes up to
n <= floor(``max_fraction`` x N) per method (``ladder_limit`` in ``stability.json``); an explicit
ladder beyond it is refused (how the limit was checked against fresh seeds:
docs/decisions/certainty.md). With 20 subsamples the share itself is uncertain (16 of 20 has a
90 % Wilson interval of about [0.62, 0.91]): ``stability.json`` gives each n's interval
(``ari_share_interval``), and per state the share of subsamples in which it dissolved
(``state_dissolved``, Jaccard < 0.5).

Subsamples are seeded (``SeedSequence([seed, n, b])``) and run in parallel (joblib, BLAS single
threaded); the result does not depend on ``n_jobs``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.dynamics.maps.hmm.splits import SelectionFailed
from trainmap.dynamics.maps.settings import ANALYSIS_DEFAULTS, StabilitySettings
from trainmap.dynamics.verdicts.certainty import (
    RefitResult,
    refit_detours,
    refit_labels,
    refit_payload,
    refit_resample,
    run_refits,
    runs_by_group,
    state_jaccard,
)
from trainmap.dynamics.verdicts.compare import (
    NO_EVIDENCE,
    NOT_ENOUGH_RUNS,
    PathEvidence,
    censoring_steps,
    compare_methods,
    per_run_quantity,
    run_quantities,
)
from trainmap.dynamics.verdicts.paths import (
    COLLAPSED_PATHS,
    FIRST_PASSAGE,
    TRAJECTORIES,
    TRANSITIONS,
    expected_transitions,
)
from trainmap.dynamics.verdicts.stability_results import (
    DEFAULT_MAX_FRACTION,
    MapStability,
    StabilityCurve,
    StabilityPoint,
    StabilityTargets,
    ladder_limit,
    verdict_key,
)
from trainmap.dynamics.verdicts.timecourse import DYNAMICS, START

#: The ladder's step (seeds per method): the config schema's default of ``analysis.stability_step``.
DEFAULT_STEP: int = ANALYSIS_DEFAULTS["stability_step"]
#: The label-free verdicts a subsample can test again only with the comparison's path evidence
#: (states visited is a per-run quantity of run_quantities, tested without it).
LABEL_FREE = (START, DYNAMICS, TRAJECTORIES, FIRST_PASSAGE, TRANSITIONS, COLLAPSED_PATHS)


def default_ladder(
    n_runs_per_group: int, step: int = DEFAULT_STEP, max_fraction: float = DEFAULT_MAX_FRACTION
) -> list[int]:
    """step, 2 step, ... up to floor(max_fraction x n_runs_per_group); when even ``step`` is beyond
    that limit, the limit alone (if it is at least 2 runs, one to train and one to hold out)."""
    if not isinstance(step, int) or step < 2:
        raise ValueError(f"step: {step!r} is not allowed; it must be an integer >= 2")
    limit = ladder_limit(n_runs_per_group, max_fraction)
    ladder = list(range(step, limit + 1, step))
    if not ladder and limit >= 2:
        ladder = [limit]
    return ladder


def draw_subsample(
    ids_by_group: Mapping[str, Sequence[str]], n: int, holdout: float, rng: np.random.Generator
) -> tuple[list[str], list[str]]:
    """``(train, heldout)``: n runs drawn without replacement from each group (groups and runs in
    sorted order, so the draw depends on the seed only), each group's draw split as the full fit
    splits (:func:`~trainmap.dynamics.maps.hmm.splits.holdout_split`'s rule: round(holdout x n) held out, at
    least one, leaving at least one to train on)."""
    train, heldout = [], []
    n_heldout = min(n - 1, max(1, round(holdout * n)))
    for group in sorted(ids_by_group):
        ids = sorted(ids_by_group[group])
        drawn = [ids[i] for i in rng.choice(len(ids), size=n, replace=False)]
        heldout += drawn[:n_heldout]
        train += drawn[n_heldout:]
    return train, heldout


def stability_curve(
    hmm: TrainingHMM,
    runs: Mapping[str, pd.DataFrame],
    groups: Mapping[str, str] | None,
    convergence: Mapping[str, int | None],
    status: Mapping[str, str],
    detour_states: Sequence[int],
    ladder: Sequence[int] | None = None,
    n_subsamples: int = ANALYSIS_DEFAULTS["stability"],
    targets: StabilityTargets | None = None,
    seed: int = ANALYSIS_DEFAULTS["seed"],
    alpha: float = ANALYSIS_DEFAULTS["alpha"],
    n_jobs: int = 1,
    max_iter: int | None = None,
    max_fraction: float = DEFAULT_MAX_FRACTION,
    warm_start: bool = True,
    verdicts: pd.DataFrame | None = None,
    permutations: int = ANALYSIS_DEFAULTS["permutations"],
    confidence: float = ANALYSIS_DEFAULTS["confidence"],
    paths: PathEvidence | None = None,
    reselect_k: bool = False,
    restarts: int | None = None,
    no_curve: str = "",
) -> StabilityCurve:
    """The stability curve of the fitted map ``hmm`` of ``runs`` (module docstring).

    ``groups`` (run -> method) for a joint comparison, where n counts runs per method; None for
    one group's map. ``detour_states``: the full map's detours; ``ladder``: the seed counts (default
    :func:`default_ladder` of the smallest group); ``max_iter`` caps each warm-started refit's EM
    iterations (default the fit's ``n_iter``), ``warm_start=False`` refits with the full fit's
    restarts (``restarts``: another count) from fresh starts
    (:class:`~trainmap.dynamics.verdicts.certainty.Refit`); ``reselect_k=True``
    refits every K and reselects it instead of keeping the full map's. ``targets``: when an n
    counts as stable (:class:`~trainmap.dynamics.verdicts.stability_results.StabilityTargets`: every state
    at mean Jaccard >= ``targets.jaccard``, detours and verdicts found again in a share >=
    ``targets.share``). ``verdicts``: the joint comparison's
    verdict table (:func:`~trainmap.dynamics.verdicts.compare.compare_methods`, run with
    ``permutations``, ``confidence``, ``alpha``); its verdicts that found a difference are tested
    again on every subsample (module docstring); ``paths``, the comparison's label-free evidence
    (:func:`~trainmap.dynamics.verdicts.compare.path_evidence`), lets its label-free verdicts be tested
    again: each subsample's drawn runs, their trajectories and their paths decoded by the
    subsample's own map. ``no_curve`` (runs without a convergence step): a subsample's comparison
    has no convergence verdict either, as the full one. Raises ValueError for a ladder entry
    that is not an integer >= 2, exceeds the runs available per method or the ladder limit.
    """
    started = time.perf_counter()
    targets = StabilityTargets() if targets is None else targets
    if not isinstance(n_subsamples, int) or n_subsamples < 1:
        raise ValueError(f"n_subsamples: {n_subsamples!r} is not allowed; it must be an integer "
                         ">= 1")  # fmt: skip
    ids_by_group = runs_by_group(list(runs), groups)
    group_sizes = {group: len(ids) for group, ids in ids_by_group.items()}
    full_n = min(group_sizes.values())
    limit = ladder_limit(full_n, max_fraction)
    ladder = default_ladder(full_n, max_fraction=max_fraction) if ladder is None else list(ladder)
    _check_ladder(ladder, full_n, limit, max_fraction, per_method=groups is not None)
    payload = refit_payload(hmm, runs, convergence, status, alpha, seed, max_iter, warm_start,
                            reselect_k, restarts)  # fmt: skip
    followed = followed_verdicts(verdicts, groups)
    payload |= {"ids_by_group": ids_by_group,
                "holdout": hmm.holdout, "groups": groups, "verdicts": followed,
                "with_convergence": not no_curve,
                "paths": paths if any(_label_free(v) for v in followed) else None,
                "counted": paths.after_window() if paths is not None else None,
                "compare": {"n_permutations": permutations, "confidence": confidence,
                            "alpha": alpha, "seed": seed,
                            "censored_at": censoring_steps(runs, convergence, status)}}  # fmt: skip
    tasks = [(n, b) for n in ladder for b in range(n_subsamples)]
    outcomes = dict(zip(tasks, run_refits(_one_subsample, tasks, payload, n_jobs), strict=True))
    points = []
    for n in ladder:
        drawn = [outcomes[(n, b)] for b in range(n_subsamples)]
        found = {int(d): sum(int(d) in r["found_detours"] for r in drawn) / n_subsamples
                 for d in detour_states}  # fmt: skip
        held = {verdict: sum(verdict in r["held_verdicts"] for r in drawn) / n_subsamples
                for verdict in followed}  # fmt: skip
        points.append(StabilityPoint(n, hmm.n_states_, [r["k"] for r in drawn],
                                     [r["ari"] for r in drawn], found, targets.ari, held,
                                     [[round(v, 6) for v in r["jaccard"]] for r in drawn],
                                     targets.jaccard))  # fmt: skip
    return StabilityCurve(
        points=points, targets=targets, full_n=full_n, n_states=hmm.n_states_,
        detour_states=[int(d) for d in detour_states], max_fraction=max_fraction,
        groups=None if groups is None else sorted(ids_by_group), seed=seed,
        seconds=time.perf_counter() - started, group_sizes=group_sizes, verdicts=list(followed),
        unanswered=bool(groups is not None and verdicts is not None and len(verdicts)
                        and (verdicts["verdict"] == NOT_ENOUGH_RUNS).all()),
        reselect_k=reselect_k,
    )  # fmt: skip


def _check_ladder(
    ladder: Sequence[int], full_n: int, limit: int, max_fraction: float, per_method: bool
) -> None:
    per = " per method" if per_method else ""
    if not ladder:
        raise ValueError(f"the ladder is empty: {full_n} runs{per} leave no seed count of at least "
                         f"2 within the ladder limit {limit} (max_fraction {max_fraction:g})")  # fmt: skip
    if len(set(ladder)) != len(ladder):
        raise ValueError(f"ladder: {list(ladder)!r} repeats a seed count")
    for n in ladder:
        if not isinstance(n, int | np.integer) or isinstance(n, bool) or n < 2:
            raise ValueError(f"ladder entry {n!r} is not allowed; it must be an integer >= 2 (one "
                             "run to train on, one to hold out)")  # fmt: skip
        if n > full_n:
            raise ValueError(f"ladder entry {n} is more than the {full_n} runs available{per}")
        if n > limit:
            raise ValueError(
                f"ladder entry {n} is above the ladder limit {limit} = floor({max_fraction:g} x "
                f"{full_n} runs{per}): subsamples that close to the full set agree with the full "
                "map by overlap (raise max_fraction to try it anyway)"
            )


def _one_subsample(task: tuple[int, int], payload: dict[str, Any]) -> dict[str, Any]:
    from sklearn.metrics import adjusted_rand_score

    n, b = task
    rng = np.random.default_rng(np.random.SeedSequence([payload["seed"], n, b]))
    train, heldout = draw_subsample(payload["ids_by_group"], n, payload["holdout"], rng)
    try:
        refit = refit_resample(payload["raw"], dict.fromkeys(train, 1.0),
                               dict.fromkeys(heldout, 1.0), payload["refit"])  # fmt: skip
    except SelectionFailed:
        return {"k": -1, "ari": math.nan, "found_detours": [], "held_verdicts": [],
                "jaccard": [0.0] * payload["n_states"]}  # fmt: skip
    labels = refit_labels(refit, payload)
    # Every run decoded once, in the full fit's units re-expressed in the subsample's; the drawn
    # runs' decodings serve its detour regression and its verdicts too.
    decoded = {run: labels[run] for run in set(refit.drawn)}
    found = refit_detours(refit, payload, decoded)
    detours, matched = found.detour_states, found.matched
    pooled = np.concatenate(list(labels.values()))
    return {"k": int(refit.selection.n_states),
            "ari": float(adjusted_rand_score(payload["full_labels"], pooled)),
            "jaccard": state_jaccard(payload["full_labels"], pooled, matched, payload["n_states"]),
            "found_detours": [full for full, state in matched.items() if state in detours],
            "held_verdicts": _held_verdicts(refit, decoded, detours, matched, payload)}  # fmt: skip


def _label_free(verdict: str) -> bool:
    """Whether a followed verdict (its :func:`verdict_key`) is one of the label-free verdicts
    that need the comparison's path evidence to be tested again."""
    return any(quantity in verdict for quantity in LABEL_FREE)


def recomputable(quantity: str) -> bool:
    """Whether a subsample can test a verdict about ``quantity`` again: the per-run quantities
    of :func:`~trainmap.dynamics.verdicts.compare.run_quantities` (occupancy of a state, states visited,
    time in detour states, convergence step) and the label-free verdicts (:data:`LABEL_FREE`,
    with the comparison's path evidence; without it they are followed and never hold)."""
    return per_run_quantity(quantity) or quantity in LABEL_FREE


def followed_verdicts(verdicts: pd.DataFrame | None, groups: Mapping[str, str] | None) -> list[str]:
    """The verdicts of a joint comparison the curve tests again: those that found a difference,
    about a quantity a subsample can recompute (:func:`recomputable`; any other row is skipped)."""
    if verdicts is None or groups is None or verdicts.empty:
        return []
    found = verdicts[~verdicts["verdict"].isin([NOT_ENOUGH_RUNS, NO_EVIDENCE])]
    return [verdict_key(row) for _, row in found.iterrows() if recomputable(row["quantity"])]


def _held_verdicts(
    refit: RefitResult, decoded: Mapping[str, np.ndarray], detours: Sequence[int],
    matched: Mapping[int, int], payload: dict[str, Any],
) -> list[str]:  # fmt: skip
    """The full map's verdicts that hold again on one subsample (module docstring): its drawn
    runs' ``decoded`` states."""
    if not payload["verdicts"]:
        return []
    drawn = sorted(decoded)
    quantities = run_quantities(decoded, refit.selection.n_states, payload["convergence"],
                                payload["status"], detours, payload.get("counted"),
                                payload.get("with_convergence", True))  # fmt: skip
    full_state = {state: full for full, state in matched.items()}
    renamed = {f"occupancy of state {state}": f"occupancy of state {full_state[state]}"
               for state in range(refit.selection.n_states) if state in full_state}  # fmt: skip
    quantities = quantities[
        [c for c in quantities if not c.startswith("occupancy") or c in renamed]
    ]
    quantities = quantities.rename(columns=renamed)
    groups = payload["groups"]
    order = list(dict.fromkeys(groups[run] for run in groups))
    ordered = {run: groups[run] for group in order for run in drawn if groups[run] == group}
    evidence = None
    full = payload.get("paths")
    if full is not None:
        kept = [run for run in ordered if run in full.states]
        counts = expected_transitions(refit.selection.model, [refit.z[r] for r in kept])
        evidence = full.subset(
            kept, decoded, refit.selection.n_states, dict(zip(kept, counts, strict=True))
        )
    table = compare_methods(quantities.loc[list(ordered)], ordered, **payload["compare"],
                            paths=evidence)  # fmt: skip
    held = {verdict_key(row) for _, row in table.iterrows()}
    return [verdict for verdict in payload["verdicts"] if verdict in held]


def map_stability(
    hmm: TrainingHMM, runs: Mapping[str, pd.DataFrame], groups: Mapping[str, str] | None,
    convergence: Mapping[str, int | None], status: Mapping[str, str],
    detour_states: Sequence[int], settings: StabilitySettings, n_jobs: int = 1,
    verdicts: pd.DataFrame | None = None, paths: PathEvidence | None = None, no_curve: str = "",
) -> MapStability:  # fmt: skip
    """The stability curve of a fitted map with the analysis settings' stability view
    (:attr:`~trainmap.dynamics.maps.settings.AnalysisSettings.stability_settings`: ``subsamples``
    per n, 0: none; the ladder's ``step`` and ``max_fraction``, the targets ``ari`` (the secondary
    ARI's) and ``share``); ``verdicts``, a joint comparison's verdict table, to test its verdicts
    again. Its refits keep the full map's K and start afresh (``warm_start=False``), with
    ``restarts`` seeded restarts each: a warm start at K would carry the full map's states into
    every subsample, and the curve asks what n fresh seeds would find."""
    if not settings.subsamples:
        return MapStability(None, "analysis.stability is 0")
    sizes = pd.Series(list(groups.values())).value_counts() if groups else pd.Series([len(runs)])
    ladder = default_ladder(int(sizes.min()), settings.step, settings.max_fraction)
    if not ladder:
        per = " per method" if groups else ""
        return MapStability(None, f"{int(sizes.min())} runs{per} leave no seed count to try (a "
                                  f"subsample needs >= 2 runs{per} and at most "
                                  f"{settings.max_fraction:g} of them)")  # fmt: skip
    targets = StabilityTargets(settings.ari, settings.share)
    curve = stability_curve(
        hmm, runs, groups, convergence, status, detour_states, ladder=ladder,
        n_subsamples=settings.subsamples, targets=targets, seed=settings.seed,
        alpha=settings.alpha, n_jobs=n_jobs, max_iter=settings.max_iter,
        max_fraction=settings.max_fraction, verdicts=verdicts,
        permutations=settings.permutations, confidence=settings.confidence, paths=paths,
        warm_start=False, restarts=settings.restarts, no_curve=no_curve,
    )  # fmt: skip
    return MapStability(curve)
