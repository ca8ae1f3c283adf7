"""Does the map's size settle as seeds are added? K of a selection rule by round (``reproducible``
by default; ``--selection folds`` or ``holdout`` for held-out BIC).

For one adaptive joint comparison of a finished study (its rounds' runs trained), the full fit
(no bootstrap, no stability curve) is made with ``selection: reproducible`` on the runs each round
pools (the grid's seeds, then each round's added seeds), once per split seed (``analysis.seed``:
which random halves) and per ``--half-sizes`` value (``analysis.half_size``: runs of each method in
each half; null: half of them). Per fit: K under ``reproduce_k: nested`` (the largest K <= K_BIC such that
K and every smaller K reproduce), K_BIC (the two-fold held-out BIC minimum), K under ``largest``
(the largest K <= K_BIC whose half maps reproduce), the share of splits reproduced at each K, and
the fit's seconds (one fit gives both: the full fit decodes every K). Fits run in ``--jobs`` processes, one core
each.

Usage::

    .venv/bin/python bench/selection_settle.py --config config/adaptive_parity_init.yaml \
        --comparison parity_init --split-seeds 0 1 2 3 --jobs 2 \
        --out bench/results/selection_settle.md
    .venv/bin/python bench/selection_settle.py --quick   # halves of 20, the first and last rounds

The study must have run every round (``snakemake --configfile config/adaptive_parity_init.yaml``);
where it has not, the script says so and exits 0 (``make bench`` on a clone without it).
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from selection_real import cell_inputs, missing_inputs, read_joint_cells, report

RESULTS: dict = {}  # the runs of each round, set in each worker by _load


def every_round(config_file: str, comparison: str) -> tuple[dict, object, list]:
    """The study's config, the adaptive comparison and the cells its last round pools."""
    from trainmap.grid import load_config
    from trainmap.grid.cells import adaptive_joints, joint_comparisons

    config = load_config("params.yaml", "config/config.yaml", config_file)
    joint = adaptive_joints(config)[comparison]
    return config, joint, joint.cells(joint_comparisons(config)[comparison], joint.rounds)


def _load(config_file: str, comparison: str) -> None:
    """Read the comparison's runs once per worker process (the analysis rows every map sees)."""

    from trainmap.dynamics.maps.settings import AnalysisSettings
    from trainmap.dynamics.pipeline import analysis_runs
    from trainmap.grid.cells import joint_settings

    config, joint, cells = every_round(config_file, comparison)
    runs, outcomes, groups = read_joint_cells(config, cells)
    settings = AnalysisSettings.of(joint_settings(config, comparison))
    runs, _ = analysis_runs(runs, outcomes, settings)
    seeds = dict(zip(groups, (cell.seed for cell in cells), strict=True))
    RESULTS.update(runs=runs, groups=groups, seeds=seeds, settings=settings, joint=joint)


def fit_round(round_: int, split_seed: int, half_size: int | None,
              selection: str = "reproducible") -> dict:  # fmt: skip
    """The full fit by ``selection`` on the runs round ``round_`` pools."""
    from trainmap.dynamics.maps.hmm import bic_minimum
    from trainmap.dynamics.maps.settings import make_hmm

    joint, seeds = RESULTS["joint"], RESULTS["seeds"]
    n = joint.seeds_per_method(round_)
    last_seed = joint.first_seed + round_ * joint.step  # the seeds below this are pooled
    chosen = {run: table for run, table in RESULTS["runs"].items() if seeds[run] < last_seed}
    settings = RESULTS["settings"].replace(selection=selection, seed=split_seed, n_jobs=1)
    if selection == "reproducible":
        settings = settings.replace(reproduce_k="nested", half_size=half_size)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm = make_hmm(settings).fit(chosen, strata=RESULTS["groups"])
    if selection != "reproducible":  # held-out BIC, on one split or over folds of the runs
        return {"rule": selection, "seeds per method": n, "split seed": split_seed,
                "K": hmm.n_states_, "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
    curve = hmm.selection_.sort_values("n_states")
    k_bic = bic_minimum(curve)
    reproduced = curve[curve["reproducible"].astype(bool) & (curve["n_states"] <= k_bic)]
    return {"seeds per method": n, "half size": half_size or "half", "split seed": split_seed, "K (nested)": hmm.n_states_,
            "K_BIC": k_bic, "K (largest)": int(reproduced["n_states"].max()),
            "share reproduced, K = 1..": " ".join(f"{v:.1f}" for v in curve["reproduced"]),
            "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config/adaptive_parity_init.yaml",
                        help="the adaptive study's config file")  # fmt: skip
    parser.add_argument("--comparison", default="parity_init", help="its adaptive comparison")
    parser.add_argument("--split-seeds", type=int, nargs="+", default=[0],
                        help="analysis.seed values: which random halves (default 0)")  # fmt: skip
    parser.add_argument("--half-sizes", nargs="+", default=["20", "null"],
                        help="analysis.half_size values (null: half the runs; default 20 null)")  # fmt: skip
    parser.add_argument("--selection", default="reproducible",
                        choices=("reproducible", "folds", "holdout"),
                        help="the selection rule fitted each round (default reproducible; folds "
                        "and holdout ignore --half-sizes)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=2, help="fits at once (default 2)")
    parser.add_argument("--out", type=Path, help="write the Markdown table here too")
    parser.add_argument("--quick", action="store_true",
                        help="the first --half-sizes value only, and only the first and the last "
                        "round (does K move between them?)")  # fmt: skip
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from trainmap.grid import results_root

    config, _, cells = every_round(args.config, args.comparison)
    if missing := missing_inputs(*cell_inputs(config, cells)):
        print(f"selection_settle: skipped: {args.config}'s adaptive study has not run every round "
              f"({len(missing)} of {2 * len(cells)} metric tables and evaluations missing under "
              f"{results_root(config)}/); run `snakemake --cores 2 --configfile {args.config}` "
              "first")  # fmt: skip
        return 0
    _load(args.config, args.comparison)
    sizes = [None if value == "null" else int(value) for value in args.half_sizes]
    if args.selection != "reproducible":
        sizes = [None]
    rounds = list(range(RESULTS["joint"].rounds + 1))
    if args.quick:
        sizes, rounds = sizes[:1], sorted({rounds[0], rounds[-1]})
    work = [(r, s, h, args.selection) for h in sizes for r in rounds
            for s in args.split_seeds]  # fmt: skip
    with ProcessPoolExecutor(args.jobs, initializer=_load,
                             initargs=(args.config, args.comparison)) as pool:  # fmt: skip
        rows = list(pool.map(fit_round, *zip(*work, strict=True)))
    rows.sort(key=lambda row: (str(row.get("half size")), row["seeds per method"],
                               row["split seed"]))  # fmt: skip
    report(f"`bench/selection_settle.py --config {args.config} --comparison {args.comparison} "
           f"--selection {args.selection}` ({args.jobs} processes)", rows, args.out)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
