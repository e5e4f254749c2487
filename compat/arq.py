"""An extension of arq's `Worker` (arq is pinned in pyproject.toml): `WakingWorker` waits on
a wake list between polls instead of sleeping, and lets its subclass decide which jobs to
start and how to take each.

arq polls its queue every `poll_delay` seconds, which adds about half of that to every job's
start; it offers no hook for waiting otherwise, nor for choosing which due jobs start. So
this module reaches past arq's documented interface, and only this module (each name is
held by tests/compat/test_arq.py, which fails when arq changes it):

- `Worker._poll_iteration` is extended: after arq's poll, the worker blocks on the wake list
  (`BLPOP`, `wake_timeout_s` at most) while it has a free slot, else waits `full_recheck_s`.
- `Worker.start_jobs(job_ids)`, which arq's poll calls with the due jobs, hands them to the
  subclass's `start` (ids as `str`); the subclass takes slots (`take_slot`, `give_slot`:
  arq's `sem` and `job_counter`) and runs a job it took (`launch`: arq's `run_job` in a task
  kept in `tasks`, the slot given back through `_release_sem_dec_counter_on_complete`).
- A job the subclass took with a script that also ran `START_LUA` (arq's first transaction
  of `run_job`: the job read, its try counted) is launched with what it read (`Started`) and
  run by `_run_started`, a copy of arq 0.28.0's `run_job` without that transaction: five
  commands and a round trip fewer before every job runs.
- `Worker.finish_job` and `finish_failed_job` write what arq's transactions write, in one
  script each (`_FINISH_JOB`: one command where arq's MULTI sends five), then call
  `finished(job_id, ended, incr_score)`. A job that did not end (cancelled by a shutdown, or
  `Retry`) arq only moves on the queue (ZINCRBY of `incr_score`); a job the subclass took off
  the queue (`took_off_queue`) is not moved, so that `finished` can put it back where it
  belongs.
- A poll iteration (`_poll_iteration`) that fails with one of the subclass's `outlived`
  errors ends there and calls its `outlive`; the next one tries again. arq lets every error
  of an iteration (its health check's write, a job task's) stop the worker.
- `Worker._pool` is None once `close` ran (`closed`).
- `arq.worker.get_kwargs` picks out of a settings class what arq's `Worker` takes.

The `arq` command line (arq.worker.run_worker) always builds a plain `Worker`; a worker that
extends it is built and run by its own entry point (`python -m worker`: worker/__main__.py),
with `worker_kwargs`. Of arq's own, only `finish_job` and `finish_failed_job` are replaced;
tests/compat/test_arq.py holds them, and the copy of `run_job`, to arq 0.28.0's sources (by
their hash) and to what arq's own transactions leave in Redis.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import arq.worker
from arq.constants import (
    abort_jobs_ss,
    in_progress_key_prefix,
    job_key_prefix,
    keep_cronjob_progress,
    result_key_prefix,
    retry_key_prefix,
)
from arq.cron import CronJob
from arq.jobs import SerializationError, deserialize_job_raw, serialize_result
from arq.utils import args_to_string, ms_to_datetime, timestamp_ms, to_ms, truncate
from arq.worker import (
    Function,
    JobExecutionFailed,
    Retry,
    RetryJob,
    Worker,
    logger,
    no_result,
)

__all__ = ["START_LUA", "Started", "WakingWorker", "start_keys", "worker_kwargs"]

# Lua: what arq's `run_job` does first, in a transaction, for a script that takes a job to
# do in the same step: `arq_start(job key, retry key)` reads the job and counts this try
# (the retry key lives 88,400 s, as arq has it), returning both. Its keys: `start_keys`.
START_LUA = """
local function arq_start(job_key, retry_key)
  local job = redis.call('GET', job_key)
  local try = redis.call('INCR', retry_key)
  redis.call('EXPIRE', retry_key, 88400)
  return job, try
end
"""


def start_keys(job_id: str) -> list[str]:
    """The job's key and its retry key, as `arq_start` (`START_LUA`) takes them."""
    return [job_key_prefix + job_id, retry_key_prefix + job_id]


@dataclass(frozen=True, slots=True)
class Started:
    """What `arq_start` read of a job as a script took it: the job (None: it expired) and
    which try this is."""

    job: bytes | None
    job_try: int


# KEYS: the job's in-progress key, its retry key, the job, arq's abort set, the queue, the
# job's result. ARGV: job id, '1' if it ended ('' if it runs again), the result ('' for
# none), its life ms ('' for ever), the queue score to add ('' for none), how long the
# in-progress key stays ms ('' deleted). arq's `finish_job` transaction, as one script (its
# `finish_failed_job` is the same for a job that ended, its in-progress key deleted).
_FINISH_JOB = """
local gone = {}
if ARGV[6] == '' then table.insert(gone, KEYS[1]) else redis.call('PEXPIRE', KEYS[1], ARGV[6]) end
if ARGV[2] == '1' then
  if ARGV[3] ~= '' then
    if ARGV[4] == '' then
      redis.call('SET', KEYS[6], ARGV[3])
    else
      redis.call('SET', KEYS[6], ARGV[3], 'PX', ARGV[4])
    end
  end
  table.insert(gone, KEYS[2])
  table.insert(gone, KEYS[3])
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('ZREM', KEYS[5], ARGV[1])
elseif ARGV[5] ~= '' then
  redis.call('ZINCRBY', KEYS[5], ARGV[5], ARGV[1])
end
if #gone > 0 then redis.call('DEL', unpack(gone)) end
"""


class WakingWorker(Worker):
    """An arq `Worker` that waits on its queue's wake list (`wake_list(queue_name)`) between
    polls (one job id pushed there wakes one worker) and starts jobs through its subclass's
    `start`."""

    # Fallback poll while idle: deferred jobs, jobs left for later, a wake-up lost.
    wake_timeout_s: ClassVar[int] = 1
    # While every job slot is busy, how often to look for a free one.
    full_recheck_s: ClassVar[float] = 0.05
    # What a poll iteration may fail with that the worker outlives (the subclass's).
    outlived: ClassVar[tuple[type[Exception], ...]] = ()

    def __init__(self, *args: Any, wake_list: Callable[[str], str], **kwargs: Any) -> None:
        # arq sleeps `poll_delay` minus the iteration's duration; the wait on the wake list
        # replaces that sleep.
        kwargs["poll_delay"] = 0
        super().__init__(*args, **kwargs)
        self.wake_key = wake_list(self.queue_name)
        # Whether this poll iteration read the queue (it had a free slot then).
        self._polled = False
        self._finish_script: Any = None

    # What the subclass decides.

    async def start(self, job_ids: list[str]) -> None:
        """Start what it should of `job_ids` (due now, in queue order, or one a wake-up
        named): for each, `take_slot`, take the job, then `launch` it or `give_slot`."""
        raise NotImplementedError

    async def finished(self, job_id: str, ended: bool, incr_score: int | None) -> None:
        """Called once arq recorded what became of `job_id`: its result or its failure
        (`ended`), or that it is to run again (`incr_score` ms later, or at once)."""

    async def outlive(self, error: Exception) -> None:
        """Called when a poll iteration failed with one of `outlived`; the next iteration
        starts once it returns."""

    def took_off_queue(self, job_id: str) -> bool:
        """Whether `start` took `job_id` off the queue (arq's retry, which moves the job's
        score, would add it back due long ago: its `incr_score` alone)."""
        return False

    # What it decides with.

    @property
    def closed(self) -> bool:
        """Whether `close` ran (arq drops its pool then)."""
        return self._pool is None

    @property
    def free_slots(self) -> int:
        """Job slots free now."""
        return self.max_jobs - self.job_counter

    async def take_slot(self) -> bool:
        """Take a job slot (waiting for one as arq does); False when none is to be had."""
        await self.sem.acquire()
        if self.job_counter >= self.max_jobs:
            self.sem.release()
            return False
        self.job_counter += 1
        return True

    def give_slot(self) -> None:
        """Give back a slot taken for a job that is not to run."""
        self.job_counter -= 1
        self.sem.release()

    def launch(
        self,
        job_id: str,
        score: int,
        done: Callable[[str], None],
        started: Started | None = None,
    ) -> None:
        """Run the job (marked in progress, in a slot taken for it) as arq runs one; once
        its task ends the slot is given back and `done(job_id)` called. `started`: what the
        script that took it read (`START_LUA`), which arq then does not read again."""
        if started is None:
            run = self.run_job(job_id, score)
        else:
            run = self._run_started(job_id, score, started)
        task = self.loop.create_task(run)
        task.add_done_callback(functools.partial(self._ended, job_id, done))
        self.tasks[job_id] = task

    def _ended(self, job_id: str, done: Callable[[str], None], _: asyncio.Task[None]) -> None:
        self._release_sem_dec_counter_on_complete()
        done(job_id)

    async def _run_started(self, job_id: str, score: int, started: Started) -> None:
        """arq 0.28.0's `Worker.run_job`, but for its first transaction (the job read, its
        try counted), which the script that took the job ran (`START_LUA`): `started`."""
        start_ms = timestamp_ms()
        v, job_try = started.job, started.job_try
        abort_job: Any = False
        if self.allow_abort_jobs:
            abort_job = await self.pool.zrem(abort_jobs_ss, job_id)

        function_name, enqueue_time_ms = "<unknown>", 0
        args: tuple[Any, ...] = ()
        kwargs: dict[Any, Any] = {}

        async def job_failed(exc: BaseException) -> None:
            self.jobs_failed += 1
            result_data_ = serialize_result(
                function=function_name,
                args=args,
                kwargs=kwargs,
                job_try=job_try,
                enqueue_time_ms=enqueue_time_ms,
                success=False,
                result=exc,
                start_ms=start_ms,
                finished_ms=timestamp_ms(),
                ref=f"{job_id}:{function_name}",
                serializer=self.job_serializer,
                queue_name=self.queue_name,
                job_id=job_id,
            )
            await asyncio.shield(self.finish_failed_job(job_id, result_data_))

        if not v:
            logger.warning("job %s expired", job_id)
            return await job_failed(JobExecutionFailed("job expired"))

        try:
            function_name, args, kwargs, enqueue_job_try, enqueue_time_ms = deserialize_job_raw(
                v, deserializer=self.job_deserializer
            )
        except SerializationError as e:
            logger.exception("deserializing job %s failed", job_id)
            return await job_failed(e)

        if abort_job:
            t = (timestamp_ms() - enqueue_time_ms) / 1000
            logger.info("%6.2fs ⊘ %s:%s aborted before start", t, job_id, function_name)
            return await job_failed(asyncio.CancelledError())

        try:
            function: Function | CronJob = self.functions[function_name]
        except KeyError:
            logger.warning("job %s, function %r not found", job_id, function_name)
            return await job_failed(JobExecutionFailed(f"function {function_name!r} not found"))

        if hasattr(function, "next_run"):
            # cron_job
            ref = function_name
            keep_in_progress: float | None = keep_cronjob_progress
        else:
            ref = f"{job_id}:{function_name}"
            keep_in_progress = None

        if enqueue_job_try and enqueue_job_try > job_try:
            job_try = enqueue_job_try
            await self.pool.setex(retry_key_prefix + job_id, 88400, str(job_try))

        max_tries = self.max_tries if function.max_tries is None else function.max_tries
        if job_try > max_tries:
            t = (timestamp_ms() - enqueue_time_ms) / 1000
            logger.warning("%6.2fs ! %s max retries %d exceeded", t, ref, max_tries)
            self.jobs_failed += 1
            result_data = serialize_result(
                function_name,
                args,
                kwargs,
                job_try,
                enqueue_time_ms,
                False,
                JobExecutionFailed(f"max {max_tries} retries exceeded"),
                start_ms,
                timestamp_ms(),
                ref,
                self.queue_name,
                job_id=job_id,
                serializer=self.job_serializer,
            )
            return await asyncio.shield(self.finish_failed_job(job_id, result_data))

        result = no_result
        exc_extra = None
        finish = False
        timeout_s = self.job_timeout_s if function.timeout_s is None else function.timeout_s
        incr_score: int | None = None
        job_ctx = {
            "job_id": job_id,
            "job_try": job_try,
            "enqueue_time": ms_to_datetime(enqueue_time_ms),
            "score": score,
        }
        ctx = {**self.ctx, **job_ctx}

        if self.on_job_start:
            await self.on_job_start(ctx)

        start_ms = timestamp_ms()
        success = False
        try:
            s = args_to_string(args, kwargs)
            extra = f" try={job_try}" if job_try > 1 else ""
            if (start_ms - score) > 1200:
                extra += f" delayed={(start_ms - score) / 1000:0.2f}s"
            logger.info("%6.2fs → %s(%s)%s", (start_ms - enqueue_time_ms) / 1000, ref, s, extra)
            self.job_tasks[job_id] = task = self.loop.create_task(
                function.coroutine(ctx, *args, **kwargs)
            )

            # run repr(result) and extra inside try/except as they can raise exceptions
            try:
                result = await asyncio.wait_for(task, timeout_s)
            except (Exception, asyncio.CancelledError) as e:
                exc_extra = getattr(e, "extra", None)
                if callable(exc_extra):
                    exc_extra = exc_extra()
                raise
            else:
                result_str = (
                    "" if result is None or not self.log_results else truncate(repr(result))
                )
            finally:
                del self.job_tasks[job_id]

        except (Exception, asyncio.CancelledError) as e:
            finished_ms = timestamp_ms()
            t = (finished_ms - start_ms) / 1000
            if self.retry_jobs and isinstance(e, Retry):
                incr_score = e.defer_score
                logger.info(
                    "%6.2fs ↻ %s retrying job in %0.2fs", t, ref, (e.defer_score or 0) / 1000
                )
                if e.defer_score:
                    incr_score = e.defer_score + (timestamp_ms() - score)
                self.jobs_retried += 1
            elif job_id in self.aborting_tasks and isinstance(e, asyncio.CancelledError):
                logger.info("%6.2fs ⊘ %s aborted", t, ref)
                result = e
                finish = True
                self.aborting_tasks.remove(job_id)
                self.jobs_failed += 1
            elif self.retry_jobs and isinstance(e, (asyncio.CancelledError, RetryJob)):
                logger.info("%6.2fs ↻ %s cancelled, will be run again", t, ref)
                self.jobs_retried += 1
            else:
                logger.exception(
                    "%6.2fs ! %s failed, %s: %s",
                    t,
                    ref,
                    e.__class__.__name__,
                    e,
                    extra={"extra": exc_extra},
                )
                result = e
                finish = True
                self.jobs_failed += 1
        else:
            success = True
            finished_ms = timestamp_ms()
            logger.info("%6.2fs ← %s ● %s", (finished_ms - start_ms) / 1000, ref, result_str)
            finish = True
            self.jobs_complete += 1

        keep_result_forever = (
            self.keep_result_forever
            if function.keep_result_forever is None
            else function.keep_result_forever
        )
        result_timeout_s = (
            self.keep_result_s if function.keep_result_s is None else function.keep_result_s
        )
        result_data = None
        if result is not no_result and (keep_result_forever or result_timeout_s > 0):
            result_data = serialize_result(
                function_name,
                args,
                kwargs,
                job_try,
                enqueue_time_ms,
                success,
                result,
                start_ms,
                finished_ms,
                ref,
                self.queue_name,
                job_id=job_id,
                serializer=self.job_serializer,
            )

        if self.on_job_end:
            await self.on_job_end(ctx)

        await asyncio.shield(
            self.finish_job(
                job_id,
                finish,
                result_data,
                result_timeout_s,
                keep_result_forever,
                incr_score,
                keep_in_progress,
            )
        )

        if self.after_job_end:
            await self.after_job_end(ctx)

    # arq's, extended.

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        await self.start([job_id.decode() for job_id in job_ids])

    async def finish_job(
        self,
        job_id: str,
        finish: bool,
        result_data: bytes | None,
        result_timeout_s: float | None,
        keep_result_forever: bool,
        incr_score: int | None,
        keep_in_progress: float | None,
    ) -> None:
        moved = None if self.took_off_queue(job_id) else incr_score
        expire = None if keep_result_forever else result_timeout_s
        await self._finish_job(
            job_id,
            "1" if finish else "",
            result_data or "",
            _or_empty(to_ms(expire)),
            _or_empty(moved or None),
            _or_empty(to_ms(keep_in_progress)),
        )
        await self.finished(job_id, finish, incr_score)

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        keep_result = self.keep_result_forever or self.keep_result_s > 0
        kept = result_data if result_data is not None and keep_result else None
        expire = 0 if self.keep_result_forever else self.keep_result_s
        await self._finish_job(job_id, "1", kept or "", _or_empty(to_ms(expire)), "", "")
        await self.finished(job_id, True, None)

    async def _finish_job(self, job_id: str, *args: bytes | str | int) -> None:
        if self._finish_script is None:
            self._finish_script = self.pool.register_script(_FINISH_JOB)
        job_keys = [
            in_progress_key_prefix + job_id,
            retry_key_prefix + job_id,
            job_key_prefix + job_id,
            abort_jobs_ss,
            self.queue_name,
            result_key_prefix + job_id,
        ]
        await self._finish_script(keys=job_keys, args=[job_id, *args])

    async def _poll_iteration(self) -> None:
        if self.closed:
            # `close` ran while a command was in flight: the cancel it sent was taken for a
            # lost connection and retried. The worker is shutting down; stop polling.
            raise asyncio.CancelledError
        try:
            await self._poll_and_wait()
        except self.outlived as error:
            await self.outlive(error)

    async def _poll_and_wait(self) -> None:
        # arq's poll reads the queue only with a slot free.
        self._polled = self.allow_pick_jobs and self.free_slots > 0
        await super()._poll_iteration()
        if not (self.allow_pick_jobs and self.free_slots > 0):
            await asyncio.sleep(self.full_recheck_s)
            return
        woken = await self.pool.blpop([self.wake_key], timeout=self.wake_timeout_s)  # type: ignore[misc]
        if woken is None:
            return
        if not self.allow_pick_jobs:
            # Told to stop taking jobs (SIGTERM) while blocked: pass it to another worker.
            await self.pool.lpush(self.wake_key, woken[1])
        elif self._polled:
            # The poll found a slot, so it started every job then due: the wake-up names a
            # newer one. Start it now rather than after another poll.
            await self.start([woken[1].decode()])
        # Else the poll found every slot busy, and a backlog may be waiting: the next poll
        # reads the woken job with it.


def _or_empty(value: int | None) -> int | str:
    return "" if value is None else value


def worker_kwargs(settings_cls: Any, *own: str) -> dict[str, Any]:
    """What a worker built from `settings_cls` (an arq settings class, or a dict) takes:
    what arq's `Worker` takes of it, and the options named `own` (a subclass's)."""
    values = settings_cls if isinstance(settings_cls, dict) else vars(settings_cls)
    return {**arq.worker.get_kwargs(settings_cls), **{name: values[name] for name in own}}
