"""Start, path and time: what an intervention's start explains, whether the dynamics differ once
the start may, and where in training two methods' metrics differ.

Any intervention on the weights (GradInit's rescaling, pruning, RepVGG's fused branches) makes the
methods' metrics differ at step 0, so "the runs differ" answers nothing. Three answers separate the
start from the path, all from the methods' **shared native checkpoints** (:func:`shared_checkpoints`:
the steps every run of the pair saved over the span they all cover; no interpolation, which would
make an error that tracks the method's schedule):

* **the start** (:func:`start_verdict`, family ``start``): H0, the methods' metric distributions at
  their first common checkpoint are equal. The energy distance (Szekely & Rizzo 2013, eq. 6.1) of
  the runs' metrics there, each metric standardised over the pair's runs at that step; relabelling
  p. Reported first, as the intervention's direct effect, never as the finding;
* **where the metrics differ** (:func:`time_resolved`, descriptive: levels count): per checkpoint
  and metric the two-sample t statistic with the pooled within-method variance *of that step*
  (each step scaled on its own), and the single-step max-T adjusted p-values (Westfall & Young 1993,
  *Resampling-Based Multiple Testing*, algorithm 2.8; Nichols & Holmes 2002): a cell differs when its
  |t| exceeds the (1 - alpha) quantile of the largest |t| over all cells under relabelling of the
  runs, which controls the family-wise error over all steps x metrics in the strong sense, so each
  step named is licensed on its own ("differ from step a to step b"). No evidence after step b is
  not equivalence (that would need a margin and two one-sided tests, Schuirmann 1987);
* **the dynamics after the start window** (:func:`dynamics_verdict`; in the start family, because
  a start that outlasts the window fires it, bench/verdict_calibration.py): H0, after a start
  window W fixed before the data are seen (``analysis.start_window``, default the first 10 % of the
  common span), the methods' runs follow the same course up to each run's own level and scale. Each
  run's each metric is centred and scaled by its own mean and standard deviation over the
  checkpoints after W (:func:`level_scale_free`), so a different start that has decayed by W, a
  constant level offset and a constant scale are all inside H0; the statistic is the largest |t|
  over those checkpoints x metrics, its p the max-T relabelling p. The effect is the largest
  standardised mean difference (second minus first over the pooled SD), its interval a percentile
  bootstrap of it (runs resampled within each method).

The likelihood-ratio form over the joint HMM (per-method initial distributions in both models,
per-method against shared transition matrices, over the states both methods visit; expected
counts from the full map's forward-backward, relabelled without refits) is
:func:`trainmap.dynamics.verdicts.paths.transition_lr`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trainmap.dynamics.verdicts.paths import (
    Verdict,
    bootstrap_counts,
    percentile_interval,
    relabellings,
    run_steps,
)

#: The verdict family of the start (its own Holm family; reported first, never the finding).
START_FAMILY = "start"
START = "start (energy distance at the first common checkpoint)"
DYNAMICS = "dynamics after the start window (max-T)"
#: Relabellings per chunk of the max-T products (memory: chunk x cells floats, a few times).
_CHUNK = 250


def shared_checkpoints(runs: Mapping[str, pd.DataFrame], groups: Mapping[str, str] | None = None
                       ) -> np.ndarray:  # fmt: skip
    """The checkpoint steps every run in ``runs`` saved over the span they all cover (the latest
    first step to the earliest last step), sorted.

    Raises ValueError naming two runs (and their methods, from ``groups``) and a step one saved and
    the other did not, when the runs' checkpoint schedules differ over that span: comparing them on
    interpolated values would add an error that follows each method's schedule."""
    if not runs:
        raise ValueError("no runs to compare on shared checkpoints")
    steps = {run: np.unique(run_steps(table)) for run, table in runs.items()}
    start = max(float(s.min()) for s in steps.values())
    end = min(float(s.max()) for s in steps.values())
    inside = {run: s[(s >= start) & (s <= end)] for run, s in steps.items()}
    reference = next(iter(inside))
    for run, own in inside.items():
        if np.array_equal(own, inside[reference]):
            continue
        one, other = (reference, run) if len(inside[reference]) >= len(own) else (run, reference)
        extra = np.setdiff1d(inside[one], inside[other])
        step = extra[0] if len(extra) else np.setdiff1d(inside[other], inside[one])[0]

        def named(r: str) -> str:
            return f"{r} ({groups[r]})" if groups and r in groups else r

        raise ValueError(
            f"runs {named(one)} and {named(other)} save different checkpoints over the steps "
            f"every run covers ({start:g} to {end:g}): step {step:g} is in one and not the other "
            f"({len(inside[one])} against {len(inside[other])} checkpoints); the time-resolved "
            "comparison reads the methods' own checkpoints and does not interpolate (an "
            "interpolation error would follow each method's schedule): give every run of a "
            "comparison the same checkpoint schedule (train.<task>.checkpoint_every and steps)"
        )  # fmt: skip
    return inside[reference].astype(float)


def window_end(setting: int | str, steps: np.ndarray) -> float:
    """The last step of the start window W (``analysis.start_window``: ``"10%"``, a share of the
    span of ``steps``, or a number of steps after the first shared checkpoint). Raises ValueError
    when W leaves fewer than 2 shared checkpoints after it (it covers the whole span), naming the
    setting, the span and the fix."""
    first, last = float(steps[0]), float(steps[-1])
    if isinstance(setting, str):
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*%\s*", setting)
        if not match or not float(match.group(1)) < 100:
            raise ValueError(f"analysis.start_window {setting!r}: write a share of the common span "
                             "below 100 % (e.g. '10%') or a number of steps (e.g. 500)")  # fmt: skip
        end = first + float(match.group(1)) / 100 * (last - first)
    else:
        if isinstance(setting, bool) or not setting >= 0:
            raise ValueError(f"analysis.start_window {setting!r}: a number of steps >= 0 or a share "
                             "such as '10%'")  # fmt: skip
        end = first + float(setting)
    after = int((steps > end).sum())
    if after < 2:
        raise ValueError(
            f"analysis.start_window {setting!r} ends at step {end:g}, leaving {after} of the "
            f"{len(steps)} shared checkpoints ({first:g} to {last:g}) after it: the dynamics "
            "cannot be compared after the start; choose a shorter window (default '10%')"
        )  # fmt: skip
    return end


def metric_cube(runs: Mapping[str, pd.DataFrame], features: Sequence[str], steps: np.ndarray
                ) -> dict[str, np.ndarray]:  # fmt: skip
    """Run -> its ``features`` at the checkpoints ``steps`` [features, steps] (the rows whose step
    is one of ``steps``, the first where a step repeats)."""
    cube = {}
    for run, table in runs.items():
        own = run_steps(table)
        _, first_rows = np.unique(own, return_index=True)
        rows = first_rows[np.searchsorted(own[first_rows], steps)]
        cube[run] = table[list(features)].to_numpy(dtype=float)[rows].T
    return cube


def level_scale_free(values: np.ndarray) -> np.ndarray:
    """``values`` [runs, features, steps] with each run's each feature centred and scaled by its own
    mean and standard deviation over the steps (a feature constant over a run's steps becomes 0):
    a constant level or scale of a run leaves it unchanged."""
    mean = values.mean(axis=2, keepdims=True)
    std = values.std(axis=2, keepdims=True)
    return (values - mean) / np.where(std > 0, std, 1.0)


def _t_statistics(weights_first: np.ndarray, weights_second: np.ndarray, values: np.ndarray,
                  floor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Pooled two-sample t and standardised difference (second minus first) of every column of
    ``values`` [n, c] for each row of the run weights [P, n] (a weight counts a run that many
    times: 0/1 for a relabelling, counts for a bootstrap draw). ``floor`` [c]: the smallest pooled
    variance (a cell both methods hold constant but apart stays finite)."""
    n_a = weights_first.sum(axis=1, keepdims=True)
    n_b = weights_second.sum(axis=1, keepdims=True)
    squares = values**2
    mean_a = weights_first @ values / n_a
    mean_b = weights_second @ values / n_b
    within_a = weights_first @ squares - n_a * mean_a**2
    within_b = weights_second @ squares - n_b * mean_b**2
    pooled = np.maximum((within_a + within_b) / np.maximum(n_a + n_b - 2, 1), floor)
    difference = mean_b - mean_a
    d = difference / np.sqrt(pooled)
    return d / np.sqrt(1 / n_a + 1 / n_b), d


def _prepared(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Columns centred on their mean over all runs (the sums of squares then cancel nothing), and
    each column's variance floor: 1e-12 of its variance over all runs (0 for a constant column,
    whose t is 0)."""
    centred = values - values.mean(axis=0)
    total = centred.var(axis=0)
    return centred, np.where(total > 0, 1e-12 * total, 1.0)


def max_t(values: np.ndarray, in_first: np.ndarray, n_permutations: int,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Single-step max-T (module docstring) over the columns of ``values`` [n, c]: the observed
    t [c], the standardised differences d [c] and the max-T adjusted p-values [c],
    p_c = (1 + #{max_c' |t*_c'| >= |t_c|}) / (1 + P)."""
    centred, floor = _prepared(values)
    first = in_first[None, :].astype(float)
    t, d = _t_statistics(first, 1 - first, centred, floor)
    t, d = t[0], d[0]
    # Relabellings keep both group sizes, and the columns are centred (they sum to 0), so with
    # S the first method's sum, Q a column's sum of squares and c = 1/n_a + 1/n_b:
    # t^2 = (n - 2) c r / (1 - c r), r = S^2 / Q, increasing in r; one product per chunk of
    # relabellings gives every S, and each relabelling's largest t is that of its largest r.
    n_first, n = int(in_first.sum()), len(in_first)
    c = 1 / n_first + 1 / (n - n_first)
    total_squares = (centred**2).sum(axis=0)
    constant = total_squares <= 0
    total_squares = np.where(constant, 1.0, total_squares)
    lowest = 1e-12 * max(n - 2, 1) / n  # the pooled variance's floor (_prepared), relative to Q
    maxima = np.empty(n_permutations)
    masks = relabellings(in_first, n_permutations, rng)
    for start in range(0, n_permutations, _CHUNK):
        sums = masks[start : start + _CHUNK].astype(float) @ centred
        largest = (sums**2 / total_squares).max(axis=1)
        maxima[start : start + _CHUNK] = np.sqrt(
            max(n - 2, 1) * c * largest / np.maximum(1 - c * largest, lowest)
        )
    maxima.sort()
    exceed = len(maxima) - np.searchsorted(maxima, np.abs(t) - 1e-9 * np.maximum(np.abs(t), 1))
    return t, d, (1 + exceed) / (1 + n_permutations)


def dynamics_verdict(values: np.ndarray, in_first: np.ndarray, n_permutations: int,
                     confidence: float, rng: np.random.Generator) -> Verdict:  # fmt: skip
    """The path verdict after the start window (module docstring) of ``values`` [runs, features,
    steps after W], the runs level- and scale-free already (:func:`level_scale_free`): the largest
    |d| over the cells (checkpoint x metric), its max-T relabelling p, and a bootstrap percentile
    interval of |d| at that cell (a bootstrap of the maximum itself is biased upward)."""
    flat = values.reshape(len(values), -1)
    _, d, p = max_t(flat, in_first, n_permutations, rng)
    cell = int(np.argmax(np.abs(d)))
    ordered = np.concatenate([flat[in_first], flat[~in_first]])[:, [cell]]
    centred, floor = _prepared(ordered)
    n_first = int(in_first.sum())
    first, second = bootstrap_counts(n_first, len(flat) - n_first, n_permutations, rng)
    _, draws = _t_statistics(first, second, centred, floor)
    return Verdict(float(abs(d[cell])), *percentile_interval(np.abs(draws[:, 0]), confidence),
                   float(p.min()))  # fmt: skip


def start_verdict(values: np.ndarray, in_first: np.ndarray, n_permutations: int,
                  confidence: float, rng: np.random.Generator) -> Verdict:  # fmt: skip
    """The start verdict (module docstring) of ``values`` [runs, features] at the first common
    checkpoint: each feature standardised over the runs, then the energy distance between the
    methods (:func:`trainmap.dynamics.verdicts.paths.energy_verdict`)."""
    from trainmap.dynamics.verdicts.paths import energy_verdict

    std = values.std(axis=0)
    z = (values - values.mean(axis=0)) / np.where(std > 0, std, 1.0)
    return energy_verdict(z[in_first], z[~in_first], n_permutations, confidence, rng)


@dataclass
class TimeResolved:
    """Where two methods' metrics differ (module docstring): per feature (rows) and shared
    checkpoint (columns) the standardised mean difference ``effect`` (second minus first, over the
    pooled within-method SD of that step) and its max-T adjusted ``p``; a cell differs when
    ``p`` < ``alpha``. ``grid_points``: the common grid's steps, where more than the shared
    checkpoints (the band then reads every checkpoint)."""

    effect: pd.DataFrame
    p: pd.DataFrame
    alpha: float
    n_permutations: int
    grid_points: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def steps(self) -> np.ndarray:
        """The shared checkpoints (columns)."""
        return np.asarray(self.effect.columns, dtype=float)

    def differing_steps(self) -> np.ndarray:
        """The checkpoints at which any metric differs."""
        return self.steps[(self.p.to_numpy() < self.alpha).any(axis=0)]

    def windows(self) -> list[tuple[float, float]]:
        """The runs of consecutive shared checkpoints at which some metric differs, as (first
        step, last step)."""
        hit = (self.p.to_numpy() < self.alpha).any(axis=0)
        found, start = [], None
        for index, flag in enumerate(hit):
            if flag and start is None:
                start = index
            if not flag and start is not None:
                found.append((self.steps[start], self.steps[index - 1]))
                start = None
        if start is not None:
            found.append((self.steps[start], self.steps[-1]))
        return found

    def sentence(self) -> str:
        """Where the metrics differ, in words: the steps, the metrics and what the band licenses."""
        windows = self.windows()
        cells = f"{self.p.shape[1]} shared checkpoints x {self.p.shape[0]} metrics"
        how = (f"max-T over {cells}, family-wise alpha {self.alpha:g}, {self.n_permutations} "
               "relabellings")  # fmt: skip
        if not windows:
            return f"the metrics differ at no checkpoint ({how})"
        spans = ", ".join(f"step {a:,.0f}" if a == b else f"steps {a:,.0f}-{b:,.0f}"
                          for a, b in windows)  # fmt: skip
        differing = self.p.index[(self.p.to_numpy() < self.alpha).any(axis=1)]
        last = windows[-1][1]
        after = ("; no evidence of a difference after it (which is not equivalence)"
                 if last < self.steps[-1] else "")  # fmt: skip
        return (f"the metrics differ at {spans} of {self.steps[0]:,.0f}-{self.steps[-1]:,.0f} "
                f"({len(differing)} of {self.p.shape[0]} metrics; {how}){after}")  # fmt: skip


def time_resolved(values: Mapping[str, np.ndarray], in_first: np.ndarray, features: Sequence[str],
                  steps: np.ndarray, n_permutations: int, alpha: float,
                  rng: np.random.Generator) -> TimeResolved:  # fmt: skip
    """:class:`TimeResolved` of the runs ``values`` (run -> [features, steps], in the order of
    ``in_first``)."""
    cube = np.stack(list(values.values()))
    _, d, p = max_t(cube.reshape(len(cube), -1), in_first, n_permutations, rng)
    shape = (len(features), len(steps))
    index, columns = pd.Index(list(features), name="feature"), pd.Index(steps, name="step")
    return TimeResolved(pd.DataFrame(d.reshape(shape), index=index, columns=columns),
                        pd.DataFrame(p.reshape(shape), index=index, columns=columns), alpha,
                        n_permutations)  # fmt: skip


#: The metrics that are ratios of norms of the same weights: a rescaling of the weights (GradInit's
#: intervention) leaves them unchanged; a change of the weights' shape does not.
SCALE_FREE_METRICS = ("l1_l2", "trace_spectral")


def architecture_note(architectures: Sequence[str], repvgg_weights: str) -> str:
    """What compares across the architectures of a comparison ("" for one architecture): which
    metrics a rescaling leaves alone, and, for RepVGG, which weights are measured
    (``analysis.repvgg_weights``)."""
    names = sorted(set(architectures))
    if len(names) < 2:
        return ""
    text = (f"The methods differ in architecture ({', '.join(names)}): the ratio metrics "
            f"{' and '.join(SCALE_FREE_METRICS)} are unchanged by a rescaling of the weights but "
            "not by their shape, so the start and the band compare architectures as well as "
            "training; the verdicts after the start window remove each run's own level and "
            "scale.")  # fmt: skip
    if any(name.startswith("repvgg") for name in names):
        text += (" RepVGG's runs are measured in their fused deploy weights (analysis.repvgg_weights: "
                 "deploy): every metric of one weight space with its plain twin's."
                 if repvgg_weights == "deploy" else
                 " RepVGG's runs are measured in their multi-branch training weights "
                 "(analysis.repvgg_weights: train): another weight space than a plain network's; "
                 "deploy compares the fused kernels.")  # fmt: skip
    return text
