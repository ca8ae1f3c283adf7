"""K recovery under run-to-run nuisance: one held-out split against folds.

Real seeds differ by more than their states: an offset, a scale and a slow drift of the metrics per
run. :func:`trainmap.dynamics.maps.synthetic.sample_runs` with ``nuisance`` > 0 gives every run its own
(module docstring there); 40 runs x 200 checkpoints of 14 metrics, true K = 3 and 5, the CLI's
defaults but 2 restarts. Rules compared (``TrainingHMM(selection=..., folds=...)``):

``holdout``        the paper's: K by the BIC on one 20 % held-out split of the runs;
``folds V``        K by the mean held-out BIC over V folds of the runs (every run held out once),
                   the model of K fitted on all runs;
``offset removed`` (candidate b, here only) the holdout rule on runs from which each run's own
                   mean over its first 10 checkpoints was subtracted (every run starts in the
                   first state, so its offset is what it adds to that state's mean).

For each rule, true K and nuisance level: the selected K over the sampler seeds (K: count), how
often it is right, the mean decoding accuracy up to relabelling
(:func:`~trainmap.dynamics.maps.synthetic.known_answer_scores`) and the mean CPU seconds of one fit.

Usage::

    .venv/bin/python bench/selection_nuisance.py                  # 10 seeds (~10 min on 2 cores)
    .venv/bin/python bench/selection_nuisance.py --seeds 3 --rules holdout,folds3
    # does the data decide K, or the split? K per estimator seed on 2 data sets per true K
    .venv/bin/python bench/selection_nuisance.py --splits 4 --seeds 2 --rules holdout,folds3,folds5 --nuisance 1

``foldsV-scaled`` rows reuse a folds fit: K by the summed held-out likelihood of every run scaled
to a held-out set of 20 % of the observations, with that set's BIC penalty.

Last line: ``selection_nuisance <rule>:<K>@<nuisance>=<right>/<seeds> ...``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections import Counter
from typing import Any

import numpy as np

RULES: dict[str, dict[str, Any]] = {
    "holdout": {"selection": "holdout"},
    "folds2": {"selection": "folds", "folds": 2},
    "folds3": {"selection": "folds", "folds": 3},
    "folds5": {"selection": "folds", "folds": 5},
    "offset": {"selection": "holdout"},  # on runs with their early-window mean removed
}
EARLY_WINDOW = 10


def select(
    rule: str, n_states: int, seed: int, nuisance: float, restarts: int, random_state: int = 0
) -> list[dict[str, Any]]:
    """One sampled data set fitted by one rule (splits and restarts seeded by ``random_state``): K,
    decoding accuracy, CPU seconds."""
    from trainmap.dynamics.maps.hmm import TrainingHMM, n_free_parameters
    from trainmap.dynamics.maps.synthetic import known_answer_scores, sample_runs

    runs, states, truth = sample_runs(n_states, seed=seed, nuisance=nuisance)
    if rule == "offset":
        runs = {run: table - table.iloc[:EARLY_WINDOW].mean().where(table.columns != "step", 0.0)
                for run, table in runs.items()}  # fmt: skip
    started = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm = TrainingHMM(restarts=restarts, random_state=random_state, **RULES[rule]).fit(runs)
    cpu = time.process_time() - started
    accuracy = known_answer_scores(hmm.decode(runs), set(), states, truth)["accuracy"]
    result = {"rule": rule, "truth": n_states, "seed": seed, "nuisance": nuisance,
              "k": hmm.n_states_, "accuracy": accuracy, "cpu_s": cpu}  # fmt: skip
    if hmm.selection == "holdout":
        return [result]
    # The same fits, K by the held-out likelihood of every run scaled to a held-out set of the
    # paper's size (20 % of the observations) with its BIC penalty.
    n_observations = sum(len(table) for table in runs.values())
    reference = 0.2 * n_observations
    curve = hmm.selection_.set_index("n_states")
    scaled = {k: -2 * curve.loc[k, "heldout_log_likelihood"] * reference / n_observations
              + n_free_parameters(model) * np.log(reference) for k, model in hmm.models_.items()
              if np.isfinite(curve.loc[k, "bic"])}  # fmt: skip
    k = min(scaled, key=lambda key: (scaled[key], key))
    hmm.model_, hmm.n_states_ = hmm.models_[k], k
    accuracy = known_answer_scores(hmm.decode(runs), set(), states, truth)["accuracy"]
    return [result, result | {"rule": f"{rule}-scaled", "k": k, "accuracy": accuracy}]


def table(results: list[dict[str, Any]], rules: list[str]) -> str:
    """The markdown table (also bench/run_offsets.py's): one row per rule x data kind (true K,
    nuisance level and, where results name one, ``scenario``); the decoding accuracy of the true
    K's model where results carry ``accuracy_true_k``."""
    scenarios = any("scenario" in r for r in results)
    at_truth = any("accuracy_true_k" in r for r in results)
    header = ["rule", "true K", "nuisance", *(["scenario"] if scenarios else []),
              "selected K (K: seeds)", "K right", "accuracy (mean, min)",
              *(["accuracy at true K (mean)"] if at_truth else []),
              "CPU s per selection"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]

    def kind(r: dict[str, Any]) -> tuple:
        return r["truth"], r["nuisance"], r.get("scenario", "-")

    for rule in rules:
        for n_states, level, scenario in sorted({kind(r) for r in results}):
            rows = [
                r for r in results if r["rule"] == rule and kind(r) == (n_states, level, scenario)
            ]
            if not rows:
                continue
            counts = Counter(r["k"] for r in rows)
            accuracy = [r["accuracy"] for r in rows]
            true_k = [f"{np.nanmean([r.get('accuracy_true_k', np.nan) for r in rows]):.3f}"]
            cells = [rule, str(n_states), f"{level:g}", *([scenario] if scenarios else []),
                     ", ".join(f"{k}: {counts[k]}" for k in sorted(counts)),
                     f"{counts[n_states]}/{len(rows)}",
                     f"{np.mean(accuracy):.3f}, {min(accuracy):.3f}", *(true_k if at_truth else []),
                     f"{np.mean([r['cpu_s'] for r in rows]):.1f}"]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def split_sensitivity(
    rules: list[str], data: list[tuple[int, int]], nuisance: float, splits: int, restarts: int,
    n_jobs: int,
) -> str:  # fmt: skip
    """Does the data decide K, or the split? The same data sets fitted with ``splits`` estimator
    seeds (another held-out split or other folds, other restarts): K per seed."""
    from joblib import Parallel, delayed

    jobs = [(rule, k, seed, nuisance, restarts, split) for rule in rules for k, seed in data
            for split in range(splits)]  # fmt: skip
    results = [row for rows in Parallel(n_jobs=n_jobs)(delayed(select)(*job) for job in jobs)
               for row in rows]  # fmt: skip
    names = [name for rule in rules for name in (rule, f"{rule}-scaled")
             if any(r["rule"] == name for r in results)]  # fmt: skip
    lines = [f"| rule | {' | '.join(f'K={k} seed {seed}' for k, seed in data)} | same K for "
             "every split |", "| --- |" + " --- |" * (len(data) + 1)]  # fmt: skip
    for name in names:
        cells, same = [], 0
        for k, seed in data:
            ks = [r["k"] for r in results if (r["rule"], r["truth"], r["seed"]) == (name, k, seed)]
            cells.append(" ".join(map(str, ks)))
            same += len(set(ks)) == 1
        lines.append(f"| {name} | {' | '.join(cells)} | {same}/{len(data)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="sampler seeds (default 10)")
    parser.add_argument("--rules", default="holdout,folds2,folds3,folds5,offset",
                        help=f"comma-separated, of {', '.join(RULES)}")  # fmt: skip
    parser.add_argument("--nuisance", default="0,1", help="nuisance levels (default 0,1)")
    parser.add_argument("--restarts", type=int, default=2, help="EM restarts per K (default 2)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    parser.add_argument("--splits", type=int, default=0,
                        help="instead: K per estimator seed (this many) on a few data sets")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="3 sampler seeds, rules holdout and folds3 (make bench's fast pass)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.rules = 3, "holdout,folds3"
    rules = args.rules.split(",")
    unknown = sorted(set(rules) - set(RULES))
    if unknown:
        parser.error(f"unknown rules {unknown}; choose from {', '.join(RULES)}")
    levels = [float(level) for level in args.nuisance.split(",")]
    if args.splits:
        data = [(k, seed) for k in (3, 5) for seed in range(args.seeds)]
        print(f"K per estimator seed (0..{args.splits - 1}), nuisance {levels[-1]:g}\n")
        print(split_sensitivity(rules, data, levels[-1], args.splits, args.restarts, args.jobs))
        return 0
    from joblib import Parallel, delayed

    jobs = [(rule, k, seed, level, args.restarts) for rule in rules for k in (3, 5)
            for level in levels for seed in range(args.seeds)]  # fmt: skip
    # Slowest first, so the processes finish together.
    jobs.sort(key=lambda job: (-RULES[job[0]].get("folds", 1), -job[1]))
    results = [row for rows in Parallel(n_jobs=args.jobs)(delayed(select)(*job) for job in jobs)
               for row in rows]  # fmt: skip
    rules = [name for rule in rules for name in (rule, f"{rule}-scaled")
             if any(r["rule"] == name for r in results)]  # fmt: skip
    print(f"K recovery, 40 runs x 200 checkpoints, {args.restarts} restarts, {args.seeds} seeds\n")
    print(table(results, rules))
    parts = []
    for rule in rules:
        for n_states in (3, 5):
            for level in levels:
                rows = [r for r in results if (r["rule"], r["truth"], r["nuisance"])
                        == (rule, n_states, level)]  # fmt: skip
                parts.append(f"{rule}:{n_states}@{level:g}="
                             f"{sum(r['k'] == n_states for r in rows)}/{len(rows)}")  # fmt: skip
    print("selection_nuisance " + " ".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
