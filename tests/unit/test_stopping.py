"""The stop request (trainmap.stopping): SIGTERM inside a stop point's listening block only asks
for a stop; anywhere else it stops the job at once."""

from __future__ import annotations

import os
import signal
import time

import pytest

from trainmap import stopping


def _sigterm_and_wait() -> float:
    """SIGTERM to this process; then a pause the handler would cut short. Its length."""
    started = time.monotonic()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)
    return time.monotonic() - started


def test_sigterm_in_a_listening_block_only_sets_the_request(stop_handler) -> None:
    reached = []
    with pytest.raises(stopping.JobStopped, match="after the training's last stop point"):
        with stopping.listening():
            assert not stopping.stop_requested()
            assert _sigterm_and_wait() >= 0.5  # nothing was raised: the code goes on
            assert stopping.stop_requested()
            reached.append("the stop point")  # where a training loop saves and raises
    # leaving the block with the request pending raised JobStopped (above)
    assert reached == ["the stop point"]
    assert stopping.JobStopped.status == stopping.STOP_STATUS == 143


def test_sigterm_outside_a_listening_block_stops_at_once(stop_handler) -> None:
    started = time.monotonic()
    with pytest.raises(stopping.JobStopped, match="outside a training step loop"):
        _sigterm_and_wait()
    assert time.monotonic() - started < 0.4
    assert stopping.stop_requested()
    assert not isinstance(stopping.JobStopped(), Exception)  # `except Exception` lets it pass


def test_a_stop_point_that_raises_leaves_its_block_with_its_own_exception(stop_handler) -> None:
    """The stop point raises JobStopped itself, naming its step; leaving the block does not
    replace it. Blocks nest: inside the inner one SIGTERM still only sets the request."""
    with pytest.raises(stopping.JobStopped, match="after step 7"):
        with stopping.listening():
            with stopping.listening():
                assert _sigterm_and_wait() >= 0.5
                if stopping.stop_requested():
                    raise stopping.JobStopped("stopped by SIGTERM after step 7")
    stopping.clear_stop_request()
    assert not stopping.stop_requested()
    with stopping.listening():  # no request: the block is left as usual
        pass
    stopping.request_stop()
    with pytest.raises(stopping.JobStopped):
        with stopping.listening():
            pass
