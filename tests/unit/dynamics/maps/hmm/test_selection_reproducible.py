"""The ``reproducible`` selection rule: K is the largest K whose maps fitted on two disjoint halves
of the runs decode every run alike, or (``reproduce_k: nested``) the largest such that every
smaller K does too (known answer, the two variants, bad settings, the halves, the bootstrap)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import adjusted_rand_score

from trainmap.dynamics.maps.hmm.curves import choose_k
from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.dynamics.maps.hmm.splits import half_splits
from trainmap.dynamics.maps.synthetic import sample_runs
from trainmap.dynamics.verdicts.certainty import bootstrap_map

K_MAX = 5


@pytest.fixture(scope="module")
def fitted():
    """A reproducible map of 24 runs x 120 checkpoints from 3 true states (no nuisance)."""
    runs, _, _ = sample_runs(3, n_runs=24, length=120, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm = TrainingHMM(selection="reproducible", restarts=2, k_max=K_MAX).fit(runs)
    return hmm, runs


def test_the_reproducible_rule_finds_the_true_k(fitted) -> None:
    hmm, runs = fitted
    assert hmm.n_states_ == 3
    curve = hmm.selection_.set_index("n_states")
    assert curve.loc[[1, 2, 3], "reproducible"].all()
    assert not curve.loc[4, "reproducible"]
    assert {"ari_median", "ari_min", "reproduced"} <= set(curve.columns)
    # half_models_: splits 2s and 2s + 1 are the two halves of split s, each K -> its model; their
    # decodings of every run give the curve's ARIs
    assert sorted(hmm.half_models_) == list(
        range(2 * 5)
    )  # halves None: 5 splits (24 runs allow more)
    sequences = [hmm.transform(runs[run]) for run in sorted(runs)]
    for k in (3, 4):
        aris = []
        for split in range(len(hmm.half_models_) // 2):
            labels = [np.concatenate(hmm.half_models_[part][k].predict_runs(sequences))
                      for part in (2 * split, 2 * split + 1)]  # fmt: skip
            aris.append(adjusted_rand_score(*labels))
        assert np.median(aris) == pytest.approx(curve.loc[k, "ari_median"])
        assert min(aris) == pytest.approx(curve.loc[k, "ari_min"])


@pytest.mark.parametrize(
    ("reproducible", "largest", "nested"),
    [
        ([True, True, False, True, True, True], 5, 2),  # K = 4..6 reproduce again
        ([True, True, True, True, True, True], 5, 5),  # all reproduce: the BIC minimum caps K
        ([True, False, False, False, False, False], 1, 1),
        ([False] * 6, 5, 1),  # none could be decoded: the BIC's K, or the smallest
    ],
)
def test_reproduce_k_takes_the_largest_reproducing_k_or_stops_at_the_first_failure(
    reproducible, largest, nested
) -> None:
    """``largest``: the largest K <= K_BIC whose halves agree; ``nested``: finer splits of the
    states can reproduce again beyond a K that does not (more runs make the halves agree on them),
    so K stops before the first failure; never past the BIC minimum (K = 5 here)."""
    curve = pd.DataFrame({"n_states": range(1, 7), "bic": [9.0, 8, 7, 6, 5, 5.5],
                          "reproducible": reproducible})  # fmt: skip
    assert choose_k(curve) == choose_k(curve, "largest") == largest
    assert choose_k(curve, "nested") == nested


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"reproduce_ari": 0}, "reproduce_ari"),
        ({"reproduce_ari": 1.5}, "reproduce_ari"),
        ({"reproduce_share": 0}, "reproduce_share"),
        ({"halves": 0}, "halves"),
        ({"reproduce_k": "smallest"}, "reproduce_k"),
        ({"half_size": 0}, "half_size"),
    ],
)
def test_bad_settings_are_refused_by_name(settings, key) -> None:
    with pytest.raises(ValueError, match=key):
        TrainingHMM(selection="reproducible", **settings)


def test_more_splits_than_the_runs_allow_names_the_key_and_the_count() -> None:
    runs, _, _ = sample_runs(3, n_runs=4, length=60, seed=0)
    hmm = TrainingHMM(selection="reproducible", halves=5, restarts=1, k_max=2)
    with pytest.raises(ValueError, match="analysis.halves") as error:
        hmm.fit(runs)
    assert "only 3 distinct" in str(error.value)  # {a,b | c,d}, {a,c | b,d}, {a,d | b,c}


def test_halves_split_every_group_evenly_disjointly_and_reproducibly() -> None:
    runs = [f"{method}_seed{seed}" for method in ("a", "b") for seed in range(6)]
    strata = {run: run.split("_")[0] for run in runs}
    splits = half_splits(runs, 4, random_state=7, strata=strata)
    assert len(splits) == 4
    for first, second in splits:
        assert not set(first) & set(second)
        assert sorted(first + second) == sorted(runs)
        for half in (first, second):
            assert sorted(strata[run] for run in half) == ["a"] * 3 + ["b"] * 3
    assert len({tuple(first) for first, _ in splits}) > 1  # random, not one split repeated
    assert half_splits(runs, 4, random_state=7, strata=strata) == splits
    assert half_splits(list(reversed(runs)), 4, random_state=7, strata=strata) == splits
    assert half_splits(runs, 4, random_state=8, strata=strata) != splits


def test_a_half_size_draws_that_many_runs_of_each_group_into_each_half() -> None:
    """Two draws of a fixed number of seeds per method, whatever the runs' count: the halves
    hold min(half_size, n // 2) runs of each group, disjoint, the rest in neither."""
    runs = [f"{method}_seed{seed}" for method, n in (("a", 9), ("b", 5)) for seed in range(n)]
    strata = {run: run.split("_")[0] for run in runs}
    splits = half_splits(runs, 6, random_state=3, strata=strata, half_size=3)
    for first, second in splits:
        assert not set(first) & set(second)
        for half in (first, second):
            assert sorted(strata[run] for run in half) == ["a"] * 3 + ["b"] * 2
    unused = {run for first, second in splits for run in runs if run not in first + second}
    assert unused  # 3 of a's 9 and 1 of b's 5 sit out each split
    assert half_splits(runs, 6, random_state=3, strata=strata, half_size=3) == splits


@pytest.mark.parametrize(("sizes", "half_size"), [([4], None), ([5], None), ([4], 1), ([5], 2),
                                                  ([3, 4], 1), ([4, 4], None)])  # fmt: skip
def test_distinct_halvings_counts_the_splits_by_enumeration(sizes, half_size) -> None:
    from itertools import combinations, product

    from trainmap.dynamics.maps.hmm.splits import distinct_halvings

    per_group = []
    for g, n in enumerate(sizes):
        ids = [f"{g}{i}" for i in range(n)]
        h = n // 2 if half_size is None else min(half_size, n // 2)
        rest = n - h if half_size is None else h
        per_group.append([(a, b) for a in combinations(ids, h)
                          for b in combinations([i for i in ids if i not in a], rest)
                          if half_size is not None or len(a) + len(b) == n])  # fmt: skip
    found = set()
    for choice in product(*per_group):
        first = frozenset(x for a, _ in choice for x in a)
        second = frozenset(x for _, b in choice for x in b)
        found.add(frozenset((first, second)))
    if half_size is None and len(sizes) > 1:  # counted as ordered pairs there: an upper bound
        assert distinct_halvings(sizes) >= len(found)
    else:
        assert distinct_halvings(sizes, half_size) == len(found)


def test_the_bootstrap_refits_with_the_reproducible_rule(fitted) -> None:
    hmm, runs = fitted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = bootstrap_map(hmm, runs, {run: 100 for run in runs},
                               dict.fromkeys(runs, "completed"), detour_states=[],
                               n_resamples=3, max_iter=5, reselect_k=True)  # fmt: skip
    assert result.n_resamples == 3
    assert len(result.ks) == 3
    assert all(1 <= k <= K_MAX for k in result.ks)


@pytest.mark.parametrize("reproduce_k", ["largest", "nested"])
def test_a_refit_decodes_only_the_deciding_ks_and_selects_the_same(
    fitted, monkeypatch, reproduce_k
) -> None:
    from trainmap.dynamics.maps.hmm import selection
    from trainmap.dynamics.verdicts.certainty import bootstrap_map

    hmm, runs = fitted[0], fitted[1]
    monkeypatch.setattr(hmm, "reproduce_k", reproduce_k)
    args = (hmm, runs, dict.fromkeys(runs, 100), dict.fromkeys(runs, "completed"), [])
    lazy = bootstrap_map(*args, n_resamples=4, max_iter=5, reselect_k=True)
    every = selection.reproducibility_curve
    monkeypatch.setattr(selection, "reproducibility_curve",
                        lambda *a, **k: every(*a, **(k | {"every_k": True})))  # fmt: skip
    assert bootstrap_map(*args, n_resamples=4, max_iter=5, reselect_k=True).ks == lazy.ks
