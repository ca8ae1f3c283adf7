"""Model selection of training maps on runs with a known answer, what it costs, and why it used to
run to K_max.

Data: :func:`trainmap.dynamics.maps.synthetic.sample_runs`: 40 runs x 200 checkpoints of 14 correlated
metrics (two shared factors, raw units between 1e-3 and 1e3) from a left-to-right Gaussian HMM with
3 or 5 states; runs differ in how long they stay in each state. Everything goes through the default
preprocessing (:class:`trainmap.dynamics.maps.hmm.estimator.TrainingHMM` with its defaults).

Studies (``--study``, default all):

``known``   every sampler seed (10 per sampler): the selected K, decoding accuracy up to relabelling,
            whether the map's kept edges are exactly the true transitions (the targets:
            K right in >= 9 of 10 seeds, accuracy >= 95 %, edges equal).
``causes``  the same data under variants that differ in one setting from the default (covariance
            type, standardisation, how BIC is taken over restarts, EM start, convergence), plus the
            authors' script's settings and trainmap's previous defaults: K per seed.
``limit``   true K = 5 with states 3, 4, 6 and 8 within-state standard deviations apart: the
            held-out BIC (paper sec. 2.1) needs a state's gain in held-out likelihood to exceed its
            parameter cost, so states closer than the limit are merged.
``cost``    one selection (K = 1..8 x 5 restarts, 40 runs x 300 checkpoints): hmmlearn's E-step
            against the batched one (same numbers), serial against parallel over (K, restart).
``analysis`` one whole joint comparison with the default settings (shared fit, 200 bootstrap
            refits, permutation tests, figures) at the sizes of the default study's comparisons
            with 32 seeds per method: 2 x 32 runs x 321 checkpoints, 3 x 32 runs x 49.

Usage::

    .venv/bin/python bench/hmm_select.py                 # everything (~15 min on 2 idle cores)
    .venv/bin/python bench/hmm_select.py --study known   # ~2 min
    .venv/bin/python bench/hmm_select.py --quick         # 3 seeds, fewer variants

Last line: ``hmm_select known3=../10 known5=../10 min_accuracy=... edges=../20 fit_s=... ratio=...
joint_s=...``.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from typing import Any

import numpy as np

#: The authors' script's settings other than its covariance type (diag by default, full for the
#: models behind their reported K).
AUTHORS_SCRIPT = {"standardisation": "per_run", "restart_rule": "mean", "init": "hmmlearn",
                  "n_iter": 10, "tol": 1e-6}  # fmt: skip
#: Settings that differ from the defaults, one cause at a time, then whole configurations.
VARIANTS: dict[str, dict[str, Any]] = {
    "default (full, pooled, best, sticky)": {},
    "diag covariance": {"covariance_type": "diag"},
    "per-run z-scores": {"standardisation": "per_run"},
    "BIC averaged over restarts": {"restart_rule": "mean"},
    "hmmlearn's EM start": {"init": "hmmlearn"},
    "loose convergence (tol 1e-2/obs)": {"tol": 1e-2},
    "tight convergence (tol 1e-5/obs)": {"tol": 1e-5},
    "authors' script (diag, per run, mean, hmmlearn start, 10 iterations)": {
        "covariance_type": "diag",
        **AUTHORS_SCRIPT,
    },
    "authors' script with full covariances": AUTHORS_SCRIPT,
    "trainmap before (diag, per run, best, hmmlearn start, 200 iterations)": {
        "covariance_type": "diag",
        "standardisation": "per_run",
        "init": "hmmlearn",
        "n_iter": 200,
        "tol": 1.6e-6,
    },  # fmt: skip
}


def select(
    n_states: int, seed: int, settings: dict[str, Any], separation: float | None = None
) -> dict[str, Any]:
    """Fit one sampled data set; the selection and how it compares with the truth."""
    from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
    from trainmap.dynamics.maps.synthetic import known_answer_scores, sample_runs
    from trainmap.dynamics.maps.training_map import transitions

    options = {} if separation is None else {"separation": separation}
    runs, states, truth = sample_runs(n_states, seed=seed, **options)
    started = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm = TrainingHMM(**settings).fit(runs)
    cpu = time.process_time() - started
    decoded = hmm.decode(runs)
    edges = {(j, k) for sequence in decoded.values() for _, j, k in transitions(sequence)}
    scores = known_answer_scores(decoded, edges, states, truth)
    curve = hmm.selection_.set_index("n_states")["bic"]
    return {"truth": n_states, "seed": seed, "k": hmm.n_states_, "cpu_s": cpu,
            "curve": curve.round(0).astype(int).tolist()} | scores  # fmt: skip


def run_many(jobs: list[tuple], n_jobs: int) -> list[dict[str, Any]]:
    from joblib import Parallel, delayed

    return Parallel(n_jobs=n_jobs)(delayed(select)(*job) for job in jobs)


def study_known(seeds: int, n_jobs: int) -> dict[str, Any]:
    print(f"== known answer: default settings, {seeds} sampler seeds per true K")
    results = run_many([(k, s, {}) for k in (3, 5) for s in range(seeds)], n_jobs)
    summary = {}
    for n_states in (3, 5):
        rows = [r for r in results if r["truth"] == n_states]
        print(f"true K = {n_states}")
        print(
            f"{'seed':>5}{'K':>4}{'accuracy':>10}{'edges ok':>10}{'cpu s':>8}  held-out BIC, K=1..8"
        )
        for r in rows:
            print(f"{r['seed']:>5}{r['k']:>4}{r['accuracy']:>10.4f}{str(r['edges_match']):>10}"
                  f"{r['cpu_s']:>8.1f}  {r['curve']}")  # fmt: skip
        summary[n_states] = {
            "right": sum(r["k"] == n_states for r in rows),
            "min_accuracy": min(r["accuracy"] for r in rows if r["k"] == n_states),
            "edges": sum(r["edges_match"] for r in rows),
            "cpu_s": float(np.mean([r["cpu_s"] for r in rows])),
        }
        print(f"K right in {summary[n_states]['right']}/{len(rows)}; mean CPU per selection "
              f"{summary[n_states]['cpu_s']:.1f} s")  # fmt: skip
    return summary


def study_causes(seeds: int, n_jobs: int, quick: bool) -> None:
    variants = dict(list(VARIANTS.items())[:4]) if quick else VARIANTS
    print(f"== causes: K selected per seed ({seeds} seeds), one setting changed at a time")
    jobs = [(k, s, v) for v in variants.values() for k in (3, 5) for s in range(seeds)]
    results = iter(run_many(jobs, n_jobs))
    print(f"{'variant':72}{'true 3':>22}{'true 5':>22}")
    for name in variants:
        cells = []
        for _ in (3, 5):
            cells.append(" ".join(str(next(results)["k"]) for _ in range(seeds)))
        print(f"{name:72}{cells[0]:>22}{cells[1]:>22}")


def study_limit(seeds: int, n_jobs: int) -> None:
    separations = (3.0, 4.0, 6.0, 8.0)
    print(
        f"== detection limit: true K = 5, states this many within-state SDs apart ({seeds} seeds)"
    )
    results = iter(run_many([(5, s, {}, sep) for sep in separations for s in range(seeds)], n_jobs))
    for separation in separations:
        ks = [next(results)["k"] for _ in range(seeds)]
        print(f"separation {separation:3.0f}: K = {' '.join(map(str, ks))}  "
              f"({sum(k == 5 for k in ks)}/{seeds} right)")  # fmt: skip


def study_analysis(n_jobs: int, quick: bool) -> float:
    """Wall time of one whole joint comparison (shared fit, bootstrap, verdicts, figures)."""
    import tempfile

    from trainmap.dynamics.maps.settings import AnalysisSettings
    from trainmap.dynamics.maps.synthetic import sample_runs
    from trainmap.dynamics.pipeline import Outcomes, convergence_from_tables, joint_group

    cases = {"parity-sized: 2 methods x 32 runs x 321 checkpoints": (2, 32, 321),
             "digits-sized: 3 methods x 32 runs x 49 checkpoints": (3, 32, 49)}  # fmt: skip
    if quick:
        cases = {"small: 2 methods x 8 runs x 60 checkpoints": (2, 8, 60)}
    print(f"== analysis cost: one joint comparison, defaults (200 bootstrap resamples, 2000 "
          f"permutations), {n_jobs} processes")  # fmt: skip
    slowest = 0.0
    for label, (n_groups, per_group, length) in cases.items():
        runs, _, _ = sample_runs(5, n_runs=n_groups * per_group, length=length, seed=0)
        groups = {run: f"method{i % n_groups}" for i, run in enumerate(runs)}
        convergence = convergence_from_tables(runs, 0.5)
        outcomes = Outcomes(convergence, dict.fromkeys(runs, "completed"))
        with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            started = time.perf_counter()
            joint_group(runs, groups, outcomes, AnalysisSettings.of({}), out, n_jobs=n_jobs)
            seconds = time.perf_counter() - started
        slowest = max(slowest, seconds)
        print(f"{label:55} {seconds:6.1f} s")
    return slowest


def fit_each_alone(models: list, X: np.ndarray, lengths: list[int], weights=None) -> list[bool]:
    """:func:`~trainmap.dynamics.maps.hmm.gaussian.fit_together`'s contract, each model by its own
    ``fit`` (hmmlearn's loop)."""
    completed = []
    for model in models:
        try:
            model.fit(X, lengths) if weights is None else model.fit_weighted(X, lengths, weights)
            completed.append(True)
        except ValueError:
            completed.append(False)
    return completed


def study_cost(n_jobs: int, quick: bool) -> tuple[float, float]:
    from trainmap.dynamics.maps.hmm import gaussian
    from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
    from trainmap.dynamics.maps.hmm.gaussian import BatchedGaussianHMM
    from trainmap.dynamics.maps.synthetic import sample_runs

    n_runs, length = (10, 100) if quick else (40, 300)
    runs, _, _ = sample_runs(5, n_runs=n_runs, length=length, seed=0)
    print(f"== cost: K = 1..8 x 5 restarts, {n_runs} runs x {length} checkpoints, "
          f"{os.cpu_count()} cores")  # fmt: skip
    timings, fitted = {}, {}
    for label, jobs in (("serial", 1), ("parallel", n_jobs)):
        started = time.perf_counter()
        fitted[label] = TrainingHMM(random_state=0, n_jobs=jobs).fit(runs)
        timings[label] = time.perf_counter() - started
    identical = np.allclose(fitted["serial"].selection_["bic"], fitted["parallel"].selection_["bic"],
                            rtol=1e-10)  # fmt: skip
    # hmmlearn's own E-step and score on the same selection (serial), each K fitted alone (not in
    # lockstep with the others): same numbers, more time.
    overrides = {name: getattr(BatchedGaussianHMM, name) for name in ("_do_estep", "score")}
    together = gaussian.fit_together
    try:
        for name in overrides:
            delattr(BatchedGaussianHMM, name)
        gaussian.fit_together = fit_each_alone
        started = time.perf_counter()
        slow = TrainingHMM(random_state=0, n_jobs=1).fit(runs)
        timings["hmmlearn E-step"] = time.perf_counter() - started
    finally:
        for name, method in overrides.items():
            setattr(BatchedGaussianHMM, name, method)
        gaussian.fit_together = together
    same = np.allclose(slow.selection_["bic"], fitted["serial"].selection_["bic"], rtol=1e-8)
    print(f"hmmlearn E-step, serial  {timings['hmmlearn E-step']:7.1f} s")
    print(f"batched E-step, serial   {timings['serial']:7.1f} s  (same BICs: {same})")
    print(f"batched, {n_jobs} processes     {timings['parallel']:7.1f} s  (same BICs: {identical})")
    print(f"chosen K = {fitted['serial'].n_states_}")
    return timings["parallel"], timings["hmmlearn E-step"] / timings["parallel"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", choices=["known", "causes", "limit", "cost", "analysis", "all"],
                        default="all")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="3 seeds, 4 variants, small cost case")
    parser.add_argument("--seeds", type=int, help="sampler seeds (default 10, quick 3)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    args = parser.parse_args(argv)
    seeds = args.seeds or (3 if args.quick else 10)
    summary, fit_s, ratio = {}, float("nan"), float("nan")
    if args.study in ("known", "all"):
        summary = study_known(seeds, args.jobs)
    if args.study in ("causes", "all"):
        study_causes(min(seeds, 5), args.jobs, args.quick)
    if args.study in ("limit", "all"):
        study_limit(seeds, args.jobs)
    if args.study in ("cost", "all"):
        fit_s, ratio = study_cost(args.jobs, args.quick)
    joint_s = float("nan")
    if args.study in ("analysis", "all"):
        joint_s = study_analysis(args.jobs, args.quick)
    parts = []
    if summary:
        parts += [f"known3={summary[3]['right']}/{seeds}", f"known5={summary[5]['right']}/{seeds}",
                  f"min_accuracy={min(s['min_accuracy'] for s in summary.values()):.3f}",
                  f"edges={sum(s['edges'] for s in summary.values())}/{2 * seeds}"]  # fmt: skip
    parts += [f"fit_s={fit_s:.1f}", f"ratio={ratio:.2f}", f"joint_s={joint_s:.1f}"]
    print("hmm_select " + " ".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
