"""Model selection with a known answer: K, decoding and the map's edges.

Runs sampled from left-to-right Gaussian HMMs with 3 and 5 states over 14 correlated features
(two shared factors, raw units from 1e-3 to 1e3), 40 runs x 200 checkpoints, runs differing in
their time per state (:mod:`trainmap.dynamics.maps.synthetic`), go through the default preprocessing
and selection (``TrainingHMM()``). For each of 10 sampler seeds per true K: the chosen K equals the
truth in >= 9 of 10 seeds, and where it does the decoded states match the truth up to relabelling
on >= 95 % of checkpoints and the map keeps exactly the true transitions.

The 20 selections run in 2 processes (~1 minute on 2 idle cores); bench/hmm_select.py prints the
same table with the selection curves, the causes study and the costs.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from joblib import Parallel, delayed

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.dynamics.maps.synthetic import known_answer_scores, sample_runs
from trainmap.dynamics.maps.training_map import build_training_map

SEEDS = range(10)


def select_and_score(n_states: int, seed: int) -> dict:
    runs, states, truth = sample_runs(n_states, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm = TrainingHMM().fit(runs)
    decoded = hmm.decode(runs)
    training_map = build_training_map(hmm, runs, decoded, {run: None for run in runs})
    edges = {(edge.source, edge.target) for edge in training_map.edges}
    return {"k": hmm.n_states_, "at_ceiling": hmm.at_ceiling_} | known_answer_scores(
        decoded, edges, states, truth
    )


@pytest.fixture(scope="module")
def selections() -> dict[tuple[int, int], dict]:
    jobs = [(k, seed) for k in (3, 5) for seed in SEEDS]
    results = Parallel(n_jobs=2)(delayed(select_and_score)(k, seed) for k, seed in jobs)
    return dict(zip(jobs, results, strict=True))


@pytest.mark.slow  # in-process, seconds
@pytest.mark.parametrize("n_states", [3, 5])
def test_selection_finds_the_true_number_of_states(selections, n_states):
    chosen = [selections[(n_states, seed)]["k"] for seed in SEEDS]
    assert sum(k == n_states for k in chosen) >= 9, chosen
    assert not any(selections[(n_states, seed)]["at_ceiling"] for seed in SEEDS)


@pytest.mark.slow  # in-process, seconds
@pytest.mark.parametrize("n_states", [3, 5])
def test_decoding_and_edges_match_the_truth(selections, n_states):
    right = [selections[(n_states, s)] for s in SEEDS if selections[(n_states, s)]["k"] == n_states]
    accuracies = [result["accuracy"] for result in right]
    assert min(accuracies) >= 0.95, accuracies
    assert all(result["edges_match"] for result in right), [r["edges"] for r in right]


def test_diagonal_covariances_run_to_the_ceiling_on_correlated_features():
    """With correlated features a diagonal model's BIC keeps
    falling to K_max; the fit says so."""
    runs, _, _ = sample_runs(3, seed=0)
    with pytest.warns(UserWarning, match="still falling at K_max = 5"):
        hmm = TrainingHMM(k_max=5, restarts=2, covariance_type="diag").fit(runs)
    assert hmm.n_states_ == 5 and hmm.at_ceiling_
    assert np.all(np.diff(hmm.selection_["bic"]) < 0)


def test_folds_recover_k_under_run_nuisance_where_one_split_does_not():
    """Seeds differ by an offset, a scale and a drift of their metrics (``nuisance``).
    On this data set (true K = 5; bench/selection_nuisance.py: K = 5 for every estimator seed with
    3 folds) the paper's one held-out split selects K = 4; the mean held-out BIC over 3 folds of the
    runs, the model refitted on all of them, recovers K and decodes the states."""
    runs, states, truth = sample_runs(5, seed=0, nuisance=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one_split = TrainingHMM(restarts=2, selection="holdout").fit(runs)
        folds = TrainingHMM(restarts=2, selection="folds", folds=3).fit(runs)
    assert one_split.n_states_ == 4
    assert folds.n_states_ == 5, folds.selection_
    scores = known_answer_scores(folds.decode(runs), set(), states, truth)
    assert scores["accuracy"] >= 0.95


def test_no_nuisance_samples_are_unchanged_and_nuisance_is_seeded():
    plain, states, _ = sample_runs(3, n_runs=3, length=50, seed=2)
    zero, _, _ = sample_runs(3, n_runs=3, length=50, seed=2, nuisance=0.0)
    noisy, noisy_states, _ = sample_runs(3, n_runs=3, length=50, seed=2, nuisance=1.0)
    again, _, _ = sample_runs(3, n_runs=3, length=50, seed=2, nuisance=1.0)
    for run in plain:
        pd.testing.assert_frame_equal(zero[run], plain[run])
        pd.testing.assert_frame_equal(noisy[run], again[run])
        np.testing.assert_array_equal(noisy_states[run], states[run])  # the states stay
        assert not np.allclose(noisy[run]["l1"], plain[run]["l1"])


def test_the_growth_bench_refuses_a_k_max_below_the_true_k_before_any_fit(
    repo_root, monkeypatch, capsys
):
    """bench/selection_growth.py with --k-max below the sampler's true K stops at the argument
    (exit 2, naming the option, the true K and the fix) without sampling or fitting."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "selection_growth", repo_root / "bench/selection_growth.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "fit_one", lambda *a, **k: pytest.fail("fitted"))
    monkeypatch.setattr(bench, "sample", lambda *a, **k: pytest.fail("sampled"))
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--k-max", "2", "--csv", "/nonexistent/rows.csv"])
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert "--k-max 2 is below the sampler's true K = 3" in message
    assert "use --k-max 3 or more" in message
