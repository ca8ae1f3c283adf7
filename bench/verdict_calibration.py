"""Calibration and power of a joint comparison's verdicts: how often each finds a difference.

A joint comparison (:func:`trainmap.dynamics.verdicts.joint.compare_groups`) tests every pair of methods
in two families, each Holm-corrected on its own (:func:`trainmap.dynamics.verdicts.compare.compare_methods`):
the primary (label-free: convergence step, trajectories, first passage to the final state, states
visited, transitions, collapsed paths) and the secondary (state-level: occupancy of each state,
time in detour states). A verdict counts as significant here when its Holm-corrected p is below
alpha (the analysis default, 0.05); a family when any of its verdicts is.

**(a) Power and false positives on runs with a known answer.** Two methods' runs from
:func:`trainmap.dynamics.maps.synthetic.sample_methods` (true K = 3, 150 checkpoints, 14 metrics), b's
law differing from a's by a planted effect of a size: ``detour`` (b's runs pass through an extra
state off the path with probability size), ``fork`` (they end in another final state with
probability size), ``slower`` (b's mean dwell in the middle phase times 1 + size), ``offset``
(b's first state moved by size within-state SDs). Size 0 is one law for both methods (the same
draws for every effect: effect ``none``), so its share of significant verdicts is the false
positive rate, which should be <= alpha within its binomial 95 % interval (Clopper-Pearson,
``scipy.stats.binomtest(...).proportion_ci()``). Each data set gets one shared map, fitted by
``compare_groups`` with :class:`~trainmap.dynamics.maps.hmm.estimator.TrainingHMM`'s defaults but
``selection="holdout"``, ``--restarts`` (default 2; ``random_state`` the sampler seed) and
``--emission`` (default ``plain``, the emission the stored tables were measured with;
``--degrees-of-freedom`` its nu under ``student_t``), the analysis defaults' 2000 permutations, convergence at the first checkpoint with ``test_acc`` 1
(the sampler's last state). "time in detours" exists only where the map's regression found a
detour state; elsewhere it counts as not significant. "occupancy" is significant when any state's
is (the map numbers its states anew for each data set). ``--jobs N`` fits N data sets at a time,
each in its own process with BLAS on one thread; every data set is seeded by its own seed, so the
rows do not depend on N.

**(b) Calibration on real runs** (``--results DIR``, a finished study's results tree; default
``results``, the default study's, which ``make run`` makes). For each joint comparison of
``--config`` whose shared map is under ``DIR/joint/<name>/``, its runs are read as the pipeline
reads them (:func:`selection_real.read_joint_cells`: metric tables and evaluations under ``DIR``;
:func:`~trainmap.dynamics.pipeline.analysis_runs`; :func:`~trainmap.jobs.analysis.rows_of_fit`,
the checkpoints the map was made from; :meth:`~trainmap.dynamics.pipeline.FittedMap.load`, the map
and every run's decoded states; the detour states of ``joint.json``). Then the method labels are
permuted among the runs ``--relabellings`` times (seeded; group sizes kept) and for each
permutation the verdicts are recomputed by ``compare_methods`` on the SAME map, with the path
evidence. Holding the map fixed is exact when the map does not depend on the labels: the
``holdout``, ``folds`` and ``gain`` rules split the runs without them, but ``reproducible`` halves
each method's runs (``strata``), so under it the map was chosen with the true labels and the
relabelled tests are conditional on that choice. Under any permutation no method differs, so the
share of permutations with a significant verdict in a family is that family's false positive
rate on real runs. ``--emission`` does not apply here (the maps are the study's own, of its
settings); ``--no-real`` leaves (b) out. Each recomputation uses ``--inner-permutations`` (default 500, >= 1/alpha)
instead of the analysis' 2000, to keep 200 of them affordable: p-values are then coarser
(1/501), which changes how often a p near alpha falls below it, not the test's level.

Rows of (a) go to ``bench/results/verdict_calibration.csv`` (resumable: a data set already
there with the same restarts and permutations is not refitted); the tables of (a) and (b) to
``bench/results/verdict_calibration.md``. Another emission has its own pair, never mixed with the
plain one: ``verdict_calibration_<emission>.csv`` and ``.md`` (``student_t`` at a nu other than
the analysis default: ``verdict_calibration_student_t_nu<nu>``). ``--quick`` writes nothing (its
few seeds would only blur the measured tables).

Usage::

    .venv/bin/python bench/verdict_calibration.py                  # 20 seeds (null 100), n = 16, 32
    .venv/bin/python bench/verdict_calibration.py --seeds 40 --runs 16 --size detour=0.5,1
    .venv/bin/python bench/verdict_calibration.py --results results --relabellings 200
    .venv/bin/python bench/verdict_calibration.py --table          # the CSV's rows, no fits
    .venv/bin/python bench/verdict_calibration.py --quick          # ~2 min: 3 seeds, n = 16
    .venv/bin/python bench/verdict_calibration.py --emission student_t --seeds 0 --null-seeds 100 --no-real --jobs 2   # the null table under the Student-t emission

Last line: ``verdict_calibration [emission=<emission>] null <null> primary=k/N ... | power primary
<effect>@<size>,n=<n>=k/N ... | real <comparison> primary=k/N secondary=k/N`` (the emission only
when not plain; the power part only with planted effects, the real part only when (b) ran).
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from selection_real import finished_maps, read_joint_cells, study_command

from trainmap.io import append_rows, load_json
from trainmap.schema import section_defaults, section_schema

if TYPE_CHECKING:
    import pandas as pd

#: trainmap.dynamics.maps.settings.ANALYSIS_DEFAULTS (the schema's analysis defaults), read from
#: the schema itself: no analysis import before the arguments are parsed
ANALYSIS_DEFAULTS = section_defaults("analysis")
#: The HMM's emission models (trainmap.dynamics.maps.hmm.factory.EMISSIONS), read from the schema
EMISSIONS: tuple[str, ...] = tuple(section_schema("analysis")["properties"]["emission"]["enum"])
#: The emission of the stored tables (``--emission``'s default, whatever the analysis default is)
PLAIN = "plain"
RESULTS = Path(__file__).parent / "results"
CSV_PATH = RESULTS / "verdict_calibration.csv"
MD_PATH = RESULTS / "verdict_calibration.md"
NULL = "none"
#: The null cells, each at one size: labels exchangeable (``none``: one law for both methods), a
#: start that decays by the start window (``start``: 8 within-state SDs at step 0, gone by a tenth
#: of training) or by twice it (``start_slow``), a constant level (4 SDs), a constant scale (x 2)
#: and Student-t noise with 3 degrees of freedom in both methods (``tails``, its size the degrees).
NULLS = {NULL: 0.0, "start": 8.0, "start_slow": 8.0, "level": 4.0, "scale": 1.0, "tails": 3.0}
#: Each planted path effect's default non-zero sizes (``offset``: b's first state moved, reported
#: by the start verdict and the band for as long as runs stay in it).
SIZES = {"slower": (1.0, 2.0), "detour": (0.5, 1.0), "fork": (0.5, 1.0), "offset": (4.0,)}
#: The trajectories verdict as published before the start window (every grid step, metrics
#: z-scored over all steps pooled): computed here only, to show what it fired on.
PUBLISHED = "trajectories, all grid steps (as published)"
FIELDS = ["effect", "size", "n_per_method", "seed", "restarts", "permutations", "k", "seconds",
          "quantity", "p"]  # fmt: skip
LENGTH, TRUE_K, THRESHOLD = 150, 3, 0.5


def emission_name(emission: str, degrees_of_freedom: float) -> str:
    """The emission as the files and headings name it: ``emission``, and ``student_t`` at a nu
    other than the analysis default as ``student_t_nu<nu>`` (``degrees_of_freedom`` is read by
    ``student_t`` only)."""
    if emission == "student_t" and degrees_of_freedom != ANALYSIS_DEFAULTS["degrees_of_freedom"]:
        return f"student_t_nu{degrees_of_freedom:g}"
    return emission


def result_paths(emission: str, degrees_of_freedom: float) -> tuple[Path, Path]:
    """The CSV of (a)'s rows and the markdown of the tables under this emission: :data:`CSV_PATH`
    and :data:`MD_PATH` for ``plain``, ``verdict_calibration_<name>.csv`` and ``.md`` beside them
    otherwise (``<name>``: :func:`emission_name`), so no other emission's rows reach the plain
    table."""
    if emission == PLAIN:
        return CSV_PATH, MD_PATH
    stem = f"verdict_calibration_{emission_name(emission, degrees_of_freedom)}"
    return CSV_PATH.with_name(f"{stem}.csv"), MD_PATH.with_name(f"{stem}.md")


@cache
def columns() -> dict[str, tuple[str, ...]]:
    """The table's verdict columns: a column name -> the quantities it reads (any significant)."""
    from trainmap.dynamics.verdicts import paths as label_free
    from trainmap.dynamics.verdicts import timecourse
    from trainmap.dynamics.verdicts.compare import CONVERGENCE_STEP, PRIMARY, SECONDARY

    return {
        "start": (timecourse.START,),
        "convergence": (CONVERGENCE_STEP,),
        "dynamics after W": (timecourse.DYNAMICS,),
        "trajectories after W": (label_free.TRAJECTORIES,),
        "transitions": (label_free.TRANSITIONS,),
        "states visited": (label_free.STATES_VISITED,),
        "first passage": (label_free.FIRST_PASSAGE,),
        "collapsed paths": (label_free.COLLAPSED_PATHS,),
        "primary (any)": (PRIMARY,),
        "occupancy (any state)": ("occupancy of state",),
        "time in detours": ("time in detour states",),
        "secondary (any)": (SECONDARY,),
        "published trajectories (raw p)": (PUBLISHED,),
    }


# --- (a) power on the known-answer sampler ------------------------------------------------------


def one_comparison(
    effect: str, size: float, n: int, seed: int, restarts: int, permutations: int, alpha: float,
    emission: str = PLAIN, degrees_of_freedom: float = ANALYSIS_DEFAULTS["degrees_of_freedom"],
) -> list[dict]:  # fmt: skip
    """One data set of :func:`sample_methods`, one shared map and its verdicts: a row per verdict
    (its raw p; Holm is applied by :func:`significant` within the families the code now names).
    The map's emission is ``emission`` (``degrees_of_freedom`` passed only with ``student_t``);
    everything random is seeded by ``seed``, so the rows depend on nothing else."""
    from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
    from trainmap.dynamics.maps.settings import AnalysisSettings
    from trainmap.dynamics.maps.synthetic import sample_methods
    from trainmap.dynamics.pipeline import convergence_from_tables
    from trainmap.dynamics.verdicts import paths as label_free
    from trainmap.dynamics.verdicts.joint import compare_groups

    if effect in (NULL, "tails"):
        drawn = sample_methods("detour", 0.0, n, n_states=TRUE_K, length=LENGTH, seed=seed,
                               tails=size if effect == "tails" else None)  # fmt: skip
    else:
        drawn = sample_methods(effect, size, n, n_states=TRUE_K, length=LENGTH, seed=seed)
    runs, groups, _, _ = drawn
    convergence = convergence_from_tables(runs, THRESHOLD)
    emission_settings: dict[str, Any] = {"emission": emission}
    if emission == "student_t":
        emission_settings["degrees_of_freedom"] = degrees_of_freedom
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verdict_settings = AnalysisSettings.of(
            {"permutations": permutations, "seed": seed, "alpha": alpha}
        ).verdict_settings
        comparison = compare_groups(runs, groups, convergence, {},
                                    TrainingHMM(selection="holdout", restarts=restarts,
                                                random_state=seed, **emission_settings),
                                    verdict_settings)  # fmt: skip
    evidence = comparison.paths
    in_first = np.array([groups[run] == "a" for run in evidence.trajectories.index])
    values = evidence.trajectories.to_numpy(dtype=float)
    published = label_free.energy_verdict(values[in_first], values[~in_first], permutations, 0.95,
                                          np.random.default_rng(seed))  # fmt: skip
    seconds = round(time.perf_counter() - started, 2)
    common = {"effect": effect, "size": size, "n_per_method": n, "seed": seed,
              "restarts": restarts, "permutations": permutations, "k": comparison.hmm.n_states_,
              "seconds": seconds}  # fmt: skip
    return [common | {"quantity": row.quantity, "p": row.p}
            for row in comparison.verdicts.itertuples()] + [
        common | {"quantity": PUBLISHED, "p": published.p}]  # fmt: skip


def one_comparison_alone(*args: Any, **options: Any) -> list[dict]:
    """:func:`one_comparison` with BLAS limited to one thread: a ``--jobs`` worker's fit (N fits
    on N cores, not N times BLAS's threads)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return one_comparison(*args, **options)


def fitted(
    todo: list[tuple[str, float, int, int]], jobs: int, **options: Any
) -> Iterator[tuple[tuple[str, float, int, int], list[dict]]]:
    """Each data set of ``todo`` (:func:`one_comparison`'s first four arguments, ``options`` the
    rest) with its rows, as its fit finishes: in order here when ``jobs`` is 1, else in ``jobs``
    processes (:func:`one_comparison_alone`) in the order they finish. A failed fit or an
    interrupt starts no further one and is raised."""
    if not todo:
        return
    if jobs == 1:
        for job in todo:
            yield job, one_comparison(*job, **options)
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(min(jobs, len(todo)))
    try:
        futures = {pool.submit(one_comparison_alone, *job, **options): job for job in todo}
        for future in as_completed(futures):
            yield futures[future], future.result()
    except BaseException:  # a failed fit, an interrupt or the caller's stop: start nothing more
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def design(effects: list[str], sizes: Mapping[str, tuple[float, ...]], per_method: list[int],
           seeds: int, null_seeds: int, nulls: Mapping[str, float] = NULLS,
           ) -> list[tuple[str, float, int, int]]:  # fmt: skip
    """Every (effect, size, n, seed) to fit: each null (``null_seeds`` seeds) and each effect's
    sizes (``seeds`` seeds); seed by seed, smallest n first, so a run cut short has every cell."""
    cells = [(effect, size) for effect in effects for size in sizes[effect]]
    jobs = []
    for n in per_method:
        for seed in range(max(seeds, null_seeds)):
            jobs += [(null, size, n, seed) for null, size in nulls.items()] \
                if seed < null_seeds else []  # fmt: skip
            jobs += [(effect, size, n, seed) for effect, size in cells] if seed < seeds else []
    return jobs


def holm(p: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values (NaN stays NaN)."""
    adjusted = np.full(len(p), np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    order = finite[np.argsort(p[finite], kind="stable")]
    m = len(order)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[index]))
        adjusted[index] = running
    return adjusted


def significant(rows: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """One row per data set (effect, size, n, seed), one boolean column per :func:`columns`:
    each verdict Holm-corrected within its family (:func:`~trainmap.dynamics.verdicts.compare.family`,
    as the code now assigns it), the published trajectories form by its own raw p. No rows give
    a table with these columns and no row."""
    import pandas as pd

    from trainmap.dynamics.verdicts.compare import PRIMARY, SECONDARY, family

    keys = ["effect", "size", "n_per_method", "seed"]
    found = {}
    for key, fit in rows.groupby(keys, sort=False):
        families = fit["quantity"].map(lambda q: "published" if q == PUBLISHED else family(q))
        adjusted = pd.Series(np.nan, index=fit.index)
        for name in families.unique():
            members = families == name
            adjusted[members] = holm(fit.loc[members, "p"].to_numpy(dtype=float))
        hit = adjusted < alpha
        cells = {}
        for column, reads in columns().items():
            if reads[0] in (PRIMARY, SECONDARY):
                chosen = families == reads[0]
            else:
                chosen = fit["quantity"].str.startswith(reads[0], na=False)
            cells[column] = bool(hit[chosen].any())
        cells["k"] = int(fit["k"].iloc[0])
        found[key] = cells
    if not found:
        return pd.DataFrame(columns=[*keys, *columns(), "k"])
    table = pd.DataFrame.from_dict(found, orient="index")
    table.index.names = keys
    return table.reset_index()


def share(hits: int, total: int) -> str:
    """``hits/total (share)``."""
    return f"{hits}/{total} ({hits / total:.2f})" if total else "-"


def interval(hits: int, total: int) -> tuple[float, float]:
    """The Clopper-Pearson 95 % interval of a binomial share."""
    from scipy.stats import binomtest

    ci = binomtest(hits, total).proportion_ci(confidence_level=0.95)
    return float(ci.low), float(ci.high)


def null_table(hits: pd.DataFrame, alpha: float) -> str:
    """False findings under every null: per null cell, n and verdict column, k/N, the
    Clopper-Pearson 95 % interval and whether alpha lies at or above its lower end (calibrated
    within the interval)."""
    lines = ["| null | runs per method | verdict | significant | 95 % interval | "
             "<= alpha within it |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for (effect, n), fits in hits[hits["effect"].isin(list(NULLS))].groupby(
            ["effect", "n_per_method"], sort=False):  # fmt: skip
        for column in columns():
            k, total = int(fits[column].sum()), len(fits)
            low, high = interval(k, total)
            lines.append(f"| {effect} | {n} | {column} | {share(k, total)} | "
                         f"[{low:.3f}, {high:.3f}] | {'yes' if low <= alpha else '**no**'} |")  # fmt: skip
    return "\n".join(lines)


def power_table(hits: pd.DataFrame) -> str:
    """Share of data sets with a significant verdict, per effect x size x n (rows) and verdict
    column (columns), each share with its Clopper-Pearson 95 % interval; the mean K."""
    header = ["effect", "size", "runs per method", "fits", "mean K", *columns()]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    order = {name: index for index, name in enumerate([*NULLS, *SIZES])}
    cells = hits.groupby(["effect", "size", "n_per_method"])
    for (effect, size, n), fits in sorted(cells, key=lambda item: (order.get(item[0][0], 99),
                                                                   item[0][1], item[0][2])):  # fmt: skip
        shares = []
        for column in columns():
            low, high = interval(int(fits[column].sum()), len(fits))
            shares.append(f"{fits[column].mean():.2f} [{low:.2f}, {high:.2f}]")
        lines.append(f"| {effect} | {size:g} | {n} | {len(fits)} | {fits['k'].mean():.1f} | "
                     + " | ".join(shares) + " |")  # fmt: skip
    return "\n".join(lines)


def read_rows(path: Path) -> pd.DataFrame:
    """The CSV's rows (none when it is not there)."""
    import pandas as pd

    if not path.is_file():
        return pd.DataFrame(columns=FIELDS)
    return pd.read_csv(path)


def run_power(args: argparse.Namespace) -> pd.DataFrame:
    """Fit every data set of the design not yet in the emission's CSV (``args.csv``, with these
    restarts and permutations), in ``args.jobs`` processes, appending each data set's rows as it
    finishes (unless ``args.write`` is false); the rows of the design, in the design's order
    whatever order the fits finished in."""
    import pandas as pd

    jobs = design(args.effects, args.sizes, args.runs, args.seeds, args.null_seeds)
    stored = read_rows(args.csv) if args.write else pd.DataFrame(columns=FIELDS)
    settings = (stored["restarts"] == args.restarts) & (stored["permutations"] == args.permutations)
    stored = stored[settings]
    done = set(zip(stored["effect"], stored["size"].astype(float), stored["n_per_method"],
                   stored["seed"], strict=True))  # fmt: skip
    todo = [job for job in jobs if (job[0], float(job[1]), job[2], job[3]) not in done]
    print(f"(a) {len(jobs)} data sets, {len(jobs) - len(todo)} already in the CSV", flush=True)
    fresh = []
    started = time.perf_counter()
    results = fitted(todo, args.jobs, restarts=args.restarts, permutations=args.permutations,
                     alpha=args.alpha, emission=args.emission,
                     degrees_of_freedom=args.degrees_of_freedom)  # fmt: skip
    for index, (_, rows) in enumerate(results):
        fresh += rows
        if args.write:
            append_rows(args.csv, rows, FIELDS)
        if (index + 1) % 20 == 0 or index + 1 == len(todo):
            print(f"  {index + 1}/{len(todo)} fitted, {time.perf_counter() - started:.0f} s",
                  flush=True)  # fmt: skip
    frames = [frame for frame in (stored, pd.DataFrame(fresh, columns=FIELDS)) if len(frame)]
    rows = pd.concat(frames, ignore_index=True) if frames else stored
    position = {(e, float(s), n, seed): index for index, (e, s, n, seed) in enumerate(jobs)}
    keys = zip(rows["effect"], rows["size"].astype(float), rows["n_per_method"], rows["seed"],
               strict=True)  # fmt: skip
    order = np.array([position.get(key, -1) for key in keys], dtype=int)
    chosen = np.flatnonzero(order >= 0)
    return rows.iloc[chosen[np.argsort(order[chosen], kind="stable")]]


# --- (b) calibration on real runs ----------------------------------------------------------------


def real_comparison(config: dict, name: str, cells: list, root: Path) -> dict | None:
    """A finished joint comparison's shared map, runs, quantities and path evidence (module
    docstring), or None (with a line saying why) when its map is not under ``root``."""
    from trainmap.dynamics.maps.settings import AnalysisSettings
    from trainmap.dynamics.pipeline import FittedMap, analysis_runs
    from trainmap.dynamics.verdicts.compare import (
        censoring_steps,
        map_transitions,
        path_evidence,
        run_quantities,
    )
    from trainmap.grid.cells import joint_settings
    from trainmap.jobs.analysis import rows_of_fit

    directory = root / "joint" / name
    if not all((directory / file).is_file() for file in ("hmm.npz", "hmm.json", "states.csv")):
        print(f"(b) {name}: left out, no shared map under {directory}/")
        return None
    settings = AnalysisSettings.of(joint_settings(config, name))
    runs, outcomes, groups = read_joint_cells(config, cells)
    runs, outcomes = analysis_runs(runs, outcomes, settings)
    runs, outcomes = rows_of_fit(runs, outcomes, directory / "states.csv")
    fitted = FittedMap.load(directory)
    states = {run: fitted.states[run] for run in runs}
    groups = {run: groups[run] for run in runs}
    detours = load_json(directory / "joint.json").get("detour_states", []) \
        if (directory / "joint.json").is_file() else []  # fmt: skip
    n_states = fitted.hmm.n_states_
    evidence = path_evidence(runs, states, n_states, fitted.hmm.features_, outcomes.status,
                             settings.trajectory_points, settings.start_window,
                             map_transitions(fitted.hmm, runs))  # fmt: skip
    return {
        "name": name, "settings": settings, "groups": groups, "selection": fitted.hmm.selection,
        "quantities": run_quantities(states, n_states, outcomes.convergence, outcomes.status,
                                     detours, evidence.after_window()),
        "censored_at": censoring_steps(runs, outcomes.convergence, outcomes.status),
        "evidence": evidence,
    }  # fmt: skip


def relabelled_verdicts(data: dict, relabellings: int, inner: int, seed: int) -> pd.DataFrame:
    """The verdicts of ``relabellings`` seeded permutations of the method labels on the same map:
    one row per permutation, quantity and pair (``relabelling``, ``quantity``, ``family``,
    ``p_holm``)."""
    import pandas as pd

    from trainmap.dynamics.verdicts.compare import compare_methods

    groups, settings = data["groups"], data["settings"]
    order = list(dict.fromkeys(groups.values()))
    members = list(groups)
    labels = [groups[run] for run in members]
    frames = []
    for index in range(relabellings):
        rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
        permuted = dict(zip(members, rng.permutation(labels), strict=True))
        ordered = {run: permuted[run] for group in order for run in members
                   if permuted[run] == group}  # fmt: skip
        verdicts = compare_methods(data["quantities"].loc[list(ordered)], ordered,
                                   n_permutations=inner, confidence=settings.confidence,
                                   alpha=settings.alpha, seed=seed + index,
                                   censored_at=data["censored_at"], paths=data["evidence"])  # fmt: skip
        frames.append(verdicts[["quantity", "family", "p_holm"]].assign(relabelling=index))
    return pd.concat(frames, ignore_index=True)


def real_table(found: dict[str, pd.DataFrame], alpha: float) -> str:
    """Per comparison and family (and primary verdict): the share of relabellings with a
    significant verdict, its 95 % interval and whether alpha lies within or above it."""
    from trainmap.dynamics.verdicts.compare import PRIMARY, SECONDARY

    lines = ["| comparison | verdict | relabellings significant | 95 % interval | "
             "<= alpha within it |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for name, rows in found.items():
        rows = rows.assign(hit=rows["p_holm"] < alpha)
        total = rows["relabelling"].nunique()
        chosen = {"primary (any)": rows["family"] == PRIMARY,
                  "secondary (any)": rows["family"] == SECONDARY}  # fmt: skip
        chosen |= {column: rows["quantity"].isin(reads) for column, reads in columns().items()
                   if reads[0] not in (PRIMARY, SECONDARY, "occupancy of state")}  # fmt: skip
        for column, mask in chosen.items():
            k = int(rows[mask].groupby("relabelling")["hit"].any().reindex(
                range(total), fill_value=False).sum())  # fmt: skip
            low, high = interval(k, total)
            lines.append(f"| {name} | {column} | {share(k, total)} | [{low:.3f}, {high:.3f}] | "
                         f"{'yes' if low <= alpha else '**no**'} |")  # fmt: skip
    return "\n".join(lines)


def run_real(args: argparse.Namespace) -> tuple[str, dict[str, pd.DataFrame]]:
    """Part (b): the table (or the line saying why it was skipped) and each comparison's rows."""
    from trainmap.grid import joint_comparisons, load_config

    root = Path(args.results)
    if not (root / "joint").is_dir():
        return (f"(b) skipped: no finished study under {root}/ (no {root}/joint/); "
                f"`{study_command(args.config, paper=False)}` makes it"), {}  # fmt: skip
    config = load_config("params.yaml", "config/config.yaml", args.config) | {"results": str(root)}
    comparisons = joint_comparisons(config)
    ready, missing = finished_maps({name: ([f"{root}/metrics/{cell.id}/metrics.csv"
                                            for cell in cells],
                                           [f"{root}/evaluate/{cell.id}/evaluation.json"
                                            for cell in cells])
                                    for name, cells in comparisons.items()})  # fmt: skip
    for name, paths in missing.items():
        print(f"(b) {name}: left out, {len(paths)} of its metric tables and evaluations are "
              f"missing (e.g. {paths[0]})")  # fmt: skip
    found = {}
    for name in ready:
        data = real_comparison(config, name, comparisons[name], root)
        if data is None:
            continue
        started = time.perf_counter()
        found[name] = relabelled_verdicts(data, args.relabellings, args.inner_permutations,
                                          args.seed)  # fmt: skip
        print(f"(b) {name}: {len(data['groups'])} runs, map selection {data['selection']}, "
              f"{args.relabellings} relabellings in {time.perf_counter() - started:.0f} s",
              flush=True)  # fmt: skip
    if not found:
        return (f"(b) skipped: no joint comparison of {args.config} has its map under "
                f"{root}/joint/"), {}  # fmt: skip
    heading = (f"`bench/verdict_calibration.py --results {root} --config {args.config} "
               f"--relabellings {args.relabellings} --inner-permutations "
               f"{args.inner_permutations}`: method labels permuted among each comparison's runs, "
               "the verdicts recomputed on the same map.")  # fmt: skip
    return heading + "\n\n" + real_table(found, args.alpha), found


# --- the command ----------------------------------------------------------------------------------


def parse_sizes(values: list[str]) -> dict[str, tuple[float, ...]]:
    """``--size effect=s1,s2`` entries over :data:`SIZES`."""
    sizes = dict(SIZES)
    for value in values:
        effect, _, listed = value.partition("=")
        if effect not in SIZES or not listed:
            raise argparse.ArgumentTypeError(f"--size {value!r}: write effect=s1,s2 with effect "
                                              f"one of {', '.join(SIZES)}")  # fmt: skip
        sizes[effect] = tuple(float(size) for size in listed.split(",") if float(size) != 0)
    return sizes


def summary(
    hits: pd.DataFrame, found: dict[str, pd.DataFrame], alpha: float, emission: str = PLAIN
) -> str:
    """The last line (module docstring): ``emission`` (:func:`emission_name`) named unless plain,
    the power part only when ``hits`` has planted effects, ``no data sets`` when it has no row."""
    from trainmap.dynamics.verdicts.compare import PRIMARY, SECONDARY

    parts = ["verdict_calibration"] + ([f"emission={emission}"] if emission != PLAIN else [])
    if not len(hits):
        parts.append("no data sets")
    for effect in NULLS:
        null = hits[hits["effect"] == effect]
        if len(null):
            parts.append(f"null {effect} primary={int(null['primary (any)'].sum())}/{len(null)}")
    planted = hits[~hits["effect"].isin(list(NULLS))]
    if len(planted):
        parts.append("| power primary")
    for (effect, size, n), fits in planted.groupby(["effect", "size", "n_per_method"]):
        parts.append(f"{effect}@{size:g},n={n}={int(fits['primary (any)'].sum())}/{len(fits)}")
    for name, rows in found.items():
        hit = rows.assign(hit=rows["p_holm"] < alpha)
        total = hit["relabelling"].nunique()
        counts = [int(hit[hit["family"] == family].groupby("relabelling")["hit"].any().sum())
                  for family in (PRIMARY, SECONDARY)]  # fmt: skip
        parts.append(f"| real {name} primary={counts[0]}/{total} secondary={counts[1]}/{total}")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """The command (module docstring): fit (a)'s missing data sets (or, ``--table``, read them
    from the emission's CSV), run (b) unless ``--table`` or ``--no-real``, print both tables and
    the last line; write the emission's markdown unless ``--quick`` or ``--table``. 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20,
                        help="sampler seeds per effect and size (default 20; 0: the nulls only)")  # fmt: skip
    parser.add_argument("--null-seeds", type=int, default=100,
                        help="sampler seeds of the null, size 0 (default 100)")  # fmt: skip
    parser.add_argument("--runs", type=int, nargs="+", default=[32],
                        help="runs per method (default 32)")  # fmt: skip
    parser.add_argument("--effects", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--size", action="append", default=[],
                        help="effect=s1,s2: that effect's non-zero sizes (default "
                        + "; ".join(f"{e}={','.join(map(str, s))}" for e, s in SIZES.items())
                        + ")")  # fmt: skip
    parser.add_argument("--restarts", type=int, default=2, help="EM restarts per K (default 2)")
    parser.add_argument("--permutations", type=int, default=ANALYSIS_DEFAULTS["permutations"],
                        help="relabellings per verdict in (a) (default: the analysis')")  # fmt: skip
    parser.add_argument("--alpha", type=float, default=ANALYSIS_DEFAULTS["alpha"])
    parser.add_argument("--emission", choices=EMISSIONS, default=PLAIN,
                        help="(a): the shared map's emission model (default plain, the emission "
                        "the stored table was measured with); another emission's rows and "
                        "tables go to their own files, verdict_calibration_<emission>.csv "
                        "and .md")  # fmt: skip
    parser.add_argument("--degrees-of-freedom", type=float,
                        default=ANALYSIS_DEFAULTS["degrees_of_freedom"],
                        help="(a): nu of --emission student_t, in (0, 1000] (default "
                        f"{ANALYSIS_DEFAULTS['degrees_of_freedom']:g}, the analysis'; another "
                        "nu's files are verdict_calibration_student_t_nu<nu>.*)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1,
                        help="(a): data sets fitted at a time, each in its own process with BLAS "
                        "on one thread (default 1: here); the rows do not depend on it")  # fmt: skip
    parser.add_argument("--results", default="results",
                        help="(b): a finished study's results tree (default results)")  # fmt: skip
    parser.add_argument("--config", default="config/config.yaml", help="(b): the study's config")
    parser.add_argument("--relabellings", type=int, default=200,
                        help="(b): permutations of the method labels (default 200)")  # fmt: skip
    parser.add_argument("--inner-permutations", type=int, default=500,
                        help="(b): relabellings per verdict of each permutation (default 500)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="(b): seed of the permutations")
    parser.add_argument("--no-real", action="store_true",
                        help="leave (b) out (it needs a finished study's results tree)")  # fmt: skip
    parser.add_argument("--table", action="store_true", help="the CSV's rows only, no fits")
    parser.add_argument("--quick", action="store_true",
                        help="3 seeds, 16 runs per method, one size per effect, 1 restart, 200 "
                        "permutations, 20 relabellings in (b); writes no file")  # fmt: skip
    args = parser.parse_args(argv)
    if args.seeds < 0 or args.null_seeds < 0:
        parser.error(f"--seeds {args.seeds} --null-seeds {args.null_seeds}: each at least 0")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: at least 1 process")
    if not 0 < args.degrees_of_freedom <= 1000:
        parser.error(f"--degrees-of-freedom {args.degrees_of_freedom:g}: nu is in (0, 1000]")
    if (args.emission != "student_t"
            and args.degrees_of_freedom != ANALYSIS_DEFAULTS["degrees_of_freedom"]):  # fmt: skip
        parser.error(f"--degrees-of-freedom is read by --emission student_t only, not "
                     f"{args.emission}")  # fmt: skip
    args.sizes = parse_sizes(args.size)
    args.write = not args.quick
    args.csv, md_path = result_paths(args.emission, args.degrees_of_freedom)
    name = emission_name(args.emission, args.degrees_of_freedom)
    if args.quick:
        args.seeds, args.null_seeds, args.runs = 3, 6, [16]
        args.restarts, args.permutations = 1, 200
        args.sizes = {effect: sizes[-1:] for effect, sizes in args.sizes.items()}
        args.relabellings = 20
    if args.table:
        rows = read_rows(args.csv)
        rows = rows[(rows["restarts"] == args.restarts)
                    & (rows["permutations"] == args.permutations)]  # fmt: skip
        if not len(rows):
            print(f"(a) no rows in {args.csv} with {args.restarts} restarts and "
                  f"{args.permutations} permutations"
                  + ("" if args.csv.is_file() else " (no such file)"))  # fmt: skip
    else:
        rows = run_power(args)
    hits = significant(rows, args.alpha)
    options = "" if args.emission == PLAIN else f" --emission {args.emission}"
    if args.emission == "student_t" and name != args.emission:
        options += f" --degrees-of-freedom {args.degrees_of_freedom:g}"
    planted = ("; ".join(f"{e} {', '.join(f'{s:g}' for s in args.sizes[e])}"
                         for e in args.effects) if args.seeds else "none (--seeds 0)")  # fmt: skip
    heading = (f"`bench/verdict_calibration.py --seeds {args.seeds} --null-seeds "
               f"{args.null_seeds} --runs "
               f"{' '.join(map(str, args.runs))}{options}` ({args.restarts} restarts, "
               f"{args.permutations} permutations, alpha {args.alpha:g}, emission {name}; "
               f"sizes {planted})")  # fmt: skip
    power = (f"{heading}\n\nShare of data sets with a significant verdict (Holm within its "
             f"family; size 0 = effect {NULL}: the false positive rate)\n\n{power_table(hits)}\n\n"
             f"False positives (effect {NULL}, size 0) with binomial 95 % intervals\n\n"
             f"{null_table(hits, args.alpha)}")  # fmt: skip
    print(power)
    if args.no_real:
        real, found = "(b) not run (--no-real)", {}
    elif args.table:
        real, found = "(b) not run (--table)", {}
    else:
        real, found = run_real(args)
    if args.emission != PLAIN and not args.no_real and not args.table:
        real = (f"The maps here are the study's own, of its settings: --emission {args.emission} "
                f"applies to (a) only.\n\n{real}")  # fmt: skip
    print(real)
    if args.write and not args.table:
        title = "Verdict calibration" + ("" if args.emission == PLAIN else f", emission {name}")
        md_path.write_text(f"# {title}\n\n## (a) Power and false positives on the "
                           f"known-answer sampler\n\n{power}\n\n## (b) Calibration on real runs"
                           f"\n\n{real}\n")  # fmt: skip
    print(summary(hits, found, args.alpha, name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
