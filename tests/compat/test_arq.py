"""compat/arq.py's departures from arq's interface, held to arq 0.28.0: each test fails when
arq renames or changes what `WakingWorker` relies on."""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from typing import Any

import arq.worker
import pytest
from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix
from arq.worker import Worker, func

from compat.arq import WakingWorker, worker_kwargs
from tests.support.session_redis import session_redis_url


def test_the_worker_internals_it_extends_are_there_with_their_signatures() -> None:
    methods = {
        "_poll_iteration": ["self"],
        "start_jobs": ["self", "job_ids"],
        "run_job": ["self", "job_id", "score"],
        "finish_job": [
            "self",
            "job_id",
            "finish",
            "result_data",
            "result_timeout_s",
            "keep_result_forever",
            "incr_score",
            "keep_in_progress",
        ],
        "finish_failed_job": ["self", "job_id", "result_data"],
        "_release_sem_dec_counter_on_complete": ["self"],
    }
    for name, parameters in methods.items():
        assert list(inspect.signature(getattr(Worker, name)).parameters) == parameters, name
    worker = Worker(functions=[func(_job, name="job")], redis_pool=_pool(), queue_name="q")
    assert (worker.job_counter, worker.sem._value) == (0, worker.max_jobs + 1)
    assert worker.tasks == {}
    assert worker._pool is not None
    assert worker.in_progress_timeout_s > 0


def test_get_kwargs_keeps_what_arqs_worker_takes() -> None:
    settings = {"queue_name": "q", "max_jobs": 3, "background": 1, "unknown": 2}
    assert arq.worker.get_kwargs(settings) == {"queue_name": "q", "max_jobs": 3}
    assert worker_kwargs(settings, "background") == {
        "queue_name": "q",
        "max_jobs": 3,
        "background": 1,
    }


# Marks a queued job in progress and takes it off the queue (as worker/queue.py's does);
# its score, or nil when it is not there or runs already.
_TAKE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score then return false end
redis.call('PSETEX', KEYS[1], 60000, '1')
redis.call('ZREM', KEYS[2], ARGV[1])
return score
"""


class _Worker(WakingWorker):
    """Takes a job the plainest way (`_TAKE`) and notes what it was told; between polls it
    waits on its wake list for up to 2 s."""

    wake_timeout_s = 2

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(wake_list=lambda queue: f"{queue}:wake", **kwargs)
        self.done: list[str] = []
        self.finished_ids: list[str] = []
        self.any_done = asyncio.Event()

    async def start(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            if not await self.take_slot():
                return
            keys = [in_progress_key_prefix + job_id, self.queue_name]
            score = await self.pool.eval(_TAKE, 2, *keys, job_id)  # type: ignore[misc]
            if score is None:
                self.give_slot()
                continue
            self.launch(job_id, int(float(score)), self._done)

    def _done(self, job_id: str) -> None:
        self.done.append(job_id)
        self.any_done.set()

    async def finished(self, job_id: str, ended: bool, incr_score: int | None) -> None:
        self.finished_ids.append(job_id)


ran: dict[str, float] = {}


async def _job(ctx: dict[str, Any], name: str) -> str:
    ran[name] = time.perf_counter()
    return name


def _pool() -> ArqRedis:
    return ArqRedis.from_url(session_redis_url())


async def test_between_polls_it_waits_on_the_wake_list_and_a_job_pushed_there_starts_at_once() -> (
    None
):
    queue = f"test-compat-arq:{uuid.uuid4().hex}"
    pool = _pool()
    worker = _Worker(
        functions=[func(_job, name="job")],
        redis_pool=pool,
        queue_name=queue,
        handle_signals=False,
        keep_result=0,
    )
    assert worker.poll_delay_s == 0
    assert worker.wake_key == f"{queue}:wake"
    run = asyncio.create_task(worker.async_run())
    try:
        await asyncio.sleep(0.3)  # its first poll found nothing: it waits on the wake list
        quiet = await pool.enqueue_job("job", "quiet", _queue_name=queue)
        assert quiet is not None
        await asyncio.sleep(0.5)
        # arq's own loop, at poll_delay 0, would have polled it up at once: the extended
        # poll iteration is what runs, blocked on the wake list.
        assert "quiet" not in ran, "a job nobody woke it for waits for the next poll"
        job = await pool.enqueue_job("job", "woken", _queue_name=queue)
        assert job is not None
        pushed = time.perf_counter()
        await pool.lpush(worker.wake_key, job.job_id)
        async with asyncio.timeout(5):
            while len(worker.done) < 2:
                await worker.any_done.wait()
                worker.any_done.clear()
        # Woken: within a few milliseconds (0.2 s leaves room for a slow box), not at the
        # next poll (up to `wake_timeout_s`, 2 s, later).
        assert ran["woken"] - pushed < 0.2
        assert sorted(worker.done) == sorted([quiet.job_id, job.job_id]), "their ends reported"
        assert sorted(worker.finished_ids) == sorted(worker.done), "arq recorded each end"
        assert (worker.free_slots, worker.job_counter) == (worker.max_jobs, 0)
        assert worker.sem._value == worker.max_jobs + 1, "their slots are given back"
        assert worker.closed is False
    finally:
        await worker.close()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    assert worker.closed is True
    await pool.delete(queue, worker.wake_key)


async def test_a_slot_taken_and_given_back_leaves_the_count_as_it_was() -> None:
    worker = _Worker(functions=[func(_job, name="job")], redis_pool=_pool(), max_jobs=1)
    try:
        assert await worker.take_slot()
        assert worker.free_slots == 0
        assert not await worker.take_slot(), "no slot past max_jobs"
        worker.give_slot()
        assert (worker.free_slots, worker.sem._value) == (1, 2)
    finally:
        await worker.pool.aclose()
