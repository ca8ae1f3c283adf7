"""Maps without a convergence criterion, and curves that fall.

A suite of language-model checkpoints ships no accuracy curve: its map, states, occupancy and path
verdicts are made from the weights alone, and what needs a convergence step (the detour
regression, the convergence verdict, its stability line, the convergence figures) is left out, each
saying why. The map itself does not depend on the curve; a held-out loss converges at the first
checkpoint at or below its threshold."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from trainmap.dynamics.maps.settings import AnalysisSettings, make_hmm
from trainmap.dynamics.maps.synthetic import sample_methods, sample_runs
from trainmap.dynamics.pipeline import Outcomes, convergence_from_tables, map_runs
from trainmap.dynamics.verdicts.compare import CONVERGENCE_STEP, answer_lines
from trainmap.dynamics.verdicts.joint import compare_groups
from trainmap.evaluation import convergence_step

WHY = "the suite ships no curve"
SMALL = AnalysisSettings.of({
    "k_max": 3,
    "restarts": 2,
    "bootstrap": 0,
    "stability": 0,
    "permutations": 200,
    "selection": "holdout",
    "baseline_k_max": 2,
})  # fmt: skip


def test_a_falling_curve_converges_at_the_first_step_at_or_below_its_threshold() -> None:
    history = pd.DataFrame({"step": [0, 10, 20, 30], "test_loss": [5.0, 3.0, 2.0, 2.5],
                            "test_acc": [0.1, 0.5, 0.9, 0.8]})  # fmt: skip
    assert convergence_step(history, 3.0, "falling", "test_loss") == 10
    assert convergence_step(history, 1.0, "falling", "test_loss") is None
    assert convergence_step(history, 0.9) == 20  # rising test_acc: the paper's
    assert convergence_step(history, 3.0, "rising", "test_loss") == 0
    with pytest.raises(ValueError, match="'down'"):
        convergence_step(history, 3.0, "down", "test_loss")


def test_a_map_without_a_curve_is_the_same_map_and_leaves_out_the_regression(tmp_path) -> None:
    runs, _, _ = sample_runs(3, n_runs=6, length=30, seed=3)
    status = dict.fromkeys(runs, "completed")
    with_curve = Outcomes(convergence_from_tables(runs, 0.5), status)
    assert any(step is not None for step in with_curve.convergence.values())
    fit, regression, _ = map_runs(runs, with_curve, SMALL, tmp_path / "curve")
    bare, bare_regression, _ = map_runs(runs, Outcomes(dict.fromkeys(runs), status, WHY), SMALL,
                                        tmp_path / "bare")  # fmt: skip
    assert bare.hmm.n_states_ == fit.hmm.n_states_
    for run in runs:
        assert (bare.states[run] == fit.states[run]).all()
    detours = json.loads((tmp_path / "bare" / "detours.json").read_text())
    assert detours["fitted"] is False and WHY in detours["not_fitted"]
    assert detours["excluded"] == {} and detours["detour_states"] == []
    assert "no detour regression" in detours["not_fitted"]
    assert WHY in bare_regression.captions["convergence.png"]
    assert (tmp_path / "bare" / "map.json").is_file() and (
        tmp_path / "bare" / "states.csv"
    ).is_file()
    # with the curve, runs that never converge are listed; without one, no run is
    assert regression.summary["excluded"]["never_converged"] == sorted(
        run for run, step in with_curve.convergence.items() if step is None
    )


def test_a_comparison_without_a_curve_drops_only_the_convergence_verdict() -> None:
    """Holm runs within each family and the convergence step is the primary family's only
    per-run quantity: without a curve its row goes, and every other verdict is unchanged."""
    runs, groups, _, _ = sample_methods("detour", 0.6, 6, length=40, seed=2)
    status = dict.fromkeys(runs, "completed")
    verdicts = SMALL.verdict_settings
    convergence = convergence_from_tables(runs, 0.5)
    full = compare_groups(runs, groups, convergence, status, make_hmm(SMALL), verdicts)
    bare = compare_groups(runs, groups, dict.fromkeys(runs), status, make_hmm(SMALL), verdicts,
                          no_curve=WHY)  # fmt: skip
    assert CONVERGENCE_STEP in set(full.verdicts["quantity"])
    assert CONVERGENCE_STEP not in set(bare.verdicts["quantity"])
    kept = full.verdicts[full.verdicts["quantity"] != CONVERGENCE_STEP].reset_index(drop=True)
    columns = ["quantity", "effect", "p", "p_holm", "verdict"]
    pd.testing.assert_frame_equal(bare.verdicts[columns].reset_index(drop=True), kept[columns])
    assert not bare.detours.fitted and not bare.with_groups.fitted
    text = bare.verdict_markdown()
    assert text.count("Left out:") == 3 and text.count(WHY) == 3
    assert bare.summary()["no_curve"] == WHY and "no_curve" not in full.summary()
    assert "no verdict of the primary family" in answer_lines(bare.verdicts)[0]


def test_checkpoint_directories_map_without_a_curve_on_the_command_line(tmp_path, capsys) -> None:
    """Without --threshold a run directory needs no evaluation.csv; with one it does."""
    import torch

    from trainmap.dynamics.__main__ import main

    generator = torch.Generator().manual_seed(0)
    for run in ("a", "b", "c"):
        folder = tmp_path / "runs" / run
        folder.mkdir(parents=True)
        for step in range(0, 50, 10):
            state = {"fc1.weight": torch.randn(8, 4, generator=generator),
                     "fc1.bias": torch.randn(8, generator=generator),
                     "fc2.weight": torch.randn(2, 8, generator=generator)}  # fmt: skip
            torch.save(state, folder / f"step_{step}.pt")
    options = ["--out", str(tmp_path / "out"), "--features", "l1", "l2", "w_mean", "--k-max",
               "2", "--restarts", "1", "--bootstrap", "0", "--stability", "0"]  # fmt: skip
    with pytest.raises(SystemExit, match="evaluation"):
        main([str(tmp_path / "runs"), *options, "--threshold", "0.5"])
    main([str(tmp_path / "runs"), *options])
    detours = json.loads((tmp_path / "out" / "detours.json").read_text())
    assert not detours["fitted"] and "--threshold" in detours["not_fitted"]
    assert "no --threshold" in capsys.readouterr().out
