"""The stability curve over seed counts, checked on runs from known HMMs.

Four known answers, 40-48 runs x 200-300 checkpoints each, fitted with small settings (K_max 4-5, 2
restarts, selection holdout; ~0.2 s a fit) and subsampled 10 times per n (~2 s a curve):

* weakly separated states (3 states, steps of 1.5 within-state SDs, 6 features): refits that
  reselect K merge two states in small subsamples (K = 2), so those states' Jaccard agreement
  rises with n and the map is stable only at the top of the ladder; refits that keep K (the
  default) place the three states alike from 8 runs on;
* well separated states (steps of 8, 4 features): stable from the smallest n;
* a map with a detour (a branch a part of the runs takes, converging later): the detour must be
  found again too;
* a joint comparison of two groups on the detour runs: its clear verdict (occupancy of the detour
  state) holds again from 8 runs per method, a marginal one (convergence step) not at 16, so the
  answer is not stable although the map is.

Per-state agreement itself (Hennig 2007's cluster-wise Jaccard) is checked on decodings built by
hand: a split or a merge lowers the states it touches only, whatever the refit's numbering.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.dynamics.maps.regression import regress_detours, state_distribution
from trainmap.dynamics.maps.settings import AnalysisSettings
from trainmap.dynamics.maps.synthetic import left_to_right_hmm, sample_runs
from trainmap.dynamics.metrics.weights import METRIC_NAMES
from trainmap.dynamics.verdicts.stability import default_ladder, draw_subsample, stability_curve
from trainmap.dynamics.verdicts.stability_results import (
    StabilityCurve,
    StabilityPoint,
    StabilityTargets,
    ladder_limit,
)

LADDER = [8, 16, 24, 32]


def fit(runs: dict[str, pd.DataFrame], n_features: int, k_max: int = 4) -> TrainingHMM:
    """A map of the runs with Gaussian emissions (the sampler's own: the curve's thresholds below
    were read on them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TrainingHMM(k_max=k_max, restarts=2, features=METRIC_NAMES[:n_features],
                           selection="holdout", emission="plain").fit(runs)  # fmt: skip


def outcomes(states: dict[str, np.ndarray], last: int) -> tuple[dict, dict]:
    """Convergence: the first step in the true last state (None: never reached)."""
    convergence = {run: int(np.argmax(s == last)) * 10 if (s == last).any() else None
                   for run, s in states.items()}  # fmt: skip
    return convergence, dict.fromkeys(states, "completed")


def known_map(separation: float, n_features: int) -> tuple:
    runs, states, _ = sample_runs(3, n_runs=40, seed=1, separation=separation,
                                  n_features=n_features)  # fmt: skip
    hmm = fit(runs, n_features)
    assert hmm.n_states_ == 3  # the full map recovers the truth: the curve measures subsamples
    return hmm, runs, *outcomes(states, 2)


@pytest.fixture(scope="module")
def weak():
    return known_map(separation=1.5, n_features=6)


@pytest.fixture(scope="module")
def weak_curve(weak):
    hmm, runs, convergence, status = weak
    return stability_curve(hmm, runs, None, convergence, status, [], ladder=LADDER,
                           n_subsamples=10, max_iter=10, reselect_k=True)  # fmt: skip


@pytest.fixture(scope="module")
def strong():
    return known_map(separation=8.0, n_features=4)


def detour_runs(n_runs: int = 40, length: int = 300, seed: int = 0) -> tuple:
    """Four states 0 -> {1 or 2} -> 2 -> 3: half the runs leaving state 0 take the detour 1 first
    (and so converge later), the others go straight to 2."""
    truth = left_to_right_hmm(4, n_features=4, length=length, separation=8.0, seed=seed)
    transmat = truth.model.transmat_.copy()
    leave = 1.0 - transmat[0, 0]
    transmat[0, 1], transmat[0, 2] = leave / 2, leave / 2
    truth.model.transmat_ = transmat
    runs, states = {}, {}
    for index in range(n_runs):
        values, hidden = truth.model.sample(length, random_state=seed * 1000 + index + 1)
        table = pd.DataFrame(values * truth.scale + truth.offset, columns=list(METRIC_NAMES[:4]))
        table.insert(0, "step", np.arange(length) * 10)
        runs[f"run{index:02d}"], states[f"run{index:02d}"] = table, hidden
    return runs, states


def test_stability_rises_with_n_when_states_are_weakly_separated(weak_curve):
    curve = weak_curve
    assert curve.ladder == LADDER and curve.n_states == 3
    points = curve.points
    means = [point.ari_mean for point in points]
    shares = [point.ari_share for point in points]
    # Monotone within subsampling noise (10 subsamples per n), and clearly up from 8 to 32 runs.
    assert all(later >= earlier - 0.05 for earlier, later in zip(means, means[1:], strict=False))
    assert means[-1] - means[0] > 0.15, means
    assert shares[0] <= 0.2 and shares[-1] >= 0.9, shares
    # Small subsamples merge two of the three states: those two states dissolve, the third
    # reproduces; at 32 runs every state does.
    assert points[0].k_same < 0.5 and points[-1].k_same >= 0.9
    assert points[0].ari_p10 < 0.8 <= points[-1].ari_p10
    assert len(points[0].states_reproduced()) < 3 and points[-1].states_reproduced() == [0, 1, 2]
    assert max(points[0].state_dissolved) >= 0.5
    assert curve.sufficient_n == 32
    assert curve.line().startswith(
        "stable from n = 32 seeds (every state of the full map reproduces, mean Jaccard >= 0.75"
    )
    assert "states 0, 1, 2 reproduce at n = 32 seeds" in curve.line()
    assert "mean ARI with the full map" in curve.line()


def test_well_separated_states_are_stable_from_the_smallest_n(strong):
    hmm, runs, convergence, status = strong
    curve = stability_curve(hmm, runs, None, convergence, status, [], ladder=[8, 16],
                            n_subsamples=10, max_iter=10)  # fmt: skip
    assert [point.ari_share for point in curve.points] == [1.0, 1.0]
    assert all(point.k_counts == {3: 10} for point in curve.points)
    assert curve.sufficient_n == 8
    assert curve.line().startswith("stable from n = 8 seeds (")


@pytest.mark.slow  # in-process, seconds
def test_a_detour_must_be_found_again_too():
    runs, states = detour_runs()
    hmm = fit(runs, 4, k_max=5)
    assert hmm.n_states_ == 4
    convergence, status = outcomes(states, 3)
    # Convergence measured with noise (SD 100 steps, a tenth of the detour's mean delay): the
    # regression finds the detour in half the subsamples of 8 runs, in 9 of 10 from 16 on.
    jitter = np.random.default_rng(0).normal(0.0, 100.0, len(convergence))
    convergence = {run: None if step is None else step + int(noise) for (run, step), noise in
                   zip(convergence.items(), jitter, strict=True)}  # fmt: skip
    decoded = hmm.decode(runs)
    distributions = {run: state_distribution(s, hmm.n_states_) for run, s in decoded.items()}
    detours = regress_detours(distributions, convergence, status).detour_states
    assert len(detours) == 1  # the decoded detour state (its number is the fit's)
    curve = stability_curve(hmm, runs, None, convergence, status, detours, ladder=LADDER,
                            n_subsamples=10, max_iter=10)  # fmt: skip
    found = [point.detour_found[detours[0]] for point in curve.points]
    assert found[0] < 0.9 and min(found[1:]) >= 0.9, found
    assert curve.points[0].ari_share >= 0.9  # the states agree at n = 8; the detour decides
    assert curve.sufficient_n == 16
    without = stability_curve(hmm, runs, None, convergence, status, [], ladder=LADDER[:1],
                              n_subsamples=10, max_iter=10)  # fmt: skip
    assert without.sufficient_n == 8  # the same map, no detour to find: stable from 8 runs
    assert "detours found again" in curve.line()
    summary = curve.to_dict()
    assert summary["detour_states"] == detours
    assert summary["points"][1]["detour_found"] == {str(detours[0]): 1.0}


def test_the_curve_is_seeded_and_does_not_depend_on_processes(weak):
    hmm, runs, convergence, status = weak
    kwargs = {"ladder": [8, 16], "n_subsamples": 4, "max_iter": 10, "seed": 5}
    serial = stability_curve(hmm, runs, None, convergence, status, [], **kwargs)
    again = stability_curve(hmm, runs, None, convergence, status, [], **kwargs)
    parallel = stability_curve(hmm, runs, None, convergence, status, [], n_jobs=2, **kwargs)

    def without_time(curve: StabilityCurve) -> dict:
        return {key: value for key, value in curve.to_dict().items() if key != "seconds"}

    assert without_time(serial) == without_time(again) == without_time(parallel)
    other = stability_curve(hmm, runs, None, convergence, status, [], **kwargs | {"seed": 6})
    assert [p.ari for p in other.points] != [p.ari for p in serial.points]


def test_the_ladder_stops_short_of_the_full_set(weak):
    assert default_ladder(40) == [8, 16, 24, 32]
    assert default_ladder(41) == [8, 16, 24, 32]  # floor(0.8 x 41) = 32
    assert default_ladder(50, step=10, max_fraction=0.5) == [10, 20]
    assert default_ladder(10) == [8] and default_ladder(6) == [4]  # below one step: the limit
    assert default_ladder(2) == [] and ladder_limit(40) == 32
    hmm, runs, convergence, status = weak
    curve = stability_curve(hmm, runs, None, convergence, status, [], n_subsamples=1, max_iter=3)
    assert curve.ladder == [8, 16, 24, 32]
    summary = curve.to_dict()
    assert summary["ladder_limit"] == 32 and summary["max_fraction"] == 0.8
    assert "inflated" in summary["ladder_note"] and summary["full_n"] == 40
    with pytest.raises(ValueError, match=r"ladder entry 36 is above the ladder limit 32"):
        stability_curve(hmm, runs, None, convergence, status, [], ladder=[8, 36])
    # In a joint comparison n counts per method: 20 runs each, so at most 16.
    groups = {run: "kaiming" if i < 20 else "gradinit" for i, run in enumerate(sorted(runs))}
    joint = stability_curve(hmm, runs, groups, convergence, status, [], n_subsamples=1,
                            max_iter=3)  # fmt: skip
    assert joint.ladder == [8, 16] and joint.ladder_limit == 16
    assert joint.to_dict()["group_sizes"] == {"gradinit": 20, "kaiming": 20}


def test_bad_inputs_are_refused_naming_the_value(weak):
    hmm, runs, convergence, status = weak
    groups = {run: "kaiming" if i < 20 else "gradinit" for i, run in enumerate(sorted(runs))}
    with pytest.raises(ValueError, match="ladder entry 24 is more than the 20 runs available "
                                         "per method"):  # fmt: skip
        stability_curve(hmm, runs, groups, convergence, status, [], ladder=[8, 24])
    with pytest.raises(ValueError, match="ladder entry 48 is more than the 40 runs available"):
        stability_curve(hmm, runs, None, convergence, status, [], ladder=[48])
    with pytest.raises(ValueError, match="ladder entry 1 is not allowed"):
        stability_curve(hmm, runs, None, convergence, status, [], ladder=[1, 8])
    for name, value in [("ari", 0.0), ("ari", 1.2), ("share", -0.1), ("share", 1.5)]:
        with pytest.raises(ValueError, match=f"stability target {name}: {value!r} is not allowed"):
            StabilityTargets(**{name: value})
    assert StabilityTargets(ari=1.0, share=1.0).share == 1.0
    with pytest.raises(ValueError, match="max_fraction: 1.5"):
        default_ladder(40, max_fraction=1.5)


def test_the_line_says_not_stable_and_names_the_largest_n(weak, weak_curve):
    hmm, runs, convergence, status = weak
    curve = stability_curve(hmm, runs, None, convergence, status, [], ladder=[8, 16],
                            n_subsamples=10, max_iter=10, reselect_k=True)  # fmt: skip
    assert curve.sufficient_n is None
    assert curve.line().startswith("not stable at n = 16 seeds: ")
    assert "of 3 states reproduce (mean Jaccard >= 0.75)" in curve.line()
    assert "does not (" in curve.line() or "do not (" in curve.line()
    assert "(target 90%; 10 subsamples per n, ladder up to 32 of 40 runs)" in curve.line()
    # A stricter target moves the verdict: the weak map never reaches ARI >= 0.99 in 100 %.
    strict = StabilityCurve.from_dict(weak_curve.to_dict() | {"targets": {
        "ari": 0.99, "share": 1.0, "require_k": True}})  # fmt: skip
    assert strict.sufficient_n is None and strict.line().startswith("not stable at n = 32 seeds")
    groups = {run: "kaiming" if i < 20 else "gradinit" for i, run in enumerate(sorted(runs))}
    joint = stability_curve(hmm, runs, groups, convergence, status, [], ladder=[4],
                            n_subsamples=2, max_iter=3)  # fmt: skip
    assert " seeds per method" in joint.line() and "of 20 runs per method" in joint.line()


def test_a_stable_n_below_an_unstable_one_does_not_count(weak_curve):
    summary = weak_curve.to_dict()
    first = summary["points"][0] | {"ari": [1.0] * 10, "ks": [3] * 10,
                                    "jaccard": [[1.0, 1.0, 1.0]] * 10}  # fmt: skip
    lucky = StabilityCurve.from_dict(summary | {"points": [first, *summary["points"][1:]]})
    assert lucky.points[0].meets(lucky.targets) and not lucky.points[1].meets(lucky.targets)
    assert lucky.sufficient_n == 32


def test_to_dict_is_json_and_round_trips(weak_curve):
    summary = weak_curve.to_dict()
    text = json.dumps(summary, allow_nan=False)
    again = StabilityCurve.from_dict(json.loads(text))
    assert again.to_dict() == summary
    assert summary["line"] == weak_curve.line() and summary["sufficient_n"] == 32
    point = summary["points"][0]
    assert point["n"] == 8 and point["n_subsamples"] == 10 and len(point["ari"]) == 10
    assert sum(point["k_counts"].values()) == 10


def test_subsamples_draw_n_runs_of_every_method_without_replacement():
    ids = {"a": [f"a{i}" for i in range(20)], "b": [f"b{i}" for i in range(12)]}
    train, heldout = draw_subsample(ids, 10, 0.2, np.random.default_rng(0))
    drawn = train + heldout
    assert len(drawn) == len(set(drawn)) == 20
    assert sum(run.startswith("a") for run in drawn) == 10
    # Split within each method as the full fit splits: round(0.2 x 10) = 2 held out of each.
    assert sorted(run[0] for run in heldout) == ["a", "a", "b", "b"]
    assert draw_subsample(ids, 2, 0.2, np.random.default_rng(1))[1] != []  # one always held out


@pytest.fixture(scope="module")
def detour_comparison():
    """A joint comparison of two 'methods' on the detour runs: b holds the runs that take the
    detour, a the others, so a's occupancy of the detour state is clearly lower (p_holm ~0.01) and
    a converges sooner, a verdict that only just passes at 23-25 runs per method (p_holm ~0.03)."""
    from trainmap.dynamics.verdicts.joint import compare_groups

    runs, states = detour_runs(n_runs=48)
    convergence, status = outcomes(states, 3)
    groups = {run: "b" if (states[run] == 1).any() else "a" for run in sorted(runs)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm = TrainingHMM(k_max=5, restarts=2, features=METRIC_NAMES[:4], selection="holdout")
        verdicts = AnalysisSettings.of({"permutations": 500}).verdict_settings
        comparison = compare_groups(runs, groups, convergence, status, hmm, verdicts)
    return runs, groups, convergence, status, comparison


def test_each_verdict_of_a_joint_comparison_is_tested_again_on_the_subsamples(detour_comparison):
    runs, groups, convergence, status, comparison = detour_comparison
    found = comparison.verdicts[~comparison.verdicts["verdict"].isin(
        ["no evidence of a difference", "not enough runs"])]  # fmt: skip
    assert len(found) >= 3 and comparison.detours.detour_states == [1]
    curve = stability_curve(comparison.hmm, runs, groups, convergence, status,
                            comparison.detours.detour_states, ladder=[4, 8, 16], n_subsamples=10,
                            max_iter=10, verdicts=comparison.verdicts,
                            permutations=500, paths=comparison.paths)  # fmt: skip
    # Only the verdicts that found a difference are followed, each named with its direction.
    assert len(curve.verdicts) == len(found)
    detour = "a vs b, occupancy of state 1: a lower"
    step = "a vs b, convergence step: a lower"
    assert {detour, step} <= set(curve.verdicts)
    held = {point.n: point.verdict_held for point in curve.points}
    # 4 runs per method cannot reach significance after Holm; the clear verdict holds from 8 on.
    assert held[4][detour] == 0.0 and held[8][detour] == held[16][detour] == 1.0
    # The marginal one does not hold at 16 per method: the map agrees (ARI, detour found again),
    # yet the answer is not stable, and the line names the verdict that fails.
    assert held[16][step] < 0.9 and curve.points[-1].ari_share == 1.0
    assert curve.sufficient_n is None
    weakest = min(held[16], key=held[16].get)  # the line names the verdict that holds least
    assert held[16][weakest] <= held[16][step] and f"({weakest}) (target 90%" in curve.line()
    # Each verdict's own seed count: the clear one from 8, the marginal one not at 16.
    assert curve.verdict_sufficient_n()[detour] == 8 and curve.verdict_sufficient_n()[step] is None
    assert f"{detour}: holds again from n = 8 seeds per method" in curve.verdict_lines()
    again = StabilityCurve.from_dict(json.loads(json.dumps(curve.to_dict(), allow_nan=False)))
    assert again.to_dict() == curve.to_dict()
    # Without the verdicts the same map is stable from 4: verdicts are part of the criterion.
    without = StabilityCurve.from_dict(curve.to_dict() | {"verdicts": [], "points": [
        p | {"verdict_held": {}} for p in curve.to_dict()["points"]]})  # fmt: skip
    assert without.sufficient_n == 4


def test_a_comparison_with_too_few_runs_for_any_verdict_is_not_stable(weak):
    from trainmap.dynamics.verdicts.compare import compare_methods, run_quantities

    hmm, runs, convergence, status = weak
    few = {run: runs[run] for run in sorted(runs)[:6]}
    groups = {run: "a" if i < 3 else "b" for i, run in enumerate(sorted(few))}
    quantities = run_quantities(hmm.decode(few), hmm.n_states_, convergence, status, [])
    verdicts = compare_methods(quantities, groups, n_permutations=200)
    assert (verdicts["verdict"] == "not enough runs").all()  # 3 vs 3 runs: p >= 0.1
    curve = stability_curve(hmm, few, groups, convergence, status, [], ladder=[2],
                            n_subsamples=2, max_iter=3, verdicts=verdicts)  # fmt: skip
    assert curve.unanswered and curve.sufficient_n is None
    assert curve.line().startswith("not stable at n = 3 seeds per method: too few runs")
    assert StabilityCurve.from_dict(curve.to_dict()).unanswered


# --- per-state agreement (Hennig 2007), on decodings built by hand -----------------------------


def plateau_runs(n_runs: int = 40, length: int = 100) -> np.ndarray:
    """Every run 0 (steps 0-29) -> 1 (30-59) -> 2 (60-99); the first 10 runs take a detour
    state 3 at steps 20-29 instead of 0. All runs' checkpoints pooled, as the curve pools them."""
    runs = []
    for index in range(n_runs):
        states = np.repeat([0, 1, 2], [30, 30, length - 60])
        if index < 10:
            states[20:30] = 3
        runs.append(states)
    return np.concatenate(runs)


FULL_MEANS = np.array([[0.0], [10.0], [20.0], [5.0]])  # 3, the detour, between 0 and 1


def agreement(full: np.ndarray, refit: np.ndarray, means: np.ndarray) -> list[float]:
    from trainmap.dynamics.verdicts.certainty import match_by_means, state_jaccard

    return state_jaccard(full, refit, match_by_means(FULL_MEANS, means), len(FULL_MEANS))


def test_a_refit_that_splits_one_state_lowers_that_state_only():
    """The refit splits the final plateau (state 2, steps 60-99) at step 80 into two states: the
    split state's Jaccard halves, every other state keeps 1."""
    full = plateau_runs()
    refit = full.copy().reshape(40, 100)
    refit[:, 80:] = 4
    means = np.vstack([FULL_MEANS, [[22.0]]])
    means[2] = [18.0]
    values = agreement(full, refit.ravel(), means)
    assert values[:2] == [1.0, 1.0] and values[3] == 1.0
    assert values[2] == pytest.approx(0.5)


def test_a_merged_detour_is_a_low_jaccard_where_ari_hardly_notices():
    """The refit has no detour state: its checkpoints go to state 0. The ARI of all checkpoints
    stays high (the detour is 2.5 % of them); the detour's Jaccard is 0, the others stay high."""
    from sklearn.metrics import adjusted_rand_score

    full = plateau_runs()
    refit = np.where(full == 3, 0, full)
    values = agreement(full, refit, FULL_MEANS[:3])
    assert adjusted_rand_score(full, refit) > 0.9
    assert values[3] == 0.0
    assert values[1] == values[2] == 1.0 and values[0] > 0.9
    point = StabilityPoint(8, 4, [4] * 5, [0.95] * 5, {}, jaccard=[values] * 5)
    assert point.states_reproduced() == [0, 1, 2] and point.state_dissolved == [0, 0, 0, 1.0]
    assert point.ari_share == 1.0 and not point.meets(StabilityTargets())


def test_relabelling_the_refits_states_changes_nothing():
    full = plateau_runs()
    rng = np.random.default_rng(0)
    refit = full.copy()
    refit[rng.random(len(refit)) < 0.1] = 1  # some disagreement, to have values below 1
    means = FULL_MEANS + 0.5
    before = agreement(full, refit, means)
    order = np.array([2, 3, 0, 1])  # refit state s is called order[s]
    relabelled_means = np.empty_like(means)
    relabelled_means[order] = means
    after = agreement(full, order[refit], relabelled_means)
    assert after == before and min(before) < 1.0


def test_the_line_names_the_states_that_reproduce_and_old_files_read_with_ari():
    jaccard = [[0.95, 0.4, 0.9]] * 10
    point = StabilityPoint(24, 3, [3] * 10, [0.97] * 10, {}, jaccard=jaccard)
    curve = StabilityCurve([point], StabilityTargets(), 40, 3, [], groups=["a", "b"])
    assert curve.sufficient_n is None
    assert curve.line().startswith("not stable at n = 24 seeds per method: 2 of 3 states "
                                   "reproduce (mean Jaccard >= 0.75)")  # fmt: skip
    assert (
        "states 0, 2 reproduce at n = 24 seeds per method (mean Jaccard >= 0.75); state 1 "
        "does not (0.40); mean ARI with the full map 0.97 (secondary)"
    ) in curve.line()
    summary = curve.to_dict()
    assert summary["states_reproduced"] == [0, 2] and "k_counts" not in summary["points"][0]
    assert StabilityCurve.from_dict(json.loads(json.dumps(summary))).to_dict() == summary
    # A stability.json written before per-state agreement: no jaccard, the ARI criterion.
    old = summary | {"points": [{k: v for k, v in p.items() if k != "jaccard"}
                                for p in summary["points"]]}  # fmt: skip
    old.pop("reselect_k")
    old["targets"] = {k: v for k, v in old["targets"].items() if k != "jaccard"}
    again = StabilityCurve.from_dict(old)
    assert again.sufficient_n == 24 and again.reselect_k
    assert again.line().startswith("stable from n = 24 seeds per method (ARI >= 0.9 with the "
                                   "full map in >= 90% of subsamples")  # fmt: skip


def test_refits_keep_the_full_maps_k_on_small_subsamples(weak):
    """By default no K is reselected: 8-run subsamples of the weakly separated map (which
    reselecting refits mostly fit with K = 2) keep K = 3, and its states reproduce."""
    hmm, runs, convergence, status = weak
    curve = stability_curve(hmm, runs, None, convergence, status, [], ladder=[8],
                            n_subsamples=4, max_iter=10)  # fmt: skip
    assert curve.points[0].ks == [3] * 4 and not curve.reselect_k
    assert curve.points[0].states_reproduced() == [0, 1, 2]
    assert "k_same" not in curve.to_dict()["points"][0]


def test_the_curves_refits_take_the_stability_restarts(strong, monkeypatch):
    """map_stability refits each subsample with analysis.stability_restarts fresh starts (the full
    fit keeps analysis.restarts); the bootstrap's warm start stays one start."""
    from trainmap.dynamics.verdicts import certainty
    from trainmap.dynamics.verdicts.certainty import Refit
    from trainmap.dynamics.verdicts.stability import map_stability

    hmm, runs, convergence, status = strong
    assert Refit.of(hmm, warm_start=False).restarts == hmm.restarts == 2
    assert Refit.of(hmm, warm_start=False, restarts=1).restarts == 1
    assert Refit.of(hmm, restarts=1).restarts == 1  # warm: one start whatever is asked
    seen = []
    original = certainty.Refit.of.__func__

    def spy(cls, *args, **kwargs):
        refit = original(cls, *args, **kwargs)
        seen.append(refit.restarts)
        return refit

    monkeypatch.setattr(certainty.Refit, "of", classmethod(spy))
    settings = AnalysisSettings.of({"stability": 2, "stability_step": 8, "permutations": 100,
                                    "stability_restarts": 1})  # fmt: skip
    map_stability(hmm, runs, None, convergence, status, [], settings.stability_settings)
    assert seen == [1]
