"""K recovery by the three selection rules side by side, and the ``reproducible`` rule's thresholds.

Data: :func:`trainmap.dynamics.maps.synthetic.sample_runs`, 40 runs x 200 checkpoints of 14 metrics
from a left-to-right Gaussian HMM with true K = 3 or 5 states, without (``nuisance`` 0) and with
(1) a per-run offset, scale and drift. Every rule fits K = 1..8 with 2 restarts per K and split
(the CLI's defaults otherwise) and ``n_jobs=1`` (one process per fit: comparable CPU seconds):

``holdout``       the paper's: K minimises the BIC on one 20 % held-out split of the runs;
``folds``         K minimises the mean held-out BIC over 3 folds of the runs;
``reproducible``  each of 5 random splits of the runs into two halves fits both halves, each
                  scored on the other (repeated two-fold held-out BIC: K_BIC its minimum); K is
                  the largest K <= K_BIC whose two half maps decode every run alike (adjusted
                  Rand index >= the target) in >= the share of the splits.

For each rule, true K and nuisance level: the selected K over the sampler seeds (K: seeds), how
often it is right, the mean decoding accuracy up to relabelling
(:func:`~trainmap.dynamics.maps.synthetic.known_answer_scores`) and the mean CPU and wall seconds of one
fit (wall: two fits run side by side on 2 cores).

Thresholds without refitting: from each reproducible fit's half maps (``hmm.half_models_``), the
ARI per K and split (both halves' Viterbi decodings of every run, concatenated, sklearn's
``adjusted_rand_score``), and the K the rule would pick for every (ARI target, share of splits) of
{0.7, 0.8, 0.9} x {0.6, 0.8, 1.0}; the check column counts fits where the recomputed (0.8, 0.8)
pick differs from the fitted one (0 expected).

Usage::

    .venv/bin/python bench/selection_reproducible.py               # 10 seeds (~28 min, 2 loaded cores)
    .venv/bin/python bench/selection_reproducible.py --length 150  # the saved run (~20 min)
    .venv/bin/python bench/selection_reproducible.py --quick       # 2 seeds, nothing written

The full run writes ``bench/results/selection_reproducible.md`` (the tables), ``..._fits.csv``
(one row per fit) and ``..._ari.csv`` (one row per data set, K and split).

Last line: ``selection_reproducible <rule>:<K>@<nuisance>=<right>/<seeds> ...
best_thresholds=<ari>/<share>:<right>/<fits> default=<right>/<fits>``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from trainmap.dynamics.maps.hmm import TrainingHMM

RULES = ("holdout", "folds", "reproducible")
ARI_TARGETS = (0.7, 0.8, 0.9)
SHARES = (0.6, 0.8, 1.0)
RESULTS = Path(__file__).parent / "results"


def split_aris(hmm: TrainingHMM, runs: dict[str, pd.DataFrame]) -> list[dict[str, Any]]:
    """Per K and split of a reproducible fit: the ARI of the two half maps' decodings of every run
    (NaN where a half could not be fitted at K), whether K's fit of all runs exists, and the
    fit's K_BIC (the minimum of its two-fold held-out BIC)."""
    from trainmap.dynamics.maps.hmm import bic_minimum

    k_bic = bic_minimum(hmm.selection_)
    from sklearn.metrics import adjusted_rand_score
    from threadpoolctl import threadpool_limits

    sequences = [hmm.transform(runs[run]) for run in sorted(runs)]
    n_splits = len(hmm.half_models_) // 2
    rows = []
    with threadpool_limits(limits=1):
        for k in range(1, hmm.k_max + 1):
            for split in range(n_splits):
                first = hmm.half_models_.get(2 * split, {}).get(k)
                second = hmm.half_models_.get(2 * split + 1, {}).get(k)
                ari = math.nan
                if first is not None and second is not None:
                    labels = [np.concatenate(m.predict_runs(sequences)) for m in (first, second)]
                    ari = float(adjusted_rand_score(*labels))
                rows.append(
                    {"k": k, "split": split, "ari": ari, "fitted": k in hmm.models_, "k_bic": k_bic}
                )
    return rows


def pick(aris: pd.DataFrame, target: float, share: float) -> int | None:
    """The K the reproducible rule picks at (``target``, ``share``) from one fit's split ARIs: the
    largest fitted K up to K_BIC whose share of splits with ARI >= target reaches ``share``
    (K_BIC when none does)."""
    k_bic = int(aris["k_bic"].iloc[0])
    reached = aris.assign(ok=aris["ari"].fillna(-1.0) >= target).groupby("k")
    shares = reached["ok"].mean()
    fitted = reached["fitted"].all()
    chosen = [k for k in shares.index if shares[k] >= share and fitted[k] and k <= k_bic]
    return int(max(chosen)) if chosen else k_bic


def fit_one(rule: str, n_states: int, seed: int, nuisance: float, restarts: int,
            length: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:  # fmt: skip
    """One sampled data set fitted by one rule: K, decoding accuracy, CPU and wall seconds, and
    (reproducible) the ARI per K and split."""
    from trainmap.dynamics.maps.hmm import TrainingHMM
    from trainmap.dynamics.maps.synthetic import known_answer_scores, sample_runs

    runs, states, truth = sample_runs(n_states, n_runs=40, length=length, seed=seed,
                                      nuisance=nuisance)  # fmt: skip
    started, cpu_started = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm = TrainingHMM(selection=rule, restarts=restarts, n_jobs=1, random_state=0).fit(runs)
    cpu, wall = time.process_time() - cpu_started, time.perf_counter() - started
    accuracy = known_answer_scores(hmm.decode(runs), set(), states, truth)["accuracy"]
    key = {"truth": n_states, "nuisance": nuisance, "seed": seed}
    result = {"rule": rule, **key, "k": hmm.n_states_, "accuracy": accuracy, "cpu_s": cpu,
              "wall_s": wall}  # fmt: skip
    aris = [key | row for row in split_aris(hmm, runs)] if rule == "reproducible" else []
    return result, aris


def kinds(fits: pd.DataFrame) -> list[tuple[int, float]]:
    return sorted(
        {(int(t), float(n)) for t, n in zip(fits["truth"], fits["nuisance"], strict=True)}
    )


def rules_table(fits: pd.DataFrame) -> str:
    header = ["rule", "true K", "nuisance", "selected K (K: seeds)", "K right",
              "accuracy (mean, min)", "CPU s per fit", "wall s per fit"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for rule in RULES:
        for n_states, level in kinds(fits):
            rows = fits[(fits["rule"] == rule) & (fits["truth"] == n_states)
                        & (fits["nuisance"] == level)]  # fmt: skip
            if rows.empty:
                continue
            counts = Counter(rows["k"])
            cells = [rule, str(n_states), f"{level:g}",
                     ", ".join(f"{k}: {counts[k]}" for k in sorted(counts)),
                     f"{counts[n_states]}/{len(rows)}",
                     f"{rows['accuracy'].mean():.3f}, {rows['accuracy'].min():.3f}",
                     f"{rows['cpu_s'].mean():.1f}", f"{rows['wall_s'].mean():.1f}"]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ari_table(aris: pd.DataFrame) -> str:
    """Median (min) ARI over seeds and splits per K, per data kind: where the thresholds cut."""
    ks = sorted(aris["k"].unique())
    lines = ["| true K | nuisance | " + " | ".join(f"K={k}" for k in ks) + " |",
             "| --- | --- |" + " --- |" * len(ks)]  # fmt: skip
    for n_states, level in kinds(aris):
        cells = []
        for k in ks:
            values = aris[(aris["truth"] == n_states) & (aris["nuisance"] == level)
                          & (aris["k"] == k)]["ari"].dropna()  # fmt: skip
            cells.append(f"{values.median():.2f} ({values.min():.2f})" if len(values) else "-")
        lines.append(f"| {n_states} | {level:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def grid(fits: pd.DataFrame, aris: pd.DataFrame) -> tuple[str, dict[tuple[float, float], int]]:
    """The K the rule picks per fit and threshold pair: recovery per data kind and in all."""
    from trainmap.dynamics.maps.hmm import DEFAULT_REPRODUCE_ARI, DEFAULT_REPRODUCE_SHARE

    data = kinds(aris)
    header = ["ARI target", "share", *(f"K={t} nuisance {n:g}" for t, n in data),
              "K right (all)", "selected K (all)"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    by_fit = {key: frame for key, frame in aris.groupby(["truth", "nuisance", "seed"])}
    right_total: dict[tuple[float, float], int] = {}
    for target in ARI_TARGETS:
        for share in SHARES:
            picks = {key: pick(frame, target, share) for key, frame in by_fit.items()}
            cells, all_k = [], Counter()
            for n_states, level in data:
                ks = [k for (t, n, _), k in picks.items() if (t, n) == (n_states, level)]
                all_k.update(ks)
                cells.append(f"{sum(k == n_states for k in ks)}/{len(ks)}"
                             f" ({', '.join(f'{k}: {c}' for k, c in sorted(Counter(ks).items(), key=str))})")  # fmt: skip
            right = sum(k == t for (t, _, _), k in picks.items())
            right_total[(target, share)] = right
            default = " (default)" if (target, share) == (DEFAULT_REPRODUCE_ARI,
                                                         DEFAULT_REPRODUCE_SHARE) else ""  # fmt: skip
            lines.append(f"| {target:g}{default} | {share:g} | " + " | ".join(cells)
                         + f" | {right}/{len(picks)} | "
                         + ", ".join(f"{k}: {c}" for k, c in sorted(all_k.items(), key=str))
                         + " |")  # fmt: skip
    bic_only = {key: int(frame["k_bic"].iloc[0]) for key, frame in by_fit.items()}
    cells = []
    for n_states, level in data:
        ks = [k for (t, n, _), k in bic_only.items() if (t, n) == (n_states, level)]
        cells.append(f"{sum(k == n_states for k in ks)}/{len(ks)}"
                     f" ({', '.join(f'{k}: {c}' for k, c in sorted(Counter(ks).items()))})")  # fmt: skip
    right = sum(k == t for (t, _, _), k in bic_only.items())
    lines.append("| two-fold BIC alone (K_BIC) | - | " + " | ".join(cells)
                 + f" | {right}/{len(bic_only)} | - |")  # fmt: skip
    fitted = fits[fits["rule"] == "reproducible"].set_index(["truth", "nuisance", "seed"])["k"]
    mismatches = sum(pick(frame, DEFAULT_REPRODUCE_ARI, DEFAULT_REPRODUCE_SHARE) != fitted[key]
                     for key, frame in by_fit.items())  # fmt: skip
    lines.append(f"\nCheck: recomputed ({DEFAULT_REPRODUCE_ARI:g}, {DEFAULT_REPRODUCE_SHARE:g}) "
                 f"pick differs from the fitted K in {mismatches}/{len(by_fit)} fits.")  # fmt: skip
    return "\n".join(lines), right_total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="sampler seeds (default 10)")
    parser.add_argument("--length", type=int, default=200, help="checkpoints per run (200)")
    parser.add_argument("--restarts", type=int, default=2, help="EM restarts per K (default 2)")
    parser.add_argument("--jobs", type=int, default=2, help="fits side by side (default 2)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write the tables and CSVs (full run: bench/results)")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="2 sampler seeds, nothing written (make bench's fast pass)")  # fmt: skip
    args = parser.parse_args(argv)
    import pandas as pd
    from joblib import Parallel, delayed

    from trainmap.dynamics.maps.hmm import DEFAULT_REPRODUCE_ARI, DEFAULT_REPRODUCE_SHARE

    if args.quick:
        args.seeds = 2
    out = args.out if args.out is not None else (None if args.quick else RESULTS)
    levels = (0.0, 1.0)
    jobs = [(rule, k, seed, level, args.restarts, args.length) for rule in RULES
            for k in (3, 5) for level in levels for seed in range(args.seeds)]  # fmt: skip
    # Slowest first, so the processes finish together.
    jobs.sort(key=lambda job: (-RULES.index(job[0]), -job[1]))
    started = time.perf_counter()
    done = Parallel(n_jobs=args.jobs)(delayed(fit_one)(*job) for job in jobs)
    elapsed = time.perf_counter() - started
    fits = pd.DataFrame([result for result, _ in done])
    aris = pd.DataFrame([row for _, rows in done for row in rows])
    title = (f"K recovery, 40 runs x {args.length} checkpoints, K = 1..8, {args.restarts} "
             f"restarts, n_jobs=1 per fit, {args.seeds} sampler seeds, {args.jobs} fits side by "
             f"side; {elapsed:.0f} s wall in all")  # fmt: skip
    grid_text, right_total = grid(fits, aris)
    best = max(right_total, key=lambda pair: (right_total[pair], pair == (0.8, 0.8)))
    n_fits = len(aris.groupby(["truth", "nuisance", "seed"]))
    command = "bench/selection_reproducible.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    text = "\n\n".join([
        f"`{command.strip()}`: {title}", "## Rules side by side", rules_table(fits),
        "## Reproducible rule: ARI of the two half maps per K, median (min) over seeds x splits",
        ari_table(aris),
        "## Reproducible rule: K right per (ARI target, share of splits), recomputed from the "
        "half maps (right/seeds (selected K: seeds))",
        grid_text,
    ])  # fmt: skip
    print(text)
    parts = []
    for rule in RULES:
        for n_states, level in kinds(fits):
            rows = fits[(fits["rule"] == rule) & (fits["truth"] == n_states)
                        & (fits["nuisance"] == level)]  # fmt: skip
            parts.append(f"{rule}:{n_states}@{level:g}={(rows['k'] == n_states).sum()}/{len(rows)}")
    default = right_total[(DEFAULT_REPRODUCE_ARI, DEFAULT_REPRODUCE_SHARE)]
    last = (f"selection_reproducible {' '.join(parts)} best_thresholds={best[0]:g}/{best[1]:g}:"
            f"{right_total[best]}/{n_fits} default={default}/{n_fits}")  # fmt: skip
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "selection_reproducible.md").write_text(text + "\n\n" + last + "\n")
        fits.to_csv(out / "selection_reproducible_fits.csv", index=False)
        aris.to_csv(out / "selection_reproducible_ari.csv", index=False)
    print(last)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
