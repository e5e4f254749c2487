"""The `arq` command line runs Bernard's `WakeWorker`, configured from the settings."""

from __future__ import annotations

import arq.worker
import pytest

from tests.conftest import make_settings
from worker.main import WorkerSettings, create_worker
from worker.queue import WakeWorker


async def test_the_arq_command_line_builds_a_wake_worker() -> None:
    # `arq worker.main.WorkerSettings` goes through arq.worker.create_worker.
    worker = arq.worker.create_worker(WorkerSettings)
    assert isinstance(worker, WakeWorker)
    assert worker.poll_delay_s == 0, "the wake list replaces arq's sleep between polls"
    assert worker.max_jobs >= 100, "turns wait on the network: one worker runs many"
    assert worker.wake_key == f"{worker.queue_name}:wake"


async def test_a_redelivered_job_gets_no_second_try() -> None:
    worker = arq.worker.create_worker(WorkerSettings)
    assert worker.functions["run_turn"].max_tries == 1
    assert worker.keep_result_s == 0


@pytest.mark.parametrize(
    ("concurrency", "share", "slots"),
    [(20, 0.25, 5), (500, 0.25, 125), (4, 0.25, 1), (3, 0.25, 1), (10, 0.0, 1), (10, 1.0, 10)],
)
async def test_background_jobs_get_their_share_of_a_workers_slots_and_at_least_one(
    concurrency: int, share: float, slots: int
) -> None:
    settings = make_settings(worker_concurrency=concurrency, worker_background_share=share)
    worker = create_worker(settings, handle_signals=False)
    try:
        assert isinstance(worker, WakeWorker)
        assert worker.background_slots == slots
    finally:
        await worker.pool.aclose()
