"""What the stability curve costs beside the full fit and the bootstrap, and the analysis' share of a
whole run.

**One joint comparison, side by side.** The default study's largest joint comparison
(``parity_init``: sparse parity, MLP, Kaiming vs GradInit, 40 seeds each, 80 runs x 321
checkpoints) is loaded from a finished run's ``results`` as rule ``joint_comparison`` loads it
(the config's cells, ``metrics.csv`` and ``evaluation.json`` per cell, read strictly) and analysed
by :func:`trainmap.dynamics.pipeline.joint_group`, the function the rule runs, with the analysis
settings of ``params.yaml`` + ``config/config.yaml`` (200 bootstrap refits, 20 subsamples per
seed count) and the rule's 2 processes. The bootstrap and the stability curve time themselves
(``seconds`` of their results); the rest of the call is the full fit with its comparison
(selection over K and restarts, decoding, regressions, permutation tests, the map). Printed: the
three times and the ratio stability / (fit + bootstrap).

**The whole run.** The workflow declares no ``benchmark:`` directive, so per-job times come from
Snakemake's own log of the run (``.snakemake/log/*.snakemake.log`` beside ``results``: the time
each job started and finished, to the second). Printed per rule: jobs, summed job time, and the
time at least one of its jobs was running; then the analysis rules' (``fit_hmm``,
``regress_detours``, ``training_map``, ``joint_comparison``) share of the run's wall time (the
budget: <= 35 %), and inside ``joint_comparison`` the bootstrap's and the stability curve's own times
(``results/joint/*/bootstrap.timing.json`` and ``stability.timing.json``), which no rule times
separately (they run inside ``fit_hmm`` and ``joint_comparison``).

Usage::

    .venv/bin/python bench/stability_cost.py [results]          # ~5 min on 2 cores
    .venv/bin/python bench/stability_cost.py results --log-only  # the run's timings only
    .venv/bin/python bench/stability_cost.py results --selection holdout reproducible  # ~20 min

Without a finished run in ``results`` (and none named) the script says so and exits 0 (``make
bench`` on a clone without ``make run``'s results).

Last line: ``stability_cost fit_s=... bootstrap_s=... stability_s=... ratio=... analysis_share=...``.
"""

from __future__ import annotations

import argparse
import re
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from trainmap.io import load_json
from trainmap.schema import section_choices

if TYPE_CHECKING:
    import pandas as pd

    from trainmap.dynamics.pipeline import Outcomes

#: trainmap.dynamics.maps.hmm.SELECTION_RULES, as the schema lists them (no analysis import
#: before the arguments are parsed)
RULES = section_choices("analysis")["selection"]
ANALYSIS_RULES = ("fit_hmm", "regress_detours", "training_map", "joint_comparison")
TARGET_SHARE = 0.35
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
STARTED = re.compile(r"^(?:local)?(?:checkpoint)?rule (\w+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
WILDCARDS = re.compile(r"^\s+wildcards: (.*)$")
FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")


def load_joint(
    results: Path, name: str, config: dict
) -> tuple[dict[str, pd.DataFrame], dict[str, str], Outcomes]:
    """The runs of joint comparison ``name`` as rule ``joint_comparison`` reads them: run ids
    ``<method>/seed<seed>`` (``<arch>/<method>`` when archs differ, the labels of
    ``trainmap.grid.joint_labels``), strict metric tables, outcomes from the evaluations."""
    from trainmap.grid import joint_comparisons, joint_labels
    from trainmap.jobs.analysis import joint_run_ids, read_group_runs

    cells = joint_comparisons(config)[name]
    labels = joint_labels(cells)
    run_ids = joint_run_ids(labels, cells)
    runs, outcomes = read_group_runs(
        [str(results / "metrics" / cell.id / "metrics.csv") for cell in cells],
        [str(results / "evaluate" / cell.id / "evaluation.json") for cell in cells], run_ids,
    )  # fmt: skip
    return runs, dict(zip(run_ids, labels, strict=True)), outcomes


def time_joint(
    results: Path,
    name: str,
    config: dict,
    threads: int,
    selection: str | None = None,
    out: Path | None = None,
) -> dict[str, float]:
    """The full fit, the bootstrap and the stability curve of one joint comparison, timed in one
    call of :func:`~trainmap.dynamics.pipeline.joint_group` (under selection rule ``selection``
    when given, else the config's); with ``out``, its answers (K, then ``verdicts.md`` as the rule
    writes it) go to ``out/<name>-<rule>.md``."""
    import pandas as pd

    from trainmap.dynamics.maps.settings import AnalysisSettings
    from trainmap.dynamics.pipeline import joint_group
    from trainmap.grid import analysis_settings

    runs, groups, outcomes = load_joint(results, name, config)
    settings = AnalysisSettings.of(
        analysis_settings(config) | ({"selection": selection} if selection else {})
    )
    sizes = pd.Series(groups).value_counts().to_dict()
    length = {len(table) for table in runs.values()}
    print(f"{name}: {len(runs)} runs ({sizes}), {sorted(length)} checkpoints; selection "
          f"{settings.selection}; bootstrap "
          f"{settings.bootstrap} refits, stability {settings.stability} subsamples per n, "
          f"{threads} processes")  # fmt: skip
    started = time.perf_counter()
    result = joint_group(runs, groups, outcomes, settings, n_jobs=threads)
    total = time.perf_counter() - started
    bootstrap = result.bootstrap.seconds
    curve = result.stability.curve
    stability = curve.seconds if curve is not None else 0.0
    fit = total - bootstrap - stability
    ladder = curve.ladder if curve is not None else []
    print(f"  K = {result.hmm.n_states_}; stability ladder {ladder}: {result.stability.line}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        rule = settings.selection
        (out / f"{name}-{rule}.md").write_text(
            f"# {name}, selection {rule}: K = {result.hmm.n_states_}\n\n{result.verdict_markdown()}"
        )
    return {"fit": fit, "bootstrap": bootstrap, "stability": stability, "total": total,
            "ratio": stability / (fit + bootstrap)}  # fmt: skip


def job_intervals(log: Path) -> pd.DataFrame:
    """One row per finished job of a Snakemake log: rule, jobid, wildcards, start, end, seconds."""
    import pandas as pd

    started: dict[str, dict] = {}
    rows, stamp, rule, job = [], None, None, None
    for line in log.read_text().splitlines():
        if match := STAMP.match(line):
            stamp, rule, job = datetime.strptime(match[1], "%a %b %d %H:%M:%S %Y"), None, None
        elif (match := STARTED.match(line)) and stamp is not None:
            rule = match[1]
        elif (match := JOBID.match(line)) and rule is not None:
            job = started[match[1]] = {"rule": rule, "jobid": int(match[1]), "wildcards": "",
                                       "start": stamp}  # fmt: skip
        elif (match := WILDCARDS.match(line)) and job is not None:
            job["wildcards"] = match[1]
        elif (match := FINISHED.match(line)) and match[1] in started:
            rows.append(started.pop(match[1]) | {"end": stamp})
    frame = pd.DataFrame(rows, columns=["rule", "jobid", "wildcards", "start", "end"])
    frame["seconds"] = (frame["end"] - frame["start"]).dt.total_seconds()
    return frame


def busy_seconds(jobs: pd.DataFrame) -> float:
    """Seconds during which at least one of ``jobs`` was running (union of their intervals)."""
    total, until = 0.0, None
    for start, end in sorted(zip(jobs["start"], jobs["end"], strict=True)):
        if until is None or start > until:
            total += (end - start).total_seconds()
            until = end
        elif end > until:
            total += (end - until).total_seconds()
            until = end
    return total


def recorded_seconds(directory: Path, part: str) -> float | None:
    """A step's own time as the job recorded it: ``<part>.timing.json`` (the sidecar that keeps
    ``<part>.json`` reproducible), else ``seconds`` in ``<part>.json``; None when neither has it."""
    for path in (directory / f"{part}.timing.json", directory / f"{part}.json"):
        if path.exists() and load_json(path).get("seconds") is not None:
            return float(load_json(path)["seconds"])
    return None


def run_timings(results: Path) -> float:
    """Print the per-rule times of the latest Snakemake run beside ``results`` and the analysis
    rules' share of its wall time; returns that share (NaN without a log)."""
    logs = [log for log in sorted((results.parent / ".snakemake" / "log").glob("*.snakemake.log"))
            if any(FINISHED.match(line) for line in log.read_text().splitlines())]  # fmt: skip
    if not logs:  # the latest log with a finished job: a rerun that failed has none
        print(f"no Snakemake log with a finished job under {results.parent / '.snakemake' / 'log'}: per-job times "
              "are not recorded anywhere else (the rules declare no benchmark: directive)")  # fmt: skip
        return float("nan")
    jobs = job_intervals(logs[-1])
    wall = (jobs["end"].max() - jobs["start"].min()).total_seconds()
    print(f"\nSnakemake log {logs[-1]}: {len(jobs)} finished jobs, wall {wall:.0f} s "
          "(first job start to last job end; times to the second)")  # fmt: skip
    table = jobs.groupby("rule").agg(jobs=("jobid", "size"), job_s=("seconds", "sum"))
    table["busy_s"] = [busy_seconds(jobs[jobs["rule"] == rule]) for rule in table.index]
    table["busy_share"] = table["busy_s"] / wall
    print(table.sort_values("job_s", ascending=False).round(3).to_string())
    analysis = jobs[jobs["rule"].isin(ANALYSIS_RULES)]
    share = busy_seconds(analysis) / wall if wall else float("nan")
    job_share = analysis["seconds"].sum() / jobs["seconds"].sum()
    print(f"analysis rules {', '.join(ANALYSIS_RULES)}: running during {share:.1%} of the wall "
          f"time (target <= {TARGET_SHARE:.0%}); {job_share:.1%} of the summed job time")  # fmt: skip
    for name in sorted(p.name for p in (results / "joint").glob("*") if p.is_dir()):
        parts = {part: recorded_seconds(results / "joint" / name, part)
                 for part in ("bootstrap", "stability")}  # fmt: skip
        job = jobs[(jobs["rule"] == "joint_comparison") & (jobs["wildcards"] == f"name={name}")]
        print(f"  joint/{name}: " + ", ".join(
            f"{part} {seconds:.0f} s" if seconds is not None else f"{part} not timed"
            for part, seconds in parts.items()
        ) + f" (its joint_comparison job: {job['seconds'].sum():.0f} s)")  # fmt: skip
    return share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", type=Path,
                        help="a finished run's results root (default: results)")  # fmt: skip
    parser.add_argument("--joint", default="parity_init", help="the joint comparison to time")
    parser.add_argument("--threads", type=int, default=2, help="processes (the rule's threads)")
    parser.add_argument("--config", nargs="+", default=["params.yaml", "config/config.yaml"],
                        help="config files, relative to the results directory's parent")  # fmt: skip
    parser.add_argument("--log-only", action="store_true", help="only the run's timings")
    parser.add_argument("--selection", nargs="*", choices=RULES, default=[],
                        help="time the comparison under each of these selection rules, side by "
                        "side (default: the config's rule)")  # fmt: skip
    parser.add_argument("--out", type=Path,
                        help="write each rule's answers (K, verdicts.md) to OUT/<joint>-<rule>.md")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="the same (it times one comparison once; make bench's fast pass)")  # fmt: skip
    args = parser.parse_args()
    results = (args.results or Path("results")).resolve()
    if not (results / "joint" / args.joint).is_dir():
        why = f"no finished run in {results} (results/joint/{args.joint} is missing)"
        if args.results is not None:
            raise SystemExit(f"stability_cost: {why}")
        print(f"stability_cost: skipped: {why}; run `make run` first, or name a results directory")
        return
    times = {}
    if not args.log_only:
        from trainmap.grid import load_config

        project = results.parent
        config = load_config(*(project / path for path in args.config), check_paths_from=project)
        by_rule = {}
        for rule in args.selection or [None]:  # side by side, one after the other
            times = by_rule[rule] = time_joint(
                results, args.joint, config, args.threads, rule, args.out
            )
            print(f"  full fit + comparison {times['fit']:.1f} s, bootstrap "
                  f"{times['bootstrap']:.1f} s, stability curve {times['stability']:.1f} s (total "
                  f"{times['total']:.1f} s); stability / (fit + bootstrap) = "
                  f"{times['ratio']:.2f}")  # fmt: skip
        if len(by_rule) > 1:
            first, *others = by_rule
            for rule in others:
                ratios = {key: by_rule[rule][key] / by_rule[first][key]
                          for key in ("fit", "bootstrap", "stability", "total")}  # fmt: skip
                print(f"  {rule} / {first}: " + ", ".join(f"{key} x{value:.1f}"
                                                          for key, value in ratios.items()))  # fmt: skip
        times = by_rule[(args.selection or [None])[0]]
    share = run_timings(results)
    figures = " ".join(f"{key}_s={times[key]:.1f}" for key in ("fit", "bootstrap", "stability")
                       if key in times)  # fmt: skip
    ratio = f" ratio={times['ratio']:.2f}" if times else ""
    print(f"stability_cost {figures}{ratio} analysis_share={share:.3f}".replace("  ", " "))


if __name__ == "__main__":
    main()
