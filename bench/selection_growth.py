"""K against the number of runs: does a selection rule's K follow the seed count?

Likelihood criteria add states as data grow when the model is misspecified: the held-out BIC's
penalty per checkpoint, p log n / n, vanishes as runs are added, so a state that fits a little of
what the emission does not model pays for itself at enough runs. Measured on the known-answer
sampler (:func:`trainmap.dynamics.maps.synthetic.sample_runs`, true K = 3, 150 checkpoints, K_max 8,
the analysis defaults' 5 restarts, one process per fit) in four forms: no nuisance; nuisance 1
(each run its own offset, drift and scale, which the plain emission does not model); AR(1)
within-state noise with coefficient 0.8 (``autocorrelation=0.8``: correlated over checkpoints as
training metrics are, which no emission models); and Student-t within-state noise with 3 degrees
of freedom (``tails=3``, heavy tails, which no emission models either); at 40, 160 and 320 runs,
every run used, over sampler seeds.

Each data set is fitted once per selection splitting: ``holdout`` (one 20 % split, the paper's
rule), ``folds`` (every run held out once over 3 folds) and ``reproducible`` (halves of 20 runs);
``--affine`` adds folds with the ``run_affine`` emission (each run's offset, drift and scale
modelled; about 10x the cost). The ``gain`` rule's K at each tolerance is read off the folds curve
(:func:`~trainmap.dynamics.maps.hmm.curves.gain_curve`: the smallest K no larger K beats by more than
the tolerance in held-out nats per checkpoint per added state; the ``gain`` rule scores on the
folds' splits, so its fit is the folds fit), so the tolerances are compared on the same fits;
``gain-holdout`` is the same reading of the holdout curve (one split: cheaper, noisier).
``--quick`` also fits ``selection="gain"`` itself and checks it picks the K read off its folds
curve. Rows (one per rule, data set and K) are appended to ``bench/results/selection_growth.csv``
(resumable: a finished (rule, form, n, seed) is not refitted); the table goes to
``bench/results/selection_growth.md``. Each fit's cost is its CPU seconds (``time.process_time``,
BLAS single-threaded).

Usage::

    .venv/bin/python bench/selection_growth.py                 # 10 seeds, ~60 min on one core
    .venv/bin/python bench/selection_growth.py --forms "nuisance 1" "ar 0.8" --runs 320
    .venv/bin/python bench/selection_growth.py --affine --forms "nuisance 1" --seeds 3
    .venv/bin/python bench/selection_growth.py --quick         # 40 runs, 2 seeds, ~2 min
    .venv/bin/python bench/selection_growth.py --table --seeds 20  # the CSV's rows, no fits

Last line: ``selection_growth <rule>=<right>/<fits> ...`` over every form and n in the table.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trainmap.io import append_rows
from trainmap.schema import section_defaults

if TYPE_CHECKING:
    import pandas as pd

RESULTS = Path(__file__).parent / "results"
FORMS = {"none": {}, "nuisance 1": {"nuisance": 1.0}, "ar 0.8": {"autocorrelation": 0.8},
         "t3 tails": {"tails": 3.0}}  # fmt: skip
#: What each fit sets on TrainingHMM (the rest: the schema's analysis defaults).
FITS = {"holdout": {"selection": "holdout"}, "folds": {"selection": "folds"},
        "reproducible": {"selection": "reproducible"},
        "affine": {"selection": "folds", "emission": "run_affine"}}  # fmt: skip
TOLERANCES = (0.3, 0.4, 0.45)
TRUE_K = 3
K_MAX = section_defaults("analysis")["k_max"]
LENGTH = 150
FIELDS = ["fit", "form", "n_runs", "seed", "n_states", "heldout_log_likelihood",
          "heldout_observations", "bic", "k_chosen", "seconds"]  # fmt: skip


def sample(form: str, n_runs: int, seed: int) -> dict[str, pd.DataFrame]:
    """The metric tables of one data set."""
    from trainmap.dynamics.maps.synthetic import sample_runs

    runs, _, _ = sample_runs(TRUE_K, n_runs=n_runs, length=LENGTH, seed=seed, **FORMS[form])
    return runs


def fit_one(fit: str, form: str, n_runs: int, seed: int, k_max: int = K_MAX) -> list[dict]:
    """One fit of one data set: a row per K of its selection curve, with the K its rule chose and
    the fit's CPU seconds."""
    from trainmap.dynamics.maps.hmm.estimator import TrainingHMM

    runs = sample(form, n_runs, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        started = time.process_time()
        hmm = TrainingHMM(**FITS[fit], k_max=k_max).fit(runs)
        seconds = time.process_time() - started
    return [{"fit": fit, "form": form, "n_runs": n_runs, "seed": seed,
             "n_states": int(row.n_states),
             "heldout_log_likelihood": float(row.heldout_log_likelihood),
             "heldout_observations": int(row.heldout_observations), "bic": float(row.bic),
             "k_chosen": int(hmm.n_states_), "seconds": round(seconds, 2)}
            for row in hmm.selection_.itertuples()]  # fmt: skip


def gain_k(curve: pd.DataFrame, tolerance: float) -> int:
    """The ``gain`` rule's K on a stored curve (rows of one fit)."""
    from trainmap.dynamics.maps.hmm.curves import gain_curve

    chosen = gain_curve(curve.reset_index(drop=True), tolerance)
    return int(chosen.loc[chosen["gain_chosen"], "n_states"].iloc[0])


def rules() -> dict[str, tuple[str, float | None]]:
    """Each table row's rule: (the fit it reads, the gain tolerance or None for the fit's own K)."""
    named: dict[str, tuple[str, float | None]] = {"holdout": ("holdout", None),
                                                  "folds": ("folds", None),
                                                  "reproducible": ("reproducible", None)}  # fmt: skip
    named |= {f"gain {tol}": ("folds", tol) for tol in TOLERANCES}
    named |= {f"gain-holdout {tol}": ("holdout", tol) for tol in TOLERANCES}
    named |= {f"gain+run_affine {tol}": ("affine", tol) for tol in TOLERANCES}
    return named


def table(rows: pd.DataFrame, sizes: list[int]) -> tuple[str, str]:
    """The Markdown table (K per sampler seed, right / fits and mean CPU seconds per fit, per rule,
    form and n) and the summary line."""
    lines = ["| rule | form | " + " | ".join(f"{n} runs" for n in sizes) + " |",
             "| --- | --- |" + " --- |" * len(sizes)]  # fmt: skip
    totals: dict[str, list[int]] = {}
    for rule, (fit, tolerance) in rules().items():
        for form in FORMS:
            cells = []
            for n in sizes:
                fits = rows[(rows["fit"] == fit) & (rows["form"] == form) & (rows["n_runs"] == n)]
                ks, seconds = [], []
                for _, curve in fits.groupby("seed"):
                    ks.append(int(curve["k_chosen"].iloc[0]) if tolerance is None
                              else gain_k(curve, tolerance))  # fmt: skip
                    seconds.append(float(curve["seconds"].iloc[0]))
                right = sum(k == TRUE_K for k in ks)
                if ks:
                    totals.setdefault(rule, [0, 0])
                    totals[rule][0] += right
                    totals[rule][1] += len(ks)
                cells.append(f"{''.join(map(str, ks))} ({right}/{len(ks)}; "
                             f"{np.mean(seconds):.1f} s)" if ks else "-")  # fmt: skip
            if any(cell != "-" for cell in cells):
                lines.append(f"| {rule} | {form} | " + " | ".join(cells) + " |")
    summary = "selection_growth " + " ".join(f"{rule.replace(' ', '')}={right}/{total}"
                                              for rule, (right, total) in totals.items())  # fmt: skip
    return "\n".join(lines) + "\n", summary


def check_gain_rule(form: str, n_runs: int, seed: int, tolerance: float) -> None:
    """``selection="gain"`` picks the K :func:`gain_k` reads off the folds fit's curve."""
    from trainmap.dynamics.maps.hmm.estimator import TrainingHMM

    runs = sample(form, n_runs, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gain = TrainingHMM(selection="gain", min_gain=tolerance).fit(runs)
        folds = TrainingHMM(selection="folds").fit(runs)
    read = gain_k(folds.selection_, tolerance)
    if gain.n_states_ != read:
        raise SystemExit(f"selection gain chose K = {gain.n_states_}, its folds curve {read}")
    print(f"selection='gain' (min_gain {tolerance}) on {form}, {n_runs} runs, seed {seed}: "
          f"K = {read}, as read off the folds curve")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="40 runs, 2 seeds, holdout and folds, into /tmp; and a gain fit",
    )
    parser.add_argument("--seeds", type=int, default=10, help="sampler seeds (default 10)")
    parser.add_argument(
        "--runs",
        type=int,
        nargs="+",
        default=[40, 160, 320],
        help="runs per data set (default 40 160 320)",
    )
    parser.add_argument(
        "--forms",
        nargs="+",
        default=list(FORMS),
        choices=list(FORMS),
        help="sampler forms (default all)",
    )
    parser.add_argument("--fits", nargs="+", default=["holdout", "folds", "reproducible"],
                        choices=list(FITS), help="fits per data set (default holdout folds "
                        "reproducible; affine: folds with the run_affine emission)")  # fmt: skip
    parser.add_argument("--affine", action="store_true", help="add the run_affine folds fit")
    parser.add_argument(
        "--table", action="store_true", help="fit nothing: write the table of the CSV's rows"
    )
    parser.add_argument("--k-max", type=int, default=K_MAX,
                        help=f"largest K tried (default {K_MAX}, the schema's; another value "
                        "writes its own CSV and table, *_kmax<K>)")  # fmt: skip
    parser.add_argument("--csv", type=Path, default=RESULTS / "selection_growth.csv")
    parser.add_argument("--out", type=Path, default=RESULTS / "selection_growth.md")
    args = parser.parse_args(argv)
    if args.k_max < TRUE_K:  # before any fit: no rule could find the truth
        parser.error(f"--k-max {args.k_max} is below the sampler's true K = {TRUE_K}: no rule "
                     f"could select it; use --k-max {TRUE_K} or more (default {K_MAX})")  # fmt: skip
    if args.k_max != K_MAX:  # never mixed with the default K_max's rows
        for name in ("csv", "out"):
            path = getattr(args, name)
            setattr(args, name, path.with_name(f"{path.stem}_kmax{args.k_max}{path.suffix}"))
    import pandas as pd

    fits = args.fits + (["affine"] if args.affine else [])
    seeds, sizes, csv_path = args.seeds, sorted(args.runs), args.csv
    if args.quick:
        seeds, sizes, fits = 2, [40], ["holdout", "folds"]
        csv_path = Path("/tmp/selection_growth_quick.csv")
    done = set()
    if csv_path.exists():
        previous = pd.read_csv(csv_path)
        done = set(zip(previous["fit"], previous["form"], previous["n_runs"], previous["seed"],
                       strict=True))  # fmt: skip
    # The rows that decide the choice first: the most runs, the misspecified forms.
    tasks = [(fit, form, n, seed) for n in sorted(sizes, reverse=True) for form in args.forms
             for seed in range(seeds) for fit in fits
             if (fit, form, n, seed) not in done and not args.table]  # fmt: skip
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        results = fit_one(*task, k_max=args.k_max)
        append_rows(csv_path, results, FIELDS)
        first = results[0]
        print(f"{first['fit']:12} {first['form']:10} n={first['n_runs']:3} seed={first['seed']}: "
              f"K {first['k_chosen']} ({first['seconds']:.1f} s)", flush=True)  # fmt: skip
    rows = pd.read_csv(csv_path)
    all_sizes = sorted(int(n) for n in rows["n_runs"].unique())
    rows = rows[rows["seed"] < seeds]
    markdown, summary = table(rows, all_sizes)
    header = ("K chosen per sampler seed, in seed order (right of true K = 3 / fits; mean CPU "
              "seconds of one fit, 5 restarts, one process), every run used; written by "
              "`python bench/selection_growth.py`. gain T: the gain rule at min_gain T (nats per "
              "checkpoint), its fit the folds fit; gain-holdout T: the same read off the holdout "
              "fit.\n\n")  # fmt: skip
    if args.quick:
        check_gain_rule("nuisance 1", 40, 0, TOLERANCES[1])
    else:
        args.out.write_text(header + markdown)
    print(markdown)
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
