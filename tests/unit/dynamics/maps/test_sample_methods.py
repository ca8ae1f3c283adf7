"""Two methods' runs with a planted difference (trainmap.dynamics.maps.synthetic.sample_methods): size 0
is one law for both groups, each effect at a large size shows in the true paths, and a seed fixes
the draws."""

from __future__ import annotations

import numpy as np
import pytest

from trainmap.dynamics.maps.synthetic import sample_methods, sample_runs

EFFECTS = ("detour", "fork", "slower", "offset", "start", "start_slow", "level", "scale")
N = 12  # runs per method


def _by_group(groups: dict[str, str], group: str) -> list[str]:
    return [run for run, label in groups.items() if label == group]


@pytest.mark.parametrize("effect", EFFECTS)
def test_size_zero_is_sample_runs_of_both_groups(effect: str) -> None:
    """At size 0 a's runs are sample_runs' and b's are its next runs, drawn from the same model:
    one law for both methods."""
    runs, groups, states, truth = sample_methods(effect, 0.0, N, length=80, seed=4, nuisance=0.5)
    reference, reference_states, known = sample_runs(3, n_runs=2 * N, length=80, seed=4,
                                                     nuisance=0.5)  # fmt: skip
    assert list(runs) == list(reference)
    assert len(_by_group(groups, "a")) == len(_by_group(groups, "b")) == N
    assert set(_by_group(groups, "a")) == set(list(reference)[:N])
    for run in runs:
        assert runs[run].equals(reference[run])
        np.testing.assert_array_equal(states[run], reference_states[run])
    np.testing.assert_array_equal(truth["a"].model.means_, known.model.means_)


def test_detour_only_b_visits_the_extra_state() -> None:
    runs, groups, states, truth = sample_methods("detour", 1.0, N, length=150, seed=1)
    extra = 3  # n_states: the detour state's number
    assert truth["b"].n_states == 4 and {(1, extra), (extra, 2)} <= truth["b"].true_edges()
    assert not any(extra in states[run] for run in _by_group(groups, "a"))
    visits = [extra in states[run] for run in _by_group(groups, "b")]
    assert sum(visits) >= N // 2
    for run in _by_group(groups, "b"):  # from the detour back to the path, never to the end
        path = states[run]
        after = path[1:][path[:-1] == extra]
        assert set(after.tolist()) <= {extra, 2}


def test_fork_ends_some_b_runs_in_another_final_state() -> None:
    runs, groups, states, _ = sample_methods("fork", 1.0, N, length=150, seed=1)
    ends = {group: [int(states[run][-1]) for run in _by_group(groups, group)] for group in "ab"}
    assert 3 not in ends["a"] and ends["b"].count(3) >= N // 2 and 2 not in ends["b"]
    for run in _by_group(groups, "b"):  # the other final state counts as converged
        assert (runs[run]["test_acc"].to_numpy() == 1.0).tolist() == (states[run] == 3).tolist()


def test_slower_lengthens_the_middle_dwell() -> None:
    """Mean dwell 3x as long (200 checkpoints cut b's longest dwells short)."""
    _, groups, states, _ = sample_methods("slower", 2.0, 2 * N, length=200, seed=2)
    dwell = {group: np.mean([(states[run] == 1).sum() for run in _by_group(groups, group)])
             for group in "ab"}  # fmt: skip
    assert dwell["b"] > 1.5 * dwell["a"]


def test_offset_moves_b_first_state() -> None:
    runs, groups, states, truth = sample_methods("offset", 3.0, N, length=60, seed=3)
    shift = truth["b"].model.means_[0] - truth["a"].model.means_[0]
    assert np.linalg.norm(shift) > 0
    np.testing.assert_array_equal(truth["b"].model.means_[1:], truth["a"].model.means_[1:])

    def first_state_mean(group: str) -> np.ndarray:
        metrics = [c for c in runs[next(iter(runs))].columns if c not in ("step", "test_acc")]
        values = [(runs[r][metrics].to_numpy() - truth["a"].offset) / truth["a"].scale
                  for r in _by_group(groups, group)]  # fmt: skip
        return np.concatenate([v[states[r] == 0] for v, r in
                               zip(values, _by_group(groups, group), strict=True)]).mean(axis=0)  # fmt: skip

    seen = first_state_mean("b") - first_state_mean("a")
    assert np.corrcoef(seen, shift)[0, 1] > 0.9


@pytest.mark.parametrize("effect", ["start", "start_slow", "level", "scale"])
def test_same_dynamics_effects_move_the_values_and_keep_the_states(effect: str) -> None:
    """start decays to nothing by a tenth of the run (start_slow by a fifth), level moves every
    checkpoint by one vector, scale multiplies the values about the first state's mean; b's true
    states are a's draws' (the dynamics unchanged)."""
    null, groups, null_states, truth = sample_methods(effect, 0.0, N, length=100, seed=3)
    runs, _, states, _ = sample_methods(effect, 4.0, N, length=100, seed=3)
    features = [c for c in runs["run00"].columns if c not in ("step", "test_acc")]
    scale = truth["a"].scale
    for run in _by_group(groups, "b"):
        np.testing.assert_array_equal(states[run], null_states[run])
        moved = (runs[run][features].to_numpy() - null[run][features].to_numpy()) / scale
        size = np.linalg.norm(moved, axis=1)
        if effect == "level":
            np.testing.assert_allclose(moved, np.repeat(moved[:1], len(moved), axis=0), atol=1e-9)
        elif effect == "scale":
            assert size.max() > 0
        else:
            gone = 10 if effect == "start" else 20
            assert size[0] > 0 and size[gone - 1] < size[0] and np.all(size[gone:] < 1e-9)
            np.testing.assert_allclose(size[: gone], size[0] * (1 - np.arange(gone) / gone),
                                       rtol=1e-6)  # fmt: skip
    for run in _by_group(groups, "a"):
        assert runs[run].equals(null[run])


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_seed_fixes_the_draws(effect: str) -> None:
    first = sample_methods(effect, 0.5, 4, length=40, seed=7, nuisance=1.0)
    again = sample_methods(effect, 0.5, 4, length=40, seed=7, nuisance=1.0)
    other = sample_methods(effect, 0.5, 4, length=40, seed=8, nuisance=1.0)
    assert first[1] == again[1]
    assert all(first[0][run].equals(again[0][run]) for run in first[0])
    assert not all(first[0][run].equals(other[0][run]) for run in first[0])


def test_refuses_what_it_cannot_plant() -> None:
    with pytest.raises(ValueError, match="effect 'wider'"):
        sample_methods("wider", 0.5, 4)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        sample_methods("detour", 1.5, 4)
