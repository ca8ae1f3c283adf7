"""The selection rules side by side on real runs: K, the stability line, the verdicts and the cost.

For each joint comparison of a finished study (``analysis.joint`` of its config) and each paper
setting (``paper``), the map is made by the one analysis path (:func:`~trainmap.dynamics.pipeline.
joint_group` for a comparison, :func:`~trainmap.dynamics.pipeline.fit_group` for a paper setting
with trainmap's pass) under each selection rule, everything else at the config's analysis
settings: ``holdout`` (the paper's held-out BIC), ``folds`` (its mean over 3 folds),
``reproducible`` (the largest K up to the two-fold BIC minimum whose half maps reproduce) and
``gain`` (the smallest K no larger K beats by more than ``min_gain`` held-out nats per checkpoint
per added state); ``--emissions`` repeats each rule under each emission model. Per map:
K, the bootstrap's K distribution, the stability line, the verdicts that found a difference (joint
comparisons) and the seconds of the full fit, the bootstrap and the stability curve, measured side
by side in one process (one rule after the other, ``--jobs`` processes each).

Usage::

    .venv/bin/python bench/selection_real.py --config config/config.yaml            # default study
    .venv/bin/python bench/selection_real.py --config config/paper/cpu.yaml --paper
    .venv/bin/python bench/selection_real.py --config config/config.yaml --only parity_init \
        --bootstrap 50 --stability 10
    .venv/bin/python bench/selection_real.py --quick    # the smallest map, fewer refits
    .venv/bin/python bench/selection_real.py --rules gain --emissions plain student_t \
        --bootstrap 0 --stability 0 --jobs 1   # K and the full fit's cost under each emission

The study must have run (its metric tables and evaluations under the config's results root); maps
whose runs are not all there are left out, and with none there the script says so and exits 0
(``make bench`` on a clone without the study). Prints a Markdown table and, with ``--out``, writes
it there.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections import Counter
from pathlib import Path

RULES = ("holdout", "folds", "reproducible", "gain")


def cell_inputs(config: dict, cells: list) -> tuple[list[str], list[str]]:
    """The metric tables and evaluations of ``cells`` under the config's results root."""
    from trainmap.grid import results_root

    root = results_root(config)
    return ([f"{root}/metrics/{cell.id}/metrics.csv" for cell in cells],
            [f"{root}/evaluate/{cell.id}/evaluation.json" for cell in cells])  # fmt: skip


def missing_inputs(metrics: list[str], evaluations: list[str]) -> list[str]:
    """The files of ``metrics`` and ``evaluations`` that are not there (a study not run, or not
    to its end)."""
    return [path for path in metrics + evaluations if not Path(path).is_file()]


def read_joint_cells(config: dict, cells: list) -> tuple[dict, object, dict]:
    """The runs, outcomes and groups (run id -> method label) of a joint comparison's cells."""
    from trainmap.grid.cells import joint_labels
    from trainmap.jobs.analysis import joint_run_ids, read_group_runs

    labels = joint_labels(cells)
    ids = joint_run_ids(labels, [cell.to_dict() for cell in cells])
    runs, outcomes = read_group_runs(*cell_inputs(config, cells), ids)
    return runs, outcomes, dict(zip(ids, labels, strict=True))


def map_inputs(config: dict, paper: bool) -> dict[str, tuple[list[str], list[str]]]:
    """Each joint comparison's (or with ``paper``, each paper setting's) metric tables and
    evaluations, cell by cell."""
    from trainmap.grid.cells import joint_comparisons, paper_groups

    groups = paper_groups(config) if paper else joint_comparisons(config)
    return {name: cell_inputs(config, cells) for name, cells in groups.items()}


def finished_maps(inputs: dict[str, tuple[list[str], list[str]]]) -> tuple[list[str], dict]:
    """The maps of ``inputs`` whose files are all there, and for the others the files missing."""
    missing = {name: missing_inputs(*files) for name, files in inputs.items()}
    return [name for name in inputs if not missing[name]], {n: m for n, m in missing.items() if m}


def smallest_map(inputs: dict[str, tuple[list[str], list[str]]], names: list[str]) -> str:
    """The map of ``names`` whose metric tables take the fewest bytes: the fastest to fit."""
    return min(names, key=lambda name: sum(Path(path).stat().st_size for path in inputs[name][0]))


def study_command(config_file: str, paper: bool) -> str:
    """The command that runs ``config_file``'s study (its paper settings with ``paper``)."""
    if paper:
        if config_file == "config/paper/cpu.yaml":
            return "make paper"
        return f"snakemake paper --cores 2 --configfile {config_file}"
    return "make run" if config_file == "config/config.yaml" else f"make run CONFIG={config_file}"


def joint_maps(config: dict, only: list[str]) -> dict[str, tuple]:
    """Each joint comparison's runs, outcomes, groups and settings."""
    from trainmap.grid.cells import joint_comparisons, joint_settings

    return {name: (*read_joint_cells(config, cells), joint_settings(config, name))
            for name, cells in joint_comparisons(config).items()
            if not only or name in only}  # fmt: skip


def paper_maps(config: dict, only: list[str]) -> dict[str, tuple]:
    """Each paper setting's runs and outcomes (trainmap's pass: the config's analysis settings)."""
    from trainmap.grid.cells import paper_groups
    from trainmap.jobs.analysis import read_group_runs, seed_labels

    found = {}
    for setting, cells in paper_groups(config).items():
        if only and setting not in only:
            continue
        runs, outcomes = read_group_runs(*cell_inputs(config, cells),
                                         seed_labels([cell.to_dict() for cell in cells]))  # fmt: skip
        found[setting] = (runs, outcomes, None, config["analysis"])
    return found


def one(name: str, data: tuple, rule: str, args: argparse.Namespace, emission: str | None = None,
        ) -> dict:  # fmt: skip
    """One map under ``rule`` (and ``emission``; None: the config's): its K, bootstrap, stability
    line, verdicts and seconds."""
    from trainmap.dynamics.maps.settings import AnalysisSettings
    from trainmap.dynamics.pipeline import analysis_runs, fit_group, joint_group

    runs, outcomes, groups, settings = data
    settings = AnalysisSettings.of(settings).replace(selection=rule, bootstrap=args.bootstrap,
                                                     stability=args.stability)  # fmt: skip
    if emission is not None:
        settings = settings.replace(emission=emission)
    runs, outcomes = analysis_runs(runs, outcomes, settings)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if groups is None:
            result = fit_group(runs, outcomes, settings, n_jobs=args.jobs)
            verdicts = []
        else:
            result = joint_group(runs, groups, outcomes, settings, n_jobs=args.jobs)
            table = result.comparison.verdicts
            verdicts = [f"{r.second} vs {r.first}, {r.quantity}: {r.verdict}"
                        for r in table.itertuples() if r.verdict.endswith(("higher", "lower"))]  # fmt: skip
    seconds = time.perf_counter() - started
    counts = Counter(result.bootstrap.ks)
    return {"map": name, "rule": rule, "emission": settings.emission, "runs": len(runs),
            "K": result.hmm.n_states_,
            "bootstrap K": ", ".join(f"{k}: {c}" for k, c in sorted(counts.items()) if k > 0),
            "stability": result.stability.line, "verdicts": "; ".join(verdicts) or "-",
            "bootstrap s": result.bootstrap.seconds, "seconds": seconds}  # fmt: skip


def k_by_seeds(name: str, data: tuple, rule: str, per_method: list[int], draws: int) -> dict:
    """K of the full fit (no bootstrap, no curve) on ``draws`` seeded draws of n runs per method,
    for each n of ``per_method``: does the map's size grow with the seeds?"""
    import numpy as np

    from trainmap.dynamics.maps.settings import AnalysisSettings, make_hmm
    from trainmap.dynamics.pipeline import analysis_runs

    runs, outcomes, groups, settings = data
    groups = groups or dict.fromkeys(runs, name)
    settings = AnalysisSettings.of(settings).replace(selection=rule)
    runs, _ = analysis_runs(runs, outcomes, settings)
    by_group: dict[str, list[str]] = {}
    for run in sorted(runs):
        by_group.setdefault(groups[run], []).append(run)
    row = {"map": name, "rule": rule}
    for n in per_method:
        ks = []
        for draw in range(draws):
            rng = np.random.default_rng(np.random.SeedSequence([draw, n]))
            chosen = [run for ids in by_group.values()
                      for run in sorted(rng.choice(ids, size=min(n, len(ids)), replace=False))]  # fmt: skip
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                hmm = make_hmm(settings.replace(n_jobs=2))
                hmm.fit({run: runs[run] for run in chosen}, strata=groups)
            ks.append(hmm.n_states_)
        row[f"K at n = {n}"] = ", ".join(map(str, ks))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config/config.yaml", help="the study's config file")
    parser.add_argument("--paper", action="store_true", help="the paper settings, not the joints")
    parser.add_argument("--only", nargs="*", default=[], help="these comparisons/settings only")
    parser.add_argument("--rules", nargs="*", default=list(RULES[:3]), choices=RULES,
                        help="selection rules (default holdout folds reproducible)")  # fmt: skip
    parser.add_argument("--emissions", nargs="*", default=[], metavar="EMISSION",
                        help="each rule under each of these emission models (default: the "
                        "config's)")  # fmt: skip
    parser.add_argument("--bootstrap", type=int, help="resamples (default 200, quick 20)")
    parser.add_argument("--stability", type=int, help="subsamples per n (default 20, quick 5)")
    parser.add_argument("--jobs", type=int, default=2, help="processes per map (default 2)")
    parser.add_argument("--out", type=Path, help="write the Markdown table here too")
    parser.add_argument("--seeds-per-method", type=int, nargs="*", default=[],
                        help="instead: K of the full fit at these seed counts per method")  # fmt: skip
    parser.add_argument("--draws", type=int, default=3, help="draws per seed count (default 3)")
    parser.add_argument("--quick", action="store_true",
                        help="the finished map with the smallest metric tables only (unless "
                        "--only), 20 bootstrap refits, 5 stability subsamples per n")  # fmt: skip
    args = parser.parse_args(argv)
    from trainmap.grid import load_config, results_root

    args.bootstrap = args.bootstrap if args.bootstrap is not None else (20 if args.quick else 200)
    args.stability = args.stability if args.stability is not None else (5 if args.quick else 20)
    config = load_config("params.yaml", "config/config.yaml", args.config)
    inputs = map_inputs(config, args.paper)
    if unknown := sorted(set(args.only) - set(inputs)):
        parser.error(
            f"--only {' '.join(unknown)}: not in {args.config} (it has {', '.join(inputs)})"
        )
    inputs = {name: files for name, files in inputs.items() if not args.only or name in args.only}
    ready, missing = finished_maps(inputs)
    if not ready:
        kind = "paper setting" if args.paper else "joint comparison"
        print(f"selection_real: skipped: {args.config}'s study has not run (no {kind} with all "
              f"its runs under {results_root(config)}/); run "
              f"`{study_command(args.config, args.paper)}` first")  # fmt: skip
        return 0
    for name, paths in missing.items():
        print(f"{name}: left out, {len(paths)} of its metric tables and evaluations are missing "
              f"(e.g. {paths[0]})")  # fmt: skip
    if args.quick and not args.only:
        ready = [smallest_map(inputs, ready)]
    maps = paper_maps(config, ready) if args.paper else joint_maps(config, ready)
    rows = []
    for name, data in maps.items():
        for rule, emission in [(r, e) for r in args.rules for e in args.emissions or [None]]:
            if args.seeds_per_method:
                row = k_by_seeds(name, data, rule, args.seeds_per_method, args.draws)
                print(row, flush=True)
            else:
                row = one(name, data, rule, args, emission)
                print(f"{name} {rule} {row['emission']}: K = {row['K']}, {row['seconds']:.0f} s; "
                      f"{row['stability']}", flush=True)  # fmt: skip
            rows.append(row)
    report(f"`bench/selection_real.py --config {args.config}{' --paper' * args.paper}` "
           f"(bootstrap {args.bootstrap}, stability {args.stability}, {args.jobs} processes)",
           rows, args.out)  # fmt: skip
    return 0


def report(heading: str, rows: list[dict], out: Path | None) -> None:
    """Print ``heading`` and ``rows`` as a Markdown table (floats to one decimal); write both to
    ``out`` too when given."""
    header = list(rows[0]) if rows else []
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v)
                                        for v in row.values()) + " |")  # fmt: skip
    text = heading + "\n\n" + "\n".join(lines)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
