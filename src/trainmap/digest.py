"""A published answer anyone can check: the SHA-256 of every result file of a study, and one line
that says whether a run reproduced it.

The published digest is a ``sha256sum``-format file (one ``<sha256>  <path>`` line per result file,
sorted by path; timing sidecars and temporary files aside, trainmap.lineage.is_result_file), and
its own SHA-256 is the study's digest the docs quote (docs/getting-started.md). In the portable mode (trainmap.portable)
the same seed and config give the same bits whatever instruction set the CPU has, so a fresh
clone's ``make run`` reproduces the file exactly on the publishing machine's kind of CPU (and the
CPU-specific results docs/running.md lists aside, on others); a result that differs names itself.

Usage::

    python -m trainmap.digest check config/published/config.results.sha256 results  # make run's
    python -m trainmap.digest write config/published/config.results.sha256 results  # publish one

Both also handle the findings page beside the listing (trainmap.findings:
``config/published/config.findings.md``): ``write`` writes it, ``check`` says whether the run's
answers are the published ones. ``make run`` checks a config's results against
``<config folder>/published/<config name>.results.sha256`` (trainmap.io.published_digest_of).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trainmap.io import (
    SEED_RANGE_MANIFEST,
    companion_path,
    load_json,
    save_json,
    save_text,
)
from trainmap.lineage import MADE_FROM, block_manifests, directory_hashes


def result_hashes(root: str | Path) -> dict[str, str]:
    """``{path: sha256}`` of every result file under ``root`` (paths as ``root/...``, sorted). A
    run's checkpoint archive (``.../seed<n>/checkpoints/``, hundreds of files) is one entry: the
    SHA-256 of its own listing (:func:`format_hashes` of its files), so the published listing stays
    one line per result and still changes with any archived bit (``sha256sum -c`` cannot check
    those lines; :func:`check_digest` does)."""
    from trainmap.training.archive import ARCHIVE_DIRECTORY  # torch: not for the command's --help

    root = Path(root)
    hashes: dict[str, str] = {}
    archives: dict[str, dict[str, str]] = {}
    for name, digest in directory_hashes(root).items():
        head, marker, inside = name.partition(f"/{ARCHIVE_DIRECTORY}/")
        if marker and "/" not in inside:
            archives.setdefault(f"{root.as_posix()}/{head}/{ARCHIVE_DIRECTORY}/", {})[inside] = (
                digest
            )
        else:
            hashes[f"{root.as_posix()}/{name}"] = digest
    for path, files in archives.items():
        hashes[path] = hashlib.sha256(format_hashes(files).encode()).hexdigest()
    return dict(sorted(hashes.items()))


def format_hashes(hashes: dict[str, str]) -> str:
    """The ``sha256sum`` form of ``hashes``: ``sha256sum -c`` checks it too."""
    return "".join(f"{digest}  {path}\n" for path, digest in sorted(hashes.items()))


def parse_hashes(text: str) -> dict[str, str]:
    """Read a ``sha256sum``-format listing back (``<sha256>  <path>`` per line)."""
    hashes = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        digest, sep, path = line.partition("  ")
        if not sep or len(digest) != 64:
            raise ValueError(f"line {number} is not '<sha256>  <path>': {line!r}")
        hashes[path] = digest
    return hashes


def study_digest(hashes: dict[str, str]) -> str:
    """The one number for a whole study: the SHA-256 of its ``sha256sum`` listing."""
    return hashlib.sha256(format_hashes(hashes).encode()).hexdigest()


# --- where a difference starts ---------------------------------------------------------------


def _seeds(seeds: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    parts, seeds = [], sorted(set(seeds))
    start = previous = seeds[0]
    for seed in [*seeds[1:], None]:
        if seed is not None and seed == previous + 1:
            previous = seed
            continue
        parts.append(f"{start}" if start == previous else f"{start}-{previous}")
        if seed is not None:
            start = previous = seed
    return ", ".join(parts)


@dataclass
class Origins:
    """Where a run's differing result files come from (:func:`trace_differences`): per stage (a
    result directory under the root, e.g. ``gradinit``), the cells whose files differ though
    everything their block read for them is the published bits (``starts``), and the cells that
    differ because something upstream does (``follows``); files outside the seed blocks (maps,
    comparisons, summaries) by stage in ``outside``. ``order``: the stages in DAG order (from the
    blocks' ``made_from``)."""

    starts: dict[str, list[str]] = field(default_factory=dict)
    follows: dict[str, list[str]] = field(default_factory=dict)
    outside: dict[str, list[str]] = field(default_factory=dict)
    files: dict[str, list[str]] = field(default_factory=dict)  # per starting cell: its files
    order: list[str] = field(default_factory=list)

    def _cells(self, cells: list[str]) -> str:
        """``sparse_parity/mlp/gradinit seeds 0-31: diagnostics.csv, init.pt`` per group."""
        groups: dict[str, list[int]] = {}
        for cell in cells:
            group, _, seed = cell.rpartition("/seed")
            groups.setdefault(group.split("/", 2)[-1], []).append(int(seed))
        names = sorted({Path(f).name or f for c in cells for f in self.files.get(c, [])})
        where = "; ".join(f"{group} seeds {_seeds(seeds)}" for group, seeds in groups.items())
        return where + (f" ({', '.join(names[:6])}{', ...' if len(names) > 6 else ''})"
                        if names else "")  # fmt: skip

    def lines(self) -> list[str]:
        """What ``make run``'s digest check adds under a mismatch: where the difference starts and
        what follows from it."""

        def rank(stage: str) -> int:
            return self.order.index(stage) if stage in self.order else len(self.order)

        starts = sorted(self.starts, key=rank)
        lines = []
        if starts:
            parts = [f"{stage} in {_count(len(cells), 'cell')}: {self._cells(cells)}"
                     for stage, cells in ((stage, self.starts[stage]) for stage in starts)]  # fmt: skip
            lines.append("The difference starts (the cells' inputs are the published bits) at: "
                         + "; ".join(parts) + ".")  # fmt: skip
        follows = [f"{stage} {_count(len(self.follows[stage]), 'cell')}" for stage in
                   sorted(self.follows, key=rank)]  # fmt: skip
        outside = [f"{stage} {_count(len(files), 'file')}" for stage, files in
                   sorted(self.outside.items(), key=lambda item: rank(item[0]))]  # fmt: skip
        if starts and (follows or outside):
            lines.append("What follows from it: " + ", ".join(follows + outside) + ".")
        elif outside:
            first = min(self.outside, key=rank)
            lines.append(
                "Every seed block's files are the published bits: the difference starts in the "
                f"analysis, at {first} ({', '.join(self.outside[first][:3])}); all: "
                + ", ".join(outside)
                + "."
            )
        return lines


#: A block's own files beside its cells (its manifest ``seeds0-7.json``, its figure ``seeds0-7.png``).
BLOCK_FILE = re.compile(r"seeds\d+-\d+\.")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _stage(path: str, root: str) -> str:
    return path[len(root) + 1 :].split("/", 1)[0]


def trace_differences(differ: list[str], root: str | Path) -> Origins:
    """Trace the differing files ``differ`` (as :func:`result_hashes` names them) through the
    blocks' lineage (trainmap.lineage: each block manifest records its cells and what it was made
    from): a cell's difference *starts* in its stage when every input its block read for it is
    identical (the same seed's files in each upstream block, and every other input file), and
    *follows* otherwise. Each manifest of the run's tree under ``root`` is read once."""
    root = Path(root)
    prefix = root.as_posix()
    records = {manifest: load_json(manifest, timing=False) for manifest in block_manifests(root)}
    manifest_of = {(manifest.parent / cell["cell"].rsplit("/", 1)[-1]).as_posix(): manifest
                   for manifest, record in records.items() for cell in record.get("cells", [])}  # fmt: skip
    differing = set(differ)
    origins = Origins()
    by_cell: dict[str, list[str]] = {}  # each differing cell directory: its differing files
    for path in differ:
        # a cell's file, or one folder down (its checkpoint archive, listed as one entry)
        cell = next((d for d in (Path(path).parent.as_posix(), Path(path).parent.parent.as_posix())
                     if d in manifest_of), None)  # fmt: skip
        if cell is not None:
            by_cell.setdefault(cell, []).append(path)
        elif not BLOCK_FILE.match(Path(path).name):  # a block's own record or figure: skip
            origins.outside.setdefault(_stage(path, prefix), []).append(path)
    edges: set[tuple[str, str]] = set()
    for manifest, record in records.items():
        for relative in record.get(MADE_FROM, {}):
            upstream = Path(os.path.normpath(manifest.parent / relative))
            if upstream.is_relative_to(root):
                edges.add(
                    (_stage(upstream.as_posix(), prefix), _stage(manifest.as_posix(), prefix))
                )
    origins.order = _dag_order(edges)
    for cell, files in sorted(by_cell.items()):
        manifest = manifest_of[cell]
        seed_dir = cell.rsplit("/", 1)[-1]
        inputs_differ = False
        for relative in records[manifest].get(MADE_FROM, {}):
            upstream = Path(os.path.normpath(manifest.parent / relative))
            if SEED_RANGE_MANIFEST.fullmatch(upstream.name):
                inputs_differ |= (upstream.parent / seed_dir).as_posix() in by_cell
            else:
                inputs_differ |= upstream.as_posix() in differing
        stage = _stage(cell, prefix)
        if inputs_differ:
            origins.follows.setdefault(stage, []).append(cell)
        else:
            origins.starts.setdefault(stage, []).append(cell)
            origins.files[cell] = [f[len(cell) + 1 :] for f in files]
    return origins


def _dag_order(edges: set[tuple[str, str]]) -> list[str]:
    """Stages ordered so that each comes after what it was made from (longest path from a
    source, then by name)."""
    stages = {stage for edge in edges for stage in edge}
    depth = dict.fromkeys(stages, 0)
    for _ in stages:  # relax: a DAG settles within len(stages) rounds
        for before, after in edges:
            depth[after] = max(depth[after], depth[before] + 1)
    return sorted(stages, key=lambda stage: (depth[stage], stage))


@dataclass
class DigestCheck:
    """How a run's results compare with a published digest; ``origins``: where the differing
    files' difference starts (:func:`trace_differences`), ``environment``: how the run's machine
    (as ``make run`` recorded it with the results; else this process's) differs from the one that
    published the digest (empty when the same, None when the digest has no record of it)."""

    published: str
    actual: str
    differ: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    listed: int = 0  # files the published listing names
    origins: Origins | None = None
    environment: list[str] | None = None
    run_recorded: bool = True  # the run's machine record was kept with the results (make run)

    @property
    def matches(self) -> bool:
        return not self.differ and not self.missing

    def lines(self) -> list[str]:
        """:meth:`line`, and under a mismatch where it starts and what differs between the
        machines."""
        lines = [self.line()]
        if self.matches:
            return lines
        if self.origins is not None:
            lines += self.origins.lines()
        if self.environment is None:
            return [*lines, "The published digest has no record of its machine to compare with."]
        which = ("This run's machine" if self.run_recorded else
                 "This machine (the run kept no record of its own: not started by make run)")  # fmt: skip
        if self.environment:
            lines.append(f"{which} against the published run's: "
                         + "; ".join(self.environment) + ".")  # fmt: skip
        else:
            lines.append(f"{which} has the published run's CPU model, kernel flags, portable level "
                         "and library versions: the difference is not the machine's.")  # fmt: skip
        return lines

    def line(self, shown: int = 5) -> str:
        """One line for the end of ``make run``."""
        if self.matches:
            extra = (f" ({len(self.extra)} files beyond it, e.g. {self.extra[0]})"
                     if self.extra else "")  # fmt: skip
            return f"Results match the published digest {self.published[:16]}{extra}."
        bad = self.differ + self.missing
        names = ", ".join(bad[:shown]) + (
            f" and {len(bad) - shown} more" if len(bad) > shown else ""
        )
        missing = f" ({len(self.missing)} missing)" if self.missing else ""
        other = ""
        if self.extra and 2 * len(self.missing) > self.listed:
            other = (f" Most listed files are missing and {len(self.extra)} are beyond the "
                     "listing: is it another study's digest (each config file has its own, "
                     "published/<config>.results.sha256)?")  # fmt: skip
        return (f"Results differ from the published digest {self.published[:16]} in {len(bad)} "
                f"files{missing}: {names} (this run: {self.actual[:16]}).{other}")  # fmt: skip


def environment_path(published_digest: str | Path) -> Path:
    """The record of the machine a digest was made on (:func:`~trainmap.portable.numeric_environment`):
    ``config/published/config.results.sha256`` -> ``config/published/config.environment.json``."""
    return companion_path(published_digest, ".environment.json")


def check_digest(published_path: str | Path, root: str | Path) -> DigestCheck:
    """Compare the result files under ``root`` with the published listing; under a mismatch,
    where it starts (:func:`trace_differences`) and how this machine differs from the published
    run's (its environment record, when there is one). A listing of another study's results
    directory is refused with the directory it is for."""
    published = parse_hashes(Path(published_path).read_text())
    prefix = Path(root).as_posix() + "/"
    roots = sorted({path.split("/", 1)[0] for path in published})
    if published and not any(path.startswith(prefix) for path in published):
        raise ValueError(f"{published_path} lists the results under {', '.join(roots)}/, not "
                         f"{prefix}: it is another study's digest (check it against "
                         f"{roots[0]}, or give this study's own listing)")  # fmt: skip
    actual = result_hashes(root)
    check = DigestCheck(
        published=study_digest(published),
        actual=study_digest({p: d for p, d in actual.items() if p in published}),
        differ=sorted(p for p in published if p in actual and actual[p] != published[p]),
        missing=sorted(p for p in published if p not in actual),
        extra=sorted(p for p in actual if p not in published),
        listed=len(published),
    )
    if not check.matches:
        from trainmap.findings import run_environment
        from trainmap.portable import environment_differences, numeric_environment

        check.origins = trace_differences(check.differ, root)
        record = environment_path(published_path)
        if record.exists():
            run = run_environment(root)  # what make run recorded of the run's machine
            check.environment = environment_differences(
                load_json(record, timing=False), run if run is not None else numeric_environment()
            )
            check.run_recorded = run is not None
    return check


def write_digest(published_path: str | Path, root: str | Path) -> str:
    """Publish the result files under ``root``: write the listing and the record of the run's
    machine (:func:`environment_path`; as ``make run`` kept it with the results, else this
    process's), return the study's digest."""
    from trainmap.findings import run_environment
    from trainmap.portable import numeric_environment

    hashes = result_hashes(root)
    save_text(format_hashes(hashes), published_path)
    # the run's own record where make run kept one (its portable level), else this process's
    save_json(run_environment(root) or numeric_environment(), environment_path(published_path))
    return study_digest(hashes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainmap.digest",
        description="Check a study's result files against a published SHA-256 listing, or publish "
        "one. Timing sidecars (*.timing.*) are left out: they differ on every run.",
    )
    parser.add_argument("action", choices=("check", "write"))
    parser.add_argument("published", help="the sha256sum-format listing, e.g. "
                        "config/published/config.results.sha256")  # fmt: skip
    parser.add_argument("root", nargs="?", default="results", help="the results directory")
    args = parser.parse_args(argv)
    from trainmap.findings import check_findings, findings_page, findings_path, title_of

    page = findings_path(args.published)
    if args.action == "write":
        print(f"{args.published}: study digest {write_digest(args.published, args.root)}")
        try:
            save_text(findings_page(args.root, title_of(page)), page)
            print(f"{page}: the findings of {args.root}/")
        except FileNotFoundError:  # a study without joint comparisons has no findings page
            pass
        return 0
    if not Path(args.published).exists():
        print(f"No published digest {args.published}: nothing to compare with "
              f"(`python -m trainmap.digest write {args.published} {args.root}` publishes one).")  # fmt: skip
        return 0
    try:
        check = check_digest(args.published, args.root)
    except ValueError as error:
        print(f"Cannot check: {error}.")
        return 2
    print("\n".join(check.lines()))
    if page.exists():  # the answers: the same, or which line of them changed
        print(check_findings(page, args.root).line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
