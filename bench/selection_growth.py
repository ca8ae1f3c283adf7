"""K against the number of runs: does a selection rule's K follow the seed count?

Likelihood criteria add states as data grow when the model is misspecified: the held-out BIC's
penalty per checkpoint, p log n / n, vanishes as runs are added, so a state that fits a little of
what the emission does not model pays for itself at enough runs. Measured on the known-answer
sampler (:func:`trainmap.dynamics.maps.synthetic.sample_runs`, true K per row: ``--true-k``,
default 3; 150 checkpoints, K_max 8, the analysis defaults' 5 restarts, one process per fit) in
these forms (:data:`FORMS`): no nuisance; nuisance 1 (each run its own offset, drift and scale,
which the plain emission does not model); AR(1) within-state noise with coefficient 0.8
(``autocorrelation=0.8``: correlated over checkpoints as training metrics are, which no emission
models); Student-t within-state noise with 3 and 5 degrees of freedom (``tails``, heavy tails,
which the Gaussian emissions do not model); a level that keeps moving inside each state
(``state_drift=2``: 2 within-state SDs along the path at the state's mean dwell, a square root
of the time in it); unequal run lengths (``length_spread=2``: each run cut short to between half
and all of its checkpoints); and ``7 metrics``, the plain sampler with only the first 7 of the 14
metrics fitted (:data:`FORM_FIT`: the fit's ``features``); at 40, 160 and 320 runs, every run
used, over sampler seeds.

Each data set is fitted once per selection splitting, with the paper's Gaussian emissions
(``emission: plain``, named in :data:`FITS`, so the stored rows keep their meaning whatever the
default): ``holdout`` (one 20 % split, the paper's rule), ``folds`` (every run held out once over 3
folds) and ``reproducible`` (halves of 20 runs);
``--affine`` adds folds with the ``run_affine`` emission (each run's offset, drift and scale
modelled; about 10x the cost), ``--fits folds_t`` folds with the ``student_t`` emission. The
``gain`` rule's K at each tolerance (``--tolerances``) is read off the folds curve
(:func:`~trainmap.dynamics.maps.hmm.curves.gain_curve`: the smallest K no larger K beats by more than
the tolerance in held-out nats per checkpoint per added state; the ``gain`` rule scores on the
folds' splits, so its fit is the folds fit), so the tolerances are compared on the same fits
(another tolerance needs no refit: ``--table --tolerances ...``); ``gain-holdout`` is the same
reading of the holdout curve (one split: cheaper, noisier), ``gain+run_affine`` and
``gain+student_t`` of the affine and folds_t fits.
``--quick`` also fits ``selection="gain"`` itself and checks it picks the K read off its folds
curve. Rows (one per fit, data set and K) are appended to ``bench/results/selection_growth.csv``
(resumable: a finished (fit, form, true K, n, seed) is not refitted; with ``--jobs N`` the fits
run in N processes, each fit's rows appended as it finishes, in any order); the table goes to
``bench/results/selection_growth.md`` (by default beside the CSV: ``--csv X.csv`` writes
``X.md``). Each fit's cost is its CPU seconds (``time.process_time``
in the process that fits, BLAS single-threaded).

``--settings KEY=VALUE`` (repeatable; VALUE read as JSON, else a string) passes TrainingHMM
arguments to every fit, over the fit's and the form's own (:data:`FITS`, :data:`FORM_FIT`). Such
rows must be kept apart from the defaults' rows: ``--settings`` needs ``--name-suffix S``, which
writes the rows under the fit name plus S (``folds`` -> ``folds@mc3``, a fit of its own in the
CSV); the same ``--name-suffix`` with ``--table`` tabulates those rows (rules named with S too),
into ``selection_growth_<S>.md`` unless ``--out`` is given, so the defaults' table stays.

Usage::

    .venv/bin/python bench/selection_growth.py                 # 10 seeds, ~60 min on one core
    .venv/bin/python bench/selection_growth.py --forms "nuisance 1" "ar 0.8" --runs 320
    .venv/bin/python bench/selection_growth.py --true-k 3 5 --forms "state drift 2" --jobs 2
    .venv/bin/python bench/selection_growth.py --runs 40 160 --true-k 3 5 --fits folds folds_t \
        --seeds 10 --jobs 2    # the old default (plain) beside the new (student_t), every form
    .venv/bin/python bench/selection_growth.py --affine --forms "nuisance 1" --seeds 3
    .venv/bin/python bench/selection_growth.py --fits folds_t --forms "t3 tails" "t5 tails"
    .venv/bin/python bench/selection_growth.py --fits folds --settings min_covar=0.001 \\
        --name-suffix @mc3                                     # rows under fit "folds@mc3"
    .venv/bin/python bench/selection_growth.py --table --name-suffix @mc3  # their table
    .venv/bin/python bench/selection_growth.py --quick         # 40 runs, 2 seeds, ~2 min
    .venv/bin/python bench/selection_growth.py --table --seeds 20  # the CSV's rows, no fits
    .venv/bin/python bench/selection_growth.py --table --tolerances 0.2 0.5  # other thresholds

Last line: ``selection_growth <rule>=<right>/<fits> ...`` over every form, true K and n in the
table.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainmap.dynamics.metrics.columns import METRIC_NAMES
from trainmap.io import append_rows
from trainmap.schema import section_defaults

if TYPE_CHECKING:
    import pandas as pd

RESULTS = Path(__file__).parent / "results"
#: Each form's sample_runs options.
FORMS = {"none": {}, "nuisance 1": {"nuisance": 1.0}, "ar 0.8": {"autocorrelation": 0.8},
         "t3 tails": {"tails": 3.0}, "t5 tails": {"tails": 5.0},
         "state drift 2": {"state_drift": 2.0}, "lengths 2x": {"length_spread": 2.0},
         "7 metrics": {}}  # fmt: skip
#: What a form sets on every fit's TrainingHMM (over the fit's own settings).
FORM_FIT: dict[str, dict[str, Any]] = {"7 metrics": {"features": list(METRIC_NAMES[:7])}}
#: The forms --quick fits when --forms is not given (the first four: its ~2 min).
QUICK_FORMS = ("none", "nuisance 1", "ar 0.8", "t3 tails")
#: What each fit sets on TrainingHMM (the rest: the schema's analysis defaults). Each names its
#: emission, so the stored rows keep their meaning when the default emission changes.
FITS = {"holdout": {"selection": "holdout", "emission": "plain"},
        "folds": {"selection": "folds", "emission": "plain"},
        "reproducible": {"selection": "reproducible", "emission": "plain"},
        "affine": {"selection": "folds", "emission": "run_affine"},
        "folds_t": {"selection": "folds", "emission": "student_t"}}  # fmt: skip
TOLERANCES = (0.25, 0.3, 0.4, 0.45)
TRUE_KS = (3,)
K_MAX = section_defaults("analysis")["k_max"]
LENGTH = 150
FIELDS = ["fit", "form", "true_k", "n_runs", "seed", "n_states", "heldout_log_likelihood",
          "heldout_observations", "bic", "k_chosen", "seconds"]  # fmt: skip
#: The columns that name one fit of one data set (the done-set's and the table's key).
KEY = ["fit", "form", "true_k", "n_runs", "seed"]


def sample(form: str, n_runs: int, seed: int, true_k: int = TRUE_KS[0]) -> dict[str, pd.DataFrame]:
    """The metric tables of one data set: ``n_runs`` runs of the sampler with ``true_k`` states."""
    from trainmap.dynamics.maps.synthetic import sample_runs

    runs, _, _ = sample_runs(true_k, n_runs=n_runs, length=LENGTH, seed=seed, **FORMS[form])
    return runs


def fit_settings(
    fit: str, form: str, settings: dict[str, Any] | None = None, k_max: int = K_MAX
) -> dict[str, Any]:
    """TrainingHMM's arguments for ``fit`` on ``form``: :data:`FITS`' ``fit``, then
    :data:`FORM_FIT`'s ``form``, then ``settings`` (each over the one before), and ``k_max``."""
    return {**FITS[fit], **FORM_FIT.get(form, {}), **(settings or {}), "k_max": k_max}


def fit_one(
    fit: str, form: str, true_k: int, n_runs: int, seed: int, k_max: int = K_MAX,
    settings: dict[str, Any] | None = None, suffix: str = "",
) -> list[dict]:  # fmt: skip
    """One fit of one data set: a row per K of its selection curve (fit column ``fit + suffix``),
    with the K its rule chose and the fit's CPU seconds in this process (BLAS single-threaded)."""
    from threadpoolctl import threadpool_limits

    from trainmap.dynamics.maps.hmm.estimator import TrainingHMM

    runs = sample(form, n_runs, seed, true_k)
    with warnings.catch_warnings(), threadpool_limits(limits=1):
        warnings.simplefilter("ignore")
        started = time.process_time()
        hmm = TrainingHMM(**fit_settings(fit, form, settings, k_max)).fit(runs)
        seconds = time.process_time() - started
    return [{"fit": fit + suffix, "form": form, "true_k": true_k, "n_runs": n_runs, "seed": seed,
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


def form_tolerance(form: str, min_gain: float) -> float:
    """The gain rule's tolerance on a form's fits: ``min_gain`` scaled to the metrics the form's
    fits see (the default ``min_gain_scale: metrics``; :func:`~trainmap.dynamics.maps.hmm.selection.
    gain_tolerance`): half of it on ``7 metrics``."""
    from trainmap.dynamics.maps.hmm.selection import gain_tolerance

    features = FORM_FIT.get(form, {}).get("features", METRIC_NAMES)
    return gain_tolerance(min_gain, "metrics", len(features))


def rules(
    tolerances: Sequence[float] = TOLERANCES, suffix: str = ""
) -> dict[str, tuple[str, float | None]]:
    """Each table row's rule: (the fit it reads, the gain tolerance or None for the fit's own K).
    With a ``suffix`` every rule reads the fits named with it (``--name-suffix``) and is named
    with it too."""
    named: dict[str, tuple[str, float | None]] = {"holdout": ("holdout", None),
                                                  "folds": ("folds", None),
                                                  "reproducible": ("reproducible", None)}  # fmt: skip
    named |= {f"gain {tol}": ("folds", tol) for tol in tolerances}
    named |= {f"gain-holdout {tol}": ("holdout", tol) for tol in tolerances}
    named |= {f"gain+run_affine {tol}": ("affine", tol) for tol in tolerances}
    named |= {f"gain+student_t {tol}": ("folds_t", tol) for tol in tolerances}
    return {f"{rule}{suffix}": (fit + suffix, tol) for rule, (fit, tol) in named.items()}


def table(
    rows: pd.DataFrame, sizes: list[int], tolerances: Sequence[float] = TOLERANCES,
    suffix: str = "",
) -> tuple[str, str]:  # fmt: skip
    """The Markdown table (K per sampler seed, right (K = the row's true K) / fits and mean CPU
    seconds per fit, per rule, form, true K and n) and the summary line."""
    lines = ["| rule | form | true K | " + " | ".join(f"{n} runs" for n in sizes) + " |",
             "| --- | --- | --- |" + " --- |" * len(sizes)]  # fmt: skip
    totals: dict[str, list[int]] = {}
    true_ks = sorted(int(k) for k in rows["true_k"].unique())
    for rule, (fit, tolerance) in rules(tolerances, suffix).items():
        for form in FORMS:
            for true_k in true_ks:
                cells = []
                for n in sizes:
                    fits = rows[(rows["fit"] == fit) & (rows["form"] == form)
                                & (rows["true_k"] == true_k) & (rows["n_runs"] == n)]  # fmt: skip
                    ks, seconds = [], []
                    for _, curve in fits.groupby("seed"):
                        ks.append(int(curve["k_chosen"].iloc[0]) if tolerance is None
                                  else gain_k(curve, form_tolerance(form, tolerance)))  # fmt: skip
                        seconds.append(float(curve["seconds"].iloc[0]))
                    right = sum(k == true_k for k in ks)
                    if ks:
                        totals.setdefault(rule, [0, 0])
                        totals[rule][0] += right
                        totals[rule][1] += len(ks)
                    cells.append(f"{''.join(map(str, ks))} ({right}/{len(ks)}; "
                                 f"{np.mean(seconds):.1f} s)" if ks else "-")  # fmt: skip
                if any(cell != "-" for cell in cells):
                    lines.append(f"| {rule} | {form} | {true_k} | " + " | ".join(cells) + " |")
    summary = "selection_growth " + " ".join(f"{rule.replace(' ', '')}={right}/{total}"
                                              for rule, (right, total) in totals.items())  # fmt: skip
    return "\n".join(lines) + "\n", summary


def check_gain_rule(
    form: str, n_runs: int, seed: int, tolerance: float, true_k: int = TRUE_KS[0],
    settings: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """``selection="gain"`` picks the K :func:`gain_k` reads off the folds fit's curve."""
    from trainmap.dynamics.maps.hmm.estimator import TrainingHMM

    runs = sample(form, n_runs, seed, true_k)
    extra = {**FORM_FIT.get(form, {}), **(settings or {})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gain = TrainingHMM(**{**extra, "selection": "gain", "min_gain": tolerance}).fit(runs)
        folds = TrainingHMM(**{**extra, "selection": "folds"}).fit(runs)
    read = gain_k(folds.selection_, tolerance)
    if gain.n_states_ != read:
        raise SystemExit(f"selection gain chose K = {gain.n_states_}, its folds curve {read}")
    print(f"selection='gain' (min_gain {tolerance}) on {form}, {n_runs} runs, seed {seed}: "
          f"K = {read}, as read off the folds curve")  # fmt: skip


def setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (KEY, VALUE read as JSON, else the string itself)."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def read_rows(path: Path) -> pd.DataFrame:
    """The CSV's rows; a CSV of other columns (one from before the ``true_k`` column) stops the
    bench, rather than have rows of two layouts appended to one file."""
    import pandas as pd

    rows = pd.read_csv(path)
    if list(rows.columns) != FIELDS:
        raise SystemExit(f"{path}: its columns {list(rows.columns)} are not this bench's "
                         f"{FIELDS}; a CSV from before the true_k column needs true_k = 3 inserted "
                         "after form in every row (every earlier fit sampled 3 states)")  # fmt: skip
    return rows


def run_fits(
    tasks: list[tuple[str, str, int, int, int]], jobs: int, csv_path: Path, **options: Any
) -> None:
    """Fit every task (:func:`fit_one`'s arguments, ``options`` its keywords) in ``jobs`` processes
    (1: here), appending each fit's rows to ``csv_path`` as it finishes."""

    def record(results: list[dict]) -> None:
        append_rows(csv_path, results, FIELDS)
        first = results[0]
        print(f"{first['fit']:12} {first['form']:14} true K {first['true_k']} "
              f"n={first['n_runs']:3} seed={first['seed']}: K {first['k_chosen']} "
              f"({first['seconds']:.1f} s)", flush=True)  # fmt: skip

    if jobs == 1:
        for task in tasks:
            record(fit_one(*task, **options))
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(jobs)
    try:
        for future in as_completed([pool.submit(fit_one, *task, **options) for task in tasks]):
            record(future.result())
    except BaseException:  # a failed fit or an interrupt: start nothing more
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="40 runs, 2 seeds, holdout and folds, the first four forms unless --forms, into "
        "/tmp; and a gain fit",
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
        "--true-k",
        type=int,
        nargs="+",
        default=list(TRUE_KS),
        help="the sampler's numbers of states, each its own data sets (default 3)",
    )
    parser.add_argument(
        "--forms",
        nargs="+",
        default=None,
        choices=list(FORMS),
        help="sampler forms (default all)",
    )
    parser.add_argument("--fits", nargs="+", default=["holdout", "folds", "reproducible"],
                        choices=list(FITS), help="fits per data set (default holdout folds "
                        "reproducible; affine: folds with the run_affine emission; folds_t: "
                        "folds with the student_t emission)")  # fmt: skip
    parser.add_argument("--affine", action="store_true", help="add the run_affine folds fit")
    parser.add_argument("--tolerances", type=float, nargs="+", default=list(TOLERANCES),
                        help="the gain rule's tolerances the table reads off the curves "
                        f"(default {' '.join(map(str, TOLERANCES))}; no refit)")  # fmt: skip
    parser.add_argument("--settings", type=setting, action="append", default=[],
                        metavar="KEY=VALUE", help="a TrainingHMM argument for every fit "
                        "(repeatable; VALUE as JSON, else a string); needs --name-suffix")  # fmt: skip
    parser.add_argument("--name-suffix", default="",
                        help="appended to the fit names of the rows written and read (keeps "
                        "rows of other --settings apart); the table: selection_growth_<suffix>.md "
                        "unless --out")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1,
                        help="fits run in this many processes (default 1)")  # fmt: skip
    parser.add_argument(
        "--table", action="store_true", help="fit nothing: write the table of the CSV's rows"
    )
    parser.add_argument("--k-max", type=int, default=K_MAX,
                        help=f"largest K tried (default {K_MAX}, the schema's; another value "
                        "writes its own CSV and table, *_kmax<K>)")  # fmt: skip
    parser.add_argument("--csv", type=Path, default=RESULTS / "selection_growth.csv")
    parser.add_argument("--out", type=Path, default=None,
                        help="the table (default: the CSV's name with .md, "
                        "bench/results/selection_growth.md; with --name-suffix S, "
                        "selection_growth_<S>.md)")  # fmt: skip
    args = parser.parse_args(argv)
    if min(args.true_k) < 2:
        parser.error(f"--true-k {min(args.true_k)}: the sampler's path needs at least 2 states")
    largest = max(args.true_k)
    if args.k_max < largest:  # before any fit: no rule could find the truth
        parser.error(f"--k-max {args.k_max} is below the sampler's true K = {largest}: no rule "
                     f"could select it; use --k-max {largest} or more (default {K_MAX})")  # fmt: skip
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: at least 1 process")
    if not all(math.isfinite(tol) and tol >= 0 for tol in args.tolerances):
        parser.error(f"--tolerances {args.tolerances}: nats per checkpoint, each finite and >= 0")
    settings = dict(args.settings)
    if settings and not args.name_suffix:
        parser.error("--settings needs --name-suffix: rows of other settings are written under "
                     "their own fit names (e.g. --name-suffix @mc3 writes folds@mc3)")  # fmt: skip
    if "k_max" in settings:
        parser.error("--settings k_max=...: use --k-max (it names its own CSV and table)")
    suffix = args.name_suffix
    if args.out is None:  # beside the CSV: a CSV elsewhere never overwrites the results' table
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", suffix).strip("_.")
        args.out = args.csv.with_name(args.csv.stem + (f"_{slug}" if slug else "") + ".md")
    if args.k_max != K_MAX:  # never mixed with the default K_max's rows
        for name in ("csv", "out"):
            path = getattr(args, name)
            setattr(args, name, path.with_name(f"{path.stem}_kmax{args.k_max}{path.suffix}"))
    forms = args.forms or (list(QUICK_FORMS) if args.quick else list(FORMS))
    fits = args.fits + (["affine"] if args.affine else [])
    seeds, sizes, csv_path = args.seeds, sorted(args.runs), args.csv
    if args.quick:
        seeds, sizes, fits = 2, [40], ["holdout", "folds"]
        csv_path = Path("/tmp/selection_growth_quick.csv")
    done = set()
    if csv_path.exists():
        previous = read_rows(csv_path)
        done = set(previous[KEY].itertuples(index=False, name=None))
    # The rows that decide the choice first: the most runs, the misspecified forms.
    tasks = [(fit, form, true_k, n, seed) for n in sorted(sizes, reverse=True) for form in forms
             for true_k in args.true_k for seed in range(seeds) for fit in fits
             if (fit + suffix, form, true_k, n, seed) not in done and not args.table]  # fmt: skip
    if tasks:  # every fit's arguments checked before any fit (an unknown setting or emission)
        from trainmap.dynamics.maps.hmm.estimator import TrainingHMM

        for fit, form in sorted({(task[0], task[1]) for task in tasks}):
            try:
                TrainingHMM(**fit_settings(fit, form, settings, args.k_max))
            except (TypeError, ValueError) as error:
                parser.error(f"fit {fit} on form {form!r}: {error}")
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    run_fits(tasks, args.jobs, csv_path, k_max=args.k_max, settings=settings, suffix=suffix)
    rows = read_rows(csv_path)
    all_sizes = sorted(int(n) for n in rows["n_runs"].unique())
    rows = rows[rows["seed"] < seeds]
    markdown, summary = table(rows, all_sizes, args.tolerances, suffix)
    header = ("K chosen per sampler seed, in seed order (right: K equal to the row's true K, the "
              "sampler's number of states / fits; mean CPU seconds of one fit, 5 restarts, one "
              "process per fit), every run used; written by "
              "`python bench/selection_growth.py`. gain T: the gain rule at min_gain T (nats per "
              "checkpoint at 14 metrics, scaled by d / 14 for d metrics: T / 2 on 7 metrics, "
              "min_gain_scale metrics), its fit the folds fit (plain emission); gain-holdout T: the same read off the holdout "
              "fit; gain+run_affine T and gain+student_t T: off folds fits with those "
              "emissions.")  # fmt: skip
    if suffix:
        header += (
            f" Rules suffixed {suffix}: the fits written with --name-suffix {suffix}"
            + (f" (settings {json.dumps(settings)})" if settings else "")
            + "."
        )
    if args.quick:
        check_gain_rule("nuisance 1", 40, 0, args.tolerances[min(1, len(args.tolerances) - 1)],
                        args.true_k[0], settings)  # fmt: skip
    else:
        args.out.write_text(header + "\n\n" + markdown)
    print(markdown)
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
