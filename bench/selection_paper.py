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

The config files are read relative to the results directory's project (the directory holding
``params.yaml``; by default the current one). Last line per analysis:
``selection_paper <setting> <rule> K=... r2=... seconds=...``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from trainmap.dynamics.hmm import SELECTION_RULES
from trainmap.dynamics.pipeline import map_runs
from trainmap.grid import analysis_settings, load_config, paper_groups
from trainmap.jobs.paper import setting_runs


def map_setting(results: Path, config: dict, setting: str, rule: str, threads: int) -> dict:
    """One paper setting's ``trainmap`` pass under selection ``rule``, as rule ``paper_map``
    runs it; returns K, the bootstrap's agreement, the stability line, R^2, detours, seconds."""
    cells = paper_groups(config)[setting]
    runs, outcomes, settings = setting_runs(
        setting, "trainmap", [cell.to_dict() for cell in cells],
        [str(results / "metrics" / cell.id / "metrics.csv") for cell in cells],
        [str(results / "evaluate" / cell.id / "evaluation.json") for cell in cells],
        analysis_settings(config) | {"selection": rule},
    )  # fmt: skip
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        fit, regression, _ = map_runs(runs, outcomes, settings, out, n_jobs=threads)
    fitted = regression.regression.fitted
    return {"K": fit.hmm.n_states_, "bootstrap_k_same": fit.bootstrap.k_same,
            "stability": fit.stability.line, "r2": regression.regression.r2 if fitted else float("nan"),
            "detours": list(regression.detour_states), "seconds": time.perf_counter() - started}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a finished paper run's results root")
    parser.add_argument("--config", nargs="+", default=["params.yaml", "config/paper/cpu.yaml"],
                        help="config files, relative to --project")  # fmt: skip
    parser.add_argument("--project", type=Path, default=Path("."),
                        help="the directory the config files and the results' paths are relative to")  # fmt: skip
    parser.add_argument("--setting", nargs="*", default=[], help="paper settings (default: all)")
    parser.add_argument(
        "--selection", nargs="*", choices=SELECTION_RULES, default=list(SELECTION_RULES)
    )
    parser.add_argument("--threads", type=int, default=2, help="processes")
    args = parser.parse_args()
    project = args.project.resolve()
    config = load_config(*(project / path for path in args.config), check_paths_from=project)
    results = args.results.resolve()
    for setting in args.setting or list(paper_groups(config)):
        for rule in args.selection:
            row = map_setting(results, config, setting, rule, args.threads)
            print(f"{setting} / {rule}: K = {row['K']} (bootstrap: same K in {row['bootstrap_k_same']:.0%}); "
                  f"R^2 = {row['r2']:.3f}; detours {row['detours']}; {row['seconds']:.0f} s\n"
                  f"  stability: {row['stability']}")  # fmt: skip
            print(f"selection_paper {setting} {rule} K={row['K']} r2={row['r2']:.3f} "
                  f"seconds={row['seconds']:.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
