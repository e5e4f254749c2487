"""Putting a turn on arq's queue, inside the transaction that stores the turn.

arq's own `enqueue_job` is an optimistic transaction (WATCH, EXISTS, MULTI, EXEC) guarding
against a second job with the same id. A turn's job id is its fresh turn id, so there is
nothing to guard against, and those three extra round trips sat on every turn's first
token. `enqueue` instead adds arq's job exactly as arq would (same key, payload, score and
expiry) to a pipeline the caller executes, together with the wake-up push a blocked worker
waits on (`worker.queue.WakeWorker`). arq is pinned in pyproject.toml for this reason.
"""

from __future__ import annotations

import time

from arq.constants import expires_extra_ms, job_key_prefix
from arq.jobs import serialize_job
from redis.asyncio.client import Pipeline

from shared import keys

RUN_TURN = "run_turn"
# Wake-ups a queue keeps while no worker waits; a worker that finds none polls arq's queue.
_WAKE_BACKLOG = 100


def enqueue(pipe: Pipeline, queue_name: str, turn_id: str) -> None:
    """Queue the job that runs `turn_id`, and wake one idle worker with its id."""
    now_ms = round(time.time() * 1000)
    job = serialize_job(RUN_TURN, (turn_id,), {}, None, now_ms)
    pipe.psetex(job_key_prefix + turn_id, expires_extra_ms, job)
    pipe.zadd(queue_name, {turn_id: now_ms})
    pipe.lpush(keys.wake(queue_name), turn_id)
    pipe.ltrim(keys.wake(queue_name), 0, _WAKE_BACKLOG - 1)
