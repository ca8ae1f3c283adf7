"""How many seeds a training map needs: the stability curve over a ladder of seed counts.

A map fitted on N runs says nothing by itself about whether N was enough. :func:`stability_curve`
asks what the map would have been with fewer: for each n of a ladder (8, 16, 24, ... runs; per
method in a joint comparison, where n runs are drawn from *each* method) it draws
``n_subsamples`` subsamples of n runs without replacement, refits each through the full fit's own
selection path (:func:`~trainmap.dynamics.certainty.refit_resample`: the full fit's
standardisation, every K, K chosen by held-out BIC; each drawn run counted once, split into
training and held-out runs in the full fit's held-out fraction, within each method, or, under
``selection: folds``, scored on folds of the drawn runs; warm-started from the full fit's model of
every K, as the bootstrap refits) and records

* the selected K;
* the agreement of the subsample's map with the full map, label-free: the adjusted Rand index
  (Hubert & Arabie 1985) between the subsample model's and the full model's Viterbi decodings of
  *all* runs (each run in the subsample's standard units, z_sub = (z_full - shift) / scale), so
  state numbers do not matter and the runs left out of the subsample count as well;
* whether each detour of the full map is found again: a state of the subsample's model with
  nearly the same emission mean (:func:`~trainmap.dynamics.certainty.match_by_means`, as the
  bootstrap matches) that is a detour of the subsample's own regression (its runs decoded,
  :func:`~trainmap.dynamics.regression.regress_detours`);
* in a joint comparison, whether each *verdict* of the full map holds again (same direction, still
  significant after Holm): the subsample's drawn runs, decoded by its own model, give each run's
  occupancy of every state matched to a full state, its time in the subsample's own detour states
  and its convergence step, and :func:`~trainmap.dynamics.verdicts.compare_methods` tests them
  between the methods as the full comparison does. A verdict about a state the subsample's model
  does not have (no state matched to it) does not hold again. Only verdicts that found a
  difference are followed: "no evidence" at n runs says nothing about fewer. A comparison whose
  every verdict is "not enough runs" has no answer to be stable: it is "not stable" whatever its
  map does.

Targets (:class:`StabilityTargets`) are settings: by default the map is stable at n when >= 90 %
of its subsamples reach ARI >= 0.9 with the full map and every detour of the full map is found
again in >= 90 % of them and (joint comparisons) every verdict of the full map holds again in
>= 90 % of them (optionally also: K reproduced in >= 90 %). The curve is "stable from
n = n*" when n* and every larger n of the ladder meet the targets (a single lucky n below an
unstable one does not count), otherwise "not stable at n = n_max" (the largest n tried). A map of
one state (K = 1 selected) is never called stable on its own: its states cannot disagree, so every
subsample "agrees"; its line says the map has one state, and only the verdicts it follows can be
stable from some n.

**Why the ladder stops at ``max_fraction`` of the runs (default 0.8).** A subsample is compared
with a map fitted on a superset of its runs. Near n = N the subsample *is* most of the full fit's
data (at n = N it is all of it), so its agreement with the full map is inflated by overlap, not
earned by stability: any procedure looks stable there. The ladder therefore only goes up to
n <= floor(``max_fraction`` x N) per method (``ladder_limit`` in ``stability.json``); an explicit
ladder beyond it is refused. Checked against a direct Monte Carlo over *fresh* seeds of a known
HMM (tests/test_stability_montecarlo.py, bench/stability_validation.py: 3 weakly separated states,
N = 40, 30 fresh sets and 20 subsamples per n): the overlap inflates agreement only at n = N (share
1.0 against 0.97 for fresh sets of 40); at n <= 0.8 N the subsample curve is no more optimistic
than fresh seeds (share 0.10/0.30/0.70/0.80 at n = 8/16/24/32 against 0.17/0.43/0.87/0.90), and
the seed count it calls sufficient is within one ladder step (a factor 1.25) of the Monte Carlo's,
on the cautious side. With 20 subsamples the share itself is uncertain (16 of 20 has a 90 % Wilson
interval of about [0.62, 0.91]): ``stability.json`` gives each n's interval (``ari_share_interval``).

Subsamples are seeded (``SeedSequence([seed, n, b])``) and run in parallel (joblib, BLAS single
threaded); the result does not depend on ``n_jobs``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from trainmap.dynamics.certainty import (
    RefitResult,
    refit_detours,
    refit_payload,
    refit_resample,
    run_refits,
)
from trainmap.dynamics.hmm.estimator import TrainingHMM
from trainmap.dynamics.hmm.splits import SelectionFailed
from trainmap.dynamics.verdicts import (
    NO_EVIDENCE,
    NOT_ENOUGH_RUNS,
    censoring_steps,
    compare_methods,
    run_quantities,
)

DEFAULT_STEP = 8
DEFAULT_MAX_FRACTION = 0.8


@dataclass(frozen=True)
class StabilityTargets:
    """When a map counts as stable at n: a share ``share`` of its subsamples agree with the full map
    at ARI >= ``ari``, every detour of the full map is found again in a share >= ``share``, and
    (``require_k``) the full map's K is selected in a share >= ``share``."""

    ari: float = 0.9
    share: float = 0.9
    require_k: bool = False

    def __post_init__(self) -> None:
        for name in ("ari", "share"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value <= 1):
                raise ValueError(f"stability target {name}: {value!r} is not allowed; it must be "
                                 "in (0, 1]")  # fmt: skip


@dataclass
class StabilityPoint:
    """The subsamples of one n (runs per method): their K, their agreement with the full map (ARI,
    NaN where the refit failed) and how often each full detour is found again."""

    n: int
    n_states: int  # the full map's K
    ks: list[int]  # per subsample (-1: the refit failed)
    ari: list[float]  # per subsample (NaN: the refit failed)
    detour_found: dict[int, float]  # full detour state -> share of subsamples finding it again
    ari_target: float = 0.9
    verdict_held: dict[str, float] = field(default_factory=dict)  # verdict -> share holding again

    @property
    def n_subsamples(self) -> int:
        """How many subsamples were drawn at this n."""
        return len(self.ks)

    @property
    def failed(self) -> int:
        """Subsamples whose refit failed (no K could be fitted); they count as disagreeing."""
        return sum(k < 0 for k in self.ks)

    @property
    def k_counts(self) -> dict[int, int]:
        """Selected K -> number of subsamples (failed refits left out)."""
        return {k: self.ks.count(k) for k in sorted(set(self.ks)) if k >= 0}

    @property
    def k_same(self) -> float:
        """Share of subsamples that select the full map's K."""
        return self.ks.count(self.n_states) / max(self.n_subsamples, 1)

    @property
    def ari_mean(self) -> float:
        """Mean ARI over the subsamples that could be refitted (NaN when none could)."""
        finite = np.asarray(self.ari, float)[np.isfinite(self.ari)]
        return float(finite.mean()) if len(finite) else math.nan

    @property
    def ari_p10(self) -> float:
        """10th percentile of the ARI, a failed refit counting as ARI = 0 (agreement of chance)."""
        values = np.nan_to_num(np.asarray(self.ari, float), nan=0.0)
        return float(np.percentile(values, 10)) if len(values) else math.nan

    @property
    def ari_reached(self) -> int:
        """Subsamples with ARI >= the target (a failed refit never is)."""
        values = np.nan_to_num(np.asarray(self.ari, float), nan=-1.0)
        return int((values >= self.ari_target).sum())

    @property
    def ari_share(self) -> float:
        """Share of subsamples with ARI >= the target."""
        return self.ari_reached / self.n_subsamples if self.n_subsamples else math.nan

    @property
    def ari_share_interval(self) -> list[float]:
        """The 90 % Wilson interval of :attr:`ari_share` over the subsamples (sampling noise)."""
        from statsmodels.stats.proportion import proportion_confint

        low, high = proportion_confint(self.ari_reached, max(self.n_subsamples, 1), 0.1, "wilson")
        return [float(low), float(high)]

    def meets(self, targets: StabilityTargets) -> bool:
        """Whether this n meets ``targets`` (module docstring)."""
        ok = self.ari_share >= targets.share
        ok &= all(share >= targets.share for share in self.detour_found.values())
        ok &= all(share >= targets.share for share in self.verdict_held.values())
        if targets.require_k:
            ok &= self.k_same >= targets.share
        return bool(ok)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN as null)."""
        return {
            "n": self.n,
            "n_subsamples": self.n_subsamples,
            "failed": self.failed,
            "k_counts": {str(k): v for k, v in self.k_counts.items()},
            "k_same": self.k_same,
            "ks": list(self.ks),
            "ari": [_finite_or_none(a) for a in self.ari],
            "ari_mean": _finite_or_none(self.ari_mean),
            "ari_p10": _finite_or_none(self.ari_p10),
            "ari_share": _finite_or_none(self.ari_share),
            "ari_share_interval": self.ari_share_interval,
            "detour_found": {str(d): v for d, v in self.detour_found.items()},
            "verdict_held": dict(self.verdict_held),
        }


@dataclass
class StabilityCurve:
    """The stability curve of one map (``groups`` None) or one joint comparison (``groups``: the
    methods, n counted per method); ``stability.json`` is :meth:`to_dict`."""

    points: list[StabilityPoint]
    targets: StabilityTargets
    full_n: int  # runs per method available (the smallest method's, in a joint comparison)
    n_states: int
    detour_states: list[int]
    max_fraction: float = DEFAULT_MAX_FRACTION
    groups: list[str] | None = None
    seed: int = 0
    seconds: float = math.nan
    group_sizes: dict[str, int] = field(default_factory=dict)
    verdicts: list[str] = field(default_factory=list)  # the full map's verdicts followed
    # a joint comparison whose every verdict is "not enough runs": no answer to be stable
    unanswered: bool = False

    @property
    def ladder(self) -> list[int]:
        """The seed counts tried."""
        return [point.n for point in self.points]

    @property
    def ladder_limit(self) -> int:
        """The largest n the ladder may reach: floor(max_fraction x full_n) (module docstring)."""
        return ladder_limit(self.full_n, self.max_fraction)

    @property
    def one_state(self) -> bool:
        """Whether the full map has one state (K = 1 selected): every map of one state agrees with
        it, so the map's own stability says nothing; only followed verdicts can be stable."""
        return self.n_states == 1

    @property
    def sufficient_n(self) -> int | None:
        """The smallest n of the ladder from which on every n meets the targets, or None (also
        when the comparison gives no answer at all: every verdict "not enough runs"). For a map of
        one state (:attr:`one_state`) only the followed verdicts count, and without any it is
        None: the map's agreement is no evidence of enough seeds."""
        if self.unanswered:
            return None
        if self.one_state:
            if not self.verdicts:
                return None
            share = self.targets.share
            return self._stable_from(
                lambda point: all(point.verdict_held.get(v, 0.0) >= share for v in self.verdicts)
            )
        return self._stable_from(lambda point: point.meets(self.targets))

    def _stable_from(self, holds: Any) -> int | None:
        """The smallest n of the ladder from which on ``holds(point)`` is true at every n."""
        found = None
        for point in sorted(self.points, key=lambda p: p.n, reverse=True):
            if not holds(point):
                break
            found = point.n
        return found

    def verdict_sufficient_n(self) -> dict[str, int | None]:
        """Per followed verdict: the smallest n of the ladder from which on it holds again in a
        share >= the target at every n (None: not at the largest n). A verdict can be stable where
        the map is not (the convergence step does not depend on the states)."""
        share = self.targets.share
        return {verdict: self._stable_from(lambda p, v=verdict: p.verdict_held.get(v, 0.0) >= share)
                for verdict in self.verdicts}  # fmt: skip

    @property
    def unit(self) -> str:
        """What n counts: seeds, or seeds per method in a joint comparison."""
        return "seeds per method" if self.groups else "seeds"

    def verdict_evidence(self) -> dict[str, tuple[int | None, int, float]]:
        """Per followed verdict: the n from which it holds again (:meth:`verdict_sufficient_n`),
        the largest n of the ladder and the share of its subsamples in which the verdict holds
        again; empty without points."""
        if not self.points:
            return {}
        largest = max(self.points, key=lambda p: p.n)
        return {verdict: (n, largest.n, largest.verdict_held.get(verdict, 0.0))
                for verdict, n in self.verdict_sufficient_n().items()}  # fmt: skip

    def verdict_lines(self) -> list[str]:
        """One line per followed verdict: from which n it holds again, or where it does not."""
        return [f"{verdict}: holds again from n = {n} {self.unit}" if n is not None else
                f"{verdict}: not at n = {largest} {self.unit} (holds again in {share:.0%})"
                for verdict, (n, largest, share) in self.verdict_evidence().items()]  # fmt: skip

    def line(self) -> str:
        """One sentence: 'stable from n = ... seeds (per method)' or 'not stable at n = ...'; for a
        map of one state, that the map's stability is not informative (and its verdicts')."""
        unit = self.unit
        criterion = f"ARI >= {self.targets.ari:g} with the full map"
        if self.detour_states:
            criterion += ", detours found again"
        if self.verdicts:
            criterion += ", verdicts held again"
        if self.targets.require_k:
            criterion += f", K = {self.n_states} selected"
        of = (f"{len(self.points[0].ks) if self.points else 0} subsamples per n, ladder up to "
              f"{self.ladder_limit} of {self.full_n} runs{' per method' * bool(self.groups)}")  # fmt: skip
        sufficient = self.sufficient_n
        if self.one_state:
            return self._one_state_line(unit, of)
        if sufficient is not None:
            return (f"stable from n = {sufficient} {unit} ({criterion} in >= "
                    f"{self.targets.share:.0%} of subsamples; {of})")  # fmt: skip
        if self.unanswered:
            return (f"not stable at n = {self.full_n} {unit}: too few runs for any verdict to "
                    "reach significance (every verdict is 'not enough runs')")  # fmt: skip
        if not self.points:
            return f"not stable: no seed count could be tried ({of})"
        last = max(self.points, key=lambda p: p.n)
        return (f"not stable at n = {last.n} {unit}: ARI >= {self.targets.ari:g} in "
                f"{last.ari_share:.0%} of subsamples{self._detour_part(last)} (target "
                f"{self.targets.share:.0%}; {of})")  # fmt: skip

    def _one_state_line(self, unit: str, of: str) -> str:
        """:meth:`line` of a map of one state: no claim about the map, the verdicts' own."""
        text = ("the map has one state (K = 1 selected): its states cannot disagree, so the "
                "stability of the map is not informative")  # fmt: skip
        if self.unanswered:
            return (f"{text}; too few runs for any verdict to reach significance (every verdict "
                    f"is 'not enough runs'; {of})")  # fmt: skip
        if not self.verdicts:
            return f"{text} ({of})"
        sufficient = self.sufficient_n
        if sufficient is not None:
            return (f"{text}; its verdicts hold again from n = {sufficient} {unit} (in >= "
                    f"{self.targets.share:.0%} of subsamples; {of})")  # fmt: skip
        if not self.points:
            return f"{text}; no seed count could be tried ({of})"
        last = max(self.points, key=lambda p: p.n)
        worst = min(self.verdicts, key=lambda v: last.verdict_held.get(v, 0.0))
        return (f"{text}; its verdicts do not all hold again at n = {last.n} {unit} ({worst}: "
                f"{last.verdict_held.get(worst, 0.0):.0%}, target {self.targets.share:.0%}; "
                f"{of})")  # fmt: skip

    def _detour_part(self, point: StabilityPoint) -> str:
        text = ""
        if point.detour_found:
            text += f", every detour found again in >= {min(point.detour_found.values()):.0%}"
        if point.verdict_held:
            worst = min(point.verdict_held, key=point.verdict_held.get)
            text += f", every verdict held again in >= {point.verdict_held[worst]:.0%} ({worst})"
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``stability.json``)."""
        return {
            "line": self.line(),
            "sufficient_n": self.sufficient_n,
            "one_state": self.one_state,
            "targets": {
                "ari": self.targets.ari,
                "share": self.targets.share,
                "require_k": self.targets.require_k,
            },
            "full_n": self.full_n,
            "per_method": bool(self.groups),
            "groups": self.groups,
            "group_sizes": dict(self.group_sizes),
            "n_states": self.n_states,
            "detour_states": list(self.detour_states),
            "verdicts": list(self.verdicts),
            "verdict_sufficient_n": self.verdict_sufficient_n(),
            "unanswered": self.unanswered,
            "ladder": self.ladder,
            "max_fraction": self.max_fraction,
            "ladder_limit": self.ladder_limit,
            "ladder_note": (
                f"subsamples of n runs are compared with a map fitted on all {self.full_n} (per "
                "method); near the full count they are mostly the same runs, so their agreement is "
                f"inflated: the ladder stops at n <= {self.max_fraction:g} x {self.full_n} = "
                f"{self.ladder_limit}"
            ),
            "seed": self.seed,
            "seconds": _finite_or_none(self.seconds),
            "points": [point.to_dict() for point in self.points],
        }

    @classmethod
    def from_dict(cls, summary: Mapping[str, Any]) -> StabilityCurve:
        """The curve :meth:`to_dict` describes."""
        targets = StabilityTargets(**summary["targets"])
        points = [
            StabilityPoint(
                n=p["n"], n_states=summary["n_states"], ks=list(p["ks"]),
                ari=[math.nan if a is None else a for a in p["ari"]],
                detour_found={int(d): v for d, v in p["detour_found"].items()},
                ari_target=targets.ari, verdict_held=dict(p.get("verdict_held", {})),
            )
            for p in summary["points"]
        ]  # fmt: skip
        seconds = summary.get("seconds")
        return cls(points, targets, summary["full_n"], summary["n_states"],
                   list(summary["detour_states"]), summary["max_fraction"], summary["groups"],
                   summary["seed"], math.nan if seconds is None else seconds,
                   dict(summary.get("group_sizes", {})),
                   list(summary.get("verdicts", [])),
                   bool(summary.get("unanswered", False)))  # fmt: skip


def ladder_limit(full_n: int, max_fraction: float = DEFAULT_MAX_FRACTION) -> int:
    """floor(max_fraction x full_n): the largest n a ladder over ``full_n`` runs may reach."""
    if not 0 < max_fraction <= 1:
        raise ValueError(f"max_fraction: {max_fraction!r} is not allowed; it must be in (0, 1]")
    return int(math.floor(max_fraction * full_n + 1e-9))


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
    splits (:func:`~trainmap.dynamics.hmm.splits.holdout_split`'s rule: round(holdout x n) held out, at
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
    n_subsamples: int = 20,
    targets: StabilityTargets | None = None,
    seed: int = 0,
    alpha: float = 0.05,
    n_jobs: int = 1,
    max_iter: int | None = None,
    max_fraction: float = DEFAULT_MAX_FRACTION,
    warm_start: bool = True,
    verdicts: pd.DataFrame | None = None,
    permutations: int = 2000,
    confidence: float = 0.95,
) -> StabilityCurve:
    """The stability curve of the fitted map ``hmm`` of ``runs`` (module docstring).

    ``groups`` (run -> method) for a joint comparison, where n counts runs per method; None for
    one group's map. ``detour_states``: the full map's detours; ``ladder``: the seed counts (default
    :func:`default_ladder` of the smallest group); ``max_iter`` caps each warm-started refit's EM
    iterations (default the fit's ``n_iter``), ``warm_start=False`` refits with the full fit's
    restarts (:class:`~trainmap.dynamics.certainty.Refit`). ``verdicts``: the joint comparison's
    verdict table (:func:`~trainmap.dynamics.verdicts.compare_methods`, run with
    ``permutations``, ``confidence``, ``alpha``); its verdicts that found a difference are tested
    again on every subsample (module docstring). Raises ValueError for a ladder entry
    that is not an integer >= 2, exceeds the runs available per method or the ladder limit.
    """
    started = time.perf_counter()
    targets = StabilityTargets() if targets is None else targets
    if not isinstance(n_subsamples, int) or n_subsamples < 1:
        raise ValueError(f"n_subsamples: {n_subsamples!r} is not allowed; it must be an integer "
                         ">= 1")  # fmt: skip
    ids_by_group = _ids_by_group(runs, groups)
    group_sizes = {group: len(ids) for group, ids in ids_by_group.items()}
    full_n = min(group_sizes.values())
    limit = ladder_limit(full_n, max_fraction)
    ladder = default_ladder(full_n, max_fraction=max_fraction) if ladder is None else list(ladder)
    _check_ladder(ladder, full_n, limit, max_fraction, per_method=groups is not None)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):  # the full map's decoding, as the refits decode
        z_full = {run: hmm.transform(runs[run]) for run in sorted(runs)}
        full_labels = np.concatenate(hmm.model_.predict_runs(list(z_full.values())))
    payload = refit_payload(hmm, runs, convergence, status, alpha, seed, max_iter, warm_start)
    followed = followed_verdicts(verdicts, groups)
    payload |= {"z_full": z_full, "full_labels": full_labels, "ids_by_group": ids_by_group,
                "holdout": hmm.holdout, "groups": groups, "verdicts": followed,
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
                                     [r["ari"] for r in drawn], found, targets.ari,
                                     held))  # fmt: skip
    return StabilityCurve(
        points=points, targets=targets, full_n=full_n, n_states=hmm.n_states_,
        detour_states=[int(d) for d in detour_states], max_fraction=max_fraction,
        groups=None if groups is None else sorted(ids_by_group), seed=seed,
        seconds=time.perf_counter() - started, group_sizes=group_sizes, verdicts=list(followed),
        unanswered=bool(groups is not None and verdicts is not None and len(verdicts)
                        and (verdicts["verdict"] == NOT_ENOUGH_RUNS).all()),
    )  # fmt: skip


def _ids_by_group(
    runs: Mapping[str, pd.DataFrame], groups: Mapping[str, str] | None
) -> dict[str, list[str]]:
    if groups is None:
        return {"all": sorted(runs)}
    missing = sorted(set(runs) - set(groups))
    if missing:
        raise ValueError(f"groups: runs {missing[:3]} have no group")
    by_group: dict[str, list[str]] = {}
    for run in sorted(runs):
        by_group.setdefault(groups[run], []).append(run)
    return by_group


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
        return {"k": -1, "ari": math.nan, "found_detours": [], "held_verdicts": []}
    model = refit.selection.model
    in_units = [(z - refit.shift) / refit.scale for z in payload["z_full"].values()]
    labels = dict(zip(payload["z_full"], model.predict_runs(in_units), strict=True))
    # Every run decoded once, in the full fit's units re-expressed in the subsample's; the drawn
    # runs' decodings serve its detour regression and its verdicts too.
    decoded = {run: labels[run] for run in set(refit.drawn)}
    found = refit_detours(refit, payload, decoded)
    detours, matched = found.detour_states, found.matched
    return {"k": int(refit.selection.n_states),
            "ari": float(adjusted_rand_score(payload["full_labels"],
                                             np.concatenate(list(labels.values())))),
            "found_detours": [full for full, state in matched.items() if state in detours],
            "held_verdicts": _held_verdicts(refit, decoded, detours, matched, payload)}  # fmt: skip


def verdict_key(row: Any) -> str:
    """How a verdict is named in ``stability.json``: 'second vs first, quantity: verdict'."""
    return f"{row['second']} vs {row['first']}, {row['quantity']}: {row['verdict']}"


def followed_verdicts(verdicts: pd.DataFrame | None, groups: Mapping[str, str] | None) -> list[str]:
    """The verdicts of a joint comparison the curve tests again: those that found a difference."""
    if verdicts is None or groups is None or verdicts.empty:
        return []
    found = verdicts[~verdicts["verdict"].isin([NOT_ENOUGH_RUNS, NO_EVIDENCE])]
    return [verdict_key(row) for _, row in found.iterrows()]


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
                                payload["status"], detours)  # fmt: skip
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
    table = compare_methods(quantities.loc[list(ordered)], ordered, **payload["compare"])
    held = {verdict_key(row) for _, row in table.iterrows()}
    return [verdict for verdict in payload["verdicts"] if verdict in held]


def _finite_or_none(value: float) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None


@dataclass
class MapStability:
    """A map's stability: its curve, or why none was measured (``stability.json``)."""

    curve: StabilityCurve | None
    reason: str = ""

    @property
    def line(self) -> str:
        """The sentence at the top of ``verdicts.md``."""
        return (
            self.curve.line()
            if self.curve is not None
            else f"stability not measured: {self.reason}"
        )

    def to_dict(self) -> dict[str, Any]:
        if self.curve is None:
            return {"measured": False, "line": self.line, "sufficient_n": None,
                    "one_state": False}  # fmt: skip
        return {"measured": True} | self.curve.to_dict()


def map_stability(
    hmm: TrainingHMM, runs: Mapping[str, pd.DataFrame], groups: Mapping[str, str] | None,
    convergence: Mapping[str, int | None], status: Mapping[str, str],
    detour_states: Sequence[int], settings: Mapping[str, Any], n_jobs: int = 1,
    verdicts: pd.DataFrame | None = None,
) -> MapStability:  # fmt: skip
    """The stability curve of a fitted map with the analysis settings (``stability`` subsamples
    per n, 0: none; ``stability_step``, ``stability_max_fraction``, ``stability_ari``,
    ``stability_share``; refits capped at ``bootstrap_iter`` EM iterations like the bootstrap's);
    ``verdicts``, a joint comparison's verdict table, to test its verdicts again."""
    if not settings["stability"]:
        return MapStability(None, "analysis.stability is 0")
    sizes = pd.Series(list(groups.values())).value_counts() if groups else pd.Series([len(runs)])
    ladder = default_ladder(int(sizes.min()), settings["stability_step"],
                            settings["stability_max_fraction"])  # fmt: skip
    if not ladder:
        per = " per method" if groups else ""
        return MapStability(None, f"{int(sizes.min())} runs{per} leave no seed count to try (a "
                                  f"subsample needs >= 2 runs{per} and at most "
                                  f"{settings['stability_max_fraction']:g} of them)")  # fmt: skip
    targets = StabilityTargets(settings["stability_ari"], settings["stability_share"])
    curve = stability_curve(
        hmm, runs, groups, convergence, status, detour_states, ladder=ladder,
        n_subsamples=settings["stability"], targets=targets, seed=settings["seed"],
        alpha=settings["alpha"], n_jobs=n_jobs, max_iter=settings["bootstrap_iter"],
        max_fraction=settings["stability_max_fraction"], verdicts=verdicts,
        permutations=settings["permutations"], confidence=settings["confidence"],
    )  # fmt: skip
    return MapStability(curve)
