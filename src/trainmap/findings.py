"""A study's findings as one committed page, written from its results tree, so the numbers the
README and the docs give are the numbers the study produces.

The page holds, per joint comparison (``results/joint/<name>/``): the methods and their runs, the
map's K and selection rule, the bootstrap's K counts, the stability line and the verdict table
with effects, intervals, Holm p-values and labels (``verdicts.md``, the one place a verdict's words
are made: trainmap.dynamics.verdicts); then the run's time, where ``make run`` recorded it
(``summary/run.timing.json``, a timing sidecar). It lives beside the published digest:
``config/config.results.sha256`` and ``config/config.findings.md``; docs/findings.md includes it.

``check`` compares the page with the one the results under a root give, the run's time aside
(a run's time is never the same twice): after ``make run`` it says whether the answers are the
published ones, and where they are not, the first line that differs.

Usage::

    python -m trainmap.findings write config/config.findings.md results
    python -m trainmap.findings check config/config.findings.md results
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from trainmap.dynamics.stability_results import reports_states, states_sentence
from trainmap.io import companion_path, load_json, save_json, save_text, timing_path

#: Where ``make run`` records its wall time (a timing sidecar: left out of the digest).
RUN_TIMING = "summary/run.json"
#: The line of the page that holds the run's time: left out of ``check``.
TIME_PREFIX = "Run time:"


def findings_path(published_digest: str | Path) -> Path:
    """The findings page beside a published digest: ``config/config.results.sha256`` ->
    ``config/config.findings.md``."""
    return companion_path(published_digest, ".findings.md")


def _k_counts(counts: dict[str, int], total: int) -> str:
    """``"7 in 32, 8 in 28, 6 in 23"``: the bootstrap's selected K, most frequent first."""
    ordered = sorted(counts.items(), key=lambda item: (-item[1], int(item[0])))
    return ", ".join(f"K = {k} in {n}" for k, n in ordered) + f" of {total} resamples"


def _comparison(directory: Path) -> str:
    """One comparison's section of the page, from its joint.json, hmm.json, bootstrap.json and
    verdicts.md."""
    joint = load_json(directory / "joint.json", timing=False)
    lines = [f"## {directory.name}", ""]
    runs = ", ".join(f"{name} {group['runs']} runs" for name, group in joint["groups"].items())
    lines.append(f"- Methods: {runs}.")
    hmm_file = directory / "hmm.json"
    estimator = load_json(hmm_file, timing=False).get("estimator", {}) if hmm_file.exists() else {}
    rule = (f" (selection rule `{estimator['selection']}`, K_max {estimator['k_max']})"
            if {"selection", "k_max"} <= set(estimator) else "")  # fmt: skip
    lines.append(f"- K = {joint['n_states']}{rule}.")
    bootstrap_file = directory / "bootstrap.json"
    if bootstrap_file.exists():
        bootstrap = load_json(bootstrap_file, timing=False)
        if not reports_states(bootstrap.get("reselect_k", True), bootstrap.get("state_jaccard")):
            lines.append(
                f"- Bootstrap: {_k_counts(bootstrap['k_counts'], bootstrap['n_resamples'])}."
            )
        else:  # refits at the full map's K: each state's mean Jaccard (Hennig 2007)
            where = f"over {bootstrap['n_resamples']} resamples"
            lines.append(f"- Bootstrap: {states_sentence(bootstrap['state_jaccard'], where)}.")
    verdicts = (directory / "verdicts.md").read_text().strip()
    lines += ["", verdicts, ""]
    return "\n".join(lines)


def _run_time(root: Path) -> str | None:
    """The run's time line, from what ``make run`` recorded (None where nothing was)."""
    path = root / RUN_TIMING
    if not timing_path(path).exists():
        return None
    timing = load_json(timing_path(path), timing=False)
    minutes, seconds = divmod(round(timing["snakemake_wall_s"]), 60)
    return (f"{TIME_PREFIX} Snakemake {minutes} min {seconds} s on {timing['cores']} cores "
            f"({timing['cpu']}), {timing['date']}.")  # fmt: skip


def findings_page(root: str | Path, title: str = "Findings") -> str:
    """The findings page of the results tree under ``root`` (Markdown)."""
    root = Path(root)
    joint = sorted(path.parent for path in (root / "joint").glob("*/joint.json"))
    if not joint:
        raise FileNotFoundError(
            f"{root}: no joint comparison's results (joint/<name>/joint.json): run the study "
            "first (make run), or name its results directory"
        )
    parts = [
        f"<!-- Generated from {root.as_posix()}/ by `python -m trainmap.findings write`: do not "
        "edit; `make run` checks it. -->",
        "",
        f"# {title}",
        "",
        "Each comparison: its methods, the shared map's K, the bootstrap's K over resamples of "
        "the runs, the stability line and every verdict with its effect, 95 % interval, Holm "
        "p-value and label (a **finding** is significant after Holm and holds again on "
        "subsamples of the seeds).",
        "",
    ]
    time_line = _run_time(root)
    if time_line:
        parts += [time_line, ""]
    parts += [_comparison(directory) for directory in joint]
    return "\n".join(parts).rstrip() + "\n"


def record_run_time(root: str | Path, seconds: float, cores: int) -> Path:
    """Record the run's Snakemake wall time beside the results (a timing sidecar of
    ``summary/run.json``), with the CPU and the date, for the findings page."""
    import datetime

    from trainmap.portable import numeric_environment

    # what the run's bits were made with (the digest check compares it with the published
    # machine's): this process has the jobs' environment
    environment = numeric_environment()
    path = timing_path(Path(root) / RUN_TIMING)
    save_json({"snakemake_wall_s": round(float(seconds), 1), "cores": int(cores),
               "cpu": environment["cpu"], "date": datetime.date.today().isoformat(),
               "environment": environment}, path)  # fmt: skip
    return path


def run_environment(root: str | Path) -> dict | None:
    """The machine record (:func:`~trainmap.portable.numeric_environment`) ``make run`` kept
    beside the results under ``root``; None where the run recorded none (a plain Snakemake run)."""
    path = timing_path(Path(root) / RUN_TIMING)
    if not path.exists():
        return None
    return load_json(path, timing=False).get("environment")


@dataclass
class FindingsCheck:
    """How a run's findings compare with the published page."""

    published: Path
    differs: bool
    first_difference: str = ""

    def line(self) -> str:
        """One line for the end of ``make run``."""
        if not self.differs:
            return f"Findings match {self.published}."
        return (f"Findings differ from {self.published}: {self.first_difference} "
                f"(`python -m trainmap.findings write {self.published} <results>` "
                "writes this run's).")  # fmt: skip


def _comparable(text: str) -> list[str]:
    """The lines a check compares: not the run's time, the generated-by comment or blank lines."""
    return [line for line in text.splitlines()
            if line.strip() and not line.startswith((TIME_PREFIX, "<!--"))]  # fmt: skip


def check_findings(published: str | Path, root: str | Path) -> FindingsCheck:
    """Compare the published page with the one the results under ``root`` give (the run's time
    and the generated-by comment aside)."""
    published = Path(published)
    text = published.read_text()
    expected = _comparable(text)
    try:
        actual = _comparable(findings_page(root, _title_in(text)))
    except FileNotFoundError as missing:  # no comparison's results: every finding is missing
        return FindingsCheck(published, True, str(missing))
    if expected == actual:
        return FindingsCheck(published, False)
    for line in difflib.unified_diff(expected, actual, lineterm="", n=0):
        if line.startswith(("-", "+")) and not line.startswith(("---", "+++")):
            first = line
            break
    else:  # pragma: no cover - unequal lists always differ somewhere
        first = "the pages differ"
    return FindingsCheck(published, True, f"first differing line {first[:160]!r}")


def _title_in(text: str) -> str:
    """A page's title: its first ``# `` heading, else ``Findings``."""
    return next((line[2:] for line in text.splitlines() if line.startswith("# ")), "Findings")


def title_of(page: Path) -> str:
    """The page's title (its first ``# `` heading), kept when it is rewritten."""
    return _title_in(page.read_text()) if page.exists() else "Findings"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainmap.findings",
        description="A study's findings page, from its results tree: K, bootstrap, stability and "
        "every verdict of each joint comparison, and the run's time.",
    )
    actions = parser.add_subparsers(dest="action", required=True)
    for action, text in (
        ("write", "write the page from the results"),
        ("check", "compare the page with the results' (the run's time aside)"),
    ):
        sub = actions.add_parser(action, help=text, description=text)
        sub.add_argument("page", help="the findings page, e.g. config/config.findings.md")
        sub.add_argument("root", nargs="?", default="results", help="the results directory")
        if action == "write":
            sub.add_argument("--title", help="the page's title (default: the page's own, else "
                             "'Findings')")  # fmt: skip
    timed = actions.add_parser("time", help="record a run's Snakemake wall time under its "
                               f"results ({RUN_TIMING}'s timing sidecar), as make run does")  # fmt: skip
    timed.add_argument("root", help="the results directory")
    timed.add_argument("seconds", type=float, help="the Snakemake wall time in seconds")
    timed.add_argument("--cores", type=int, default=2, help="the cores it used (default 2)")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if args.action == "time":
        if args.seconds < 0:
            parser.error(f"seconds: {args.seconds} is negative; give the run's wall time")
        print(f"{record_run_time(root, args.seconds, args.cores)}: the run's time")
        return 0
    page = Path(args.page)
    if args.action == "write":
        try:
            save_text(findings_page(root, args.title or title_of(page)), page)
        except FileNotFoundError as missing:
            parser.error(str(missing))
        print(f"{page}: the findings of {root}/")
        return 0
    if not page.exists():
        print(f"No published findings {page}: nothing to compare with "
              f"(`python -m trainmap.findings write {page} {root}` publishes them).")  # fmt: skip
        return 0
    try:
        print(check_findings(page, root).line())
    except (json.JSONDecodeError, KeyError) as broken:
        print(f"Findings not checked: {broken}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
