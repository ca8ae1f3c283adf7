"""Start, path and time (trainmap.dynamics.verdicts.timecourse): the start verdict sees a start, the path
verdict after the start window cannot see a start, a level or a scale, the max-T band holds its
family-wise error and names the steps where a difference lies, and bad schedules are refused."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from trainmap.dynamics.maps.synthetic import sample_methods
from trainmap.dynamics.verdicts import paths, timecourse
from trainmap.dynamics.verdicts.compare import (
    START,
    STARTS_DIFFER,
    compare_methods,
    path_evidence,
    run_quantities,
    verdict_markdown,
)


def _verdicts(runs: dict[str, pd.DataFrame], groups: dict[str, str], permutations: int = 300
              ) -> pd.DataFrame:  # fmt: skip
    """The label-free verdicts of runs with one state each (no map: the path verdicts here read
    the metrics)."""
    states = {run: np.zeros(len(table), dtype=int) for run, table in runs.items()}
    evidence = path_evidence(runs, states, 1, _features(runs), {}, grid_points=20)
    quantities = run_quantities(states, 1, {}, {}, [])
    return compare_methods(quantities, groups, n_permutations=permutations, seed=1,
                           paths=evidence).set_index("quantity")  # fmt: skip


def _features(runs: dict[str, pd.DataFrame]) -> list[str]:
    return [c for c in next(iter(runs.values())).columns if c not in ("step", "test_acc")]


@pytest.mark.parametrize("effect", ["start", "level", "scale"])
def test_a_start_a_level_or_a_scale_leaves_the_path_verdicts_exactly_as_under_the_null(effect):
    """The same draws with and without the planted effect: the start verdict sees the start, and
    the verdicts after the start window give the null's very numbers (each run's own level and
    scale removed; the start has decayed by the window)."""
    null, groups, _, _ = sample_methods("start", 0.0, 8, length=60, seed=2)
    planted, _, _, _ = sample_methods(effect, 8.0 if effect != "scale" else 1.0, 8, length=60,
                                      seed=2)  # fmt: skip
    before, after = _verdicts(null, groups), _verdicts(planted, groups)
    for quantity in (timecourse.DYNAMICS, paths.TRAJECTORIES):
        assert after.loc[quantity, "family"] == START
        np.testing.assert_allclose(after.loc[quantity, ["effect", "p"]].to_numpy(float),
                                   before.loc[quantity, ["effect", "p"]].to_numpy(float),
                                   rtol=1e-9, atol=1e-12)  # fmt: skip
    assert after.loc[timecourse.START, "family"] == START
    if effect in ("start", "level"):
        assert after.loc[timecourse.START, "verdict"] == STARTS_DIFFER
        assert before.loc[timecourse.START, "p"] > 0.05


def test_a_difference_in_the_course_after_the_window_is_a_path_difference():
    """b's runs end in another final state off the path: the same start, another course."""
    runs, groups, _, _ = sample_methods("fork", 1.0, 16, length=80, seed=0)
    table = _verdicts(runs, groups, permutations=200)
    assert table.loc[timecourse.DYNAMICS, "p"] < 0.01
    assert table.loc[timecourse.DYNAMICS, "low"] <= table.loc[timecourse.DYNAMICS, "effect"]
    assert table.loc[timecourse.DYNAMICS, "effect"] <= table.loc[timecourse.DYNAMICS, "high"]


def test_the_max_t_band_holds_its_family_wise_error_under_the_null():
    """200 null data sets of 40 cells: the share with any cell below alpha is within alpha's
    binomial interval (strong control: here every cell is null)."""
    rng = np.random.default_rng(0)
    in_first = np.arange(16) < 8
    hits = 0
    for _ in range(200):
        values = rng.standard_t(3, size=(16, 40))
        _, _, p = timecourse.max_t(values, in_first, 199, rng)
        hits += bool((p < 0.05).any())
    assert binomtest(hits, 200).proportion_ci().low <= 0.05


def test_the_band_names_the_steps_where_the_metrics_differ_and_no_others():
    rng = np.random.default_rng(3)
    steps = np.arange(30) * 10.0
    values = {f"r{i}": rng.normal(size=(2, 30)) for i in range(24)}
    in_first = np.arange(24) < 12
    for i in range(12, 24):
        values[f"r{i}"][0, 10:15] += 4.0  # metric 0, steps 100-140
    band = timecourse.time_resolved(values, in_first, ["l1", "l2"], steps, 500, 0.05, rng)
    assert band.windows() == [(100.0, 140.0)]
    sentence = band.sentence()
    assert "steps 100-140" in sentence and "1 of 2 metrics" in sentence
    assert "not equivalence" in sentence
    assert (band.p.loc["l2"] >= 0.05).all()


def test_runs_with_other_checkpoints_are_refused_naming_them():
    every_ten = pd.DataFrame({"step": np.arange(0, 200, 10), "l2": np.zeros(20)})
    every_twenty = pd.DataFrame({"step": np.arange(0, 200, 20), "l2": np.zeros(10)})
    with pytest.raises(ValueError, match=r"runs a0 \(a\) and b0 \(b\) save different checkpoints"):
        timecourse.shared_checkpoints({"a0": every_ten, "b0": every_twenty},
                                      {"a0": "a", "b0": "b"})  # fmt: skip
    # a run that saved more before the common span starts is fine: only the span is compared
    longer = pd.DataFrame({"step": np.arange(-50, 200, 10), "l2": np.zeros(25)})
    np.testing.assert_array_equal(timecourse.shared_checkpoints({"a": every_ten, "b": longer}),
                                  np.arange(0, 200, 10))  # fmt: skip


def test_a_start_window_that_covers_the_span_or_is_malformed_is_refused():
    steps = np.arange(0, 1000, 100.0)
    assert timecourse.window_end("10%", steps) == pytest.approx(90.0)
    assert timecourse.window_end(250, steps) == 250.0
    with pytest.raises(ValueError, match=r"start_window 900 ends at step 900, leaving 0"):
        timecourse.window_end(900, steps)
    with pytest.raises(ValueError, match="below 100 %"):
        timecourse.window_end("100%", steps)
    with pytest.raises(ValueError, match="start_window 'ten'"):
        timecourse.window_end("ten", steps)


def test_transition_rows_one_method_never_leaves_carry_no_comparison():
    first = np.array([[8.0, 2.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 0.0]])
    second = np.array([[8.0, 2.0, 0.0], [0.0, 0.0, 0.0], [0.0, 3.0, 9.0]])
    assert paths.transition_g(first, second) == pytest.approx(0.0)
    other = np.array([[2.0, 8.0, 0.0], [0.0, 0.0, 0.0], [0.0, 3.0, 9.0]])
    # G of the shared row alone: 2 sum n log(p_own / p_shared)
    own_a, own_b, shared = np.array([0.8, 0.2]), np.array([0.2, 0.8]), np.array([0.5, 0.5])
    expected = 2 * (np.array([8, 2]) @ np.log(own_a / shared)
                    + np.array([2, 8]) @ np.log(own_b / shared))  # fmt: skip
    assert paths.transition_g(first, other) == pytest.approx(expected)


def test_expected_transitions_count_every_step_of_a_run():
    from trainmap.dynamics.maps.hmm.estimator import TrainingHMM

    runs = sample_methods("start", 0.0, 4, length=40, seed=0)[0]
    hmm = TrainingHMM(k_max=4, restarts=1).fit(runs)
    counts = paths.expected_transitions(hmm.model_, [hmm.transform(t) for t in runs.values()])
    assert all(c.sum() == pytest.approx(39.0) for c in counts)


def test_the_start_family_is_shown_first_with_its_band():
    runs, groups, _, _ = sample_methods("start", 8.0, 6, length=40, seed=1)
    table = _verdicts(runs, groups, permutations=100).reset_index()
    markdown = verdict_markdown(table, 0.95)
    assert markdown.index("The start") < markdown.index("The path")


def test_the_answer_says_the_start_where_and_the_path_in_that_order():
    """answer_lines on a table whose start differs and whose course after the window does not: the
    start is the intervention's direct effect, the band's steps follow, then the path."""
    from trainmap.dynamics.verdicts.compare import answer_lines

    runs, groups, _, _ = sample_methods("start", 8.0, 8, length=60, seed=2)
    table = _verdicts(runs, groups).reset_index()
    start = table["quantity"] == timecourse.START
    table.loc[start, "note"] += "; the metrics differ at steps 0-60 of 0-590"
    (line,) = answer_lines(table)
    assert line.startswith("**b vs a**: start: the runs start apart (at step 0, p = ")
    assert line.index("start:") < line.index("where: the metrics differ at steps 0-60")
    assert line.index("where:") < line.index("path:")
    # these runs have no convergence step (no accuracy): the one path verdict cannot be had
    assert line.endswith("path: not enough runs to tell.")
    assert ") no evidence that the course differs" in line
