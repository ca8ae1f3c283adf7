"""The label-free verdicts' cost against the rest of a joint comparison, side by side.

A joint comparison (:func:`trainmap.dynamics.joint.compare_groups`) fits the shared map, decodes
the runs, regresses detours and tests every pair of methods. The label-free verdicts
(:mod:`trainmap.dynamics.paths`: trajectories by energy distance, first passage, states visited,
transitions, collapsed paths) add a common step grid, a distance matrix and their relabelling
tests and bootstrap intervals. Measured on the known-answer sampler at the default study's sizes
(2 methods x 32 runs, 600 checkpoints, 14 metrics, the analysis defaults' 2000 permutations):
the state-level verdict table alone, the table with the label-free verdicts, and the whole
comparison (map fit included), each the median of alternating rounds.

Usage::

    .venv/bin/python bench/verdict_cost.py           # ~1 minute on 2 cores
    .venv/bin/python bench/verdict_cost.py --quick   # 16 runs per method, 200 checkpoints

Last line: ``verdict_cost label_free_s=... state_level_s=... comparison_s=... share=...``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from trainmap.dynamics.hmm.estimator import TrainingHMM
from trainmap.dynamics.joint import compare_groups
from trainmap.dynamics.synthetic import sample_runs
from trainmap.dynamics.verdicts import compare_methods, path_evidence, run_quantities


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 runs per method, 200 checkpoints")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    args = parser.parse_args(argv)
    per_method, length = (16, 200) if args.quick else (32, 600)
    runs, states, _ = sample_runs(4, n_runs=2 * per_method, length=length, seed=2)
    groups = {run: ("a" if index < per_method else "b") for index, run in enumerate(runs)}
    features = [c for c in next(iter(runs.values())).columns if c not in ("step", "test_acc")]
    quantities = run_quantities(states, 4, {}, {}, [])
    evidence = path_evidence(runs, states, 4, features, {}, 20)
    times: dict[str, list[float]] = {"state-level table": [], "with label-free verdicts": []}
    for index in range(args.rounds):
        order = list(times) if index % 2 == 0 else list(reversed(times))
        for which in order:
            started = time.perf_counter()
            compare_methods(quantities, groups, n_permutations=2000,
                            paths=evidence if which != "state-level table" else None)  # fmt: skip
            times[which].append(time.perf_counter() - started)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compare_groups(runs, groups, {}, {}, TrainingHMM(k_max=6, restarts=2))
    comparison = time.perf_counter() - started
    state_level = statistics.median(times["state-level table"])
    label_free = statistics.median(times["with label-free verdicts"]) - state_level
    print(
        f"{2 * per_method} runs x {length} checkpoints, 2000 permutations, "
        f"median of {args.rounds} alternating rounds"
    )
    print(f"{'state-level verdict table':34}{state_level:>9.3f} s")
    print(f"{'label-free verdicts (added)':34}{label_free:>9.3f} s")
    print(f"{'whole comparison (K 1..6, 2 restarts)':34}{comparison:>9.3f} s")
    print(
        f"verdict_cost label_free_s={label_free:.3f} state_level_s={state_level:.3f} "
        f"comparison_s={comparison:.1f} share={label_free / comparison:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
