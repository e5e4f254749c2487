"""The worker's side of arq's internals (arq is pinned in pyproject.toml; the enqueue side
is `shared.queue`).

arq polls its queue every `poll_delay` seconds, which adds about half of that to every
turn's first token. `WakeWorker` instead blocks on a wake list that the API pushes each new
job's id to, so an idle worker starts a job within a millisecond or two while issuing
about two Redis commands a second. Starting a job is one script instead of arq's
optimistic transaction (four round trips), and the started job leaves arq's queue in that
same script, so polls cost the same with one turn running or a thousand.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import arq.worker
import uvloop
from arq.constants import in_progress_key_prefix
from arq.utils import timestamp_ms
from arq.worker import Worker
from redis.exceptions import RedisError

from shared import keys
from shared.connection import wait_until_reachable
from shared.logs import configure_logging

# Fallback poll while idle: picks up deferred jobs and a token lost to a Redis restart.
WAKE_TIMEOUT_S = 1
# While every job slot is busy, how often to look for a free one.
FULL_RECHECK_S = 0.05
# The longest a shutdown waits on Redis.
_CLOSE_TIMEOUT_S = 5.0

# KEYS: the job's in-progress key, the queue. ARGV: job id, now ms, in-progress ms.
# arq's start checks in a WATCH/MULTI: not running elsewhere, still queued, due. Returns
# the job's score once it is marked in progress, nil when another worker has it. A running
# job leaves the queue: otherwise every poll of every worker spends round trips re-checking
# it, and a turn never runs twice anyway (its claim refuses).
_TAKE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if (not score) or tonumber(score) > tonumber(ARGV[2]) then return false end
redis.call('PSETEX', KEYS[1], ARGV[3], '1')
redis.call('ZREM', KEYS[2], ARGV[1])
return score
"""


class WakeWorker(Worker):
    """An arq `Worker` that waits on a wake list instead of sleeping between polls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # arq sleeps `poll_delay` minus the iteration's duration; the wait below replaces it.
        kwargs["poll_delay"] = 0
        super().__init__(*args, **kwargs)
        self.wake_key = keys.wake(self.queue_name)
        self._take: Any = None

    async def main(self) -> None:
        """arq's `main`, once Redis answers: a worker started against a Redis that is down
        says so at once and waits, rather than retrying in silence and then dying.

        Logging is set up here, before that wait's lines, from the worker's own settings
        when it was built with some (`create_worker` puts them in `ctx`; the `arq` command
        line's worker has none and reads the environment's)."""
        configure_logging(self.ctx.get("settings"))
        await wait_until_reachable(self.pool, logging.getLogger("bernard.worker"))
        try:
            await super().main()
        except (RedisError, OSError):
            if self._pool is None:
                return  # `close` ran during start-up and closed the connections in use
            raise

    async def close(self) -> None:
        """arq's `close`, bounded: with Redis down its first step (deleting the health-check
        key) would retry for half a minute and then fail with a traceback."""
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await super().close()
        except (RedisError, OSError, TimeoutError) as exc:
            logging.getLogger("bernard.worker").warning("shut down without Redis: %s", exc)

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        """arq's `start_jobs` (same job slots and bookkeeping), one round trip per job."""
        if self._take is None:
            self._take = self.pool.register_script(_TAKE)
        for job_id_b in job_ids:
            await self.sem.acquire()
            if self.job_counter >= self.max_jobs:
                self.sem.release()
                return
            self.job_counter += 1
            job_id = job_id_b.decode()
            score = None
            try:
                score = await self._take(
                    keys=[in_progress_key_prefix + job_id, self.queue_name],
                    args=[job_id, timestamp_ms(), int(self.in_progress_timeout_s * 1000)],
                )
            finally:
                if score is None:
                    # Started by another worker, a stale wake-up, or Redis failed: free the slot.
                    self.job_counter -= 1
                    self.sem.release()
            if score is None:
                continue
            task = self.loop.create_task(self.run_job(job_id, int(float(score))))
            task.add_done_callback(lambda _: self._release_sem_dec_counter_on_complete())
            self.tasks[job_id] = task

    async def _poll_iteration(self) -> None:
        if self._pool is None:
            # `close` ran while a command was in flight: the cancel it sent was taken for a
            # lost connection and retried. The worker is shutting down; stop polling.
            raise asyncio.CancelledError
        await super()._poll_iteration()
        if self.allow_pick_jobs and self.job_counter < self.max_jobs:
            woken = await self.pool.blpop([self.wake_key], timeout=WAKE_TIMEOUT_S)  # type: ignore[misc]
            if woken is None:
                return
            if self.allow_pick_jobs:
                # The wake-up names its job: start it now rather than after another poll.
                await self.start_jobs([woken[1]])
            else:
                # Told to stop taking jobs (SIGTERM) while blocked: pass it to another worker.
                await self.pool.lpush(self.wake_key, woken[1])
        else:
            await asyncio.sleep(FULL_RECHECK_S)


def _create_wake_worker(settings_cls: Any, **kwargs: Any) -> Worker:
    # The command line's worker runs on uvloop, as uvicorn runs the API: arq's `Worker`
    # makes its loop from the policy. Under 100 streaming turns the default loop's socket
    # writes alone were 7 % of the worker's CPU (docs/benchmarks.md, cost per token).
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return WakeWorker(**{**arq.worker.get_kwargs(settings_cls), **kwargs})


# The `arq` command line always builds a plain `Worker` (arq.worker.run_worker calls the
# module-level `create_worker`). Importing this module makes it build a `WakeWorker` on
# uvloop, so the Procfile's `arq worker.main.WorkerSettings` gets fast pickup too.
arq.worker.create_worker = _create_wake_worker
