"""Locks that say who holds them: an exclusive ``flock`` on a file whose content is one JSON line
naming the holder (its pid, host, since when, ...). The kernel releases the lock when every process
holding the open file has closed it or died, however it ended. One mechanism for the job lock
(:mod:`trainmap.worker`) and the results root's (:mod:`trainmap.grid.roots`).

``flock`` belongs to the open file description: a second ``open()`` of the file conflicts even
within one process, and a descriptor passed to another process (``SCM_RIGHTS``) shares the lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class LockHeld(Exception):
    """Another open file holds the lock of ``path``; ``holder`` is what it wrote (None when it
    wrote nothing readable)."""

    def __init__(self, path: Path, holder: dict[str, Any] | None) -> None:
        super().__init__(f"{path} is held by {holder or 'a process that has not said who it is'}")
        self.path, self.holder = path, holder


def hold(path: str | os.PathLike, holder: Mapping[str, Any], patience_s: float = 0.0) -> int:
    """Open (create) ``path``, lock it exclusively and write ``holder`` into it; return the open
    descriptor, which holds the lock until it is closed in every process that has it (Python's
    descriptors are not inherited by programs it starts). Without waiting, but retrying for
    ``patience_s`` (a :func:`holder_of` probe holds the lock for an instant); :class:`LockHeld`
    when another keeps it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + patience_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockHeld(Path(path), read_holder(fd)) from None
                time.sleep(0.05)
        write_holder(fd, holder)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_holder(fd: int, holder: Mapping[str, Any]) -> None:
    """Say who holds the lock of ``fd``: its file's one JSON line, written in place (the lock
    belongs to this inode: a rename would make a new one)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(dict(holder)) + "\n").encode(), 0)


def read_holder(fd: int) -> dict[str, Any] | None:
    """The holder line of a lock file; None if it says nothing readable (its holder may be
    between truncating and writing it: a few tries)."""
    for _ in range(20):
        line = os.pread(fd, 4096, 0).partition(b"\n")[0]
        try:
            holder = json.loads(line)
        except ValueError:
            holder = None
        if isinstance(holder, dict) and "pid" in holder:
            return holder
        time.sleep(0.01)
    return None


def holder_of(path: str | os.PathLike) -> dict[str, Any] | None:
    """Who holds the lock of ``path`` (:func:`hold`), or None when nobody does (or there is no
    such file). Probes without waiting with a shared lock (it works on a read-only file, and two
    probes never collide), released at once."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return read_holder(fd) or {}
        return None
    finally:
        os.close(fd)
