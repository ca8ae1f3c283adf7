"""Detour regression, dissimilarity, the training map and the joint comparison."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.dynamics.maps.regression import (
    regress_detours,
    state_distribution,
    trajectory_dissimilarity,
)
from trainmap.dynamics.maps.training_map import build_training_map, draw_training_map, transitions
from trainmap.dynamics.verdicts.joint import compare_groups


def detour_case(n_runs: int = 40, seed: int = 0):
    """Runs through states 0 -> 1 -> 2; half also pass through optional state 3, which costs a known
    delay per checkpoint spent there. State 1's share varies too but does not change convergence."""
    rng = np.random.default_rng(seed)
    distributions, convergence, sequences = {}, {}, {}
    for index in range(n_runs):
        lengths = [int(rng.integers(15, 25)), int(rng.integers(10, 30)), int(rng.integers(35, 45)),
                   int(rng.integers(5, 25)) if index % 2 else 0]  # fmt: skip
        sequence = np.repeat([0, 1, 3, 2], [lengths[0], lengths[1], lengths[3], lengths[2]])
        run = f"run{index:02d}"
        sequences[run] = sequence
        distributions[run] = state_distribution(sequence, 4)
        convergence[run] = int(1000 + 50 * lengths[3] + rng.normal(0, 20))
    return distributions, convergence, sequences


def test_state_distribution_is_the_bag_of_states():
    np.testing.assert_allclose(state_distribution(np.array([0, 0, 2, 2, 2, 1]), 4),
                               [2 / 6, 1 / 6, 3 / 6, 0])  # fmt: skip


def test_optional_delaying_state_is_a_detour_with_the_right_sign():
    distributions, convergence, _ = detour_case()
    result = regress_detours(distributions, convergence)
    table = result.coefficients.set_index("state")
    assert result.detour_states == [3]
    assert table.loc[3, "coefficient"] > 0 and table.loc[3, "p_value"] < 1e-6
    assert not table.loc[3, "visited_by_all"] and table.loc[3, "visited_by"] == 20
    assert table.loc[0, "visited_by_all"] and not table.loc[0, "detour"]
    assert result.r2 > 0.9 and result.f_pvalue < 1e-6
    # Effect coding: the state coefficients sum to zero.
    assert table["coefficient"].sum() == pytest.approx(0.0, abs=1e-6)
    assert result.n_runs == 40 and result.excluded == {"diverged": [], "never_converged": []}


def test_effect_coding_matches_a_direct_fit_and_its_standard_errors():
    """b_0 + b_k is the predicted convergence of a run spending all its time in state k, and the
    implicit last coefficient's standard error matches an explicit refit with another reference."""
    distributions, convergence, _ = detour_case()
    result = regress_detours(distributions, convergence)
    runs = sorted(distributions)
    x = np.array([distributions[r] for r in runs])
    y = np.array([convergence[r] for r in runs], dtype=float)
    # No-intercept fit on all four shares: coefficient k = predicted y when all time is in state k.
    direct, *_ = np.linalg.lstsq(x, y, rcond=None)
    table = result.coefficients.set_index("state")
    np.testing.assert_allclose(result.intercept + table["coefficient"].to_numpy(), direct,
                               rtol=1e-8)  # fmt: skip
    # Reorder the states so another one is the implicit reference: same numbers.
    permuted = {r: d[[3, 0, 1, 2]] for r, d in distributions.items()}
    again = regress_detours(permuted, convergence).coefficients.set_index("state")
    for new, old in enumerate([3, 0, 1, 2]):
        assert again.loc[new, "coefficient"] == pytest.approx(table.loc[old, "coefficient"])
        assert again.loc[new, "std_error"] == pytest.approx(table.loc[old, "std_error"])


def test_p_value_is_two_sided_for_negative_coefficients():
    distributions, convergence, _ = detour_case()
    table = regress_detours(distributions, convergence).coefficients
    negative = table[table["coefficient"] < 0].iloc[0]
    df = 40 - 4  # runs minus (intercept + 3 free state terms)
    expected = 2 * stats.t.sf(abs(negative["t"]), df)
    assert negative["p_value"] == pytest.approx(expected)
    assert negative["p_value"] <= 1.0 and negative["t"] < 0


def test_diverged_and_never_converged_runs_are_reported_not_dropped_silently():
    distributions, convergence, _ = detour_case()
    convergence["run00"] = None
    convergence["run01"] = None
    status = {"run01": "diverged"}
    result = regress_detours(distributions, convergence, status)
    assert result.excluded == {"diverged": ["run01"], "never_converged": ["run00"]}
    assert result.n_runs == 38


def test_dissimilarity_is_the_mean_pairwise_wasserstein_distance():
    distributions = {"a": np.array([1.0, 0, 0]), "b": np.array([0, 0, 1.0]),
                     "c": np.array([0.5, 0.5, 0])}  # fmt: skip
    pairs = [(1.0, 0, 0, 0, 0, 1.0), (1.0, 0, 0, 0.5, 0.5, 0), (0, 0, 1.0, 0.5, 0.5, 0)]
    expected = np.mean([stats.wasserstein_distance([0, 1, 2], [0, 1, 2], p[:3], p[3:])
                        for p in pairs])  # fmt: skip
    assert trajectory_dissimilarity(distributions, "state_index") == pytest.approx(expected)
    assert trajectory_dissimilarity({"a": distributions["a"], "a2": distributions["a"]}) == 0
    assert expected == pytest.approx((2 + 0.5 + 1.5) / 3)
    # Total variation (the default ground metric): the same optimal transport with cost 1
    # between any two different states.
    assert trajectory_dissimilarity(distributions) == pytest.approx((1 + 0.5 + 1) / 3)


def test_default_dissimilarity_does_not_depend_on_state_labels():
    """Eq. (1) over state indices changes when two arbitrary labels swap (a hand
    example: 1.333 -> 1.0); total variation does not."""
    distributions = {"a": np.array([1.0, 0, 0]), "b": np.array([0, 0, 1.0]),
                     "c": np.array([0.5, 0.5, 0])}  # fmt: skip
    swapped = {run: p[[1, 0, 2]] for run, p in distributions.items()}
    assert trajectory_dissimilarity(distributions, "state_index") == pytest.approx(4 / 3)
    assert trajectory_dissimilarity(swapped, "state_index") == pytest.approx(1.0)
    assert trajectory_dissimilarity(swapped) == trajectory_dissimilarity(distributions)
    with pytest.raises(ValueError, match="'wasser' is not a ground metric; choose one of"):
        trajectory_dissimilarity(distributions, "wasser")


def test_a_positive_optional_state_without_evidence_is_not_a_detour():
    """State 3 is optional and its coefficient happens to be positive, but convergence does not
    depend on it: not significant after Holm, so not a detour (the authors' rule would say so)."""
    distributions, convergence, _ = detour_case(seed=3)
    rng = np.random.default_rng(5)
    unrelated = {run: int(1000 + 25 * rng.normal()) for run in convergence}
    result = regress_detours(distributions, unrelated)
    table = result.coefficients.set_index("state")
    positive_optional = [k for k in range(4) if table.loc[k, "coefficient"] > 0
                         and not table.loc[k, "visited_by_all"]]  # fmt: skip
    assert result.detour_states == []
    assert all(table.loc[k, "p_holm"] >= 0.05 for k in positive_optional)
    # Holm: the smallest p-value is multiplied by the number of tests.
    tested = table["p_value"].dropna()
    assert table["p_holm"].dropna().min() == pytest.approx(min(1.0, tested.min() * len(tested)))
    found = regress_detours(*detour_case()[:2])
    threshold = found.coefficients.set_index("state").loc[3, "p_holm"] / 2
    strict = regress_detours(*detour_case()[:2], alpha=threshold)
    assert found.detour_states == [3] and strict.detour_states == [] and strict.alpha == threshold


def test_too_few_runs_for_the_regressors_are_not_fitted_and_say_why():
    distributions, convergence, _ = detour_case(n_runs=5)
    result = regress_detours(distributions, convergence)  # 5 runs, 3 state regressors
    assert not result.fitted and np.isnan(result.r2)
    assert "5 included runs for 3 regressors" in result.not_fitted
    summary = result.to_dict()
    assert summary["r2"] is None and summary["fitted"] is False and summary["detour_states"] == []
    enough = regress_detours(*detour_case(n_runs=6)[:2])
    assert enough.fitted and enough.not_fitted is None


def test_runs_that_all_converge_at_one_step_are_not_fitted_and_say_why():
    """E.g. sparse retraining from a converged teacher: every run is past the threshold at step 0.
    With method indicators (a joint comparison) the fit would otherwise report R^2 of 0/0."""
    distributions, convergence, _ = detour_case()
    same = dict.fromkeys(convergence, 0)
    extra = pd.DataFrame({"method_b": [i % 2 for i in range(len(same))]}, index=list(same))
    for result in (regress_detours(distributions, same),
                   regress_detours(distributions, same, extra=extra)):  # fmt: skip
        assert not result.fitted
        assert "converges at step 0: there is no variation" in result.not_fitted


def test_adjusted_r2_is_reported():
    distributions, convergence, _ = detour_case()
    result = regress_detours(distributions, convergence)
    n, p = 40, 3
    assert result.r2_adjusted == pytest.approx(1 - (1 - result.r2) * (n - 1) / (n - p - 1))
    assert result.to_dict()["r2_adjusted"] == pytest.approx(result.r2_adjusted)


def test_transitions_of_a_sequence():
    assert transitions(np.array([0, 0, 1, 1, 3, 1])) == [(2, 0, 1), (4, 1, 3), (5, 3, 1)]


def fake_runs(sequences: dict[str, np.ndarray], seed: int = 0) -> dict[str, pd.DataFrame]:
    """Metric tables whose features follow the state sequences (state means differ)."""
    rng = np.random.default_rng(seed)
    means = np.array([[0, 0, 0], [4, 0, 1], [4, 4, -3], [0, 8, 4]], dtype=float)
    return {
        run: pd.DataFrame(means[s] + rng.normal(0, 0.3, (len(s), 3)), columns=["a", "b", "c"])
        for run, s in sequences.items()
    }


def test_training_map_has_exactly_the_decoded_transitions(tmp_path):
    _, convergence, sequences = detour_case(n_runs=12)
    runs = fake_runs(sequences)
    hmm = TrainingHMM(k_max=4, restarts=2, random_state=0, features=("a", "b", "c")).fit(runs)
    states = hmm.decode(runs)
    training_map = build_training_map(hmm, runs, states, convergence)
    expected = {(j, k) for s in states.values() for _, j, k in transitions(s)}
    assert {(e.source, e.target) for e in training_map.edges} == expected
    for edge in training_map.edges:
        takers = [r for r, s in states.items() if (edge.source, edge.target) in
                  {(j, k) for _, j, k in transitions(s)}]  # fmt: skip
        assert edge.runs == len(takers) and edge.frequency == len(takers) / 12
        assert edge.mean_convergence_step == pytest.approx(
            np.mean([convergence[r] for r in takers])
        )
        assert len(edge.top_features) == 3
        # The reported change is the difference of the state means in z-units.
        means = hmm.state_means()
        for change in edge.top_features:
            assert change.change == pytest.approx(
                means.loc[edge.target, change.feature] - means.loc[edge.source, change.feature]
            )
    # The importance of an edge is the mean |gradient| over its occurrences.
    edge = training_map.edges[0]
    gradients = []
    for run, s in states.items():
        z = hmm.transform(runs[run])
        for t, j, k in transitions(s):
            if (j, k) == (edge.source, edge.target):
                gradients.append(hmm.feature_importance(z, k, t))
    top = edge.top_features[0]
    assert top.importance == pytest.approx(
        np.mean(gradients, axis=0)[hmm.features_.index(top.feature)]
    )
    assert sum(training_map.visited_by) >= 12
    caption = draw_training_map(training_map, tmp_path / "map.png", tmp_path / "map.svg",
                                detour_states=[3])  # fmt: skip
    assert (tmp_path / "map.png").read_bytes()[:4] == b"\x89PNG"
    assert b"<svg" in (tmp_path / "map.svg").read_bytes()[:400]
    assert "how many runs" in caption
    training_map.save(tmp_path / "map.json")
    assert (tmp_path / "map.json").stat().st_size > 100


def test_joint_comparison_shares_states_and_finds_the_group_with_detours():
    """Group 'slow' takes the optional delaying state, group 'fast' never does."""
    _, _, sequences = detour_case(n_runs=16)
    runs = fake_runs(sequences)
    groups = {run: "slow" if int(run[-2:]) % 2 else "fast" for run in runs}
    convergence = {run: 1000 + 5 * int((s == 3).sum()) for run, s in sequences.items()}
    status = {run: "completed" for run in runs}
    hmm = TrainingHMM(k_max=4, restarts=2, random_state=0, features=("a", "b", "c"))
    result = compare_groups(runs, groups, convergence, status, hmm)
    summary = result.summary()
    assert summary["n_states"] == hmm.n_states_
    assert len(result.detours.detour_states) == 1
    assert summary["groups"]["slow"]["detour_visit_rate"] == 1.0
    assert summary["groups"]["fast"]["detour_visit_rate"] == 0.0
    detour = result.detours.detour_states[0]
    assert result.occupancy.loc["fast", detour] == 0.0 < result.occupancy.loc["slow", detour]
    assert (summary["groups"]["slow"]["convergence_step_mean"]
            > summary["groups"]["fast"]["convergence_step_mean"])  # fmt: skip
    names = list(result.with_groups.coefficients["state"])
    assert "group:slow" in names or "group:fast" in names
    # Time in the detour sets each slow run's delay: the state explains more than the group does.
    assert summary["detours_explained_by_group"] == []


def test_a_detour_only_one_group_visits_is_flagged_when_the_group_explains_the_delay():
    """The slow group converges 300 steps later whatever time it spends in state 3: the pooled
    regression calls state 3 a detour, the regression with group indicators does not, and the
    joint comparison says so (joint.json and verdicts.md)."""
    _, _, sequences = detour_case(n_runs=16)
    runs = fake_runs(sequences)
    groups = {run: "slow" if int(run[-2:]) % 2 else "fast" for run in runs}
    rng = np.random.default_rng(1)
    convergence = {run: int(1000 + 300 * (groups[run] == "slow") + rng.normal(0, 20))
                   for run in runs}  # fmt: skip
    status = {run: "completed" for run in runs}
    hmm = TrainingHMM(k_max=4, restarts=2, random_state=0, features=("a", "b", "c"))
    result = compare_groups(runs, groups, convergence, status, hmm)
    assert len(result.detours.detour_states) == 1 and result.with_groups.detour_states == []
    assert result.summary()["detours_explained_by_group"] == result.detours.detour_states
    assert "not a detour once the group indicators enter" in result.verdict_markdown()


def test_a_one_state_map_explains_nothing_and_an_unfitted_one_is_unknown() -> None:
    one_state = {f"r{i}": np.array([1.0, 0.0]) for i in range(6)}
    convergence = {f"r{i}": 100 + 10 * i for i in range(6)}
    result = regress_detours(one_state, convergence)
    assert not result.fitted and result.one_state and result.explained == 0.0
    assert result.to_dict()["explained"] == 0.0
    two_states = {"a": np.array([1.0, 0.0]), "b": np.array([0.0, 1.0])}
    too_few = regress_detours(two_states, {"a": 1, "b": 2})
    assert not too_few.fitted and too_few.explained is None
    fitted = regress_detours({f"r{i}": np.array([i / 9, 1 - i / 9]) for i in range(10)},
                             {f"r{i}": 100 + 10 * i + (i % 3) for i in range(10)})  # fmt: skip
    assert fitted.fitted and fitted.explained == fitted.r2
