"""The stability curve's seed count against a direct Monte Carlo over fresh seeds.

:func:`trainmap.dynamics.verdicts.stability.stability_curve` answers "from which n does a map of n of our N
runs reproduce the map of all N" by *subsampling* the N runs. What a user wants to know is "are n
seeds enough", i.e. would a map of n *fresh* seeds agree. On runs from a known HMM the second
question can be answered directly: draw fresh sets of n runs from the true model (new sampler
seeds, none of them among the N), fit a :class:`~trainmap.dynamics.maps.hmm.estimator.TrainingHMM` on each with
the same settings, and measure the same criterion (ARI >= 0.9 of the decodings in >= 90 % of the
draws; :class:`~trainmap.dynamics.verdicts.stability_results.StabilityTargets`) against a reference:

* ``MC vs full``: the full N-run map's decoding of the N runs, the curve's own reference. Fresh
  maps share no run with the full fit, so the difference to the subsample curve at the same n is
  the overlap (n / N of the full fit's runs) plus the curve's warm starts;
* ``MC vs truth``: the true HMM's Viterbi decoding of the same N runs (the map of infinitely many
  seeds): the ground truth of "n seeds are enough".

Both criteria decode the same evaluation set (the N runs), so state numbers never matter (ARI).
Fresh fits are cold (the fit's own restarts); the curve's refits are warm-started from the full
map (k-step, ``max_iter`` 10, as in the workflow), so the curve is also shown cold (``sub cold``:
``warm_start=False``) to separate the two sources of optimism.

Setting: the known answer of ``tests/unit/dynamics/verdicts/test_stability.py`` (3 states, steps of 1.5
within-state SDs, 6 features, 200 checkpoints; K_max 4, 2 restarts). The full sets are the first N
runs of :func:`~trainmap.dynamics.maps.synthetic.sample_runs` (N = 40 and, to show what the ladder's cap
is for, N = 24); the fresh sets are later runs of the same sampler, disjoint from the full set and
from each other. The subsample curve is run up to n = N (``max_fraction`` 1) so that the bias near
N can be seen; the tool's answer is the curve up to its cap, floor(0.8 N).

Usage::

    .venv/bin/python bench/stability_validation.py            # ~6 min on 2 idle cores
    .venv/bin/python bench/stability_validation.py --quick    # ~2 min: 10 draws, no cold curve

Found (30 fresh sets, 20 subsamples, N = 40/24/16): the Monte Carlo is stable from n = 32 (share
0.87 at 24, 0.90 at 32, 0.97 at 40; ARI >= 0.9 exactly when K = 3 is selected). Below n = N the
curve is not optimistic: its shares are 0.1-0.17 *lower* than fresh sets' (warm or cold refits
alike), so the tool says "not stable up to 32" at N = 40 (0.80 at 32), one ladder step (factor
1.25) above the Monte Carlo. The overlap bias sits at n = N: share 1.0 (mean ARI 0.997-0.999)
against 0.87 (N = 24) and 0.97 (N = 40) for fresh sets of N runs.

Last line: ``stability_validation N=40 tool=.. mc_truth=.. mc_full=.. factor=.. | N=24 ...``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from trainmap.dynamics.metrics.columns import METRIC_NAMES

if TYPE_CHECKING:
    import pandas as pd

    from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
    from trainmap.dynamics.maps.synthetic import KnownHMM
    from trainmap.dynamics.verdicts.stability_results import StabilityTargets

#: The weakly separated known answer of tests/unit/dynamics/verdicts/test_stability.py.
SETTING = {"n_states": 3, "seed": 1, "separation": 1.5, "n_features": 6}
FEATURES = list(METRIC_NAMES[: SETTING["n_features"]])
K_MAX, RESTARTS, MAX_ITER = 4, 2, 10


@cache
def targets() -> StabilityTargets:
    """The library's default stability targets (made once, after the arguments are parsed)."""
    from trainmap.dynamics.verdicts.stability_results import StabilityTargets

    return StabilityTargets()


def fit_map(runs: Mapping[str, pd.DataFrame]) -> TrainingHMM:
    """A map with the known answer's settings (as the stability test fits)."""
    from trainmap.dynamics.maps.hmm.estimator import TrainingHMM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TrainingHMM(k_max=K_MAX, restarts=RESTARTS, features=FEATURES).fit(runs)


def draw_runs(n_runs: int) -> tuple[dict[str, pd.DataFrame], dict[str, np.ndarray], KnownHMM]:
    """The sampler's first ``n_runs`` runs, in sampler order (run00, run01, ..., run100, ...)."""
    from trainmap.dynamics.maps.synthetic import sample_runs

    runs, states, truth = sample_runs(SETTING["n_states"], n_runs=n_runs, seed=SETTING["seed"],
                                      separation=SETTING["separation"],
                                      n_features=SETTING["n_features"])  # fmt: skip
    order = sorted(runs, key=lambda run: int(run.removeprefix("run")))
    return {r: runs[r] for r in order}, {r: states[r] for r in order}, truth


def outcomes(states: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """Convergence: the first checkpoint in the true last state (as the stability test)."""
    last = SETTING["n_states"] - 1
    convergence = {run: int(np.argmax(s == last)) * 10 if (s == last).any() else None
                   for run, s in states.items()}  # fmt: skip
    return convergence, dict.fromkeys(states, "completed")


def truth_decoding(truth: KnownHMM, runs: Mapping[str, pd.DataFrame]) -> np.ndarray:
    """The true model's Viterbi states of ``runs`` (the map of infinitely many seeds)."""
    return np.concatenate([
        truth.model.predict((table[FEATURES].to_numpy(float) - truth.offset) / truth.scale)
        for table in runs.values()
    ])  # fmt: skip


def decoding(hmm: TrainingHMM, runs: Mapping[str, pd.DataFrame]) -> np.ndarray:
    """A fitted map's Viterbi states of ``runs``, concatenated in order."""
    return np.concatenate([hmm.predict(table) for table in runs.values()])


def sufficient_n(aris: Mapping[int, Sequence[float]], full_n: int, n_states: int) -> int | None:
    """The library's rule (StabilityCurve.sufficient_n) applied to ARIs per n."""
    from trainmap.dynamics.verdicts.stability_results import StabilityCurve, StabilityPoint

    points = [StabilityPoint(n, n_states, [n_states] * len(a), list(a), {}, targets().ari)
              for n, a in sorted(aris.items())]  # fmt: skip
    return StabilityCurve(points, targets(), full_n, n_states, []).sufficient_n


def share(aris: Sequence[float]) -> float:
    """Share of draws with ARI >= the target (NaN: a failed fit, never)."""
    values = np.nan_to_num(np.asarray(aris, float), nan=-1.0)
    return float(np.mean(values >= targets().ari))


def full_set(full_n: int, truth: KnownHMM, n_subsamples: int, cold: bool) -> dict:
    """The full map of the sampler's first ``full_n`` runs, its decoding and the true one, and its
    subsample curve up to n = N (warm-started as the workflow refits, and cold)."""
    from sklearn.metrics import adjusted_rand_score

    from trainmap.dynamics.verdicts.stability import stability_curve

    runs, states, _ = draw_runs(full_n)
    hmm = fit_map(runs)
    convergence, status = outcomes(states)
    ladder = list(range(8, full_n + 1, 8))
    if ladder[-1] != full_n:
        ladder.append(full_n)
    kwargs = {"ladder": ladder, "n_subsamples": n_subsamples, "max_iter": MAX_ITER,
              "max_fraction": 1.0, "reselect_k": True}  # fmt: skip
    curves = {"sub": stability_curve(hmm, runs, None, convergence, status, [], **kwargs)}
    if cold:
        curves["cold"] = stability_curve(hmm, runs, None, convergence, status, [],
                                         warm_start=False, **kwargs)  # fmt: skip
    full_labels, true_labels = decoding(hmm, runs), truth_decoding(truth, runs)
    return {"full_n": full_n, "runs": runs, "hmm": hmm, "curves": curves,
            "references": {"MCfull": full_labels, "MCtruth": true_labels},
            "full_vs_truth": adjusted_rand_score(true_labels, full_labels)}  # fmt: skip


def monte_carlo(
    ladder: Sequence[int], draws: int, first_index: int, fulls: Sequence[dict]
) -> dict[tuple[int, str], dict[int, list[float]]]:
    """``draws`` maps per n, each fitted on its own fresh n runs (sampler indices from
    ``first_index`` on, disjoint across draws), each scored against every full set's references:
    (N, reference) -> n -> ARIs; (0, "K") -> n -> selected K."""
    from sklearn.metrics import adjusted_rand_score

    pool, _, _ = draw_runs(first_index + draws * sum(ladder))
    ids = list(pool)[first_index:]
    scores: dict[tuple[int, str], dict[int, list[float]]] = {}
    start = 0
    for n in ladder:
        for _ in range(draws):
            hmm = fit_map({run: pool[run] for run in ids[start : start + n]})
            start += n
            scores.setdefault((0, "K"), {}).setdefault(n, []).append(hmm.n_states_)
            for full in fulls:
                labels = decoding(hmm, full["runs"])
                for name, reference in full["references"].items():
                    scores.setdefault((full["full_n"], name), {}).setdefault(n, []).append(
                        adjusted_rand_score(reference, labels)
                    )
    return scores


def validate(full: dict, scores: Mapping[tuple[int, str], Mapping[int, list[float]]]) -> dict:
    """The table and the sufficient n of each side for one full set."""
    import pandas as pd

    from trainmap.dynamics.verdicts.stability_results import DEFAULT_MAX_FRACTION, ladder_limit

    full_n, k = full["full_n"], full["hmm"].n_states_
    limit = ladder_limit(full_n, DEFAULT_MAX_FRACTION)
    curves = {name: {p.n: p for p in curve.points} for name, curve in full["curves"].items()}
    mc = {name: scores[(full_n, name)] for name in full["references"]}
    rows = []
    for n in sorted(set(curves["sub"]) | set(scores[(0, "K")])):
        row: dict = {"n": n, "n/N": n / full_n}
        for name, points in curves.items():
            if n in points:
                row |= {f"{name} mean": points[n].ari_mean, f"{name} share": points[n].ari_share}
        for name, aris in mc.items():
            if n in aris:
                row |= {f"{name} mean": np.mean(aris[n]), f"{name} share": share(aris[n])}
        if n in scores[(0, "K")]:
            row["MC K=3"] = np.mean(np.asarray(scores[(0, "K")][n]) == 3)
        rows.append(row)
    result = {
        "full_n": full_n, "k_full": k, "limit": limit, "full_vs_truth": full["full_vs_truth"],
        "table": pd.DataFrame(rows).set_index("n"), "mc_max": max(scores[(0, "K")]),
        "mc_full": sufficient_n(mc["MCfull"], full_n, k),
        "mc_truth": sufficient_n(mc["MCtruth"], full_n, k),
    }  # fmt: skip
    for name, points in curves.items():
        aris = {n: p.ari for n, p in points.items()}
        capped = {n: a for n, a in aris.items() if n <= limit}
        result[f"tool_{name}"] = sufficient_n(capped, full_n, k) if capped else None
        result[f"uncapped_{name}"] = sufficient_n(aris, full_n, k)
    return result


def factor(tool: int | None, limit: int, mc: int | None, mc_max: int) -> str:
    """How far apart two sufficient n are: max / min; with one side beyond its ladder, a bound."""
    if tool is not None and mc is not None:
        return f"{max(tool, mc) / min(tool, mc):.2f}"
    if tool is None and mc is not None:
        return (f"consistent (tool: not stable up to {limit}; MC: {mc} > {limit})" if mc > limit
                else f"tool misses it (MC stable from {mc} <= {limit})")  # fmt: skip
    if tool is not None:
        return f">= {(mc_max + 8) / tool:.2f} (MC not stable up to {mc_max})"
    return f"both not stable (tool up to {limit}, MC up to {mc_max})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full-n", type=int, nargs="+", default=[40, 24])
    parser.add_argument("--subsamples", type=int, default=20, help="subsamples per n (curve)")
    parser.add_argument("--draws", type=int, default=20, help="fresh sets per n (Monte Carlo)")
    parser.add_argument("--mc-ladder", type=int, nargs="+", default=[8, 16, 24, 32, 40, 48, 56])
    parser.add_argument("--quick", action="store_true", help="10 draws and subsamples, no cold")
    args = parser.parse_args()
    import pandas as pd

    draws, subsamples = (10, 10) if args.quick else (args.draws, args.subsamples)
    started = time.perf_counter()
    _, _, truth = draw_runs(1)
    fulls = [full_set(full_n, truth, subsamples, cold=not args.quick) for full_n in args.full_n]
    print(f"full maps and subsample curves: {time.perf_counter() - started:.0f} s")
    scores = monte_carlo(args.mc_ladder, draws, max(args.full_n), fulls)
    print(f"Monte Carlo: {draws} fresh sets per n: {time.perf_counter() - started:.0f} s")
    last = []
    for full in fulls:
        result = validate(full, scores)
        full_n, limit, mc_max = result["full_n"], result["limit"], result["mc_max"]
        print(f"\n== N = {full_n} (full map K = {result['k_full']}, ARI with the true decoding "
              f"{result['full_vs_truth']:.3f}; {subsamples} subsamples, {draws} fresh sets per n; "
              f"share: of ARI >= {targets().ari:g})")  # fmt: skip
        with pd.option_context("display.width", 250, "display.max_columns", 30):
            print(result["table"].round(3).to_string(na_rep="-"))
        print(f"sufficient n: tool (ladder capped at {limit}) {result['tool_sub']}; cold-refit "
              f"curve {result.get('tool_cold', '-')}; uncapped curve (to n = N) "
              f"{result['uncapped_sub']}; MC vs full map {result['mc_full']}; MC vs truth "
              f"{result['mc_truth']}")  # fmt: skip
        print(f"factor tool / MC vs truth: "
              f"{factor(result['tool_sub'], limit, result['mc_truth'], mc_max)}; uncapped / MC vs "
              f"truth: {factor(result['uncapped_sub'], full_n, result['mc_truth'], mc_max)}")  # fmt: skip
        last.append(f"N={full_n} tool={result['tool_sub']} uncapped={result['uncapped_sub']} "
                    f"mc_truth={result['mc_truth']} mc_full={result['mc_full']}")  # fmt: skip
    print(f"\n({time.perf_counter() - started:.0f} s)")
    print("stability_validation " + " | ".join(last))


if __name__ == "__main__":
    main()
