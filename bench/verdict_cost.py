"""The label-free verdicts' cost against the rest of a joint comparison, side by side.

A joint comparison (:func:`trainmap.dynamics.verdicts.joint.compare_groups`) fits the shared map, decodes
the runs, regresses detours and tests every pair of methods. The label-free verdicts
(:mod:`trainmap.dynamics.verdicts.paths` and :mod:`trainmap.dynamics.verdicts.timecourse`: the start, the dynamics
after the start window by max-T, trajectories by energy distance, first passage, states visited,
transitions, collapsed paths) add a common step grid, the shared checkpoints, a distance matrix
and their relabelling tests and bootstrap intervals; the comparison also draws where the metrics
differ, a max-T band over every shared checkpoint x metric. Measured on the known-answer sampler at
the default study's sizes (2 methods x 32 runs, 321 checkpoints, 14 metrics, the analysis
defaults' 2000 permutations): the state-level verdict table alone, the table with the label-free
verdicts, the band, and the whole comparison (map fit included), each the median of alternating
rounds. The stability curve recomputes the verdict table on every subsample (the default study's:
20 subsamples x 3 seed counts = 60), so its added cost is 60 x the label-free verdicts' (parallel
over the job's threads).

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

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 runs per method, 200 checkpoints")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    args = parser.parse_args(argv)
    from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
    from trainmap.dynamics.maps.synthetic import sample_runs
    from trainmap.dynamics.verdicts.compare import compare_methods, path_evidence, run_quantities
    from trainmap.dynamics.verdicts.joint import compare_groups
    from trainmap.dynamics.verdicts.timecourse import time_resolved

    per_method, length = (16, 200) if args.quick else (32, 321)
    runs, states, _ = sample_runs(4, n_runs=2 * per_method, length=length, seed=2)
    groups = {run: ("a" if index < per_method else "b") for index, run in enumerate(runs)}
    features = [c for c in next(iter(runs.values())).columns if c not in ("step", "test_acc")]
    quantities = run_quantities(states, 4, {}, {}, [])
    evidence = path_evidence(runs, states, 4, features, {}, 20)
    in_first = np.array([groups[run] == "a" for run in evidence.values])
    times: dict[str, list[float]] = {"state-level table": [], "with label-free verdicts": [],
                                     "band": []}  # fmt: skip
    for index in range(args.rounds):
        order = list(times) if index % 2 == 0 else list(reversed(times))
        for which in order:
            started = time.perf_counter()
            if which == "band":
                time_resolved(evidence.values, in_first, features, evidence.checkpoints, 2000,
                              0.05, np.random.default_rng(index))  # fmt: skip
            else:
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
    band = statistics.median(times["band"])
    print(f"{'label-free verdicts (added)':34}{label_free:>9.3f} s")
    print(f"{'max-T band (checkpoints x metrics)':34}{band:>9.3f} s")
    print(f"{'  x 60 stability subsamples':34}{60 * label_free:>9.3f} s (label-free verdicts)")
    print(f"{'whole comparison (K 1..6, 2 restarts)':34}{comparison:>9.3f} s")
    print(
        f"verdict_cost label_free_s={label_free:.3f} band_s={band:.3f} "
        f"state_level_s={state_level:.3f} comparison_s={comparison:.1f} "
        f"share={(label_free + band) / comparison:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
