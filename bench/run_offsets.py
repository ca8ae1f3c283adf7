"""K recovery with a per-run emission offset (issue 22): the plain ``holdout`` rule against the same
rule with :class:`trainmap.dynamics.run_offsets.RunOffsetHMM` (offset, and offset + drift).

Data as bench/selection_nuisance.py: :func:`trainmap.dynamics.synthetic.sample_runs`, 40 runs x 200
checkpoints of 14 metrics, true K = 3 and 5, nuisance 0 and 1, sampler seeds 0..N-1. Every rule
standardises as :class:`~trainmap.dynamics.hmm.TrainingHMM` does (pooled statistics of all runs),
holds out the same 20 % of the runs (:func:`~trainmap.dynamics.hmm.holdout_split`), tries K = 1..8
with 2 seeded sticky restarts and chooses K by held-out BIC:

``holdout``       the plain model (``TrainingHMM(selection="holdout")``);
``offset``        :func:`~trainmap.dynamics.run_offsets.select_offset_model`, a per-run offset;
``offset+drift``  the same with a per-run linear drift as well.

Per row: the selected K (K: seeds), how often it is right, the decoding accuracy up to relabelling
of the selected model (:func:`~trainmap.dynamics.synthetic.known_answer_scores`; mean, min) and of
the true K's model (mean), and the mean CPU seconds of one full selection (single-threaded BLAS).

``--difference``: does the offset model keep a real difference between runs? Nuisance 0, true K = 3,
half the runs (20 of 40) start elsewhere: ``late`` in state 1 (they never visit state 0), ``stuck``
in the last, absorbing state (they sit in one state all along, which the other half reaches only at
the end; an offset could move them onto another state). Same table.

Usage::

    .venv/bin/python bench/run_offsets.py --seeds 3          # a quick check
    .venv/bin/python bench/run_offsets.py                    # 10 seeds
    .venv/bin/python bench/run_offsets.py --difference --seeds 5
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

import numpy as np
import pandas as pd
from candidates.run_offset_hmm import select_offset_model
from joblib import Parallel, delayed
from selection_nuisance import table

from trainmap.dynamics.hmm import TrainingHMM, holdout_split, stack, standardise_runs
from trainmap.dynamics.metrics import METRIC_NAMES
from trainmap.dynamics.synthetic import known_answer_scores, left_to_right_hmm, sample_runs

RULES: dict[str, dict[str, Any] | None] = {
    "holdout": None,
    "offset": {"drift": False},
    "offset+drift": {"drift": True},
}
SCENARIOS = ("late", "stuck")


def sample_split_runs(scenario: str, seed: int, n_runs: int = 40, length: int = 200) -> tuple:
    """:func:`sample_runs`'s tables (true K = 3, no nuisance) with the second half of the runs
    starting in state 1 (``late``) or in the last state (``stuck``)."""
    truth = left_to_right_hmm(3, length=length, seed=seed)
    start = {"late": 1, "stuck": 2}[scenario]
    runs, states = {}, {}
    for index in range(n_runs):
        first = start if index >= n_runs // 2 else 0
        values, hidden = truth.model.sample(length, random_state=seed * 1000 + index + 1,
                                            currstate=first)  # fmt: skip
        table = pd.DataFrame(values * truth.scale + truth.offset, columns=list(METRIC_NAMES))
        table.insert(0, "step", np.arange(length) * 10)
        runs[f"run{index:02d}"], states[f"run{index:02d}"] = table, hidden
    return runs, states, truth


def data_set(n_states: int, seed: int, nuisance: float, scenario: str | None) -> tuple:
    """``(runs, states, truth)`` of one job."""
    if scenario is None:
        return sample_runs(n_states, seed=seed, nuisance=nuisance)
    return sample_split_runs(scenario, seed)


def accuracy(decoded: dict[str, np.ndarray], states: dict, truth: Any) -> float:
    """Fraction of checkpoints decoded right up to relabelling."""
    return float(known_answer_scores(decoded, set(), states, truth)["accuracy"])


def plain(runs: dict, states: dict, truth: Any, restarts: int) -> dict[str, Any]:
    """The plain holdout rule: K, accuracy of K's and of the true K's model, CPU seconds."""
    started = time.process_time()
    hmm = TrainingHMM(restarts=restarts, selection="holdout").fit(runs)
    cpu = time.process_time() - started
    chosen = accuracy(hmm.decode(runs), states, truth)
    at_truth = float("nan")
    if truth.n_states in hmm.models_:
        hmm.model_ = hmm.models_[truth.n_states]
        at_truth = accuracy(hmm.decode(runs), states, truth)
    return {"k": hmm.n_states_, "accuracy": chosen, "accuracy_true_k": at_truth, "cpu_s": cpu}


def with_offsets(
    runs: dict, states: dict, truth: Any, restarts: int, options: dict[str, Any]
) -> dict[str, Any]:
    """The holdout rule with run offsets, standardised and split as ``TrainingHMM`` does."""
    started = time.process_time()
    reference = TrainingHMM(restarts=restarts, selection="holdout")
    raw = {run: table[list(METRIC_NAMES)].to_numpy(dtype=float) for run, table in runs.items()}
    z, _ = standardise_runs(raw, "pooled")
    train, heldout = holdout_split(list(runs), reference.holdout, reference.random_state)
    selection = select_offset_model(
        stack([z[run] for run in train]), stack([z[run] for run in heldout]),
        reference.settings(), range(1, reference.k_max + 1), restarts, **options,
    )  # fmt: skip
    cpu = time.process_time() - started
    decode = lambda model: {run: model.predict(z[run]) for run in runs}  # noqa: E731
    chosen = accuracy(decode(selection.model), states, truth)
    at_truth = float("nan")
    if truth.n_states in selection.models:
        at_truth = accuracy(decode(selection.models[truth.n_states]), states, truth)
    return {"k": selection.n_states, "accuracy": chosen, "accuracy_true_k": at_truth, "cpu_s": cpu}


def job(
    rule: str, n_states: int, seed: int, nuisance: float, restarts: int, scenario: str | None,
    options: dict[str, Any] | None,
) -> dict[str, Any]:  # fmt: skip
    """One data set fitted by one rule (``options``: the offset model's; None: the plain one)."""
    runs, states, truth = data_set(n_states, seed, nuisance, scenario)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if options is None:
            result = plain(runs, states, truth, restarts)
        else:
            result = with_offsets(runs, states, truth, restarts, options)
    return {"rule": rule, "truth": n_states, "seed": seed, "nuisance": nuisance,
            "scenario": scenario or "-"} | result  # fmt: skip


def summary_line(results: list[dict[str, Any]], rules: list[str], kinds: list[tuple],
                 seeds: int) -> str:  # fmt: skip
    """``run_offsets <rule>:<K>@<nuisance>[/<scenario>]=<right>/<seeds> ...``."""
    parts = []
    for rule in rules:
        for k, level, scenario in kinds:
            key = (rule, k, level, scenario or "-")
            rows = [r for r in results
                    if (r["rule"], r["truth"], r["nuisance"], r["scenario"]) == key]  # fmt: skip
            right = sum(r["k"] == k for r in rows)
            parts.append(f"{rule}:{k}@{level:g}{'' if scenario is None else '/' + scenario}="
                         f"{right}/{seeds}")  # fmt: skip
    return "run_offsets " + " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="sampler seeds (default 10)")
    parser.add_argument("--rules", default=",".join(RULES), help=f"of {', '.join(RULES)}")
    parser.add_argument("--nuisance", default="0,1", help="nuisance levels (default 0,1)")
    parser.add_argument("--truths", default="3,5", help="true K (default 3,5)")
    parser.add_argument("--restarts", type=int, default=2, help="EM restarts per K (default 2)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    parser.add_argument("--offset-scale", type=float, default=None,
                        help="prior SD of offsets and drifts (default the model's)")  # fmt: skip
    parser.add_argument("--difference", action="store_true",
                        help="half the runs start elsewhere (no nuisance, K = 3)")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="2 sampler seeds, true K = 5 only (make bench's fast pass)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.truths = 2, "5"
    rules = args.rules.split(",")
    unknown = sorted(set(rules) - set(RULES))
    if unknown:
        parser.error(f"unknown rules {unknown}; choose from {', '.join(RULES)}")
    if args.difference:
        kinds = [(3, 0.0, scenario) for scenario in SCENARIOS]
    else:
        kinds = [(int(k), float(level), None) for k in args.truths.split(",")
                 for level in args.nuisance.split(",")]  # fmt: skip
    prior = ({} if args.offset_scale is None else
             {"offset_scale": args.offset_scale, "drift_scale": args.offset_scale})  # fmt: skip
    options = {rule: None if RULES[rule] is None else RULES[rule] | prior for rule in rules}
    jobs = [(rule, k, seed, level, args.restarts, scenario, options[rule]) for rule in rules
            for k, level, scenario in kinds for seed in range(args.seeds)]  # fmt: skip
    jobs.sort(key=lambda j: -j[1])  # larger K first, so the processes finish together
    results = Parallel(n_jobs=args.jobs)(delayed(job)(*arguments) for arguments in jobs)
    print(f"K recovery, 40 runs x 200 checkpoints, K = 1..8, {args.restarts} restarts, 20 % "
          f"held-out runs, {args.seeds} sampler seeds, offset prior SD "
          f"{args.offset_scale or 'default'}\n")  # fmt: skip
    print(table(results, rules))
    print(summary_line(results, rules, kinds, args.seeds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
