"""Which processes are alive (trainmap.processes): a zombie is gone, a group's members are listed."""

from __future__ import annotations

import os
import time

import pytest

from trainmap.processes import live_group_members, process_alive


def test_this_process_is_alive_and_no_pid_names_a_group() -> None:
    assert process_alive(os.getpid())
    assert not process_alive(0) and not process_alive(-os.getpgrp())


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux's /proc")
def test_a_zombie_is_gone_until_and_after_it_is_reaped() -> None:
    child = os.fork()
    if child == 0:  # exits at once; not reaped until waitpid below: a zombie meanwhile
        os._exit(0)
    deadline = time.monotonic() + 10
    while process_alive(child) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process_alive(child)  # os.kill(child, 0) still succeeds on the zombie
    os.kill(child, 0)
    assert child not in (live_group_members(os.getpgrp()) or [])
    assert os.getpid() in (live_group_members(os.getpgrp()) or [])
    os.waitpid(child, 0)
    assert not process_alive(child)
