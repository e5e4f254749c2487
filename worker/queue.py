"""Which jobs a worker starts, and how it takes each (the enqueue side is `shared.queue`).

`WakeWorker` (a `compat.arq.WakingWorker`) blocks on a wake list the API pushes each job's id
to, instead of arq's poll every `poll_delay` (half of it on every first token), and takes a
job in one script rather than arq's optimistic transaction. Where jobs start it departs from
arq in four more ways: one user's jobs hold at most `BERNARD_WORKER_USER_SHARE` of the slots;
background jobs at most `BERNARD_WORKER_BACKGROUND_SHARE`, taking their budget slots in the
script that takes the job; a backlog starts round-robin across owners (worker/fairness.py)
rather than in queue order; and a Redis at its `maxmemory` ends the turn it cannot take
`store_full` rather than stopping the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from typing import Any

from arq.constants import in_progress_key_prefix
from arq.utils import timestamp_ms
from redis.exceptions import OutOfMemoryError, RedisError

from compat.arq import START_LUA, Started, WakingWorker, start_keys
from shared import keys
from shared.connection import REDIS_ERRORS, wait_until_reachable
from shared.events import TurnStatus
from shared.logs import configure_logging
from shared.queue import (
    SLOTS,
    BackgroundLimits,
    background_owner,
    dequeue,
    release_background,
    requeue_background,
)
from shared.settings import user_slots
from worker.fairness import Candidate, fair_order

# How long a worker leaves alone the background jobs of an owner over their budget (or
# all of them, over the queue's) before it tries one again.
BACKGROUND_RECHECK_S = 0.5
# The owners over budget a worker remembers before it forgets the ones whose wait is over.
_REFUSED_KEPT = 256
# The longest a shutdown waits on Redis.
_CLOSE_TIMEOUT_S = 5.0
# How long a worker waits after Redis, at its maxmemory, refused a write of its poll; and
# how often at most it says so.
FULL_PAUSE_S = 0.5
_FULL_LOG_S = 30.0

# KEYS: the job's in-progress key, the queue. ARGV: job id, now ms. arq's start checks in a
# WATCH/MULTI: not running elsewhere, still queued, due.
_DUE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if (not score) or tonumber(score) > tonumber(ARGV[2]) then return false end
"""
# ARGV[3]: in-progress ms. KEYS[3], KEYS[4]: the job and its retry key (compat/arq.py
# `start_keys`). Marks the job in progress and does what arq's `run_job` does first (reads
# the job, counts this try: `START_LUA`), in the same step. A running job leaves the queue:
# otherwise every poll of every worker spends round trips re-checking it, and a turn never
# runs twice anyway (its claim refuses).
_START = """
redis.call('PSETEX', KEYS[1], ARGV[3], '1')
redis.call('ZREM', KEYS[2], ARGV[1])
local job, try = arq_start(KEYS[3], KEYS[4])
"""
# A turn's job. KEYS[5]: its owner key, read and deleted in one GETDEL (Redis 6.2, as
# GETEX and ZMSCORE elsewhere). Returns {score, owner, job, try} once the
# job is marked in progress, nil when another worker has it (or it is not due).
_TAKE = (
    START_LUA
    + _DUE
    + _START
    + """
return {score, redis.call('GETDEL', KEYS[5]), job, try}
"""
)
# A background job. KEYS[5], KEYS[6]: its owner's and the queue's background slots. ARGV[4..8]:
# now (epoch s), the owner's limit, the queue's, the slots' lapse, their ttl s. As `_TAKE`,
# once the job holds both slots; -1 or -2 (shared/queue.py `refused`) leaves it queued.
_TAKE_BACKGROUND = (
    SLOTS
    + START_LUA
    + _DUE
    + """
local refusal = refused(KEYS[5], KEYS[6], ARGV[4], ARGV[5], ARGV[6], ARGV[1])
if refusal then return refusal end
hold(KEYS[5], KEYS[6], ARGV[7], ARGV[1], ARGV[8])
"""
    + _START
    + """
return {score, false, job, try}
"""
)
_OVER_USER_BUDGET, _OVER_DEPLOYMENT_BUDGET = -1, -2
# What a `WakeWorker` takes beyond arq's `Worker`.
WAKE_OPTIONS = ("background", "background_share", "user_share")


class WakeWorker(WakingWorker):
    """An arq `Worker` that waits on a wake list instead of sleeping between polls, admits
    background jobs, and starts a backlog in a fair order (see above).

    `background` are the budgets background jobs are admitted against; `background_share`
    the share of `max_jobs` they may take (at least one slot). It marks the jobs' context
    (`MARK`): worker/main.py's start-up refuses a worker that is not one."""

    MARK = "bernard_wake_worker"
    # The ctx entry (set by worker/main.py's start-up) that ends a turn Redis is too full
    # to start: `refuse(turn_id)` returns the status the turn is left in.
    REFUSE_FULL = "bernard_refuse_full"
    outlived = (OutOfMemoryError,)

    def __init__(
        self,
        *args: Any,
        background: BackgroundLimits,
        background_share: float,
        user_share: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, wake_list=keys.wake, **kwargs)
        self.ctx[self.MARK] = True
        self.background = background
        self.background_slots = max(1, int(self.max_jobs * background_share))
        self.user_slots = user_slots(self.max_jobs, user_share)
        self._take: Any = None
        self._take_background: Any = None
        # The jobs running here: id → (owner, background), and how many each owner runs.
        self._running: dict[str, tuple[str | None, bool]] = {}
        self._running_by_owner: Counter[str | None] = Counter()
        self._background_running = 0
        # The score (due time, ms) each background job running here had on the queue: a job
        # stopped before it ends goes back with it (`finish_job`).
        self._background_scores: dict[str, int] = {}
        # Owners over their background budget, and the queue over its: until when (monotonic)
        # their background jobs are left alone.
        self._refused_until: dict[str, float] = {}
        self._all_refused_until = 0.0
        self._full_logged = -_FULL_LOG_S  # `time.monotonic()` of the last "Redis is full"
        # A turn left queued for each owner at their share: a wake-up for it goes out as a
        # job of theirs ends here (`_job_done`), and the tasks sending them.
        self._held: dict[str, str] = {}
        self._waking: set[asyncio.Task[None]] = set()

    async def main(self) -> None:
        """arq's `main`, once Redis answers: a worker started against a Redis that is down
        says so at once and waits, rather than retrying in silence and then dying.

        Logging is set up here, before that wait's lines, from the worker's own settings
        when it was built with some in `ctx` (tests do; `python -m worker`'s has none and
        reads the environment's)."""
        configure_logging(self.ctx.get("settings"))
        await wait_until_reachable(self.pool, logging.getLogger("bernard.worker"))
        try:
            await super().main()
        except (RedisError, OSError):
            if self.closed:
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

    async def outlive(self, error: Exception) -> None:
        """A write of the poll was refused for Redis's maxmemory: say so, pause, go on."""
        self._say_full(error)
        await asyncio.sleep(FULL_PAUSE_S)

    def _say_full(self, error: Exception) -> None:
        now = time.monotonic()
        if now - self._full_logged >= _FULL_LOG_S:
            self._full_logged = now
            logging.getLogger("bernard.worker").warning(
                "Redis is full (%s): turns are refused until it has room", error
            )

    async def start(self, job_ids: list[str]) -> None:
        """Start what is due of `job_ids`, one round trip per job: a backlog in fair order,
        background jobs within their share and budgets."""
        candidates = [_candidate(job_id) for job_id in job_ids]
        if len(candidates) > self.free_slots or self._may_reach_share(len(candidates)):
            candidates = await self._with_owners(candidates)
        if len(candidates) > self.free_slots:
            candidates = fair_order(candidates, self._running_by_owner)
        for candidate in candidates:
            if candidate.background and not self._may_start_background(candidate.owner):
                continue  # stays queued: a later poll looks at it again
            if not candidate.background and self._at_share(candidate):
                continue
            if not await self.take_slot():
                return
            started = None
            try:
                started = await self._start(candidate)
            finally:
                if started is None:
                    # Started by another worker, a stale wake-up, over a budget, or Redis
                    # failed: free the slot.
                    self.give_slot()
            if started is None:
                continue
            score, owner, taken = started
            job_id = candidate.job_id
            self._running[job_id] = (owner, candidate.background)
            self._running_by_owner[owner] += 1
            self._background_running += candidate.background
            if candidate.background:
                self._background_scores[job_id] = score
            self.launch(job_id, score, self._job_done, taken)

    async def _start(self, candidate: Candidate) -> tuple[int, str | None, Started] | None:
        """Take the job: (its score, its owner, what arq's start read of it) once it is
        marked in progress, None when it is not to start now."""
        job_id = candidate.job_id
        common = [job_id, timestamp_ms(), int(self.in_progress_timeout_s * 1000)]
        taken_keys = [in_progress_key_prefix + job_id, self.queue_name, *start_keys(job_id)]
        if not candidate.background:
            if self._take is None:
                self._take = self.pool.register_script(_TAKE)
            try:
                reply = await self._take(
                    keys=[*taken_keys, keys.job_owner(self.queue_name, job_id)], args=common
                )
            except OutOfMemoryError as error:
                await self._refuse_full(job_id, error)
                return None
            if reply is None:
                return None
            score, owner, job, job_try = reply
            owner_id = owner.decode() if owner is not None else None
            return int(float(score)), owner_id, Started(job, int(job_try))
        assert candidate.owner is not None
        if self._take_background is None:
            self._take_background = self.pool.register_script(_TAKE_BACKGROUND)
        now = time.time()
        limits = self.background
        take_background = self._take_background(
            keys=[
                *taken_keys,
                keys.background_jobs(candidate.owner),
                keys.queued_background(self.queue_name),
            ],
            args=[
                *common,
                now,
                limits.per_user,
                limits.total,
                now + self.in_progress_timeout_s,
                limits.ttl_s,
            ],
        )
        try:
            reply = await take_background
        except OutOfMemoryError as error:
            # It waits on the queue, as over a budget, until Redis has room.
            self._say_full(error)
            self._refused(candidate.owner, everyone=True)
            return None
        if reply is None:
            return None
        if isinstance(reply, int):
            self._refused(candidate.owner, everyone=reply == _OVER_DEPLOYMENT_BUDGET)
            return None
        score, _, job, job_try = reply
        return int(float(score)), candidate.owner, Started(job, int(job_try))

    async def _refuse_full(self, turn_id: str, error: OutOfMemoryError) -> None:
        """Redis is too full to start the turn: end it (unless another worker has it) and
        drop its job."""
        self._say_full(error)
        refuse = self.ctx.get(self.REFUSE_FULL)
        if refuse is None:
            return  # not started up yet: it stays queued
        if await refuse(turn_id) != TurnStatus.RUNNING:
            await dequeue(self.pool, self.queue_name, turn_id)

    def _may_reach_share(self, more: int) -> bool:
        """Whether `more` jobs started now could take an owner to their share."""
        return max(self._running_by_owner.values(), default=0) + more > self.user_slots

    def _at_share(self, candidate: Candidate) -> bool:
        """Whether the candidate's owner holds their share of the slots (it then stays
        queued, and a job of theirs ending here wakes a worker for it)."""
        owner = candidate.owner
        if owner is None or self._running_by_owner[owner] < self.user_slots:
            return False
        self._held[owner] = candidate.job_id
        return True

    def _may_start_background(self, owner: str | None) -> bool:
        if self._background_running >= self.background_slots:
            return False
        now = time.monotonic()
        return self._all_refused_until <= now and self._refused_until.get(owner or "", 0) <= now

    def _refused(self, owner: str, *, everyone: bool) -> None:
        """A background job of `owner` was over a budget: leave theirs (or, `everyone`,
        all) alone for a while."""
        until = time.monotonic() + BACKGROUND_RECHECK_S
        if everyone:
            self._all_refused_until = until
            return
        if len(self._refused_until) >= _REFUSED_KEPT:
            now = time.monotonic()
            self._refused_until = {o: t for o, t in self._refused_until.items() if t > now}
        self._refused_until[owner] = until

    async def _with_owners(self, candidates: list[Candidate]) -> list[Candidate]:
        """`candidates` with the owners of the turns among them, read in one round trip
        (a background job's is in its id)."""
        unknown = [c.job_id for c in candidates if c.owner is None and not c.background]
        if not unknown:
            return candidates
        replies = await self.pool.mget([keys.job_owner(self.queue_name, i) for i in unknown])
        owners = {job_id: raw.decode() for job_id, raw in zip(unknown, replies, strict=True) if raw}
        return [
            Candidate(c.job_id, owners.get(c.job_id), False) if c.job_id in owners else c
            for c in candidates
        ]

    def _job_done(self, job_id: str) -> None:
        owner, background = self._running.pop(job_id, (None, False))
        self._running_by_owner[owner] -= 1
        if self._running_by_owner[owner] <= 0:
            del self._running_by_owner[owner]
        self._background_running -= background
        held = self._held.pop(owner, None) if owner is not None else None
        if held is not None and not self.closed:
            # This worker may be waiting on the wake list for a while: a wake-up now.
            task = asyncio.create_task(self._wake(held))
            self._waking.add(task)
            task.add_done_callback(self._waking.discard)

    async def _wake(self, job_id: str) -> None:
        with contextlib.suppress(*REDIS_ERRORS):
            await self.pool.lpush(self.wake_key, job_id)  # type: ignore[misc]

    def took_off_queue(self, job_id: str) -> bool:
        """A background job this worker started: `finished` puts it back if it did not end."""
        return job_id in self._background_scores

    async def finished(self, job_id: str, ended: bool, incr_score: int | None) -> None:
        """Once arq recorded the job's end (or its failure to start or run): the background
        slots it held are given back. A background job that did not end (cancelled by this
        worker's shutdown, or retried) goes back on the queue, due when arq would have it
        (its score moved by `incr_score`, else now), for another worker to run: a turn
        never runs twice (its claim refuses), so a turn's job is left off."""
        score = self._background_scores.pop(job_id, None)
        await release_background(self.pool, self.queue_name, job_id)
        if not ended and score is not None:
            due = score + incr_score if incr_score else timestamp_ms()
            await requeue_background(self.pool, self.queue_name, job_id, due)


def _candidate(job_id: str) -> Candidate:
    """A job as its id tells it: a background job names its owner; a turn's does not."""
    owner = background_owner(job_id)
    return Candidate(job_id, owner, owner is not None)
