"""Splits of the runs that score K: one held-out part, folds, or random halves.

Every split is a seeded permutation of the sorted run ids, so it depends on the seed and the set of
runs, never on their order (the training-maps authors' split followed file order). The paper's
rule holds out a fraction of the runs (:func:`holdout_split`); ``folds`` deals them into folds,
every run held out once (:func:`fold_split`); ``reproducible`` splits them, within each group,
into two halves many times (:func:`half_splits`, :func:`distinct_halvings`). A split's runs are
stacked as hmmlearn takes them (:func:`stack`, :class:`Split`). Which rule uses which split:
:func:`~trainmap.dynamics.maps.hmm.selection.selection_splits`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The ``reproducible`` rule's random splits of the runs into two halves (setting ``halves`` None:
#: this many, or as many distinct ones as the runs allow; docs/decisions/hmm-selection.md).
DEFAULT_HALVES = 5
Data = tuple[np.ndarray, list[int]]


class SelectionFailed(ValueError):
    """No K could be fitted and scored (every fit lost its states, or none could be scored)."""


def holdout_split(
    run_ids: Sequence[str], holdout: float, random_state: int
) -> tuple[list[str], list[str]]:
    """``(train, heldout)``: a seeded split of the sorted run ids (independent of input order)."""
    ordered = sorted(run_ids)
    if len(ordered) < 2:
        raise ValueError(
            f"a training map needs at least 2 runs (one to hold out), got {len(ordered)}"
        )
    n_heldout = min(len(ordered) - 1, max(1, round(holdout * len(ordered))))
    order = np.random.default_rng(random_state).permutation(len(ordered))
    heldout = sorted(ordered[i] for i in order[:n_heldout])
    return [run for run in ordered if run not in heldout], heldout


def fold_split(run_ids: Sequence[str], folds: int, random_state: int) -> list[list[str]]:
    """The held-out runs of each of ``folds`` folds: a seeded permutation of the sorted distinct run
    ids dealt round-robin, so fold sizes differ by at most one and every run is held out once
    (fewer runs than folds: one run per fold)."""
    ordered = sorted(set(run_ids))
    if len(ordered) < 2:
        raise ValueError(
            f"a training map needs at least 2 runs (one to hold out), got {len(ordered)}"
        )
    n_folds = min(folds, len(ordered))
    order = np.random.default_rng(random_state).permutation(len(ordered))
    return [sorted(ordered[i] for i in order[fold::n_folds]) for fold in range(n_folds)]


def distinct_halvings(group_sizes: Sequence[int], half_size: int | None = None) -> int:
    """How many distinct splits into two halves (each group halved, :func:`half_splits`) runs in
    groups of ``group_sizes`` allow: the product of C(n, n // 2) over groups, halved for one group
    of even size (a split and its mirror image are one). With ``half_size`` (h = min(half_size,
    n // 2) runs of each group in each half, the rest in neither): the product of
    C(n, h) C(n - h, h), halved (the two halves are interchangeable)."""
    if half_size is not None:
        sizes = [(n, min(half_size, n // 2)) for n in group_sizes]
        return math.prod(math.comb(n, h) * math.comb(n - h, h) for n, h in sizes) // 2
    distinct = math.prod(math.comb(n, n // 2) for n in group_sizes)
    return distinct // 2 if len(group_sizes) == 1 and group_sizes[0] % 2 == 0 else distinct


def half_splits(
    run_ids: Sequence[str], n_splits: int | None, random_state: int,
    strata: Mapping[str, str] | None = None, cap: bool = False, half_size: int | None = None,
) -> list[tuple[list[str], list[str]]]:  # fmt: skip
    """``n_splits`` random splits of the sorted distinct runs into two disjoint halves, each a
    seeded permutation (``SeedSequence([random_state, split])``), within each stratum of
    ``strata`` (run -> group: per method in a joint comparison; the first half of a stratum of odd
    size has the smaller part). ``half_size``: each half takes min(half_size, n // 2) runs of each
    stratum of n runs, the rest sit out that split (two draws of a fixed number of seeds per
    method, whatever the runs' count). Splits may repeat when the runs allow few distinct ones;
    more splits than distinct halvings, or a stratum with fewer than 2 runs, is a ValueError
    naming the key (``cap``, a refit's resample: as many splits as exist, and
    :class:`SelectionFailed` for a stratum of one run). ``n_splits`` None:
    :data:`DEFAULT_HALVES`, or as many as exist."""
    if n_splits is None:
        n_splits, cap = DEFAULT_HALVES, True
    ordered = sorted(set(run_ids))
    groups: dict[str, list[str]] = {}
    for run in ordered:
        groups.setdefault(strata.get(run, "") if strata else "", []).append(run)
    small = {group: len(ids) for group, ids in groups.items() if len(ids) < 2}
    if small and cap:
        raise SelectionFailed(f"groups {sorted(small)} have one distinct run: no halves")
    if small:
        raise ValueError(f"analysis.halves: the reproducible rule splits every group's runs in two "
                         f"halves, but {small} have fewer than 2 runs; use selection holdout or "
                         "more seeds")  # fmt: skip
    distinct = distinct_halvings([len(ids) for ids in groups.values()], half_size)
    if n_splits > distinct and cap:
        n_splits = distinct
    elif n_splits > distinct:
        raise ValueError(f"analysis.halves: {n_splits} splits of {len(ordered)} runs into halves "
                         f"but only {distinct} distinct ones exist; lower analysis.halves to at "
                         f"most {distinct} or add seeds")  # fmt: skip
    splits = []
    for split in range(n_splits):
        rng = np.random.default_rng(np.random.SeedSequence([random_state, split]))
        first, second = [], []
        for group in sorted(groups):
            ids = groups[group]
            order = rng.permutation(len(ids))
            size = len(ids) // 2 if half_size is None else min(half_size, len(ids) // 2)
            first += [ids[i] for i in order[:size]]
            second += [ids[i] for i in order[size : None if half_size is None else 2 * size]]
        splits.append((sorted(first), sorted(second)))
    return splits


def stack(sequences: Sequence[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """Concatenated observations and their lengths (hmmlearn's ``X, lengths``)."""
    return np.concatenate(sequences), [len(sequence) for sequence in sequences]


@dataclass
class Split:
    """One split of the runs: the training runs and the held-out runs (stacked: ``X, lengths``) and
    each part's run weights (None: each run once). ``heldout`` None: a fit of the runs that gives
    each K its model without scoring it (the final fit of the ``folds`` rule)."""

    train: Data
    heldout: Data | None
    weights: tuple[Any, Any] = (None, None)
