"""The known-answer sampler's misspecified forms (trainmap.dynamics.maps.synthetic.sample_runs):
``state_drift`` moves the level inside each state as a square root of the time in it, along the
path, and nothing else; ``length_spread`` cuts runs short; their defaults leave every sample as
it was."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from trainmap.dynamics.maps.synthetic import sample_runs
from trainmap.dynamics.metrics.columns import METRIC_NAMES

LENGTH = 80


def _standard(table: pd.DataFrame, truth) -> np.ndarray:
    """A table's metric values back in standard units."""
    return (table[list(METRIC_NAMES)].to_numpy() - truth.offset) / truth.scale


def _visits(states: np.ndarray) -> list[tuple[int, int, int]]:
    """(state, first checkpoint, end) of each visit of a state sequence."""
    starts = np.flatnonzero(np.r_[True, states[1:] != states[:-1]])
    ends = np.r_[starts[1:], len(states)]
    return [(int(states[s]), int(s), int(e)) for s, e in zip(starts, ends, strict=True)]


def test_the_defaults_leave_every_sample_as_it_was() -> None:
    plain, plain_states, _ = sample_runs(3, n_runs=3, length=50, seed=1)
    explicit, explicit_states, _ = sample_runs(3, n_runs=3, length=50, seed=1, state_drift=0.0,
                                               length_spread=1.0)  # fmt: skip
    assert list(plain) == list(explicit)
    for run in plain:
        pd.testing.assert_frame_equal(plain[run], explicit[run], check_exact=True)
        np.testing.assert_array_equal(plain_states[run], explicit_states[run])


def test_state_drift_moves_values_by_the_square_root_of_the_time_in_the_state() -> None:
    """Same seed: the same states and test_acc; each checkpoint moved by
    drift * sqrt(tau / dwell) within-state SDs along the path's step (0 at each state's entry)."""
    drift = 2.0
    plain, states, truth = sample_runs(3, n_runs=4, length=LENGTH, seed=1)
    moved, moved_states, _ = sample_runs(3, n_runs=4, length=LENGTH, seed=1, state_drift=drift)
    model = truth.model
    to_factors = np.linalg.pinv(truth.loadings)
    factor_means = model.means_ @ to_factors.T
    steps = np.diff(factor_means, axis=0)
    steps = np.vstack([steps, steps[-1]])  # the last state drifts along the step into it
    checked_ratio = False
    for run in plain:
        np.testing.assert_array_equal(states[run], moved_states[run])
        pd.testing.assert_series_equal(plain[run]["step"], moved[run]["step"])
        pd.testing.assert_series_equal(plain[run]["test_acc"], moved[run]["test_acc"])
        deviation = _standard(moved[run], truth) - _standard(plain[run], truth)
        # only along the factors: the features move together, as the loadings map the factors
        in_factors = deviation @ to_factors.T
        np.testing.assert_allclose(in_factors @ truth.loadings.T, deviation, atol=1e-8)
        for state, start, end in _visits(states[run]):
            np.testing.assert_allclose(deviation[start], 0.0, atol=1e-9)  # none at entry
            unit = steps[state] / np.linalg.norm(steps[state])
            spread = math.sqrt(unit @ to_factors @ model.covars_[state] @ to_factors.T @ unit)
            stay = model.transmat_[state, state]
            dwell = 1 / (1 - stay) if stay < 1 else LENGTH / (truth.n_states + 1)
            tau = np.arange(end - start)
            expected = (drift * spread * np.sqrt(tau / dwell))[:, None] * unit
            np.testing.assert_allclose(in_factors[start:end], expected, rtol=1e-6, atol=1e-8)
            if end - start > 4:  # sqrt(4) / sqrt(1): twice as far at tau 4 as at tau 1
                ratio = np.linalg.norm(deviation[start + 4]) / np.linalg.norm(deviation[start + 1])
                assert ratio == pytest.approx(2.0, rel=1e-6)
                checked_ratio = True
    assert checked_ratio


def test_length_spread_cuts_runs_short_with_their_states() -> None:
    """length_spread 2: lengths in [length / 2, length], not all equal; each run the first
    checkpoints of its full-length run, its true states cut with it."""
    full, full_states, _ = sample_runs(3, n_runs=20, length=LENGTH, seed=2)
    cut, cut_states, _ = sample_runs(3, n_runs=20, length=LENGTH, seed=2, length_spread=2.0)
    lengths = [len(table) for table in cut.values()]
    assert all(LENGTH // 2 <= n <= LENGTH for n in lengths)
    assert len(set(lengths)) > 1
    for run, table in cut.items():
        kept = len(table)
        assert len(cut_states[run]) == kept
        pd.testing.assert_frame_equal(table, full[run].iloc[:kept], check_exact=True)
        np.testing.assert_array_equal(cut_states[run], full_states[run][:kept])
        np.testing.assert_array_equal(table["test_acc"].to_numpy(),
                                      (cut_states[run] == 2).astype(float))  # fmt: skip
    again, _, _ = sample_runs(3, n_runs=20, length=LENGTH, seed=2, length_spread=2.0)
    assert [len(table) for table in again.values()] == lengths  # seeded


@pytest.mark.parametrize(
    ("option", "value"),
    [("state_drift", -0.5), ("state_drift", math.nan), ("state_drift", math.inf),
     ("length_spread", 0.5), ("length_spread", math.nan), ("length_spread", math.inf)],
)  # fmt: skip
def test_bad_values_name_the_option(option: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"{option} {value!r}"):
        sample_runs(3, n_runs=2, length=20, seed=0, **{option: value})
