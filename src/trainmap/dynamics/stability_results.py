"""What the stability curve reports: its targets, its points per seed count, the curve's sentences.

Targets (:class:`StabilityTargets`) are settings: by default the map is stable at n when >= 90 %
of its subsamples reach ARI >= 0.9 with the full map and every detour of the full map is found
again in >= 90 % of them and (joint comparisons) every verdict of the full map holds again in
>= 90 % of them (optionally also: K reproduced in >= 90 %). The curve is "stable from
n = n*" when n* and every larger n of the ladder meet the targets (a single lucky n below an
unstable one does not count), otherwise "not stable at n = n_max" (the largest n tried). A map of
one state (K = 1 selected) is never called stable on its own: its states cannot disagree, so every
subsample "agrees"; its line says the map has one state, and only the verdicts it follows can be
stable from some n.

The ladder stops at ``max_fraction`` of the runs (:func:`ladder_limit`; why:
:mod:`trainmap.dynamics.stability`). :class:`StabilityCurve` is ``stability.json``;
:class:`MapStability` a map's curve, or why none was measured. The curve itself is computed by
:func:`trainmap.dynamics.stability.stability_curve`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
