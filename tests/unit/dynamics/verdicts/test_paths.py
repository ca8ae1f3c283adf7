"""Label-free verdicts (trainmap.dynamics.verdicts.paths): they find planted differences between methods'
paths, do not change when the map's states are renumbered, and refuse input they cannot answer."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.dynamics.maps.settings import AnalysisSettings
from trainmap.dynamics.maps.synthetic import sample_runs
from trainmap.dynamics.verdicts import paths, timecourse
from trainmap.dynamics.verdicts.compare import (
    DIFFER,
    PRIMARY,
    SECONDARY,
    START,
    PathEvidence,
    compare_methods,
    path_evidence,
    run_quantities,
    verdict_markdown,
)
from trainmap.dynamics.verdicts.joint import check_comparable, compare_groups


def _table(values: np.ndarray, steps: np.ndarray | None = None) -> pd.DataFrame:
    steps = np.arange(len(values)) * 10 if steps is None else steps
    return pd.DataFrame({"step": steps, "l2": values[:, 0], "l1": values[:, 1]})


def _runs_with_late_offset(offset: float, seed: int = 0, n: int = 12) -> dict[str, pd.DataFrame]:
    """n runs per method of two random-walk metrics; method b's l2 shifted by ``offset`` in the
    second half of training only."""
    rng = np.random.default_rng(seed)
    runs = {}
    for method in ("a", "b"):
        for i in range(n):
            values = np.cumsum(rng.normal(size=(50, 2)), axis=0) * 0.2
            if method == "b":
                values[25:, 0] += offset
            runs[f"{method}{i:02d}"] = _table(values)
    return runs


def _evidence(runs: dict[str, pd.DataFrame], states: dict[str, np.ndarray], k: int) -> PathEvidence:
    return path_evidence(runs, states, k, ["l2", "l1"], {}, grid_points=10)


def _pair(evidence: PathEvidence, groups: dict[str, str], permutations: int = 400) -> pd.DataFrame:
    quantities = run_quantities(evidence.states, evidence.n_states, {}, {}, [])
    return compare_methods(quantities, groups, n_permutations=permutations, seed=3, paths=evidence)


def test_the_trajectory_test_finds_a_late_offset_and_locates_it():
    runs = _runs_with_late_offset(offset=3.0)
    groups = {run: run[0] for run in runs}
    states = {run: np.zeros(50, dtype=int) for run in runs}
    table = _pair(_evidence(runs, states, 1), groups).set_index("quantity")
    row = table.loc[paths.TRAJECTORIES]
    assert row["family"] == START  # after the start window: a start outlasting it fires it too
    assert row["p"] < 0.01 and row["verdict"] == DIFFER
    assert row["low"] <= row["effect"] <= row["high"]
    evidence = _evidence(runs, states, 1)
    in_first = np.array([groups[r] == "a" for r in evidence.values])
    band = timecourse.time_resolved(evidence.values, in_first, evidence.features,
                                    evidence.checkpoints, 400, 0.05, np.random.default_rng(0))  # fmt: skip
    where = band.effect
    feature, step = np.unravel_index(np.abs(where.to_numpy()).argmax(), where.shape)
    assert where.index[feature] == "l2" and where.columns[step] >= 250
    assert band.windows()[0][0] >= 250  # nothing differs before the offset


def test_the_trajectory_test_finds_nothing_between_draws_of_one_method():
    runs = _runs_with_late_offset(offset=0.0, seed=5)
    groups = {run: run[0] for run in runs}
    states = {run: np.zeros(50, dtype=int) for run in runs}
    row = _pair(_evidence(runs, states, 1), groups).set_index("quantity").loc[paths.TRAJECTORIES]
    assert row["p"] > 0.05 and row["low"] <= 0 <= row["high"]


def _paths_runs(n: int = 10) -> tuple[dict[str, pd.DataFrame], dict[str, np.ndarray]]:
    """Method a goes 0 -> 1 -> 2, method b skips 1: 0 -> 2, and reaches 2 later."""
    rng = np.random.default_rng(1)
    runs, states = {}, {}
    for i in range(n):
        runs[f"a{i:02d}"] = _table(rng.normal(size=(30, 2)))
        runs[f"b{i:02d}"] = _table(rng.normal(size=(30, 2)))
        a_change, b_change = 5 + i % 3, 15 + i % 4
        states[f"a{i:02d}"] = np.array([0] * a_change + [1] * 5 + [2] * (25 - a_change))
        states[f"b{i:02d}"] = np.array([0] * b_change + [2] * (30 - b_change))
    return runs, states


def test_map_verdicts_find_a_skipped_state_a_different_transition_and_a_later_passage():
    runs, states = _paths_runs()
    groups = {run: run[0] for run in sorted(runs)}
    table = _pair(_evidence(runs, states, 3), groups).set_index("quantity")
    assert table.loc[paths.COLLAPSED_PATHS, "effect"] == pytest.approx(1.0)
    assert table.loc[paths.STATES_VISITED, "effect"] == pytest.approx(-1.0)
    assert table.loc[paths.STATES_VISITED, "verdict"] == "b lower"
    for quantity in (paths.COLLAPSED_PATHS, paths.TRANSITIONS):
        assert table.loc[quantity, "verdict"] == DIFFER
    assert table.loc[paths.FIRST_PASSAGE, "effect"] > 0  # b reaches state 2 later
    assert table.loc[paths.FIRST_PASSAGE, "verdict"] == "b higher"
    assert "state 2" in table.loc[paths.FIRST_PASSAGE, "note"]


def test_renumbering_the_states_changes_no_label_free_verdict():
    runs, states = _paths_runs()
    groups = {run: run[0] for run in sorted(runs)}
    renumber = np.array([2, 0, 1])  # state s -> renumber[s]
    renumbered = {run: renumber[path] for run, path in states.items()}
    before = _pair(_evidence(runs, states, 3), groups).set_index("quantity")
    after = _pair(_evidence(runs, renumbered, 3), groups).set_index("quantity")
    label_free = [paths.TRANSITIONS, paths.STATES_VISITED, paths.FIRST_PASSAGE,
                  paths.COLLAPSED_PATHS, paths.TRAJECTORIES]  # fmt: skip
    columns = ["effect", "low", "high", "p", "verdict"]
    pd.testing.assert_frame_equal(before.loc[label_free, columns], after.loc[label_free, columns])
    # the state-level verdicts do depend on it: their quantities are named by state number
    assert (before.loc["occupancy of state 1", "effect"]
            != after.loc["occupancy of state 1", "effect"])  # fmt: skip


def test_holm_runs_within_each_family():
    runs, states = _paths_runs()
    groups = {run: run[0] for run in sorted(runs)}
    table = _pair(_evidence(runs, states, 3), groups)
    start = table[table["family"] == START]
    primary = table[table["family"] == PRIMARY]
    secondary = table[table["family"] == SECONDARY]
    assert list(table["family"]) == ([START] * len(start) + [PRIMARY] * len(primary)
                                     + [SECONDARY] * len(secondary))  # fmt: skip
    # Holm over the secondary family alone: the smallest p is multiplied by its size, not the
    # table's
    tested = secondary[np.isfinite(secondary["p"])]
    smallest = tested["p"].idxmin()
    assert tested.loc[smallest, "p_holm"] == pytest.approx(
        min(1.0, tested["p"].min() * len(tested))
    )
    markdown = verdict_markdown(table, 0.95)
    assert markdown.index("The path") < markdown.index("State-level verdicts")


def test_diverged_runs_are_left_out_of_the_label_free_verdicts():
    runs, states = _paths_runs()
    runs["a00"] = runs["a00"].iloc[:5]  # diverged early: its table stops
    evidence = path_evidence(runs, states, 3, ["l2", "l1"], {"a00": "diverged"}, grid_points=10)
    assert "a00" not in evidence.states and "a00" not in evidence.trajectories.index


def test_final_state_is_where_most_runs_end_whatever_its_number():
    assert paths.final_state({"r1": np.array([0, 1, 3]), "r2": np.array([1, 3]),
                              "r3": np.array([0, 2])}) == 3  # fmt: skip
    assert paths.first_passage(np.array([0, 0, 2, 2]), np.array([0, 10, 20, 30]), 2) == (20.0, True)
    assert paths.first_passage(np.array([0, 0, 1]), np.array([0, 10, 20]), 2) == (20.0, False)
    assert paths.collapse(np.array([0, 0, 2, 2, 3, 3])) == (0, 2, 3)


def test_runs_too_short_for_a_common_grid_are_named():
    runs = {"long": _table(np.zeros((100, 2))), "short": _table(np.zeros((20, 2)))}
    with pytest.raises(ValueError, match="run short ends at step 190"):
        paths.common_grid(runs, 20)
    with pytest.raises(ValueError, match="analysis.trajectory_points"):
        paths.common_grid(runs, 1)


def test_fewer_permutations_than_alpha_allows_are_refused():
    runs, states = _paths_runs()
    groups = {run: run[0] for run in sorted(runs)}
    quantities = run_quantities(states, 3, {}, {}, [])
    with pytest.raises(ValueError, match=r"analysis.permutations 10: .* >= 20"):
        compare_methods(quantities, groups, n_permutations=10, alpha=0.05)


def test_a_group_with_one_run_is_refused_before_any_fit():
    runs, _, _ = sample_runs(3, n_runs=5, length=40, seed=0)
    groups = {run: ("a" if i < 4 else "b") for i, run in enumerate(runs)}
    with pytest.raises(ValueError, match=r"group 'b' has 1 run \(run04\)"):
        check_comparable(runs, groups, {}, 20)
    hmm = TrainingHMM(k_max=2)
    with pytest.raises(ValueError, match="group 'b'"):
        compare_groups(runs, groups, {}, {}, hmm)
    assert not hasattr(hmm, "n_states_")  # refused before the fit


def test_a_label_free_verdict_is_tested_again_on_subsamples():
    """The stability curve recomputes a followed label-free verdict on each subsample (its drawn
    runs' trajectories, their paths under the subsample's own map): a clear trajectory difference
    holds again; without the path evidence it could not be tested and would never hold."""
    import warnings

    from trainmap.dynamics.verdicts.stability import stability_curve

    runs, _, _ = sample_runs(3, n_runs=32, length=60, seed=4)
    groups = {run: ("a" if i < 16 else "b") for i, run in enumerate(sorted(runs))}
    shifted = {}
    for run, table in runs.items():
        table = table.copy()
        if groups[run] == "b":  # b's metrics higher by two of their SDs in the second half
            late = table.index >= len(table) // 2
            for column in table.columns[1:-1]:
                table.loc[late, column] += 2 * table[column].std()
        shifted[run] = table
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm = TrainingHMM(k_max=3, restarts=1)
        verdicts = AnalysisSettings.of({"permutations": 200}).verdict_settings
        comparison = compare_groups(shifted, groups, {}, {}, hmm, verdicts)
    key = f"b vs a, {paths.TRAJECTORIES}: {DIFFER}"
    curve = stability_curve(comparison.hmm, shifted, groups, {}, {}, [], ladder=[12],
                            n_subsamples=4, max_iter=5, verdicts=comparison.verdicts,
                            permutations=200, paths=comparison.paths)  # fmt: skip
    assert key in curve.verdicts
    assert curve.points[0].verdict_held[key] == 1.0
    blind = stability_curve(comparison.hmm, shifted, groups, {}, {}, [], ladder=[12],
                            n_subsamples=4, max_iter=5, verdicts=comparison.verdicts,
                            permutations=200)  # fmt: skip
    assert blind.points[0].verdict_held[key] == 0.0
