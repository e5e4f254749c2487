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
- `Worker.finish_job` and `finish_failed_job` call `finished(job_id, ended, incr_score)` once
  arq's ran. A job that did not end (cancelled by a shutdown, or `Retry`) arq only moves on
  the queue (ZINCRBY of `incr_score`); a job the subclass took off the queue
  (`took_off_queue`) is not moved, so that `finished` can put it back where it belongs.
- A poll iteration (`_poll_iteration`) that fails with one of the subclass's `outlived`
  errors ends there and calls its `outlive`; the next one tries again. arq lets every error
  of an iteration (its health check's write, a job task's) stop the worker.
- `Worker._pool` is None once `close` ran (`closed`).
- `arq.worker.get_kwargs` picks out of a settings class what arq's `Worker` takes.

The `arq` command line (arq.worker.run_worker) always builds a plain `Worker`; a worker that
extends it is built and run by its own entry point (`python -m worker`: worker/__main__.py),
with `worker_kwargs`. Nothing of arq's is replaced.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, ClassVar

import arq.worker
from arq.worker import Worker

__all__ = ["WakingWorker", "worker_kwargs"]


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

    def launch(self, job_id: str, score: int, done: Callable[[str], None]) -> None:
        """Run the job (marked in progress, in a slot taken for it) as arq runs one; once
        its task ends the slot is given back and `done(job_id)` called."""
        task = self.loop.create_task(self.run_job(job_id, score))
        task.add_done_callback(functools.partial(self._ended, job_id, done))
        self.tasks[job_id] = task

    def _ended(self, job_id: str, done: Callable[[str], None], _: asyncio.Task[None]) -> None:
        self._release_sem_dec_counter_on_complete()
        done(job_id)

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
        await super().finish_job(
            job_id,
            finish,
            result_data,
            result_timeout_s,
            keep_result_forever,
            None if self.took_off_queue(job_id) else incr_score,
            keep_in_progress,
        )
        await self.finished(job_id, finish, incr_score)

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        await super().finish_failed_job(job_id, result_data)
        await self.finished(job_id, True, None)

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


def worker_kwargs(settings_cls: Any, *own: str) -> dict[str, Any]:
    """What a worker built from `settings_cls` (an arq settings class, or a dict) takes:
    what arq's `Worker` takes of it, and the options named `own` (a subclass's)."""
    values = settings_cls if isinstance(settings_cls, dict) else vars(settings_cls)
    return {**arq.worker.get_kwargs(settings_cls), **{name: values[name] for name in own}}
