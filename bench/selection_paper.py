"""The selection rules side by side on the training-maps paper's settings (``make paper``'s runs).

Each setting of a finished paper run (``config/paper/cpu.yaml``: sparse parities, stabilised
modular addition, MNIST-5k; 40 seeds each) is mapped as rule ``paper_map`` maps it in its
``trainmap`` pass (:func:`trainmap.jobs.paper.setting_runs` reads the runs with the pass's
settings, :func:`trainmap.dynamics.pipeline.map_runs` fits, bootstraps, draws the stability curve
and regresses convergence on the states), once per selection rule, every
other setting the config's. Printed per (setting, rule): K, the bootstrap's share of resamples at
that K, the stability line, the detour regression's R^2 and its detour states, and the seconds.

Usage::

    .venv/bin/python bench/selection_paper.py results-paper/cpu --config params.yaml config/paper/cpu.yaml
    .venv/bin/python bench/selection_paper.py results-paper/cpu --setting sparse_parities --selection reproducible
    .venv/bin/python bench/selection_paper.py results-paper/cpu --setting mnist_5k --selection reproducible --refits 32 36
    .venv/bin/python bench/selection_paper.py --quick    # the smallest setting, fewer refits

The config files are read relative to the results directory's project (the directory holding
``params.yaml``; by default the current one). Without a results root, the config's own
(``results-paper/cpu``); where it holds no finished setting, the script says so and exits 0
(``make bench`` on a clone without ``make paper``'s runs). Last line per analysis:
``selection_paper <setting> <rule> K=... r2=... seconds=...``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trainmap.schema import section_choices

if TYPE_CHECKING:
    from trainmap.dynamics.maps.settings import AnalysisSettings

#: trainmap.dynamics.maps.hmm.SELECTION_RULES, as the schema lists them (no analysis import
#: before the arguments are parsed)
SELECTION_RULES = section_choices("analysis")["selection"]


def setting_inputs(results: Path, config: dict, setting: str) -> tuple[list[Path], list[Path]]:
    """One paper setting's metric tables and evaluations under ``results``, cell by cell."""
    from trainmap.grid import paper_groups

    cells = paper_groups(config)[setting]
    return ([results / "metrics" / cell.id / "metrics.csv" for cell in cells],
            [results / "evaluate" / cell.id / "evaluation.json" for cell in cells])  # fmt: skip


def smallest_setting(results: Path, config: dict, settings: list[str]) -> str:
    """The setting of ``settings`` whose metric tables take the fewest bytes: the fastest map."""
    return min(settings, key=lambda setting: sum(
        path.stat().st_size for path in setting_inputs(results, config, setting)[0]))  # fmt: skip


def load_setting(results: Path, config: dict, setting: str, rule: str,
                 overrides: dict | None = None) -> tuple:  # fmt: skip
    """One paper setting's runs, outcomes and ``trainmap``-pass settings under selection ``rule``
    (and ``overrides``, e.g. fewer bootstrap refits), read as rule ``paper_map`` reads them."""
    from trainmap.dynamics.maps.settings import AnalysisSettings
    from trainmap.grid import analysis_settings, paper_groups
    from trainmap.jobs.paper import setting_runs

    cells = paper_groups(config)[setting]
    metrics, evaluations = setting_inputs(results, config, setting)
    return setting_runs(
        setting, "trainmap", [cell.to_dict() for cell in cells],
        list(map(str, metrics)), list(map(str, evaluations)),
        AnalysisSettings.of(analysis_settings(config) | {"selection": rule} | (overrides or {})),
    )  # fmt: skip


def map_setting(results: Path, config: dict, setting: str, rule: str, threads: int,
                overrides: dict | None = None) -> dict:  # fmt: skip
    """One paper setting's ``trainmap`` pass under selection ``rule``, as rule ``paper_map``
    runs it; returns K, the bootstrap's agreement, the stability line, R^2, detours, seconds."""
    from trainmap.dynamics.pipeline import map_runs

    runs, outcomes, settings = load_setting(results, config, setting, rule, overrides)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        fit, regression, _ = map_runs(runs, outcomes, settings, out, n_jobs=threads)
    fitted = regression.regression.fitted
    return {"K": fit.hmm.n_states_, "bootstrap_k_same": fit.bootstrap.k_same,
            "stability": fit.stability.line, "r2": regression.regression.r2 if fitted else float("nan"),
            "detours": list(regression.detour_states), "seconds": time.perf_counter() - started}  # fmt: skip


REFIT_COLUMNS = ["n_states", "bic", "bic_fold_sd", "ari_median", "reproduced", "reproducible"]


def refit_check(runs: dict, outcomes, settings: AnalysisSettings, threads: int, sizes: list[int],
                draws: int) -> None:  # fmt: skip
    """Why a rule's bootstrap refits select another K than its full fit: print the selection
    curve of the full fit, then of the refit path (:func:`trainmap.dynamics.verdicts.certainty.refit_resample`,
    warm-started as the bootstrap refits) on every run drawn once, on one bootstrap draw and on
    ``sizes[0]`` distinct runs; then K of full fits of ``draws`` random subsets of each size."""
    from trainmap.dynamics.pipeline import make_hmm
    from trainmap.dynamics.verdicts.certainty import (
        draw_counts,
        refit_payload,
        refit_resample,
        split_runs,
    )

    hmm = make_hmm(settings.replace(n_jobs=threads)).fit(runs)
    print(f"full fit: K = {hmm.n_states_}\n{hmm.selection_[REFIT_COLUMNS].to_string()}")
    payload = refit_payload(hmm, runs, outcomes.convergence, outcomes.status, settings.alpha,
                            settings.seed, settings.bootstrap_iter, True,
                            reselect_k=True)  # fmt: skip
    ids, n_held = sorted(payload["raw"]), len(hmm.heldout_runs_)
    rng = np.random.default_rng(0)
    train, held = split_runs(ids, n_held, rng)
    cases = {"every run once": ({r: 1.0 for r in train}, {r: 1.0 for r in held}),
             "a bootstrap draw": (draw_counts(train, len(train), rng), draw_counts(held, n_held, rng)),
             f"{sizes[0]} distinct runs": ({r: 1.0 for r in train[: sizes[0] - n_held]},
                                           {r: 1.0 for r in held})}  # fmt: skip
    for name, (train_counts, held_counts) in cases.items():
        selection = refit_resample(
            payload["raw"], train_counts, held_counts, payload["refit"]
        ).selection
        print(f"refit, {name} ({len(set(train_counts) | set(held_counts))} distinct runs): "
              f"K = {selection.n_states}\n{selection.curve[REFIT_COLUMNS].to_string()}")  # fmt: skip
    for size in sizes:
        ks = []
        for draw in range(draws):
            pick = np.random.default_rng([size, draw]).choice(ids, size=size, replace=False)
            ks.append(
                make_hmm(settings.replace(n_jobs=threads)).fit({r: runs[r] for r in pick}).n_states_
            )
        print(f"full fits of {draws} random subsets of {size} runs: K = {ks}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, nargs="?",
                        help="a finished paper run's results root (default: the config's)")  # fmt: skip
    parser.add_argument("--config", nargs="+", default=["params.yaml", "config/paper/cpu.yaml"],
                        help="config files, relative to --project")  # fmt: skip
    parser.add_argument("--project", type=Path, default=Path("."),
                        help="the directory the config files and the results' paths are relative to")  # fmt: skip
    parser.add_argument("--setting", nargs="*", default=[], help="paper settings (default: all)")
    parser.add_argument(
        "--selection", nargs="*", choices=SELECTION_RULES, default=list(SELECTION_RULES)
    )
    parser.add_argument("--threads", type=int, default=2, help="processes")
    parser.add_argument("--refits", type=int, nargs="*", metavar="N",
                        help="instead of the maps: why the refits select another K (refit_check), "
                             "with subsets of N runs (e.g. 32 36)")  # fmt: skip
    parser.add_argument("--draws", type=int, default=3, help="subsets per size with --refits")
    parser.add_argument("--quick", action="store_true",
                        help="the finished setting with the smallest metric tables only (unless "
                        "--setting), 20 bootstrap refits, 5 stability subsamples per n")  # fmt: skip
    args = parser.parse_args()
    from trainmap.grid import load_config, paper_groups, results_root

    project = args.project.resolve()
    config = load_config(*(project / path for path in args.config), check_paths_from=project)
    results = (args.results or project / results_root(config)).resolve()
    asked = args.setting or list(paper_groups(config))
    missing = {setting: [path for path in sum(setting_inputs(results, config, setting), [])
                         if not path.is_file()] for setting in asked}  # fmt: skip
    ready = [setting for setting in asked if not missing[setting]]
    if not ready:
        why = f"no finished paper setting under {results}"
        if args.results is not None:
            parser.error(why)
        print(f"selection_paper: skipped: {why}; run `make paper` first, or name a finished "
              "paper run's results root (bench/selection_paper.py RESULTS)")  # fmt: skip
        return
    for setting in asked:
        if missing[setting]:
            print(f"{setting}: left out, {len(missing[setting])} of its metric tables and "
                  f"evaluations are not under {results} (e.g. {missing[setting][0]})")  # fmt: skip
    overrides = {}
    if args.quick:
        overrides = {"bootstrap": 20, "stability": 5}
        if not args.setting:
            ready = [smallest_setting(results, config, ready)]
    for setting in ready:
        for rule in args.selection:
            if args.refits:
                print(f"== {setting} / {rule}", flush=True)
                refit_check(*load_setting(results, config, setting, rule, overrides),
                            args.threads, args.refits, args.draws)  # fmt: skip
                continue
            row = map_setting(results, config, setting, rule, args.threads, overrides)
            print(f"{setting} / {rule}: K = {row['K']} (bootstrap: same K in {row['bootstrap_k_same']:.0%}); "
                  f"R^2 = {row['r2']:.3f}; detours {row['detours']}; {row['seconds']:.0f} s\n"
                  f"  stability: {row['stability']}")  # fmt: skip
            print(f"selection_paper {setting} {rule} K={row['K']} r2={row['r2']:.3f} "
                  f"seconds={row['seconds']:.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
