"""What the stability curve reports: its targets, its points per seed count, the curve's sentences.

Targets (:class:`StabilityTargets`) are settings. By default the map is stable at n when every
state of the full map *reproduces* in its subsamples' maps, and every detour of the full map is
found again in >= 90 % of them and (joint comparisons) every verdict of the full map holds again
in >= 90 % of them (optionally also: K reproduced in >= 90 %, when the refits reselect K). A state
reproduces when its mean Jaccard agreement over the subsamples is >= 0.75 (:data:`STATE_JACCARD`):
cluster-wise stability, C. Hennig, "Cluster-wise assessment of cluster stability", Computational
Statistics & Data Analysis 52 (2007), whose rule of thumb calls a cluster with mean Jaccard
<= 0.5 dissolved and >= 0.75 stable. Per state, not per checkpoint: the adjusted Rand index of
all checkpoints (still reported, a secondary number) weights states by their time, so it hardly
notices a detour merged away and counts a finer map as a disagreement everywhere (numbers:
docs/decisions/certainty.md); per state, a merge or a split is a fact about the states it
touches, and the line names the states that reproduce. The curve is "stable from n = n*" when n* and every larger n of the ladder meet the
targets (a single lucky n below an unstable one does not count), otherwise "not stable at n =
n_max" (the largest n tried). A ``stability.json`` written before the per-state agreement reads
back with the ARI criterion (>= 90 % of its subsamples at ARI >= 0.9). A map of one state (K = 1
selected) is never called stable on its own: its states cannot disagree, so every subsample
"agrees"; its line says the map has one state, and only the verdicts it follows can be stable
from some n.

The ladder stops at ``max_fraction`` of the runs (:func:`ladder_limit`; why:
:mod:`trainmap.dynamics.verdicts.stability`). :class:`StabilityCurve` is ``stability.json``;
:class:`MapStability` a map's curve, or why none was measured. The curve itself is computed by
:func:`trainmap.dynamics.verdicts.stability.stability_curve`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainmap.dynamics.maps.settings import ANALYSIS_DEFAULTS

#: The ladder's limit, the stability targets (ARI, share of subsamples): the config schema's
#: defaults of ``analysis.stability_max_fraction``, ``stability_ari`` and ``stability_share``.
DEFAULT_MAX_FRACTION: float = ANALYSIS_DEFAULTS["stability_max_fraction"]
DEFAULT_ARI: float = ANALYSIS_DEFAULTS["stability_ari"]
DEFAULT_SHARE: float = ANALYSIS_DEFAULTS["stability_share"]
#: Hennig's (2007) rule of thumb for cluster-wise stability: a state whose mean Jaccard agreement
#: over the refits reaches 0.75 reproduces (a mean <= 0.5: it dissolved).
STATE_JACCARD = 0.75
#: Hennig's (2007) dissolution point: in a refit whose Jaccard agreement for a state is below
#: 0.5, that state dissolved.
DISSOLVED_JACCARD = 0.5


def mean_jaccard(jaccards: Sequence[Sequence[float]]) -> list[float]:
    """Per state, the mean of ``jaccards`` (per refit, per state of the full map) over the
    refits, rounded to 6 digits; empty without refits."""
    if not len(jaccards):
        return []
    return np.asarray(jaccards, dtype=float).mean(axis=0).round(6).tolist()


def dissolved_shares(jaccards: Sequence[Sequence[float]]) -> list[float]:
    """Per state, the share of refits in which it dissolved (Jaccard < :data:`DISSOLVED_JACCARD`,
    Hennig 2007); empty without refits."""
    if not len(jaccards):
        return []
    return (np.asarray(jaccards, dtype=float) < DISSOLVED_JACCARD).mean(axis=0).round(6).tolist()


def reproduced_states(means: Sequence[float], threshold: float = STATE_JACCARD) -> list[int]:
    """The states whose mean Jaccard (``means``, per state) reaches ``threshold`` (Hennig 2007: a
    cluster with mean Jaccard >= 0.75 is stable, <= 0.5 dissolved)."""
    return [state for state, value in enumerate(means) if value >= threshold]


def reports_states(reselect_k: bool, state_jaccard: Sequence[float] | None) -> bool:
    """Whether a bootstrap reports each state's mean Jaccard (its refits kept the full map's K and
    recorded per-state values) rather than the distribution of a reselected K (``reselect_k``, or
    a file written before refits kept K)."""
    return not reselect_k and bool(state_jaccard)


def states_sentence(means: Sequence[float], where: str, threshold: float = STATE_JACCARD) -> str:
    """Which states reproduce: 'states 0, 2 reproduce {where} (mean Jaccard >= 0.75); state 1
    does not (0.41)', from each state's mean Jaccard (``means``); empty without states."""

    def states(items: list[int]) -> str:
        return ("state " if len(items) == 1 else "states ") + ", ".join(map(str, items))

    kept = reproduced_states(means, threshold)
    lost = [state for state in range(len(means)) if state not in kept]
    parts = []
    if kept:
        verb = "reproduces" if len(kept) == 1 else "reproduce"
        parts.append(f"{states(kept)} {verb} {where} (mean Jaccard >= {threshold:g})")
    if lost:
        values = ", ".join(f"{means[state]:.2f}" for state in lost)
        verb = "does not" if len(lost) == 1 else "do not"
        parts.append(f"{states(lost)} {verb} ({values})")
    return "; ".join(parts)


@dataclass(frozen=True)
class StabilityTargets:
    """When a map counts as stable at n: every state of the full map reproduces (its mean Jaccard
    agreement over the subsamples >= ``jaccard``: Hennig 2007, cluster-wise stability), every
    detour of the full map is found again in a share >= ``share`` of the subsamples, every followed
    verdict holds again in a share >= ``share`` and (``require_k``, meaningful when the refits
    reselect K) the full map's K is selected in a share >= ``share``. ``ari``: the agreement a
    subsample's map must reach with the full map (adjusted Rand index of all checkpoints) to count
    in :attr:`StabilityPoint.ari_share`, a secondary number; the criterion of a curve without
    per-state agreement (a ``stability.json`` written before it), in place of the states."""

    ari: float = DEFAULT_ARI
    share: float = DEFAULT_SHARE
    require_k: bool = False
    jaccard: float = STATE_JACCARD

    def __post_init__(self) -> None:
        for name in ("ari", "share", "jaccard"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value <= 1):
                raise ValueError(f"stability target {name}: {value!r} is not allowed; it must be "
                                 "in (0, 1]")  # fmt: skip


@dataclass
class StabilityPoint:
    """The subsamples of one n (runs per method): their K, their agreement with the full map per
    state (Jaccard, Hennig 2007) and in all (ARI, NaN where the refit failed), and how often each
    full detour is found again and each followed verdict holds again."""

    n: int
    n_states: int  # the full map's K
    ks: list[int]  # per subsample (-1: the refit failed)
    ari: list[float]  # per subsample (NaN: the refit failed)
    detour_found: dict[int, float]  # full detour state -> share of subsamples finding it again
    ari_target: float = DEFAULT_ARI
    verdict_held: dict[str, float] = field(default_factory=dict)  # verdict -> share holding again
    # per subsample, per state of the full map: the Jaccard agreement of its checkpoints with the
    # subsample map's matched state (trainmap.dynamics.verdicts.certainty.state_jaccard; 0: failed refit)
    jaccard: list[list[float]] = field(default_factory=list)
    jaccard_target: float = STATE_JACCARD

    @property
    def state_jaccard(self) -> list[float]:
        """Per state of the full map, its mean Jaccard agreement over the subsamples."""
        return mean_jaccard(self.jaccard)

    @property
    def state_dissolved(self) -> list[float]:
        """Per state of the full map, the share of subsamples in which it dissolved (Jaccard
        < 0.5, Hennig 2007)."""
        return dissolved_shares(self.jaccard)

    def states_reproduced(self, threshold: float | None = None) -> list[int]:
        """The full map's states whose mean Jaccard reaches ``threshold`` (default the point's
        target; Hennig 2007: a cluster with mean Jaccard >= 0.75 is stable, <= 0.5 dissolved)."""
        threshold = self.jaccard_target if threshold is None else threshold
        return reproduced_states(self.state_jaccard, threshold)

    @property
    def per_state(self) -> bool:
        """Whether the point has per-state agreement (older ``stability.json`` files have not)."""
        return bool(self.jaccard)

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
        """Whether this n meets ``targets`` (module docstring): every state reproduces (without
        per-state agreement: ARI >= the target in a share >= ``targets.share``), every detour is
        found again and every followed verdict holds again."""
        if self.per_state:
            ok = all(value >= targets.jaccard for value in self.state_jaccard)
        else:
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
            "jaccard": [list(values) for values in self.jaccard],
            "state_jaccard": self.state_jaccard,
            "state_dissolved": self.state_dissolved,
            "states_reproduced": self.states_reproduced(),
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
    seed: int = ANALYSIS_DEFAULTS["seed"]
    seconds: float = math.nan
    group_sizes: dict[str, int] = field(default_factory=dict)
    verdicts: list[str] = field(default_factory=list)  # the full map's verdicts followed
    # a joint comparison whose every verdict is "not enough runs": no answer to be stable
    unanswered: bool = False
    reselect_k: bool = False  # whether the refits reselected K (else: the full map's K)

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

    def states_line(self) -> str:
        """Which of the full map's states reproduce at the ladder's largest n: 'states 0, 2
        reproduce at n = 24 seeds per method (mean Jaccard >= 0.75); state 1 does not (0.41)',
        then the ARI there, a secondary number (empty without per-state agreement, e.g. an older
        stability.json)."""
        if not self.points:
            return ""
        last = max(self.points, key=lambda p: p.n)
        if not last.per_state:
            return ""
        text = states_sentence(last.state_jaccard, f"at n = {last.n} {self.unit}",
                               self.targets.jaccard)  # fmt: skip
        if math.isfinite(last.ari_mean):
            text += f"; mean ARI with the full map {last.ari_mean:.2f} (secondary)"
        return text

    def line(self) -> str:
        """One sentence: 'stable from n = ... seeds (per method)' or 'not stable at n = ...'; for a
        map of one state, that the map's stability is not informative (and its verdicts'); then
        which states reproduce (:meth:`states_line`)."""
        text = self._map_line()
        states = self.states_line() if not self.one_state else ""
        return f"{text}; {states}" if states else text

    def _criterion(self, per_state: bool) -> str:
        """What :attr:`sufficient_n` asks of every n, in words."""
        share = f" in >= {self.targets.share:.0%} of subsamples"
        shared = (["detours found again"] * bool(self.detour_states)
                  + ["verdicts held again"] * bool(self.verdicts)
                  + [f"K = {self.n_states} selected"] * self.targets.require_k)  # fmt: skip
        if not per_state:
            return ", ".join([f"ARI >= {self.targets.ari:g} with the full map", *shared]) + share
        text = (f"every state of the full map reproduces, mean Jaccard >= "
                f"{self.targets.jaccard:g} over the subsamples")  # fmt: skip
        return text + (f", {', '.join(shared)}{share}" if shared else "")

    def _map_line(self) -> str:
        unit = self.unit
        per_state = bool(self.points) and all(point.per_state for point in self.points)
        of = (f"{len(self.points[0].ks) if self.points else 0} subsamples per n, ladder up to "
              f"{self.ladder_limit} of {self.full_n} runs{' per method' * bool(self.groups)}")  # fmt: skip
        sufficient = self.sufficient_n
        if self.one_state:
            return self._one_state_line(unit, of)
        if sufficient is not None:
            return f"stable from n = {sufficient} {unit} ({self._criterion(per_state)}; {of})"
        if self.unanswered:
            return (f"not stable at n = {self.full_n} {unit}: too few runs for any verdict to "
                    "reach significance (every verdict is 'not enough runs')")  # fmt: skip
        if not self.points:
            return f"not stable: no seed count could be tried ({of})"
        last = max(self.points, key=lambda p: p.n)
        if per_state:
            kept = len(last.states_reproduced(self.targets.jaccard))
            agreement = (f"{kept} of {self.n_states} states reproduce (mean Jaccard >= "
                         f"{self.targets.jaccard:g})")  # fmt: skip
        else:
            agreement = f"ARI >= {self.targets.ari:g} in {last.ari_share:.0%} of subsamples"
        return (f"not stable at n = {last.n} {unit}: {agreement}{self._detour_part(last)} "
                f"(target {self.targets.share:.0%}; {of})")  # fmt: skip

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

    def states_reproduced(self) -> list[int]:
        """The full map's states that reproduce at the ladder's largest n (mean Jaccard >= the
        target; empty without points or per-state agreement)."""
        if not self.points:
            return []
        return max(self.points, key=lambda p: p.n).states_reproduced(self.targets.jaccard)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``stability.json``). Without ``reselect_k`` every refit keeps the full
        map's K, so the points' K distribution (``k_counts``, ``k_same``) is left out; their
        ``ks`` stay (-1 marks a failed refit)."""
        points = [point.to_dict() for point in self.points]
        if not self.reselect_k:
            points = [{k: v for k, v in p.items() if k not in ("k_counts", "k_same")}
                      for p in points]  # fmt: skip
        return {
            "line": self.line(),
            "sufficient_n": self.sufficient_n,
            "one_state": self.one_state,
            "states_reproduced": self.states_reproduced(),
            "reselect_k": self.reselect_k,
            "targets": {
                "ari": self.targets.ari,
                "share": self.targets.share,
                "require_k": self.targets.require_k,
                "jaccard": self.targets.jaccard,
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
            "points": points,
        }

    @classmethod
    def from_dict(cls, summary: Mapping[str, Any]) -> StabilityCurve:
        """The curve :meth:`to_dict` describes; a file written before per-state agreement (no
        ``jaccard``) reads with the ARI criterion, and as reselecting K."""
        targets = StabilityTargets(**summary["targets"])
        points = [
            StabilityPoint(
                n=p["n"], n_states=summary["n_states"], ks=list(p["ks"]),
                ari=[math.nan if a is None else a for a in p["ari"]],
                detour_found={int(d): v for d, v in p["detour_found"].items()},
                ari_target=targets.ari, verdict_held=dict(p.get("verdict_held", {})),
                jaccard=[list(v) for v in p.get("jaccard", [])], jaccard_target=targets.jaccard,
            )
            for p in summary["points"]
        ]  # fmt: skip
        seconds = summary.get("seconds")
        return cls(points, targets, summary["full_n"], summary["n_states"],
                   list(summary["detour_states"]), summary["max_fraction"], summary["groups"],
                   summary["seed"], math.nan if seconds is None else seconds,
                   dict(summary.get("group_sizes", {})),
                   list(summary.get("verdicts", [])),
                   bool(summary.get("unanswered", False)),
                   bool(summary.get("reselect_k", True)))  # fmt: skip


def ladder_limit(full_n: int, max_fraction: float = DEFAULT_MAX_FRACTION) -> int:
    """floor(max_fraction x full_n): the largest n a ladder over ``full_n`` runs may reach."""
    if not 0 < max_fraction <= 1:
        raise ValueError(f"max_fraction: {max_fraction!r} is not allowed; it must be in (0, 1]")
    return int(math.floor(max_fraction * full_n + 1e-9))


def verdict_key(row: Any) -> str:
    """How a verdict is named in ``stability.json``: 'second vs first, quantity: verdict'."""
    return f"{row['second']} vs {row['first']}, {row['quantity']}: {row['verdict']}"


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


def _finite_or_none(value: float) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None
