"""The ``gain`` selection rule: K is the smallest K that no larger K beats by more than ``min_gain``
held-out nats per checkpoint per added state, every run held out once over the folds (the curve's
arithmetic, the known answer, a misspecified case where held-out BIC adds states, the setting's
checks, and a bootstrap refit that chooses K by the rule)."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pandas as pd
import pytest

from trainmap.dynamics.maps.hmm.curves import bic_minimum, choose_k, gain_curve
from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.dynamics.maps.hmm.selection import SELECTION_RULES, select_model
from trainmap.dynamics.maps.synthetic import sample_runs
from trainmap.dynamics.verdicts.certainty import Refit, refit_resample

MIN_GAIN = 0.4  # nats per checkpoint; explicit, so the tests do not follow the schema's default


def curve_of(log_likelihoods: list[float], observations: int = 1000) -> pd.DataFrame:
    """A folds curve of K = 1, 2, ... with these held-out log-likelihoods per checkpoint."""
    return pd.DataFrame({"n_states": np.arange(1, len(log_likelihoods) + 1),
                         "heldout_log_likelihood": np.array(log_likelihoods) * observations,
                         "heldout_observations": observations,
                         "bic": -2.0 * np.array(log_likelihoods) * observations})  # fmt: skip


@pytest.mark.parametrize(
    ("per_checkpoint", "tolerance", "k"),
    [
        ([0.0, 1.0, 1.5, 1.6, 1.7], 0.3, 3),  # 3 -> 4 adds 0.1 <= 0.3
        ([0.0, 1.0, 1.5, 1.6, 1.7], 0.05, 5),  # every step beats 0.05
        ([0.0, 1.0, 1.5, 1.6, 1.7], 0.6, 2),  # 2 -> 3 adds 0.5 <= 0.6
        ([0.0, 1.0, 1.1, 1.9, 1.9], 0.3, 4),  # 2 -> 4 adds 0.45 per state: a look past K + 1
        ([0.0, 1.0, 1.5, 1.4, 1.3], 0.0, 3),  # held-out log-likelihood falls after K = 3
    ],
)
def test_gain_curve_chooses_the_smallest_k_no_larger_k_beats_by_the_tolerance(
    per_checkpoint: list[float], tolerance: float, k: int
) -> None:
    curve = gain_curve(curve_of(per_checkpoint), tolerance)
    assert curve["ll_per_checkpoint"].to_numpy() == pytest.approx(per_checkpoint)
    assert curve.loc[curve["gain_chosen"], "n_states"].tolist() == [k]
    assert choose_k(curve) == k


def test_gain_curve_never_chooses_a_k_some_fold_could_not_score() -> None:
    curve = curve_of([0.0, 1.0, 1.5, 1.7])
    curve.loc[curve["n_states"] == 3, "bic"] = math.inf  # K = 3 failed on a fold
    chosen = gain_curve(curve, 0.3)
    assert math.isnan(chosen.loc[2, "ll_per_checkpoint"])
    assert choose_k(chosen) == 4  # 2 -> 4 adds 0.35 per state; K = 3 is passed over
    assert choose_k(gain_curve(curve, 0.4)) == 2


def test_the_gain_rule_finds_the_true_k_where_held_out_bic_does() -> None:
    runs, _, _ = sample_runs(3, n_runs=24, length=120, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm = TrainingHMM(selection="gain", min_gain=MIN_GAIN, restarts=2, k_max=5).fit(runs)
    assert "gain" in SELECTION_RULES
    assert hmm.n_states_ == 3
    assert bic_minimum(hmm.selection_) == 3  # the folds' held-out BIC agrees
    assert len(hmm.folds_) == 3 and sorted(sum(hmm.folds_, [])) == sorted(runs)
    per = hmm.selection_.set_index("n_states")["ll_per_checkpoint"]
    assert per[3] - per[2] > MIN_GAIN  # a real state adds more than the tolerance ...
    assert (per[4:] - per[3]).max() < MIN_GAIN  # ... a spurious one less


def test_the_gain_rule_adds_fewer_states_than_held_out_bic_when_the_noise_is_autocorrelated(
) -> None:  # fmt: skip
    """200 runs with AR(1) within-state noise (which no emission models): the held-out BIC, on
    the folds and on the paper's one split, adds a fourth state; the gain rule keeps three."""
    runs, _, _ = sample_runs(3, n_runs=200, length=100, seed=0, autocorrelation=0.9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gain = TrainingHMM(selection="gain", min_gain=MIN_GAIN, restarts=1, k_max=5).fit(runs)
        holdout = TrainingHMM(selection="holdout", restarts=1, k_max=5).fit(runs)
    assert bic_minimum(gain.selection_) == 4 and holdout.n_states_ == 4
    assert gain.n_states_ == 3


@pytest.mark.parametrize("min_gain", [-0.1, math.nan, math.inf])
def test_a_bad_min_gain_is_refused_naming_the_key(min_gain: float) -> None:
    with pytest.raises(ValueError, match="min_gain"):
        TrainingHMM(selection="gain", min_gain=min_gain)
    z = {f"run{i}": np.zeros((10, 2)) for i in range(4)}
    with pytest.raises(ValueError, match="analysis.min_gain"):
        select_model(z, dict.fromkeys(z, 1.0), {}, TrainingHMM().settings(), [1, 2],
                     selection="gain", min_gain=min_gain)  # fmt: skip


def test_a_refit_chooses_k_by_the_gain_rule_and_its_tolerance() -> None:
    """The bootstrap's and the stability curve's refit (refit_resample) reselects K through the
    same path: the gain curve, with the full fit's min_gain."""
    runs, _, _ = sample_runs(3, n_runs=24, length=120, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = TrainingHMM(selection="gain", min_gain=MIN_GAIN, restarts=1, k_max=4).fit(runs)
        raw = {run: table[full.features_].to_numpy(dtype=float) for run, table in runs.items()}
        # a bootstrap draw: every third run twice, the last four not at all
        resample = {run: 2.0 if i % 3 == 0 else 1.0 for i, run in enumerate(sorted(runs)[:-4])}
        refit = Refit.of(full, max_iter=10, reselect_k=True)
        assert refit.selection == "gain" and refit.reproducibility["min_gain"] == MIN_GAIN
        result = refit_resample(raw, resample, {}, refit)
        # a tolerance no state can beat: the same refit keeps one state
        strict = dataclasses.replace(refit, reproducibility=refit.reproducibility
                                     | {"min_gain": 100.0})  # fmt: skip
        strict_result = refit_resample(raw, resample, {}, strict)
    assert "gain_chosen" in result.selection.curve
    assert result.selection.n_states == 3
    assert strict_result.selection.n_states == 1


def test_the_tolerance_is_per_metric_and_the_gains_do_not_change_with_the_metrics_units() -> None:
    """min_gain_scale metrics: a map of d metrics takes min_gain * d / 14 (fixed: min_gain); and
    the held-out gains the rule reads do not change when each metric is multiplied by a constant
    (standardised z-scores are the same; a log-likelihood difference between Ks would not change
    with a linear change of units either), so neither does K."""
    from trainmap.dynamics.maps.hmm.selection import gain_tolerance
    from trainmap.dynamics.metrics.columns import METRIC_NAMES

    assert gain_tolerance(0.4, "metrics", 14) == 0.4 and gain_tolerance(0.4, "fixed", 7) == 0.4
    assert gain_tolerance(0.4, "metrics", 7) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="min_gain_scale"):
        gain_tolerance(0.4, "per_run", 7)
    runs, _, _ = sample_runs(3, n_runs=12, length=60, seed=2)
    seven = list(METRIC_NAMES[:7])
    factors = 10.0 ** np.arange(-3, 4)
    rescaled = {run: table.assign(**{m: table[m] * f for m, f in zip(seven, factors, strict=True)})
                for run, table in runs.items()}  # fmt: skip
    fits = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, data, scale in (("metrics", runs, "metrics"), ("fixed", runs, "fixed"),
                                  ("rescaled", rescaled, "metrics")):  # fmt: skip
            fits[name] = TrainingHMM(selection="gain", min_gain=MIN_GAIN, min_gain_scale=scale,
                                     restarts=1, k_max=4, features=seven).fit(data)  # fmt: skip
    curve = fits["metrics"].selection_
    assert choose_k(gain_curve(curve, MIN_GAIN * 7 / 14)) == fits["metrics"].n_states_
    assert choose_k(gain_curve(fits["fixed"].selection_, MIN_GAIN)) == fits["fixed"].n_states_
    np.testing.assert_allclose(np.diff(fits["rescaled"].selection_["ll_per_checkpoint"]),
                               np.diff(curve["ll_per_checkpoint"]), atol=1e-6)  # fmt: skip
    assert fits["rescaled"].n_states_ == fits["metrics"].n_states_
