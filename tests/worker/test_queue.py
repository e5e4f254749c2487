"""The `arq` command line runs Bernard's `WakeWorker`, configured from the settings."""

from __future__ import annotations

import arq.worker

from worker.main import WorkerSettings
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
