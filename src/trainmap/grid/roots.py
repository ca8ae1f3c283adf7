"""Results roots: where a study may write, which directories are its own, and who holds one.

A study writes every output under its results root (config key ``results``, relative to the
project: :func:`~trainmap.grid.study.results_root`), and Snakemake deletes a job's declared outputs
before it runs the job. So a root must never be, contain or lie inside the project's own files
(:data:`OWN_DIRS`, the project directory itself), nor be a dangling link or an existing file:
:func:`check_roots` refuses such a root, and a local MLflow store (``sqlite:///...``) inside the
project's own files, when the config is checked (``python -m trainmap.grid``, the Snakefile). A
link to scratch space outside the project stays a root.

Each root a workflow writes carries a marker, :data:`MARKER` (:func:`mark_root`, called when the
workflow starts), and is listed in the project's registry (:data:`REGISTRY`), so ``make clean``
(:func:`clean_roots`, ``python -m trainmap.grid.roots clean``) deletes every root a study wrote,
wherever it lies and whatever its name, and nothing unmarked (besides ``results`` and
``results-*`` directly in the project, the shipped configs' roots, which studies run before
markers existed wrote unmarked).

One workflow writes a root at a time: :func:`claim_root` takes an exclusive ``flock`` on the root's
lock file (:data:`LOCK`) for the life of the workflow (the kernel releases it when the process ends,
however it ends), :func:`root_holder` says who holds it. ``flock`` locks belong to an open file
description: a second ``open()`` of the lock file conflicts even within one process. On NFS, Linux
emulates ``flock`` with POSIX record locks, which do not conflict within one process (across
processes and hosts they still do).

This module is imported by ``make clean`` and by the workflow's start: it imports nothing heavy
(no torch, no JSON schema validator) at module level.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from trainmap.errors import ConfigError
from trainmap.io import save_text
from trainmap.locks import LockHeld, hold, holder_of

#: The marker file a workflow writes into each root it writes (a small JSON record).
MARKER = ".trainmap-root"
#: The lock file :func:`claim_root` holds inside a root. Not the marker itself: the marker is
#: written atomically (a new inode by rename), and a lock must stay on one inode.
LOCK = ".trainmap-root.lock"
#: Where the project lists the absolute paths of the roots its workflows marked, one a line.
REGISTRY = Path(".snakemake/trainmap/roots")

#: The project's own directories, relative to the project, and what each holds: a results root
#: may not be, contain or lie inside any of them (Snakemake deletes declared outputs before a job).
OWN_DIRS = {
    "src": "the project's source code",
    "workflow": "the workflow's rules and scripts",
    "config": "the project's config directory",
    "tests": "the test suite",
    "docs": "the documentation",
    "bench": "the benchmarks",
    "profiles": "the Snakemake profiles",
    "examples": "the examples",
    ".ci": "the CI settings",
    ".git": "git's repository",
    ".dvc": "DVC's cache and settings",
    ".snakemake": "Snakemake's state",
    ".venv": "the Python environment",
}
#: Top-level directories :func:`clean_roots` does not search for markers: the own directories and
#: large trees no workflow writes roots into (the tracking stores, logs, caches, the docs site).
UNSEARCHED = frozenset(OWN_DIRS) | {
    "mlartifacts", "mlartifacts-server", "logs", "site", ".slurm", ".pytest_cache", ".ruff_cache",
    ".test-durations", "__pycache__",
}  # fmt: skip
#: How deep below the project :func:`clean_roots` looks for marked roots (results-paper/cpu: 2).
SEARCH_DEPTH = 4
#: The fix every refused root's message ends with.
ROOT_FIX = "choose a directory of its own, e.g. results-mine, or a link to scratch space"
#: How long :func:`claim_root` retries a lock held for an instant (a :func:`root_holder` probe).
CLAIM_PATIENCE_S = 0.5

__all__ = [
    "MARKER",
    "RootInUseError",
    "check_roots",
    "claim_root",
    "clean_roots",
    "in_use_message",
    "mark_root",
    "root_holder",
    "root_problem",
    "store_problem",
]


class RootInUseError(ConfigError):
    """A results root another running workflow holds (:func:`claim_root`); ``holder`` is its
    record (pid, host, since), ``root`` the root as the config or the caller named it."""

    def __init__(self, message: str, root: Path | str = "", holder: dict | None = None) -> None:
        super().__init__(message)
        self.root = root
        self.holder = holder or {}
        #: What :func:`clean_roots` removed before it stopped on held roots.
        self.removed: list[Path] = []


# --- which directories may be a root --------------------------------------------------------------


def _own_dir_problem(resolved: Path, project: Path, verb: str) -> str | None:
    """How ``resolved`` (a path with links followed) meets the project's own files, or None."""
    if resolved == project:
        return f"is the project directory itself ({project})"
    if project.is_relative_to(resolved):
        return f"contains the project directory ({project})"
    for name, what in OWN_DIRS.items():
        for own in dict.fromkeys([project / name, (project / name).resolve()]):  # .venv: a link?
            if resolved == own:
                return f"is {what} ({name}/)"
            if resolved.is_relative_to(own):
                return f"{verb} inside {what} ({name}/)"
            if own.is_relative_to(resolved):
                return f"contains {what} ({name}/)"
    return None


def _dangling_link(path: Path) -> Path | None:
    """The first link on the way to ``path`` (itself or a parent) whose target does not exist."""
    for step in reversed([path, *path.parents]):
        if step.is_symlink() and not step.exists():
            return step
    return None


def root_problem(root: str, base_dir: Path) -> str | None:
    """Why ``root`` (a results root, relative to the project ``base_dir`` or absolute) cannot be
    one, checked on the path with every link followed, or None when it can: it is, contains or lies
    inside :data:`OWN_DIRS` or the project directory, is a dangling link (or lies under one), or is
    an existing file (or lies under one). The message starts with the root as written and ends with
    the fix; :func:`check_roots` puts the config key before it."""
    project = base_dir.resolve()
    path = base_dir / root
    if dangling := _dangling_link(path):
        target = os.readlink(dangling)
        where = "is a link" if dangling == path else f"lies under the link {dangling}, which leads"
        return (f"{root!r} {where} to {target}, which does not exist: create that directory "
                f"(mkdir -p), remove the link, or {ROOT_FIX}")  # fmt: skip
    resolved = path.resolve()
    written = Path(os.path.normpath(project / root))  # the path without its links followed
    shown = repr(root) if resolved == written else f"{root!r} (a link to {resolved})"
    existing = next(step for step in [resolved, *resolved.parents] if step.exists())
    if not existing.is_dir():
        where = "is an existing file" if existing == resolved else f"lies under the file {existing}"
        return f"{shown} {where}, not a directory; {ROOT_FIX}"
    if problem := _own_dir_problem(resolved, project, "lies"):
        return f"{shown} {problem}; {ROOT_FIX}"
    return None


def store_problem(uri: str, base_dir: Path) -> str | None:
    """Why the local MLflow store ``uri`` names cannot be one, or None: an SQLite database
    (``sqlite:///relative.db``, relative to the project ``base_dir``; ``sqlite:////abs.db``) must
    be a file outside :data:`OWN_DIRS`. Other URIs (a server, PostgreSQL, ...) are not checked
    here; MLflow 3 serves no ``file:`` store (:func:`~.tracking_checks.tracking_uri_problem`)."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    name = uri[len(prefix) :].split("?", 1)[0]
    if name in ("", ":memory:"):
        return None
    database = (base_dir / name).resolve()  # a leading '/' (four slashes) makes it absolute
    fix = "name a file of its own, e.g. sqlite:///mlflow.db"
    if database.is_dir():
        return f"{uri!r} names a directory ({database}), not a database file; {fix}"
    if problem := _own_dir_problem(database, base_dir.resolve(), "puts the database"):
        return f"{uri!r} {problem}; {fix}"
    return None


def check_roots(config: dict, base_dir: Path) -> None:
    """Refuse, with a :class:`ConfigError` naming the key, a results root (config key
    ``results``) :func:`root_problem` refuses and a local tracking store (``mlflow.tracking_uri``,
    or ``$MLFLOW_TRACKING_URI`` where it is null) :func:`store_problem` refuses."""
    from trainmap.grid.study import results_root
    from trainmap.grid.tracking_checks import tracking_uri_of

    if problem := root_problem(results_root(config), base_dir):
        raise ConfigError(f"config key results: {problem}")
    uri, where = tracking_uri_of(config)
    if uri and (problem := store_problem(uri, base_dir)):
        raise ConfigError(f"{where}: {problem}")


# --- markers and the registry ---------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def read_marker(root: Path) -> dict | None:
    """The marker record of ``root`` (a dict), or None where it has none (or not a readable one:
    then it is not a marker this module wrote)."""
    try:
        record = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


@contextmanager
def _registry_locked(project: Path) -> Iterator[Path]:
    """The registry file, with its lock held: two workflows starting at once both get listed."""
    registry = project / REGISTRY
    registry.parent.mkdir(parents=True, exist_ok=True)
    with open(registry.with_name("roots.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield registry


def _registered(registry: Path) -> list[Path]:
    try:
        lines = registry.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [Path(line) for line in dict.fromkeys(lines) if line.strip()]


def mark_root(root: Path, project: Path) -> None:
    """Create ``root`` (relative to ``project`` or absolute) where needed, write its marker
    (:data:`MARKER`: what it is, the project's absolute path, when first marked; a marker already
    there is kept) and list its absolute path, and the directory a link leads to, in the project's
    registry (:data:`REGISTRY`, deduplicated, rewritten atomically). Raises :class:`ConfigError`
    for a root :func:`root_problem` refuses: a marker never goes into the project's own files."""
    if problem := root_problem(str(root), project):
        raise ConfigError(f"config key results: {problem}")
    path = project.resolve() / root
    path.mkdir(parents=True, exist_ok=True)
    if read_marker(path) is None:
        record = {
            "what": "a trainmap results root: a study's workflow writes every output here, and "
            "`make clean` (python -m trainmap.grid.roots clean) deletes this directory",
            "project": str(project.resolve()),
            "root": str(path),
            "marked": _now(),
        }
        save_text(json.dumps(record, indent=2) + "\n", path / MARKER)
    with _registry_locked(project) as registry:
        known = _registered(registry)
        new = [entry for entry in dict.fromkeys([path, path.resolve()]) if entry not in known]
        if new:
            save_text("".join(f"{entry}\n" for entry in [*known, *new]), registry)


# --- who holds a root -----------------------------------------------------------------------------


#: What a refusal says of a holder that has not written who it is (it is writing it this instant).
UNKNOWN_HOLDER = {"pid": "?", "host": "?", "since": "?"}


def _in_use(label: str, holder: dict) -> str:
    pid, host = holder.get("pid", "?"), holder.get("host", "?")
    where = "" if host == socket.gethostname() else f" on host {host}"
    return (f"{label} is in use by another run (pid {pid} on host {host} since "
            f"{holder.get('since', '?')}): wait for it, or end it (kill {pid}{where})")  # fmt: skip


def in_use_message(root: str, holder: dict) -> str:
    """The message refusing a second workflow on ``root`` (as the config names it), which
    ``holder`` (:func:`root_holder`'s record) holds; its first words name the config key."""
    return (f"config key results: {_in_use(root, holder)}; another study can write to another "
            "root (config key results)")  # fmt: skip


def root_holder(root: Path) -> dict | None:
    """The record (``pid``, ``host``, ``since``) of the workflow holding ``root``
    (:func:`claim_root`), or None when none does (:func:`trainmap.locks.holder_of`)."""
    holder = holder_of(root / LOCK)
    return None if holder is None else holder or UNKNOWN_HOLDER


def claim_root(root: Path) -> IO[str]:
    """Hold ``root`` (created where needed) for this process: an exclusive lock on its
    :data:`LOCK` file, which then records this process's pid, host and start time. Keep the
    returned open file for the life of the workflow; closing it, or the process ending in any way,
    releases the root. Raises :class:`RootInUseError`, naming the holder's pid, when another run
    (another open of the file, even in this process) holds it; waits up to
    :data:`CLAIM_PATIENCE_S` for a :func:`root_holder` probe to let go."""
    root.mkdir(parents=True, exist_ok=True)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}
    try:
        fd = hold(root / LOCK, record, CLAIM_PATIENCE_S)
    except LockHeld as held:
        holder = held.holder or UNKNOWN_HOLDER
        raise RootInUseError(in_use_message(str(root), holder), root, holder) from None
    return os.fdopen(fd, "r+")


# --- make clean ----------------------------------------------------------------------------------


def _marked_under(project: Path) -> Iterator[Path]:
    """Marked roots under ``project`` (at most :data:`SEARCH_DEPTH` deep), not searching
    :data:`UNSEARCHED` nor inside a marked root nor through links (a link to a marked directory
    is itself a root: its target is not searched)."""
    stack = [(project, 0)]
    while stack:
        folder, level = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name, reverse=True)
        except OSError:  # unreadable: not ours to clean
            continue
        for entry in entries:
            if level == 0 and entry.name in UNSEARCHED:
                continue
            path = Path(entry.path)
            if entry.is_symlink() or entry.is_dir(follow_symlinks=False):
                if (path / MARKER).is_file():
                    yield path
                elif not entry.is_symlink() and level + 1 < SEARCH_DEPTH:
                    stack.append((path, level + 1))


def _legacy_roots(project: Path) -> list[Path]:
    """``results`` and ``results-*`` directly in the project (directories or links): the shipped
    configs' roots, which ``make clean`` always removed, marked or not."""
    return sorted(
        path
        for path in project.glob("results*")
        if (path.name == "results" or path.name.startswith("results-"))
        and (path.is_symlink() or path.is_dir())
    )


def _shown(path: Path, project: Path) -> str:
    return str(path.relative_to(project)) if path.is_relative_to(project) else str(path)


def _remove_tree(target: Path) -> dict | None:
    """Remove the directory ``target`` while holding its lock (a workflow starting meanwhile is
    refused, not half-deleted); the holder's record, and nothing removed, when a run holds it."""
    lock_path = target / LOCK
    if not lock_path.exists():
        shutil.rmtree(target)
        return None
    try:  # held while it goes: a workflow starting meanwhile is refused, not half-deleted
        fd = hold(lock_path, {"pid": os.getpid(), "host": socket.gethostname(), "since": _now(),
                              "cleaning": True})  # fmt: skip
    except LockHeld as held:
        return held.holder or UNKNOWN_HOLDER
    try:
        shutil.rmtree(target)
    finally:
        os.close(fd)
    return None


def clean_roots(
    project: Path, dry_run: bool = False, *, say: Callable[[str], Any] | None = None
) -> list[Path]:
    """Remove every marked results root of ``project`` and return what was removed: the roots its
    registry lists that still hold a marker naming this project (or lie in it), every directory
    in it holding a marker (:func:`_marked_under`), and ``results``, ``results-*`` directly in it
    (:func:`_legacy_roots`); nothing else. A root reached by a link: the directory it leads to
    (only where the marker is inside it), then the link (an unmarked ``results`` link: the link
    alone, as ``rm -rf`` did). A path :func:`root_problem` refuses (an own directory, the project)
    is never removed. ``dry_run``: remove nothing, return what would go. ``say`` gets a line per
    root removed or kept. Roots a running workflow holds (and directories holding them) are kept;
    after the rest are removed, :class:`RootInUseError` names each with its holder's pid."""
    project = project.resolve()
    report = say or (lambda line: None)
    registry = project / REGISTRY
    registered = _registered(registry)
    candidates: dict[Path, str] = {}
    for path in registered:
        candidates.setdefault(path, "registered")
    for path in _marked_under(project):
        candidates.setdefault(path, "marked")
    for path in _legacy_roots(project):
        candidates.setdefault(path, "legacy")

    plan: list[tuple[Path, Path | None, str]] = []  # (path, the directory to remove, why)
    for path, kind in candidates.items():
        if not os.path.lexists(path):
            continue
        if path.is_symlink() and not path.exists():  # a dangling link: ours if we listed it
            if kind in ("registered", "legacy"):
                plan.append((path, None, "a link to nothing"))
            continue
        if not path.is_dir():
            continue
        target = path.resolve()
        if problem := root_problem(str(path), project):
            report(f"kept {_shown(path, project)}: {problem.split(';')[0]}")
            continue
        marker = read_marker(target)
        # Outside the project, a marker must name it: the directory may be another checkout's.
        ours = marker is not None and (
            target.is_relative_to(project) or marker.get("project") == str(project)
        )
        if kind != "legacy" and not ours:
            report(f"kept {_shown(path, project)}: its marker is gone or names another project")
            continue
        if path.is_symlink() and not ours:  # an unmarked results link: the link alone
            plan.append((path, None, f"a link to {target}, whose contents stay: no marker there"))
            continue
        plan.append((path, target, "a marked root" if ours else "a shipped config's root"))

    held: dict[Path, dict] = {}
    for _, target, _ in plan:
        if target is not None and target not in held and (holder := root_holder(target)):
            held[target] = holder
    removed: list[Path] = []
    gone: set[Path] = set()
    verb = "would remove" if dry_run else "removed"
    for path, target, why in plan:
        fresh = False  # this entry removed the directory (another link to it may have already)
        if target is not None and target not in gone:
            if any(root.is_relative_to(target) for root in held):
                if target not in held:
                    report(f"kept {_shown(path, project)}: a root in it is in use")
                continue
            if not dry_run and (holder := _remove_tree(target)):
                held[target] = holder
                continue
            gone.add(target)
            removed.append(target)
            fresh = True
        if path.is_symlink():
            if not dry_run:
                path.unlink()
            removed.append(path)
            where = f" and the directory it leads to, {target}" if fresh else ""
            report(f"{verb} link {_shown(path, project)}{where} ({why})")
        elif fresh:
            report(f"{verb} {_shown(path, project)} ({why})")
    if not dry_run and registered:
        with _registry_locked(project) as registry:
            kept = [path for path in _registered(registry) if os.path.lexists(path)]
            save_text("".join(f"{path}\n" for path in kept), registry)
    if held:
        lines = [_in_use(_shown(root, project), holder) for root, holder in held.items()]
        error = RootInUseError(
            "kept the roots runs hold: " + "; ".join(lines) + "; then clean again",
            next(iter(held)),
            next(iter(held.values())),
        )
        error.removed = removed
        raise error
    return removed


def main(argv: list[str] | None = None) -> int:
    """``python -m trainmap.grid.roots clean [--dry-run] [--project DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m trainmap.grid.roots",
        description="The project's results roots (config key results). clean: delete every "
        f"root a study marked ({MARKER}: those the project's registry lists, wherever they lie, "
        "and marked directories in the project), and results, results-* in the project (the "
        "shipped configs' roots); nothing unmarked besides. A root a running workflow holds is "
        "kept (exit status 1, naming its pid).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    clean = commands.add_parser("clean", help="delete every marked results root")
    clean.add_argument("--dry-run", action="store_true", help="print what would go; remove nothing")
    clean.add_argument("--project", type=Path, default=Path.cwd(),
                       help="the project directory (default: the current one)")  # fmt: skip
    args = parser.parse_args(argv)
    if not args.project.is_dir():
        parser.error(f"--project {args.project}: not a directory; give the project's directory")
    try:
        removed = clean_roots(args.project, args.dry_run, say=print)
    except RootInUseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EBUSY):
            raise
        print(f"error: could not remove {error.filename}: {error.strerror}; check its "
              "permissions (or whether a process keeps it busy), then clean again",
              file=sys.stderr)  # fmt: skip
        return 1
    if not removed:
        print("no results roots to remove")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
