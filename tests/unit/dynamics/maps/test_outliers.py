"""Outlier runs (trainmap.dynamics.maps.outliers): a run whose decoded path enters a state fewer than
the share of runs enter is an outlier from its first such checkpoint; runs on shared states are not."""

from __future__ import annotations

import numpy as np
import pytest

from trainmap.dynamics.maps.outliers import outlier_runs, visit_shares

STEPS = np.array([0, 10, 20, 30, 40])


def nine_seeds() -> dict[str, np.ndarray]:
    """Nine runs through states 0 -> 1 -> 2; seed7 detours through state 3 from step 20, seed8
    through state 4 (which seed2 enters too) from step 30."""
    paths = {f"seed{i}": np.array([0, 0, 1, 2, 2]) for i in range(9)}
    paths["seed7"] = np.array([0, 0, 3, 3, 2])
    paths["seed8"] = np.array([0, 1, 1, 4, 2])
    paths["seed2"] = np.array([0, 1, 4, 2, 2])
    return paths


def test_a_run_entering_a_state_few_runs_visit_is_an_outlier_from_its_first_such_step() -> None:
    states = nine_seeds()
    assert visit_shares(states) == {0: 1.0, 1: 8 / 9, 2: 1.0, 3: 1 / 9, 4: 2 / 9}
    steps = dict.fromkeys(states, STEPS)
    assert outlier_runs(states, steps) == {
        "seed7": {"from_step": 20, "checkpoint": 2, "state": 3, "visit_share": 1 / 9}}  # fmt: skip
    # State 4 (2 of 9 runs, 22 %) becomes rare under a share of 0.25: both runs from their entry.
    wider = outlier_runs(states, steps, share=0.25)
    assert list(wider) == ["seed2", "seed7", "seed8"]
    assert (wider["seed2"]["from_step"], wider["seed8"]["from_step"]) == (20, 30)


def test_runs_that_share_every_state_have_no_outlier_and_a_bad_share_is_named() -> None:
    states = {f"seed{i}": np.array([0, 1, 2]) for i in range(5)}
    assert outlier_runs(states, dict.fromkeys(states, np.array([0, 1, 2]))) == {}
    with pytest.raises(ValueError, match="outlier share 1.5"):
        outlier_runs(states, dict.fromkeys(states, np.array([0, 1, 2])), share=1.5)
