"""What ``--help`` costs: CPU seconds of every ``trainmap`` command's and every bench script's help.

Each command and bench script parses its arguments before it imports torch or the analysis stack,
so its ``--help`` answers at once. For the bare ``trainmap --help``, each ``trainmap <command>
--help`` (map, check, plan, digest, run; run as ``python -m trainmap.cli``) and each
``bench/*.py --help``, a fresh process is started ``--rounds`` times; its CPU time (user + sys, from
``resource.getrusage`` of the finished child) is taken, best of the rounds. Goal: under 1 s each.

Usage::

    .venv/bin/python bench/help_cost.py            # 3 rounds, ~1 min on 2 cores
    .venv/bin/python bench/help_cost.py --quick    # 1 round

Writes ``bench/results/help_cost.md`` (the table) unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results" / "help_cost.md"
#: the trainmap commands whose help is measured ("" is the bare ``trainmap --help``)
COMMANDS = ("", "map", "check", "plan", "digest", "run")
GOAL_S = 1.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="one round (default rounds: 3)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="fresh processes per command, the best taken (default 3; quick 1)")  # fmt: skip
    parser.add_argument("--no-write", action="store_true", help="print only")
    return parser.parse_args(argv)


def help_commands() -> dict[str, list[str]]:
    """label -> the command line of each ``--help`` measured."""
    commands = {}
    for name in COMMANDS:
        words = [name, "--help"] if name else ["--help"]
        commands[" ".join(["trainmap", *words])] = [sys.executable, "-m", "trainmap.cli", *words]
    for script in sorted(BENCH.glob("*.py")):
        commands[f"bench/{script.name} --help"] = [sys.executable, str(script), "--help"]
    return commands


def child_cpu_seconds(command: list[str], env: dict[str, str]) -> tuple[float, int]:
    """CPU seconds (user + sys) of one run of ``command`` and its exit status."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    finished = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, finished.returncode


def machine() -> str:
    """This machine in words: the CPU's model and its cores."""
    from trainmap.portable import cpu_model_and_flags

    return f"{cpu_model_and_flags()[0]}, {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    # the checkout's package first, as `make bench` runs it; the children inherit it
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]))  # fmt: skip
    commands = help_commands()
    best: dict[str, float] = {}
    failed: dict[str, int] = {}
    for _ in range(rounds):
        for label, command in commands.items():
            seconds, status = child_cpu_seconds(command, env)
            best[label] = min(seconds, best.get(label, seconds))
            if status != 0:
                failed[label] = status
    over = [label for label, seconds in best.items() if seconds >= GOAL_S]
    rows = [f"| `{label}` | {seconds:.2f} | {'no' if label in over else 'yes'}"
            f"{f' (exit status {failed[label]})' if label in failed else ''} |"
            for label, seconds in best.items()]  # fmt: skip
    flag = " --quick" if args.quick else ""
    lines = [
        "# What --help costs",
        "",
        f"`bench/help_cost.py{flag} --rounds {rounds}` on {machine()}, Python "
        f"{platform.python_version()}: CPU seconds (user + sys) of each command's `--help` in a "
        f"fresh process, best of {rounds} round{'s' if rounds != 1 else ''}.",
        "",
        f"| command | CPU s | under {GOAL_S:g} s |",
        "|---|---:|---|",
        *rows,
        "",
        f"Goal: every `--help` under {GOAL_S:g} s of CPU (it parses its arguments before importing "
        "torch or the analysis stack; tests/unit/project/test_help.py checks what it imports).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text)
    slowest = max(best, key=best.get)
    print(f"help_cost_max={best[slowest]:.2f}s ({slowest}) over_{GOAL_S:g}s={len(over)}/{len(best)} "
          f"failed={len(failed)} (target: every --help < {GOAL_S:g} s)")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
