"""A process-wide stop request: SIGTERM asks a job to stop, and training stops at its next step.

A job process (:mod:`trainmap.worker`) installs :func:`install_stop_handler` before the job runs.
From then on SIGTERM sets the process's stop request, and what happens next depends on where the
main thread is:

* inside :func:`listening` (the training loop, :func:`trainmap.training.loop.train_block`): only
  the request is set. The loop's stop point sees it after the step in progress, saves the resume
  state of that step (as at a resume point) and raises :class:`JobStopped`; a rerun continues from
  that step, bit-identical to an uninterrupted run. A request still pending when the block is left
  (it came after the last step) raises :class:`JobStopped` there.
* anywhere else: :class:`JobStopped` is raised at once in the main thread (there is no state worth
  saving outside a step loop).

:class:`JobStopped` derives from ``BaseException``, so a job's ``except Exception`` does not swallow
it; the job runner exits with :data:`STOP_STATUS` (143, as a process SIGTERM ended) when it ends
a job. Without the handler installed SIGTERM does what it always did (the process ends at once);
:func:`stop_requested` is then simply never true.

This module sits on the ground floor: it imports neither torch nor any other trainmap module, so the
job client (which must start in milliseconds) and the training loop can both import it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

#: The exit status of a job that stopped on request: 128 + SIGTERM, as if SIGTERM had ended it.
STOP_STATUS = 128 + signal.SIGTERM

_requested = threading.Event()
# How many listening() blocks the main thread is inside. Only the main thread enters them and
# only the main thread runs signal handlers, so a plain counter is enough.
_listening = 0


class JobStopped(BaseException):
    """The job stopped because it was asked to (SIGTERM); its message says where.

    A ``BaseException``, like ``KeyboardInterrupt``: code that catches ``Exception`` lets it pass.
    The process should exit with :data:`STOP_STATUS`."""

    status = STOP_STATUS


def install_stop_handler() -> None:
    """Make SIGTERM a stop request in this process (see the module docstring). Call it from the
    main thread (Python runs signal handlers there, and only it may install them)."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def request_stop() -> None:
    """Ask for a stop, as SIGTERM does inside :func:`listening` (the request only: nothing is
    raised here)."""
    _requested.set()


def stop_requested() -> bool:
    """Whether a stop was requested in this process (and not cleared since)."""
    return _requested.is_set()


def clear_stop_request() -> None:
    """Forget a stop request: for a process that handled a stop and goes on (a test runs a
    stopped training again in the same process); a job process never needs it."""
    _requested.clear()


@contextmanager
def listening() -> Iterator[None]:
    """While inside, SIGTERM only sets the request: the code inside promises to check
    :func:`stop_requested` regularly and stop cleanly. Leaving normally with a request pending
    raises :class:`JobStopped` (the request is honoured before anything after the block runs).
    Blocks nest."""
    global _listening
    _listening += 1
    try:
        yield
    finally:
        _listening -= 1
    if _requested.is_set():
        raise JobStopped("stopped by SIGTERM, which came after the training's last stop point")


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _requested.set()
    if _listening == 0:
        raise JobStopped("stopped by SIGTERM outside a training step loop (nothing to save)")
