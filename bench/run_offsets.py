"""K recovery with a per-run emission offset: the analysis setting ``emission`` of
:class:`trainmap.dynamics.maps.hmm.estimator.TrainingHMM`, ``plain`` against ``run_offset``, ``run_offset_drift``
and ``run_affine`` (:mod:`trainmap.dynamics.maps.hmm.run_terms`), through trainmap's one selection path.

Data as bench/selection_nuisance.py: :func:`trainmap.dynamics.maps.synthetic.sample_runs`, 40 runs x 200
checkpoints of 14 metrics, true K = 3 and 5, nuisance 0 and 1, sampler seeds 0..N-1. Every row is
``TrainingHMM(restarts=2, emission=...)`` (pooled z-scores, the paper's 20 % held-out split,
K = 1..8, 2 seeded sticky restarts, K by held-out BIC: the selection of
:func:`~trainmap.dynamics.maps.hmm.selection.select_model`):

``plain``             the paper's Gaussian HMM (the default);
``run_offset``        a per-run offset of the emission means, fitted with the states (ECM);
``run_offset_drift``  a per-run offset and linear drift;
``run_affine``        a per-run offset, linear drift and scale (the sampler's nuisance has all
                      three: its scale is exp(N(0, (nuisance / 10)^2)) per run).

Per row: the selected K (K: seeds), how often it is right, the decoding accuracy up to relabelling
of the selected model (:func:`~trainmap.dynamics.maps.synthetic.known_answer_scores`; mean, min) and of
the true K's model (mean), and the mean CPU seconds of one full selection (single-threaded BLAS).

``--difference``: does the offset model keep a real difference between runs? Nuisance 0, true K = 3,
half the runs (20 of 40) start elsewhere: ``late`` in state 1 (they never visit state 0), ``stuck``
in the last, absorbing state (they sit in one state all along, which the other half reaches only at
the end; an offset could move them onto another state). Same table.

Usage::

    .venv/bin/python bench/run_offsets.py --seeds 3          # a quick check
    .venv/bin/python bench/run_offsets.py                    # 10 seeds
    .venv/bin/python bench/run_offsets.py --difference --seeds 5
    .venv/bin/python bench/run_offsets.py --rules run_affine     # one emission's rows
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

import numpy as np

from trainmap.dynamics.metrics.columns import METRIC_NAMES
from trainmap.schema import section_choices

#: the rows: one per emission model (trainmap.dynamics.maps.hmm.EMISSIONS, as the schema lists
#: them: no analysis import before the arguments are parsed)
RULES = section_choices("analysis")["emission"]
SCENARIOS = ("late", "stuck")


def sample_split_runs(scenario: str, seed: int, n_runs: int = 40, length: int = 200) -> tuple:
    """:func:`sample_runs`'s tables (true K = 3, no nuisance) with the second half of the runs
    starting in state 1 (``late``) or in the last state (``stuck``)."""
    import pandas as pd

    from trainmap.dynamics.maps.synthetic import left_to_right_hmm

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
        from trainmap.dynamics.maps.synthetic import sample_runs

        return sample_runs(n_states, seed=seed, nuisance=nuisance)
    return sample_split_runs(scenario, seed)


def accuracy(decoded: dict[str, np.ndarray], states: dict, truth: Any) -> float:
    """Fraction of checkpoints decoded right up to relabelling."""
    from trainmap.dynamics.maps.synthetic import known_answer_scores

    return float(known_answer_scores(decoded, set(), states, truth)["accuracy"])


def select(runs: dict, states: dict, truth: Any, restarts: int, emission: str) -> dict[str, Any]:
    """One selection with ``emission``: K, accuracy of K's and of the true K's model, CPU s."""
    from trainmap.dynamics.maps.hmm import TrainingHMM

    started = time.process_time()
    hmm = TrainingHMM(restarts=restarts, selection="holdout", emission=emission).fit(runs)
    cpu = time.process_time() - started
    chosen = accuracy(hmm.decode(runs), states, truth)
    at_truth = float("nan")
    if truth.n_states in hmm.models_:
        hmm.model_ = hmm.models_[truth.n_states]
        at_truth = accuracy(hmm.decode(runs), states, truth)
    return {"k": hmm.n_states_, "accuracy": chosen, "accuracy_true_k": at_truth, "cpu_s": cpu}


def job(
    rule: str, n_states: int, seed: int, nuisance: float, restarts: int, scenario: str | None
) -> dict[str, Any]:
    """One data set fitted with one emission model (``rule``)."""
    runs, states, truth = data_set(n_states, seed, nuisance, scenario)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = select(runs, states, truth, restarts, rule)
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
    parser.add_argument("--rules", default=",".join(RULES),
                        help=f"emission models, of {', '.join(RULES)} (default all)")  # fmt: skip
    parser.add_argument("--nuisance", default="0,1", help="nuisance levels (default 0,1)")
    parser.add_argument("--truths", default="3,5", help="true K (default 3,5)")
    parser.add_argument("--restarts", type=int, default=2, help="EM restarts per K (default 2)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
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
    jobs = [(rule, k, seed, level, args.restarts, scenario) for rule in rules
            for k, level, scenario in kinds for seed in range(args.seeds)]  # fmt: skip
    from joblib import Parallel, delayed
    from selection_nuisance import table

    # The costly emission models first, so the processes finish together.
    jobs.sort(key=lambda j: (-RULES.index(j[0]), -j[1]))
    started = time.perf_counter()
    results = Parallel(n_jobs=args.jobs)(delayed(job)(*arguments) for arguments in jobs)
    wall = time.perf_counter() - started
    print(f"K recovery, 40 runs x 200 checkpoints, K = 1..8, {args.restarts} restarts, 20 % "
          f"held-out runs, {args.seeds} sampler seeds, {args.jobs} processes, "
          f"{wall:.0f} s wall\n")  # fmt: skip
    print(table(results, rules))
    print(summary_line(results, rules, kinds, args.seeds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
