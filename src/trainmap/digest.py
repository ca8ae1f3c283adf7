"""A published answer anyone can check: the SHA-256 of every result file of a study, and one line
that says whether a run reproduced it.

The published digest is a ``sha256sum``-format file (one ``<sha256>  <path>`` line per result file,
sorted by path; timing sidecars and temporary files aside, trainmap.lineage.is_result_file), and
its own SHA-256 is the study's digest the docs quote (docs/getting-started.md). In the portable mode (trainmap.portable)
the same seed and config give the same bits on any x86-64 CPU, so a fresh clone's ``make run``
reproduces the file exactly; a result that differs names itself.

Usage::

    python -m trainmap.digest check config/config.results.sha256 results   # after make run
    python -m trainmap.digest write config/config.results.sha256 results   # publish a new one

Both also handle the findings page beside the listing (trainmap.findings:
``config/config.findings.md``): ``write`` writes it, ``check`` says whether the run's answers are
the published ones.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trainmap.io import save_text
from trainmap.lineage import directory_hashes
from trainmap.training.archive import ARCHIVE_DIRECTORY


def result_hashes(root: str | Path) -> dict[str, str]:
    """``{path: sha256}`` of every result file under ``root`` (paths as ``root/...``, sorted). A
    run's checkpoint archive (``.../seed<n>/checkpoints/``, hundreds of files) is one entry: the
    SHA-256 of its own listing (:func:`format_hashes` of its files), so the published listing stays
    one line per result and still changes with any archived bit (``sha256sum -c`` cannot check
    those lines; :func:`check_digest` does)."""
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


@dataclass
class DigestCheck:
    """How a run's results compare with a published digest."""

    published: str
    actual: str
    differ: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)

    @property
    def matches(self) -> bool:
        return not self.differ and not self.missing

    def line(self, shown: int = 5) -> str:
        """One line for the end of ``make run``."""
        if self.matches:
            extra = f" ({len(self.extra)} files beyond it)" if self.extra else ""
            return f"Results match the published digest {self.published[:16]}{extra}."
        bad = self.differ + self.missing
        names = ", ".join(bad[:shown]) + (
            f" and {len(bad) - shown} more" if len(bad) > shown else ""
        )
        missing = f" ({len(self.missing)} missing)" if self.missing else ""
        return (f"Results differ from the published digest {self.published[:16]} in {len(bad)} "
                f"files{missing}: {names} (this run: {self.actual[:16]}).")  # fmt: skip


def check_digest(published_path: str | Path, root: str | Path) -> DigestCheck:
    """Compare the result files under ``root`` with the published listing."""
    published = parse_hashes(Path(published_path).read_text())
    actual = {path: digest for path, digest in result_hashes(root).items()}
    return DigestCheck(
        published=study_digest(published),
        actual=study_digest({p: d for p, d in actual.items() if p in published}),
        differ=sorted(p for p in published if p in actual and actual[p] != published[p]),
        missing=sorted(p for p in published if p not in actual),
        extra=sorted(p for p in actual if p not in published),
    )


def write_digest(published_path: str | Path, root: str | Path) -> str:
    """Publish the result files under ``root``: write the listing, return the study's digest."""
    hashes = result_hashes(root)
    save_text(format_hashes(hashes), published_path)
    return study_digest(hashes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainmap.digest",
        description="Check a study's result files against a published SHA-256 listing, or publish "
        "one. Timing sidecars (*.timing.*) are left out: they differ on every run.",
    )
    parser.add_argument("action", choices=("check", "write"))
    parser.add_argument("published", help="the sha256sum-format listing, e.g. "
                        "config/config.results.sha256")  # fmt: skip
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
    check = check_digest(args.published, args.root)
    print(check.line())
    if page.exists():  # the answers: the same, or which line of them changed
        print(check_findings(page, args.root).line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
