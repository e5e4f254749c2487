"""`python -m worker` runs Bernard's `WakeWorker`, configured from the settings; arq's own
command line, which would run a plain `Worker`, is refused at start-up."""

from __future__ import annotations

import arq.worker
import pytest

from tests.support.stack import make_settings, make_worker
from worker.main import WorkerSettings, startup, worker_from
from worker.queue import WakeWorker


async def test_the_entry_point_builds_a_wake_worker() -> None:
    worker = worker_from(WorkerSettings)
    assert isinstance(worker, WakeWorker)
    assert worker.poll_delay_s == 0, "the wake list replaces arq's sleep between polls"
    assert worker.max_jobs >= 100, "turns wait on the network: one worker runs many"
    assert worker.wake_key == f"{worker.queue_name}:wake"
    assert worker.background_slots >= 1, "WakeWorker's own options are passed too"


async def test_importing_the_worker_replaces_nothing_of_arqs_and_arqs_own_worker_is_refused() -> (
    None
):
    assert arq.worker.create_worker.__module__ == "arq.worker"
    plain = arq.worker.create_worker(WorkerSettings)
    assert type(plain) is arq.worker.Worker
    with pytest.raises(RuntimeError, match="python -m worker"):
        await startup(plain.ctx)


async def test_a_redelivered_job_gets_no_second_try() -> None:
    worker = worker_from(WorkerSettings)
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
    worker = make_worker(settings, handle_signals=False)
    try:
        assert isinstance(worker, WakeWorker)
        assert worker.background_slots == slots
    finally:
        await worker.pool.aclose()


@pytest.mark.parametrize(
    ("concurrency", "share", "slots"),
    [(20, 0.5, 10), (500, 0.5, 250), (4, 0.5, 2), (3, 0.5, 1), (1, 0.5, 1), (10, 1.0, 10)],
)
async def test_one_users_jobs_get_their_share_of_a_workers_slots_and_at_least_one(
    concurrency: int, share: float, slots: int
) -> None:
    settings = make_settings(worker_concurrency=concurrency, worker_user_share=share)
    worker = make_worker(settings, handle_signals=False)
    try:
        assert isinstance(worker, WakeWorker)
        assert worker.user_slots == slots
    finally:
        await worker.pool.aclose()


@pytest.mark.parametrize(
    ("concurrency", "share", "active", "warned"),
    [
        (20, 0.5, 20, False),  # the defaults' shape: ten slots are another user's
        (20, 1.0, 19, False),  # one user's turns cannot fill the worker
        (20, 1.0, 20, True),  # the issue's: at concurrency 20 one user held every slot
        (1, 0.5, 20, True),  # one slot is always one user's
        (2, 0.5, 20, False),
    ],
)
def test_settings_that_let_one_user_hold_every_slot_are_warned_of(
    concurrency: int, share: float, active: int, warned: bool
) -> None:
    settings = make_settings(
        worker_concurrency=concurrency,
        worker_user_share=share,
        max_active_turns_per_user=active,
    )
    warning = settings.slot_warning()
    assert (warning is not None) is warned
    if warning is not None:
        assert "BERNARD_WORKER_USER_SHARE" in warning
        assert f"{concurrency} slots" in warning
