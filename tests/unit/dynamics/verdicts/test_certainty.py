"""Stated certainty: the bootstrap over runs, permutation tests and the verdict table."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.dynamics.maps.regression import holm
from trainmap.dynamics.maps.synthetic import sample_runs
from trainmap.dynamics.verdicts.certainty import bootstrap_map, match_by_means
from trainmap.dynamics.verdicts.compare import (
    NO_EVIDENCE,
    NOT_ENOUGH_RUNS,
    compare_methods,
    run_quantities,
    smallest_p,
    verdict_markdown,
)


@pytest.fixture(scope="module")
def fitted_map():
    runs, states, _ = sample_runs(3, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm = TrainingHMM(k_max=4, restarts=2, n_jobs=2, selection="holdout").fit(runs)
    convergence = {run: int(np.argmax(s == 2)) * 10 if (s == 2).any() else None
                   for run, s in states.items()}  # fmt: skip
    return hmm, runs, convergence


def test_bootstrap_is_seeded_and_does_not_depend_on_processes(fitted_map):
    hmm, runs, convergence = fitted_map
    status = dict.fromkeys(runs, "completed")
    serial = bootstrap_map(hmm, runs, convergence, status, [], n_resamples=6, seed=3)
    parallel = bootstrap_map(hmm, runs, convergence, status, [], n_resamples=6, seed=3, n_jobs=2)
    assert serial.ks == parallel.ks and serial.state_found == parallel.state_found
    assert serial.jaccards == parallel.jaccards
    assert serial.n_resamples == 6 and sum(serial.k_counts.values()) == 6
    # Three well separated states: every resample finds K = 3 and every state again.
    assert serial.k_counts == {3: 6} and serial.k_same == 1.0
    assert serial.state_found == [1.0, 1.0, 1.0]
    other = bootstrap_map(hmm, runs, convergence, status, [], n_resamples=6, seed=4)
    assert other.to_dict()["n_states"] == 3 and other.to_dict()["k_counts"] == {"3": 6}


def test_states_are_matched_by_emission_means():
    full = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    resample = np.array([[0.2, 9.7], [0.1, -0.3], [30.0, 30.0]])  # 2 ~ 0, 0 ~ 2; no state 1
    assert match_by_means(full, resample) == {0: 1, 2: 0}


def test_holm_matches_statsmodels():
    from statsmodels.stats.multitest import multipletests

    p = np.array([0.01, 0.04, 0.03, 0.2, 0.005, 0.5])
    np.testing.assert_allclose(holm(p), multipletests(p, method="holm")[1])


def quantities_of(groups_effect: dict[str, float], n: int, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    rows, groups = {}, {}
    for group, shift in groups_effect.items():
        for index in range(n):
            run = f"{group}/seed{index}"
            occupancy = 0.3 + shift + 0.05 * rng.normal()
            rows[run] = {"occupancy of state 0": occupancy, "occupancy of state 1": 1 - occupancy,
                         "convergence step": 1000 + 2000 * shift + 50 * rng.normal()}  # fmt: skip
            groups[run] = group
    return pd.DataFrame.from_dict(rows, orient="index"), groups


def test_a_real_difference_is_found_with_an_interval_that_covers_it():
    quantities, groups = quantities_of({"kaiming": 0.0, "gradinit": 0.2}, n=32)
    verdicts = compare_methods(quantities, groups, n_permutations=500, seed=1)
    row = verdicts.set_index("quantity").loc["occupancy of state 0"]
    assert (row["first"], row["second"]) == ("kaiming", "gradinit")
    assert row["effect"] == pytest.approx(0.2, abs=0.04)
    assert row["low"] < 0.2 < row["high"] and row["p_holm"] < 0.01
    assert row["verdict"] == "gradinit higher"
    step = verdicts.set_index("quantity").loc["convergence step"]
    assert step["verdict"] == "gradinit higher" and step["effect"] > 0


def test_no_difference_and_not_enough_runs_are_said_in_words():
    same, groups = quantities_of({"a": 0.0, "b": 0.0}, n=32, seed=2)
    verdicts = compare_methods(same, groups, n_permutations=500)
    assert set(verdicts["verdict"]) == {NO_EVIDENCE}
    # 4 seeds per method: 2 / C(8, 4) = 0.029 > 0.05 / 2 tests of the secondary family (the two
    # occupancies), so not even a perfect separation could be significant after Holm's correction
    # within it; the convergence step, alone in the primary family here, is held to 0.05.
    few, few_groups = quantities_of({"a": 0.0, "b": 0.5}, n=4)
    verdicts = compare_methods(few, few_groups, n_permutations=500)
    secondary = verdicts[verdicts["family"] == "secondary"]
    assert len(secondary) == 2 and set(secondary["verdict"]) == {NOT_ENOUGH_RUNS}
    primary = verdicts[verdicts["family"] == "primary"].set_index("quantity")
    assert primary.loc["convergence step", "verdict"] == "b higher"
    assert smallest_p(4, 4, 500) == pytest.approx(2 / 70)
    # No run of either method converged: nothing to compare, and the table says so.
    few["convergence step"] = np.nan
    none = compare_methods(few, few_groups, n_permutations=50).set_index("quantity")
    assert none.loc["convergence step", "verdict"] == NOT_ENOUGH_RUNS
    assert none.loc["convergence step", "n_first"] == 0
    assert "not enough runs" in verdict_markdown(verdicts, 0.95)


def test_permutation_p_value_is_the_fraction_of_relabellings_as_extreme():
    quantities = pd.DataFrame({"q": [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0]},
                              index=[f"r{i}" for i in range(8)])  # fmt: skip
    groups = {f"r{i}": "a" if i < 4 else "b" for i in range(8)}
    verdicts = compare_methods(quantities, groups, n_permutations=4000, seed=0)
    # Only the observed split and its mirror are as extreme: exact p = 2 / 70.
    assert verdicts.loc[0, "p"] == pytest.approx(2 / 70, abs=0.01)
    assert verdicts.loc[0, "effect"] == pytest.approx(10.0)


def test_run_quantities_of_decoded_states():
    states = {"a": np.array([0, 0, 1, 1]), "b": np.array([0, 2, 2, 2])}
    table = run_quantities(states, 3, {"a": 30, "b": None}, {"b": "diverged"}, [2])
    assert table.loc["a", "occupancy of state 1"] == 0.5
    assert table.loc["b", "time in detour states"] == 0.75
    assert table.loc["a", "convergence step"] == 30 and np.isnan(table.loc["b", "convergence step"])


def test_a_stratified_draw_keeps_every_groups_count():
    from trainmap.dynamics.verdicts.certainty import (
        draw_within_groups,
        runs_by_group,
        split_within_groups,
    )

    groups = {f"a{i}": "a" for i in range(5)} | {f"b{i}": "b" for i in range(9)}
    ids = runs_by_group(list(groups), groups)
    for seed in range(20):
        counts = draw_within_groups(ids, np.random.default_rng(seed))
        for group, size in (("a", 5), ("b", 9)):
            assert sum(c for run, c in counts.items() if groups[run] == group) == size
    # Reselecting: each group's held-out part has the full fit's size in that group.
    train, held = split_within_groups(ids, ["a0", "b0", "b1"], np.random.default_rng(0))
    assert sum(c for r, c in held.items() if r[0] == "a") == 1
    assert sum(c for r, c in held.items() if r[0] == "b") == 2
    assert sum(train.values()) == 11


def test_the_bootstrap_resamples_within_each_method(fitted_map, monkeypatch):
    """A joint map's resamples (``strata_``: run -> method) draw each method's runs with
    replacement, as many as it has: seen by the refit each resample asks for."""
    import copy

    from trainmap.dynamics.maps.hmm.splits import SelectionFailed
    from trainmap.dynamics.verdicts import certainty

    hmm, runs, convergence = fitted_map
    joint = copy.copy(hmm)
    joint.strata_ = {run: "a" if i < 7 else "b" for i, run in enumerate(sorted(runs))}
    drawn: list[dict[str, float]] = []

    def recorded(raw, train, heldout, refit):
        drawn.append(dict(train) | dict(heldout))
        raise SelectionFailed("not needed here")

    monkeypatch.setattr(certainty, "refit_resample", recorded)
    result = bootstrap_map(joint, runs, convergence, {}, [], n_resamples=8, seed=2)
    assert len(drawn) == 8 and result.ks == [-1] * 8
    sizes = {"a": 7, "b": len(runs) - 7}
    for counts in drawn:
        for group, size in sizes.items():
            assert sum(c for r, c in counts.items() if joint.strata_[r] == group) == size
    assert len({tuple(sorted(counts.items())) for counts in drawn}) > 1


def test_a_refit_keeps_the_full_maps_k_on_a_few_runs(fitted_map):
    """By default a refit fits the full map's K once (no reselection): even 3 runs give K = 3."""
    from trainmap.dynamics.verdicts.certainty import Refit, refit_resample

    hmm, runs, _ = fitted_map
    raw = {run: table[hmm.features_].to_numpy(dtype=float) for run, table in runs.items()}
    few = dict.fromkeys(sorted(runs)[:3], 1.0)
    refit = refit_resample(raw, few, {}, Refit.of(hmm, max_iter=5))
    assert refit.selection.n_states == hmm.n_states_ == 3
    assert list(refit.selection.models) == [3]


def test_the_bootstrap_reports_each_states_jaccard_and_round_trips(fitted_map):
    from trainmap.dynamics.verdicts.certainty import BootstrapResult

    hmm, runs, convergence = fitted_map
    result = bootstrap_map(hmm, runs, convergence, {}, [], n_resamples=3, seed=1, max_iter=5)
    assert not result.reselect_k and result.ks == [3, 3, 3]
    assert len(result.jaccards) == 3 and all(len(j) == 3 for j in result.jaccards)
    assert min(result.state_jaccard) > 0.9 and result.states_reproduced() == [0, 1, 2]
    summary = result.to_dict()
    assert summary["states_reproduced"] == [0, 1, 2] and summary["state_dissolved"] == [0, 0, 0]
    assert BootstrapResult.from_dict(summary).to_dict() == summary
    # An older bootstrap.json (no per-state values): readable, as reselecting K.
    old = {k: v for k, v in summary.items()
           if k not in ("state_jaccard", "jaccards", "reselect_k")}  # fmt: skip
    again = BootstrapResult.from_dict(old)
    assert again.reselect_k and again.state_jaccard == [] and again.states_reproduced() == []
