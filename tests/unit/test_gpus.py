"""trainmap.gpus: each training job of a multi-GPU node on its own GPU, small ones sharing where
the plan says they fit, nothing claimed where a scheduler already chose."""

from __future__ import annotations

import os
from contextlib import ExitStack

import pytest

from trainmap.gpus import VISIBLE, gpu_slot

NODE = [(0, 10_000), (1, 10_000)]  # two GPUs of 10 GB


@pytest.fixture(autouse=True)
def no_scheduler_choice(monkeypatch):
    monkeypatch.delenv(VISIBLE, raising=False)


def claim_as_another_job(stack: ExitStack, planned_mb: int, ledger, **options) -> int | None:
    """A claim as a job in its own process makes it: it does not see the others' variable."""
    index = stack.enter_context(gpu_slot("cuda", planned_mb, gpus=NODE, ledger=ledger, **options))
    assert os.environ.pop(VISIBLE) == str(index)
    return index


def test_jobs_get_their_own_gpu_and_small_ones_share(tmp_path):
    ledger = tmp_path / "reserved.json"
    with ExitStack() as running:
        assert claim_as_another_job(running, 6_000, ledger) == 0
        assert claim_as_another_job(running, 6_000, ledger) == 1  # GPU 0 has 4 GB left
        assert claim_as_another_job(running, 3_000, ledger) == 0  # fits beside the first job
        with pytest.raises(TimeoutError, match="no GPU of this node had 5,000 MB free"):
            claim_as_another_job(running, 5_000, ledger, wait_s=0.0)
    with gpu_slot("cuda", 9_000, gpus=NODE, ledger=ledger) as again:
        assert again == 0 and os.environ[VISIBLE] == "0"  # every reservation was released
    assert VISIBLE not in os.environ


def test_a_dead_jobs_reservation_is_dropped(tmp_path):
    ledger = tmp_path / "reserved.json"
    dead = 2**30  # above any pid_max: no such process
    ledger.write_text(f'{{"{dead}:1": [0, 10000], "{dead}:2": [1, 10000]}}')
    with gpu_slot("cuda", 8_000, gpus=NODE, ledger=ledger, wait_s=0.0) as index:
        assert index == 0


def test_nothing_is_claimed_where_the_choice_is_made(tmp_path, monkeypatch):
    ledger = tmp_path / "reserved.json"
    for device in ("cpu", "cuda:1"):
        with gpu_slot(device, 6_000, gpus=NODE, ledger=ledger) as index:
            assert index is None and VISIBLE not in os.environ
    monkeypatch.setenv(VISIBLE, "3")  # SLURM's --gpus
    with gpu_slot("cuda", 6_000, gpus=NODE, ledger=ledger) as index:
        assert index is None and os.environ[VISIBLE] == "3"
    assert not ledger.exists()


def test_a_job_larger_than_any_gpu_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"seed_block: the plan puts this job at 12,000 MB"):
        with gpu_slot("cuda", 12_000, gpus=NODE, ledger=tmp_path / "reserved.json"):
            pass
