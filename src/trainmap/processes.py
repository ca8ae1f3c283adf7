"""Which processes are alive, from ``os.kill(pid, 0)`` and Linux's ``/proc``: one answer for the job
server (a job's process group, the workflow it watches), the MLflow runs of dead jobs and the GPU
ledger's dead owners.

A zombie (exited, not yet reaped by its parent) counts as gone: where PID 1 does not reap orphans,
``kill(pid, 0)`` alone would call it alive until the machine restarts.
"""

from __future__ import annotations

import os
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name (state, ppid, pgrp, ...), or None when there
    is no such process (or no ``/proc``)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()  # the command name may hold spaces and ")"


def process_alive(pid: int) -> bool:
    """Whether ``pid`` names a process that has not exited: a zombie has; another user's process
    is alive; ``pid`` <= 0 names no single process (``kill`` would signal a group)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = stat_fields(pid)
    if fields is None:  # reaped since the kill; or no /proc (not Linux): kill's answer stands
        return not Path("/proc/self").exists()
    return fields[0] != "Z"


def live_group_members(pgid: int) -> list[int] | None:
    """The processes of group ``pgid`` that have not exited, from ``/proc``; None without it."""
    proc = Path("/proc")
    if not (proc / "self").exists():
        return None
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))
        if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members
