"""The training-maps paper's tables side by side (trainmap.dynamics.paper, rules
paper_map and paper_table), at smoke size."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import copy_workflow, snakemake

from trainmap.dynamics.maps.regression import (
    pairwise_distances,
    state_distribution,
    trajectory_dissimilarity,
)
from trainmap.dynamics.maps.settings import AnalysisSettings
from trainmap.dynamics.maps.synthetic import sample_runs
from trainmap.dynamics.paper import (
    PAPER,
    REPRODUCED,
    REVERSED,
    UNDECIDED,
    analysis_settings,
    claims,
    collapsed_bootstrap,
    contrasts,
    difference_interval,
    paper_row,
    table_markdown,
)
from trainmap.dynamics.pipeline import Outcomes, convergence_from_tables, map_runs
from trainmap.grid import ConfigError, load_config

SMALL = {"k_max": 4, "restarts": 2, "baseline_k_max": 4, "bootstrap": 12, "stability": 0,
         "n_iter": 50}  # fmt: skip


def _row(setting: str, analysis: str = "trainmap", *, r2: float, dissimilarity: float,
         detours: list[int], draws: int = 40, spread: float = 0.02, seed: int = 0,
         detour_share: float = 0.0) -> dict:  # fmt: skip
    """A hand-made paper_row dict whose bootstrap draws scatter around the given values."""
    rng = np.random.default_rng(seed)
    with_detour = int(round(detour_share * draws))
    return {
        "setting": setting, "analysis": analysis, "seeds": 40, "checkpoints": 301, "k": 3,
        "k_at_ceiling": False,
        "kmeans": 8, "hmm1": 5, "r2": r2, "r2_adjusted": r2, "p_value": 1e-4,
        "regression_runs": 40, "not_fitted": None, "never_converged": 0, "diverged": 0,
        "dissimilarity_state_index": dissimilarity,
        "dissimilarity_total_variation": dissimilarity / 2, "forking": bool(detours),
        "detours": detours, "detours_found_again": {str(d): 0.9 for d in detours},
        "detours_unchecked": detours + [7],
        "bootstrap_k": {3: draws}, "bootstrap_k_draws": [3] * draws,
        "bootstrap_r2": list(r2 + spread * rng.standard_normal(draws)),
        "bootstrap_dissimilarity": {
            "state_index": list(dissimilarity + spread * rng.standard_normal(draws)),
            "total_variation": list(dissimilarity / 2 + spread * rng.standard_normal(draws))},
        "bootstrap_detours": [1] * with_detour + [0] * (draws - with_detour),
        "stability": "stable from n = 16 seeds",
    }  # fmt: skip


# --- the paper's numbers and the claims -------------------------------------------------------


def test_the_paper_rows_are_tables_1_2_and_4() -> None:
    sparse, modular = PAPER["sparse_parities"], PAPER["modular_addition"]
    assert (sparse.r2, sparse.dissimilarity, sparse.k, sparse.kmeans, sparse.hmm1) == (
        0.961,
        0.183,
        6,
        16,
        13,
    )
    assert sparse.detours == (0,) and modular.detours == (2, 5)
    assert PAPER["modular_addition_stabilised"].k == 3 and not PAPER["mnist"].forking
    # Table 1's claim in the paper's own numbers: every forking setting above every linear one.
    forking = [p for p in PAPER.values() if p.forking]
    linear = [p for p in PAPER.values() if not p.forking]
    assert min(p.r2 for p in forking) > max(p.r2 for p in linear)
    assert min(p.dissimilarity for p in forking) > max(p.dissimilarity for p in linear)
    assert all(p.detours for p in forking) and not any(p.detours for p in linear)


def test_contrasts_pair_each_forking_setting_with_each_linear_one_papers_pairs_first() -> None:
    pairs = contrasts(["modular_addition_stabilised", "mnist_5k", "sparse_parities"])
    assert pairs == [("sparse_parities", "mnist_5k"),
                     ("sparse_parities", "modular_addition_stabilised")]  # fmt: skip
    assert contrasts(["mnist_5k", "modular_addition_stabilised"]) == []


def test_authors_pass_is_the_authors_script_as_they_ran_it() -> None:
    given = {"k_max": 6, "covariance_type": "diag", "bootstrap": 7}
    base = AnalysisSettings.of(given)
    assert analysis_settings(base, "trainmap").as_dict() == given
    authors = analysis_settings(base, "authors").as_dict()
    # model_selection.py run with --cov_type full --num_iters 32: hmmlearn's own start and tol
    # (0.01 on the total log-likelihood), per-run z-scores of the first 1000 rows, NaN runs out,
    # K = 1..8, 5 restarts, the mean BIC over them, 20 % held out.
    assert authors == given | {"standardisation": "per_run", "covariance_type": "full",
                              "init": "hmmlearn", "restart_rule": "mean", "n_iter": 32,
                              "tol": 0.01, "tol_scale": "total", "first_n": 1000,
                              "nan_runs": "runs", "k_max": 8, "restarts": 5, "holdout": 0.2,
                              "selection": "holdout", "emission": "plain"}  # fmt: skip
    with pytest.raises(ValueError, match="'mine'.*authors, trainmap"):
        analysis_settings(base, "mine")


def test_authors_pass_sees_the_authors_checkpoints_per_run_where_the_runs_have_them() -> None:
    def passed(analysis: str, setting: str, shortest: int) -> dict:
        return analysis_settings(AnalysisSettings.of({}), analysis, setting, shortest).as_dict()

    # Stabilised modular addition: 30 per run in the authors' plots; trainmap's runs keep 101.
    assert passed("authors", "modular_addition_stabilised", 101)["checkpoints_per_run"] == 30
    assert passed("authors", "sparse_parities", 601)["checkpoints_per_run"] == 300
    # MNIST: the authors' 250 are more than the 5k subset's 101 checkpoints: every one is used.
    assert passed("authors", "mnist_5k", 101)["checkpoints_per_run"] is None
    assert "checkpoints_per_run" not in passed("trainmap", "mnist_5k", 101)


def test_checkpoint_cuts_spread_evenly_then_take_the_first_rows() -> None:
    from trainmap.dynamics.metrics.tables import analysis_tables, checkpoint_rows

    assert checkpoint_rows(101, 30, None).tolist()[:4] == [0, 3, 7, 10]
    assert len(checkpoint_rows(101, 30, None)) == 30 and checkpoint_rows(101, 30, None)[-1] == 100
    assert checkpoint_rows(601, 300, 1000).tolist() == checkpoint_rows(601, 300, None).tolist()
    assert checkpoint_rows(10, None, 4).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="analysis.checkpoints_per_run: 300 is more than the "
                                         "run's 101 checkpoints"):  # fmt: skip
        checkpoint_rows(101, 300, None)
    assert len(checkpoint_rows(101, 30, 50)) == 30  # head(50) of 30 rows: all 30 (pandas' head)
    good = pd.DataFrame({"step": range(5), "l2": [1.0, 2, 3, 4, 5]})
    bad = good.assign(l2=[1.0, 2, float("nan"), 4, 5])
    tables, out = analysis_tables({"a": good, "b": bad}, ["l2"], nan_runs="runs")
    assert list(tables) == ["a"] and list(out) == ["b"]
    # Cut first: a NaN outside the rows the map sees does not drop the run (the authors' order).
    tables, out = analysis_tables({"a": good, "b": bad}, ["l2"], first_n=2, nan_runs="runs")
    assert list(tables) == ["a", "b"] and len(tables["b"]) == 2 and not out
    tables, out = analysis_tables({"a": good, "b": bad}, ["l2"])
    assert list(tables) == ["a", "b"] and not out


def test_difference_interval_is_the_percentile_interval_of_paired_differences() -> None:
    forking = [1.0, 2.0, 3.0, None, 5.0]
    linear = [0.0, 0.0, 1.0, 1.0, math.nan]
    low, high, n = difference_interval(forking, linear, 0.5)
    assert n == 3  # the pairs with a missing value are left out
    assert (low, high) == tuple(np.percentile([1.0, 2.0, 2.0], [25, 75]))
    assert difference_interval([None], [1.0], 0.95)[2] == 0


def test_claims_reproduced_reversed_and_undecided() -> None:
    forking = _row("sparse_parities", r2=0.9, dissimilarity=0.5, detours=[0], detour_share=0.9)
    linear = _row("mnist_5k", r2=0.1, dissimilarity=0.05, detours=[], detour_share=0.0, seed=1)
    verdicts = {c["claim"]: c for c in claims([forking, linear])}
    assert {c["verdict"] for c in verdicts.values()} == {REPRODUCED}
    r2 = verdicts["R^2 higher where the map forks"]
    assert r2["difference"] == pytest.approx(0.8) and 0 < r2["low"] < 0.8 < r2["high"]
    # the other ordering: reversed; overlapping draws: undecided
    swapped = claims([_row("sparse_parities", r2=0.1, dissimilarity=0.05, detours=[]),
                      _row("mnist_5k", r2=0.9, dissimilarity=0.5, detours=[1],
                           detour_share=0.9)])  # fmt: skip
    assert {c["verdict"] for c in swapped} == {REVERSED}
    close = claims([_row("sparse_parities", r2=0.50, dissimilarity=0.2, detours=[0],
                         spread=0.2, detour_share=0.3),
                    _row("mnist_5k", r2=0.49, dissimilarity=0.2, detours=[], spread=0.2, seed=3,
                         detour_share=0.2)])  # fmt: skip
    assert {c["verdict"] for c in close} == {UNDECIDED}


def test_claims_are_made_within_each_analysis_pass() -> None:
    rows = [_row("sparse_parities", "authors", r2=0.9, dissimilarity=0.5, detours=[0]),
            _row("mnist_5k", "trainmap", r2=0.1, dissimilarity=0.1, detours=[])]  # fmt: skip
    assert claims(rows) == []  # no pass ran both settings
    rows += [_row("mnist_5k", "authors", r2=0.1, dissimilarity=0.1, detours=[])]
    assert {c["analysis"] for c in claims(rows)} == {"authors"}


def test_table_lists_paper_values_claims_and_the_commands_of_settings_not_run() -> None:
    rows = [_row("sparse_parities", r2=0.9, dissimilarity=0.5, detours=[0], detour_share=0.9),
            _row("mnist_5k", r2=0.1, dissimilarity=0.05, detours=[])]  # fmt: skip
    text = table_markdown(rows, claims(rows), not_run=["modular_addition", "cifar100"])
    assert "| Sparse parities | trainmap | 40 (40) | 301 | 3 (6) | 8 (16) | 5 (13) |" in text
    authors = table_markdown([rows[0] | {"analysis": "authors"}], [])
    assert "| Sparse parities | authors | 40 (40) | 301 (300) | 3 (6) |" in authors
    assert "(0.961)" in text and "MNIST (5k subset)" in text and "(0.049)" in text
    # the detour, found again in 90 % of resamples; the paper's; the paper's rule without a test
    assert "| 0 (90%) (0) | 0, 7 |" in text
    assert "**reproduced**" in text
    assert "config/paper/modular_addition.yaml" in text and "config/paper/cifar100.yaml" in text
    assert "stable from n = 16 seeds" in text


def test_bootstrap_cell_names_the_states_that_reproduce_at_the_maps_own_k() -> None:
    row = _row("sparse_parities", r2=0.9, dissimilarity=0.3, detours=[0])
    fixed = row | {"bootstrap_reselect_k": False, "bootstrap_state_jaccard": [0.91, 0.62, 0.8]}
    text = table_markdown([fixed], [])
    # states 0 and 2 reach Hennig's 0.75; state 1 does not, and its Jaccard is shown
    assert "| 0, 2 of 3 (Jaccard 0.91, 0.62, 0.80) |" in text
    none = fixed | {"bootstrap_state_jaccard": [0.5, 0.6, 0.7]}
    assert "| none of 3 (Jaccard 0.50, 0.60, 0.70) |" in table_markdown([none], [])
    # a bootstrap that reselected K (or a file without per-state values) gives its K counts
    assert "| 3: 40 |" in table_markdown([fixed | {"bootstrap_reselect_k": True}], [])
    assert "| 3: 40 |" in table_markdown([row], [])


def test_table_warns_when_the_resamples_collapse_to_one_state_and_only_then() -> None:
    row = _row("mnist_5k", r2=0.1, dissimilarity=0.05, detours=[])
    collapsed = row | {"bootstrap_k": {1: 197, 2: 3}}
    text = table_markdown([collapsed], [])
    assert "Bootstrap, MNIST (5k subset), trainmap: 197 of 200 resamples select K = 1" in text
    assert "K = 3" in collapsed_bootstrap(collapsed)
    assert collapsed_bootstrap(row) == ""  # every resample at the map's K
    assert collapsed_bootstrap(row | {"bootstrap_k": {1: 170, 3: 30}}) == ""  # 85 %: below 90 %
    assert collapsed_bootstrap(row | {"k": 1, "bootstrap_k": {1: 200}}) == ""  # a one-state map
    assert collapsed_bootstrap(row | {"bootstrap_k": {}}) == ""  # no bootstrap
    assert "Bootstrap," not in table_markdown([row], [])


# --- one map -> one row -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def mapped(tmp_path_factory) -> dict[str, Path]:
    """Known-answer runs (3 states) mapped by both passes with small settings."""
    runs, _, _ = sample_runs(3, n_runs=16, length=80, seed=4)
    outcomes = Outcomes(convergence_from_tables(runs, 0.5), dict.fromkeys(runs, "completed"))
    out = {}
    for analysis in ("authors", "trainmap"):
        out[analysis] = tmp_path_factory.mktemp(analysis)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            map_runs(runs, outcomes, analysis_settings(AnalysisSettings.of(SMALL), analysis),
                     out[analysis])  # fmt: skip
    return out


@pytest.mark.slow  # in-process, seconds
def test_paper_row_reads_what_the_one_analysis_path_wrote(mapped: dict[str, Path]) -> None:
    directory = mapped["trainmap"]
    row = paper_row(directory, "sparse_parities", "trainmap")
    detours = json.loads((directory / "detours.json").read_text())
    baselines = pd.read_csv(directory / "baselines.csv").set_index("model")["components"]
    assert (row["k"], row["kmeans"], row["hmm1"]) == (
        detours["n_states"],
        baselines["k-means"],
        baselines["HMM-1"],
    )
    assert row["seeds"] == 16 and row["r2"] == detours["r2"]
    states = pd.read_csv(directory / "states.csv", dtype={"run": str})
    distributions = {run: state_distribution(g["state"].to_numpy(), row["k"])
                     for run, g in states.groupby("run")}  # fmt: skip
    assert row["dissimilarity_state_index"] == pytest.approx(
        trajectory_dissimilarity(distributions, "state_index")
    )
    assert len(row["bootstrap_r2"]) == len(row["bootstrap_detours"]) == SMALL["bootstrap"]
    assert sum(row["bootstrap_k"].values()) == SMALL["bootstrap"]
    # the refits keep the map's K: each state's mean Jaccard, as bootstrap.json holds it
    bootstrap = json.loads((directory / "bootstrap.json").read_text())
    assert not row["bootstrap_reselect_k"] and row["bootstrap_k"] == {row["k"]: SMALL["bootstrap"]}
    assert row["bootstrap_state_jaccard"] == bootstrap["state_jaccard"]
    assert len(row["bootstrap_state_jaccard"]) == row["k"]


@pytest.mark.slow  # in-process, seconds
def test_bootstrap_records_each_resamples_r2_and_both_dissimilarities(mapped) -> None:
    row = paper_row(mapped["trainmap"], "sparse_parities", "trainmap")
    r2 = np.array([v for v in row["bootstrap_r2"] if v is not None])
    assert len(r2) > 0 and np.all((r2 >= 0) & (r2 <= 1))
    index = np.array(row["bootstrap_dissimilarity"]["state_index"], dtype=float)
    total = np.array(row["bootstrap_dissimilarity"]["total_variation"], dtype=float)
    # On states 0..K-1 the Wasserstein distance moves every unit of mass at least one state:
    # W1 >= total variation, resample by resample.
    assert np.all(index >= total - 1e-12) and np.all((total >= 0) & (total <= 1))


@pytest.mark.slow  # in-process, seconds
def test_authors_pass_fits_full_per_run_models_of_32_iterations(mapped: dict[str, Path]) -> None:
    authors = json.loads((mapped["authors"] / "hmm.json").read_text())
    ours = json.loads((mapped["trainmap"] / "hmm.json").read_text())
    estimator = authors["estimator"]
    assert (estimator["covariance_type"], estimator["standardisation"], estimator["restart_rule"],
            estimator["n_iter"], estimator["tol"], estimator["tol_scale"]) == (
        "full", "per_run", "mean", 32, 0.01, "total")  # fmt: skip
    assert max(row["iterations"] for row in authors["restarts"]) <= 32
    assert '"full"' in json.dumps(ours) and '"pooled"' in json.dumps(ours)


def test_pairwise_distances_match_scipy_on_random_distributions() -> None:
    from scipy.stats import wasserstein_distance

    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(5), size=6)
    ours = pairwise_distances(p, "state_index")
    pairs = [(i, j) for i in range(6) for j in range(i + 1, 6)]
    support = np.arange(5)
    scipy = [wasserstein_distance(support, support, p[i], p[j]) for i, j in pairs]
    assert ours == pytest.approx(scipy, abs=1e-12)
    assert pairwise_distances(p) == pytest.approx([0.5 * np.abs(p[i] - p[j]).sum()
                                                   for i, j in pairs])  # fmt: skip


# --- the config key ---------------------------------------------------------------------------


def _paper_config(repo_root: Path, tmp_path: Path, text: str) -> dict:
    path = tmp_path / "paper.yaml"
    path.write_text(text)
    return load_config(repo_root / "params.yaml", repo_root / "config/config.yaml", path,
                       check_paths_from=repo_root)  # fmt: skip


GRID = """grid:
  - {task: sparse_parity, archs: [mlp], methods: [kaiming], seeds: [0, 1, 2]}
analysis: {joint: []}
"""


def test_a_setting_the_paper_does_not_have_is_refused_by_name(repo_root, tmp_path) -> None:
    with pytest.raises(
        ConfigError, match=r"paper\[0\]\.setting: .*'sparse_parity'.*sparse_parities"
    ):
        _paper_config(repo_root, tmp_path, GRID + "paper:\n  - {setting: sparse_parity, task: "
                      "sparse_parity, arch: mlp, method: kaiming}\n")  # fmt: skip


def test_a_setting_whose_group_the_grid_does_not_train_is_refused(repo_root, tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"paper\[0\]: the grid trains 0 run\(s\) of "
                                          r"sparse_parity/mlp/gradinit"):  # fmt: skip
        _paper_config(repo_root, tmp_path, GRID + "paper:\n  - {setting: sparse_parities, task: "
                      "sparse_parity, arch: mlp, method: gradinit}\n")  # fmt: skip


def test_every_paper_config_this_machine_can_run_is_accepted(repo_root: Path) -> None:
    for name in ("cpu", "sparse_parities", "modular_addition_stabilised", "mnist_5k"):
        config = load_config(repo_root / "params.yaml", repo_root / "config/config.yaml",
                             repo_root / f"config/paper/{name}.yaml", check_paths_from=repo_root)  # fmt: skip
        assert config["paper"] and all(len(config["grid"][i]["seeds"]) == 40
                                       for i in range(len(config["grid"])))  # fmt: skip


# --- the workflow's target --------------------------------------------------------------------

TINY = """grid:
  - {task: sparse_parity, archs: [mlp], methods: [kaiming], seeds: [0, 1, 2, 3, 4, 5]}
  - {task: mnist_5k, archs: [mlp], methods: [kaiming], seeds: [0, 1, 2, 3]}
paper:
  - {setting: sparse_parities, task: sparse_parity, arch: mlp, method: kaiming}
  - {setting: mnist_5k, task: mnist_5k, arch: mlp, method: kaiming}
model:
  mnist_5k: {mlp: {hidden: [16]}}
train:
  sparse_parity: {steps: 300, checkpoint_every: 25, resume_every: 100, seed_block: 6}
  mnist_5k: {steps: 60, checkpoint_every: 5, resume_every: 30, seed_block: 4}
evaluate:
  sparse_parity: {latency_repeats: 2, threshold: 0.6}
  mnist_5k: {latency_repeats: 2, threshold: 0.5}
quantize: {methods: []}
analysis: {group_maps: none, joint: [], k_max: 3, restarts: 2, baseline_k_max: 3, bootstrap: 8,
           stability: 0}
mlflow: {experiment: trainmap-paper-smoke}
"""


@pytest.mark.integration
def test_paper_target_writes_the_side_by_side_table(tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path / "paper")
    (workdir / "config/tiny_paper.yaml").write_text(TINY)
    snakemake("paper", "--cores", "2", "--configfile", "config/tiny_paper.yaml", cwd=workdir)
    out = workdir / "results/paper"
    for setting in ("sparse_parities", "mnist_5k"):
        for analysis in ("authors", "trainmap"):
            assert (out / setting / analysis / "map.png").stat().st_size > 0
    table = (out / "table.md").read_text()
    assert table.count("| Sparse parities |") == 2 and table.count("MNIST (5k subset)") >= 2
    assert "## The paper's comparative claims" in table and "Sparse parities vs MNIST" in table
    assert "config/paper/modular_addition.yaml" in table  # a GPU row: its command
    frame = pd.read_csv(out / "table.csv")
    assert sorted(zip(frame["setting"], frame["analysis"], strict=True)) == [
        ("mnist_5k", "authors"), ("mnist_5k", "trainmap"), ("sparse_parities", "authors"),
        ("sparse_parities", "trainmap")]  # fmt: skip
    assert set(pd.read_csv(out / "claims.csv")["verdict"]) <= {REPRODUCED, REVERSED, UNDECIDED}
    assert (out / "table.png").stat().st_size > 0
    # resumable: a second run has nothing to do
    again = snakemake("paper", "-n", "--cores", "2", "--configfile", "config/tiny_paper.yaml",
                      cwd=workdir)  # fmt: skip
    assert "Nothing to be done" in again.stdout + again.stderr


def test_the_papers_detour_rule_alone_takes_positive_skipped_states_without_a_test() -> None:
    from trainmap.dynamics.paper import _unchecked_detours

    detours = {"coefficients": [
        {"state": 0, "coefficient": 0.8, "visited_by": 12, "visited_by_all": False, "p_holm": 0.4},
        {"state": 1, "coefficient": 0.9, "visited_by": 40, "visited_by_all": True, "p_holm": 0.01},
        {"state": 2, "coefficient": -0.3, "visited_by": 5, "visited_by_all": False, "p_holm": 0.01},
        {"state": 3, "coefficient": 0.1, "visited_by": 0, "visited_by_all": False, "p_holm": None},
        {"state": "method_b", "coefficient": 2.0, "visited_by": None, "visited_by_all": None},
    ]}  # fmt: skip
    assert _unchecked_detours(detours) == [0]


def test_analysis_runs_cut_every_run_and_leave_out_nan_runs_with_their_outcomes() -> None:
    from trainmap.dynamics.pipeline import analysis_runs

    table = pd.DataFrame({"step": range(0, 1010, 10), "l2": np.linspace(1, 2, 101),
                          "test_acc": np.linspace(0, 1, 101)})  # fmt: skip
    broken = table.assign(l2=np.where(table["step"] == 1000, np.nan, table["l2"]))  # kept: last
    runs = {"a": table, "b": broken}
    outcomes = Outcomes({"a": 300, "b": 400}, {"a": "completed", "b": "completed"})
    settings = AnalysisSettings.of({"features": ["l2"], "checkpoints_per_run": 30,
                                    "nan_runs": "runs"})  # fmt: skip
    with pytest.warns(UserWarning, match="1 of 2 runs left out of the map"):
        cut, kept = analysis_runs(runs, outcomes, settings)
    assert list(cut) == ["a"] and len(cut["a"]) == 30 and kept.convergence == {"a": 300}
    assert cut["a"]["step"].iloc[[0, -1]].tolist() == [0, 1000]
    # The convergence step stays the run's own: it comes from the whole history, not the cut.
    same, _ = analysis_runs(runs, outcomes, AnalysisSettings.of({"features": ["l2"]}))
    assert same["a"] is runs["a"] and len(same) == 2
