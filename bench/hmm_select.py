"""Time of the HMM's model selection (K = 1..8, 5 restarts each), serial vs parallel over K.

Synthetic data of the paper's size: 40 runs x 300 checkpoints x 14 features, drawn from a seeded
4-state Gaussian HMM. :class:`trainmap.dynamics.hmm.TrainingHMM` fits the K values one after another
(``n_jobs=1``) and in parallel processes (``n_jobs=-1``), side by side; the two must select the same
K with identical numbers (BLAS is single-threaded inside each fit). Larger K take longer, so the
speed-up is bounded by the slowest K and by the number of cores (2 here).

Usage::

    .venv/bin/python bench/hmm_select.py           # ~2 minutes on 2 cores
    .venv/bin/python bench/hmm_select.py --quick   # 10 runs x 100 checkpoints

Last line: ``hmm_select serial_s=... parallel_s=... ratio=... identical=...``.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pandas as pd
from hmmlearn.hmm import GaussianHMM

from trainmap.dynamics.hmm import TrainingHMM
from trainmap.dynamics.metrics import METRIC_NAMES


def synthetic_runs(n_runs: int, length: int, seed: int = 0) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    truth = GaussianHMM(n_components=4, covariance_type="diag")
    truth.startprob_ = np.full(4, 0.25)
    truth.transmat_ = np.full((4, 4), 0.1) + np.eye(4) * 0.6
    truth.means_ = rng.normal(0, 2, (4, len(METRIC_NAMES)))
    truth.covars_ = np.full((4, len(METRIC_NAMES)), 0.5)
    truth.n_features = len(METRIC_NAMES)
    return {
        f"run{i:02d}": pd.DataFrame(truth.sample(length, random_state=seed + i)[0],
                                    columns=list(METRIC_NAMES))
        for i in range(n_runs)
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 runs x 100 checkpoints")
    args = parser.parse_args(argv)
    n_runs, length = (10, 100) if args.quick else (40, 300)
    runs = synthetic_runs(n_runs, length)
    timings, fitted = {}, {}
    for label, jobs in (("serial", 1), ("parallel", -1)):
        started = time.perf_counter()
        fitted[label] = TrainingHMM(k_max=8, restarts=5, random_state=0, n_jobs=jobs).fit(runs)
        timings[label] = time.perf_counter() - started
    identical = fitted["serial"].selection_.equals(
        fitted["parallel"].selection_
    ) and np.array_equal(fitted["serial"].model_.means_, fitted["parallel"].model_.means_)
    print(f"{n_runs} runs x {length} checkpoints x {len(METRIC_NAMES)} features; K = 1..8, "
          f"5 restarts; {os.cpu_count()} cores")  # fmt: skip
    print(fitted["serial"].selection_.round(1).to_string(index=False))
    print(f"serial {timings['serial']:.1f} s, parallel {timings['parallel']:.1f} s, "
          f"chosen K = {fitted['serial'].n_states_}")  # fmt: skip
    ratio = timings["serial"] / timings["parallel"]
    print(f"hmm_select serial_s={timings['serial']:.1f} parallel_s={timings['parallel']:.1f} "
          f"ratio={ratio:.2f} identical={identical}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
