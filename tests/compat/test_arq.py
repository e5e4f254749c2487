"""compat/arq.py's departures from arq's interface, held to arq 0.28.0: each test fails when
arq renames or changes what `WakingWorker` relies on."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import arq.worker
import pytest
from arq.connections import ArqRedis
from arq.constants import (
    abort_jobs_ss,
    in_progress_key_prefix,
    job_key_prefix,
    result_key_prefix,
    retry_key_prefix,
)
from arq.worker import Worker, func

from compat.arq import START_LUA, Started, WakingWorker, start_keys, worker_kwargs
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


# sha256 of arq 0.28.0's sources that compat/arq.py copies or writes again, first 16 hex
# digits: `run_job` (`_run_started`), `finish_job` and `finish_failed_job` (`_FINISH_JOB`).
_COPIED = {
    "run_job": "589a19059ff84ee7",
    "finish_job": "903f09c92830d3fd",
    "finish_failed_job": "3e16087f318a7acf",
}


def test_what_it_copies_of_arq_is_arqs_as_copied() -> None:
    for name, digest in _COPIED.items():
        source = inspect.getsource(getattr(Worker, name))
        assert hashlib.sha256(source.encode()).hexdigest()[:16] == digest, (
            f"arq's Worker.{name} changed: compare compat/arq.py with it again"
        )


async def _job_keys(pool: ArqRedis, job_id: str, queue: str) -> dict[str, Any]:
    """What arq keeps of a job: each key's value and whether it lives for ever (-1), for a
    while (1) or not at all (-2); its queue score and whether it is in the abort set."""
    state: dict[str, Any] = {}
    for prefix in (in_progress_key_prefix, retry_key_prefix, job_key_prefix, result_key_prefix):
        ttl = await pool.pttl(prefix + job_id)
        state[prefix] = (await pool.get(prefix + job_id), ttl if ttl < 0 else 1)
    state["queue"] = await pool.zscore(queue, job_id)
    state["abort"] = await pool.zscore(abort_jobs_ss, job_id)
    return state


async def _queued(pool: ArqRedis, job_id: str, queue: str) -> None:
    await pool.psetex(in_progress_key_prefix + job_id, 60_000, b"1")
    await pool.set(retry_key_prefix + job_id, b"1", ex=88400)
    await pool.set(job_key_prefix + job_id, b"job", px=86_400_000)
    await pool.zadd(queue, {job_id: 1000})
    await pool.zadd(abort_jobs_ss, {job_id: 1})


async def _ends_alike(
    worker: _Worker,
    arqs_end: Callable[[str], Awaitable[None]],
    our_end: Callable[[str], Awaitable[None]],
) -> None:
    """Queue two jobs as arq leaves a running one, end one by `arqs_end` and the other by
    `our_end`: both leave the same keys, and only ours is reported `finished`. Deletes every
    key of both, and closes the worker's pool."""
    pool, queue = worker.pool, worker.queue_name
    arqs, ours = f"arq-{uuid.uuid4().hex}", f"ours-{uuid.uuid4().hex}"
    try:
        for job_id in (arqs, ours):
            await _queued(pool, job_id, queue)
        await arqs_end(arqs)
        await our_end(ours)
        assert await _job_keys(pool, ours, queue) == await _job_keys(pool, arqs, queue)
        assert worker.finished_ids == [ours]
    finally:
        await pool.delete(queue, *(p + i for p in _PREFIXES for i in (arqs, ours)))
        await pool.zrem(abort_jobs_ss, arqs, ours)
        await pool.aclose()


@pytest.mark.parametrize(
    ("finish", "result", "result_s", "forever", "incr_score", "keep_in_progress"),
    [
        (True, None, 0, False, None, None),  # a turn's: no result kept
        (True, b"result", 10, False, None, None),
        (True, b"result", None, True, None, None),
        (True, None, 0, False, None, 60.0),  # a cron job's in-progress key kept
        (False, None, 0, False, 5000, None),  # `Retry`: its score moved
        (False, None, 0, False, None, None),  # cancelled, run again at once
        (False, None, 0, False, 0, None),
    ],
)
async def test_a_jobs_end_leaves_what_arqs_own_transaction_leaves(
    finish: bool,
    result: bytes | None,
    result_s: float | None,
    forever: bool,
    incr_score: int | None,
    keep_in_progress: float | None,
) -> None:
    queue = f"test-compat-arq:{uuid.uuid4().hex}"
    worker = _Worker(functions=[func(_job, name="job")], redis_pool=_pool(), queue_name=queue)
    args = (finish, result, result_s, forever, incr_score, keep_in_progress)
    await _ends_alike(
        worker,
        lambda job_id: Worker.finish_job(worker, job_id, *args),
        lambda job_id: worker.finish_job(job_id, *args),
    )


@pytest.mark.parametrize(("keep_result", "forever"), [(0, False), (10, False)])
async def test_a_failed_jobs_end_leaves_what_arqs_own_transaction_leaves(
    keep_result: int, forever: bool
) -> None:
    worker = _Worker(
        functions=[func(_job, name="job")],
        redis_pool=_pool(),
        queue_name=f"test-compat-arq:{uuid.uuid4().hex}",
        keep_result=keep_result,
        keep_result_forever=forever,
    )
    await _ends_alike(
        worker,
        lambda job_id: Worker.finish_failed_job(worker, job_id, b"failed"),
        lambda job_id: worker.finish_failed_job(job_id, b"failed"),
    )


_PREFIXES = (in_progress_key_prefix, retry_key_prefix, job_key_prefix, result_key_prefix)

# As `_TAKE`, and what arq's `run_job` reads first (`START_LUA`): {score, job, try}.
_TAKE_STARTED = (
    START_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score then return false end
redis.call('PSETEX', KEYS[1], 60000, '1')
redis.call('ZREM', KEYS[2], ARGV[1])
local job, try = arq_start(KEYS[3], KEYS[4])
return {score, job, try}
"""
)
tries: dict[str, tuple[int, bool]] = {}


async def _counted(ctx: dict[str, Any], name: str) -> str:
    # Its try, and whether its count lives as arq's does (88,400 s) while it runs.
    ttl = await ctx["redis"].ttl(retry_key_prefix + ctx["job_id"])
    tries[name] = (ctx["job_try"], 88_000 < ttl <= 88_400)
    return name


class _Starting(_Worker):
    """Takes a job with what arq reads first (`_TAKE_STARTED`), and launches it started."""

    async def start(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            if not await self.take_slot():
                return
            keys = [in_progress_key_prefix + job_id, self.queue_name, *start_keys(job_id)]
            reply = await self.pool.eval(_TAKE_STARTED, 4, *keys, job_id)  # type: ignore[misc]
            if reply is None:
                self.give_slot()
                continue
            score, job, job_try = reply
            self.launch(job_id, int(float(score)), self._done, Started(job, int(job_try)))


async def test_a_job_launched_as_the_take_started_it_runs_as_arqs_own_run_would() -> None:
    queue = f"test-compat-arq:{uuid.uuid4().hex}"
    pool = _pool()
    worker = _Starting(
        functions=[func(_counted, name="counted", max_tries=2)],
        redis_pool=pool,
        queue_name=queue,
        handle_signals=False,
        keep_result=0,
    )
    run = asyncio.create_task(worker.async_run())
    first, again, spent = (f"{kind}-{uuid.uuid4().hex}" for kind in ("first", "again", "spent"))
    try:
        for name, tried in ((first, 0), (again, 1), (spent, 2)):
            job = await pool.enqueue_job("counted", name, _queue_name=queue, _job_id=name)
            assert job is not None
            if tried:  # a try or two already counted (a worker died while running it)
                await pool.set(retry_key_prefix + name, tried)
            await pool.lpush(worker.wake_key, name)
        async with asyncio.timeout(10):
            while len(worker.done) < 3:
                await worker.any_done.wait()
                worker.any_done.clear()
        # Each try counted as arq's run counts it; past `max_tries` the job does not run.
        assert {name: tries.get(name) for name in (first, again, spent)} == {
            first: (1, True),
            again: (2, True),
            spent: None,
        }
        for name in (first, again, spent):
            assert await _job_keys(pool, name, queue) == {
                in_progress_key_prefix: (None, -2),
                retry_key_prefix: (None, -2),
                job_key_prefix: (None, -2),
                result_key_prefix: (None, -2),
                "queue": None,
                "abort": None,
            }
    finally:
        await worker.close()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    await pool.delete(queue, worker.wake_key)
