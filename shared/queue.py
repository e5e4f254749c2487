"""Putting jobs on arq's queue: a turn's inside the transaction that stores the turn, and the
background jobs a user's turns cause, each admitted against a budget.

`enqueue` adds arq's job exactly as arq would (same key, payload, score and expiry), with
the wake-up push and the job's owner, in one script on a pipeline the caller runs: arq's own
`enqueue_job` guards with WATCH and MULTI against a duplicate id that a fresh turn id cannot
have, three round trips on every first token (arq is pinned for this). A *live* job is a
turn, admitted by the API. A *background* job (`BackgroundKind`: summaries, titles, timer
firings) has the id `<kind>:<owner>/<key>` and holds a slot of its owner's and of the
queue's budget while queued or running: over either, a summary or a title is not queued and
a due timer waits. Webhook deliveries hold no slot: the turns they follow bound them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from arq.constants import expires_extra_ms, job_key_prefix, result_key_prefix
from arq.jobs import serialize_job
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from shared import keys
from shared.scripts import in_pipeline

if TYPE_CHECKING:
    from shared.settings import Settings

logger = logging.getLogger("bernard.queue")

RUN_TURN = "run_turn"
# The worker's job that folds a conversation's older messages into its summary.
SUMMARIZE = "summarize_conversation"
# The worker's job that names a conversation after its first exchange (worker/titles.py).
TITLE = "title_conversation"
# Wake-ups a queue keeps while no worker waits; a worker that finds none polls arq's queue.
_WAKE_BACKLOG = 100
# How long a queued background job holds its slots before a worker starts it (then they
# last as long as arq's in-progress key): only a job lost from the queue ever waits so long.
QUEUED_LAPSE_S = 3600


class BackgroundKind(StrEnum):
    """The kinds of background job; each is its jobs' id prefix (`background_job_id`)."""

    SUMMARY = "summary"
    TIMER = "timer"
    TITLE = "title"
    WEBHOOK = "webhook"


_KINDS = frozenset(kind.value for kind in BackgroundKind)


class Admission(StrEnum):
    """What asking for a background job came to."""

    QUEUED = "queued"
    ALREADY_QUEUED = "already_queued"
    OVER_USER_BUDGET = "over_user_budget"
    OVER_DEPLOYMENT_BUDGET = "over_deployment_budget"


@dataclass(frozen=True, slots=True)
class BackgroundLimits:
    """The budgets background jobs are admitted against, on one queue."""

    queue_name: str
    per_user: int
    total: int
    # The slot sets' TTL: above any entry's lapse, queued or running.
    ttl_s: int

    @classmethod
    def of(cls, settings: Settings) -> BackgroundLimits:
        return cls(
            queue_name=settings.queue_name,
            per_user=settings.max_background_jobs_per_user,
            total=settings.max_background_jobs,
            ttl_s=QUEUED_LAPSE_S + int(settings.turn_timeout_s) + 3600,
        )


def background_job_id(kind: BackgroundKind, owner: str, key: str) -> str:
    """The job id of a background job of `kind` for `owner`, one per `key` at a time."""
    # Percent-encoded: no owner name holds the "/" that ends it.
    return f"{kind.value}:{quote(owner, safe='')}/{key}"


def background_owner(job_id: str) -> str | None:
    """The owner of the background job `job_id`; None for a live job (a turn's bare id) or
    a background id without an owner (queued before jobs named theirs), which runs as
    before, unadmitted."""
    kind, sep, rest = job_id.partition(":")
    if not sep or kind not in _KINDS:
        return None
    owner, sep, _ = rest.partition("/")
    return unquote(owner) if sep else None


# KEYS: the job, the queue, the wake list, the job's owner key (a turn's only). ARGV: job id,
# the job, its expiry ms, its score, '1' to wake one idle worker with its id ('' not to),
# its owner. arq's job (key, payload, score and expiry as arq's `enqueue_job` writes them)
# with its wake-up and owner, in one command rather than five.
_ENQUEUE = f"""
redis.call('PSETEX', KEYS[1], ARGV[3], ARGV[2])
if KEYS[4] then redis.call('PSETEX', KEYS[4], ARGV[3], ARGV[6]) end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
if ARGV[5] ~= '' then
  redis.call('LPUSH', KEYS[3], ARGV[1])
  redis.call('LTRIM', KEYS[3], 0, {_WAKE_BACKLOG - 1})
end
"""


def enqueue(pipe: Pipeline, queue_name: str, turn_id: str, owner: str, defer_s: float = 0) -> None:
    """Queue the job that runs `owner`'s turn `turn_id`, and wake one idle worker with
    its id; or, deferred `defer_s`, due only then unless it is made due sooner (`promote`):
    a turn waiting in its conversation's line (shared/conversation_state.py)."""
    now_ms = round(time.time() * 1000)
    defer_ms = round(defer_s * 1000)
    job = serialize_job(RUN_TURN, (turn_id,), {}, None, now_ms)
    job_keys = [
        job_key_prefix + turn_id,
        queue_name,
        keys.wake(queue_name),
        keys.job_owner(queue_name, turn_id),
    ]
    args = [turn_id, job, expires_extra_ms + defer_ms, now_ms + defer_ms, "" if defer_ms else "1"]
    in_pipeline(pipe, _ENQUEUE, job_keys, [*args, owner])


def promote(pipe: Pipeline, queue_name: str, turn_id: str) -> None:
    """Make the deferred job of turn `turn_id` due now and wake one idle worker for it; a
    job no longer queued (a worker took it) is left alone."""
    pipe.zadd(queue_name, {turn_id: round(time.time() * 1000)}, xx=True)
    pipe.lpush(keys.wake(queue_name), turn_id)
    pipe.ltrim(keys.wake(queue_name), 0, _WAKE_BACKLOG - 1)


async def dequeue(queue: Redis, queue_name: str, turn_id: str) -> None:
    """Take the job of turn `turn_id` off the queue unrun (the turn ended without it).
    Deletions only: Redis runs them at its maxmemory too."""
    async with queue.pipeline(transaction=False) as pipe:
        pipe.zrem(queue_name, turn_id)
        pipe.delete(job_key_prefix + turn_id, keys.job_owner(queue_name, turn_id))
        await pipe.execute()


def enqueue_due(pipe: Pipeline, queue_name: str, job_id: str, function: str, *args: Any) -> None:
    """Queue `function(*args)` as the background job `job_id`, due now, in the caller's
    pipeline, and wake one idle worker for it. Unadmitted here: its slots are taken as a
    worker starts it, as a timer's are."""
    now_ms = round(time.time() * 1000)
    job = serialize_job(function, args, {}, None, now_ms)
    job_keys = [job_key_prefix + job_id, queue_name, keys.wake(queue_name)]
    in_pipeline(pipe, _ENQUEUE, job_keys, [job_id, job, expires_extra_ms, now_ms, "1"])


# Lua shared by the scripts that admit a background job. KEYS of the caller: the owner's
# slots `mine`, the queue's `all`. `refused` drops lapsed entries, then says whether
# `member` may not hold a slot in both: -1 over the owner's `mine_limit`, -2 over the
# queue's, false when it may (a member already holding a slot keeps it). `hold` gives it
# the slots until `lapse` (epoch s), each set living `ttl` s past its latest entry.
SLOTS = """
local function refused(mine, all, now, mine_limit, all_limit, member)
  redis.call('ZREMRANGEBYSCORE', mine, '-inf', now)
  redis.call('ZREMRANGEBYSCORE', all, '-inf', now)
  if not redis.call('ZSCORE', mine, member)
      and redis.call('ZCARD', mine) >= tonumber(mine_limit) then
    return -1
  end
  if not redis.call('ZSCORE', all, member)
      and redis.call('ZCARD', all) >= tonumber(all_limit) then
    return -2
  end
  return false
end
local function hold(mine, all, lapse, member, ttl)
  for _, set in ipairs({mine, all}) do
    redis.call('ZADD', set, lapse, member)
    redis.call('EXPIRE', set, ttl)
  end
end
"""

# KEYS: the owner's slots, the queue's slots, the job, its result, the queue. ARGV: now
# (epoch s), the owner's limit, the queue's, job id, lapse, slots' ttl s, the job, its
# score, its expiry ms. arq's enqueue (nothing when the job is already queued: 0) behind
# the admission (-1, -2 as `refused`); 1 queued.
_ENQUEUE_BACKGROUND = (
    SLOTS
    + """
if redis.call('EXISTS', KEYS[3], KEYS[4]) > 0 then return 0 end
local refusal = refused(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if refusal then return refusal end
hold(KEYS[1], KEYS[2], ARGV[5], ARGV[4], ARGV[6])
redis.call('PSETEX', KEYS[3], ARGV[9], ARGV[7])
redis.call('ZADD', KEYS[5], ARGV[8], ARGV[4])
return 1
"""
)
_ADMISSIONS = {
    1: Admission.QUEUED,
    0: Admission.ALREADY_QUEUED,
    -1: Admission.OVER_USER_BUDGET,
    -2: Admission.OVER_DEPLOYMENT_BUDGET,
}


async def enqueue_background(
    queue: Redis,
    limits: BackgroundLimits,
    kind: BackgroundKind,
    owner: str,
    key: str,
    function: str,
    *args: Any,
) -> Admission:
    """Queue `function(*args)` as `owner`'s background job of `kind` for `key`, due now,
    if it is within the owner's and the queue's budgets and no such job is queued yet (one
    script: nothing is stored when it is refused)."""
    job_id = background_job_id(kind, owner, key)
    now = time.time()
    now_ms = round(now * 1000)
    reply = await queue.register_script(_ENQUEUE_BACKGROUND)(
        keys=[
            keys.background_jobs(owner),
            keys.queued_background(limits.queue_name),
            job_key_prefix + job_id,
            result_key_prefix + job_id,
            limits.queue_name,
        ],
        args=[
            now,
            limits.per_user,
            limits.total,
            job_id,
            now + QUEUED_LAPSE_S,
            limits.ttl_s,
            serialize_job(function, args, {}, None, now_ms),
            now_ms,
            expires_extra_ms,
        ],
    )
    return _ADMISSIONS[int(reply)]


async def request_background(
    queue: Redis,
    limits: BackgroundLimits,
    kind: BackgroundKind,
    owner: str,
    conversation_id: str,
    job: str,
    *job_args: Any,
    refused: str,
) -> Admission:
    """Queue the background job `job(owner, conversation_id, *job_args)` of `kind` for the
    owner's conversation (`enqueue_background`); over a budget it is not queued, and
    `refused` (formatted with the conversation and the admission) says so in the log."""
    admission = await enqueue_background(
        queue, limits, kind, owner, conversation_id, job, owner, conversation_id, *job_args
    )
    if admission in (Admission.OVER_USER_BUDGET, Admission.OVER_DEPLOYMENT_BUDGET):
        logger.info(
            refused,
            conversation_id,
            admission.value,
            extra={"user": owner, "conversation_id": conversation_id},
        )
    return admission


async def requeue_background(queue: Redis, queue_name: str, job_id: str, score_ms: int) -> None:
    """Put the background job `job_id` back on the queue, due at `score_ms`, and wake a
    worker for it: it was stopped before it ended (its worker shut down) or asked to run
    again (arq's `Retry`). A worker takes a job off the queue as it starts it
    (worker/queue.py), so arq's own retry, which only moves the job's score, would leave
    it on no queue: lost."""
    async with queue.pipeline(transaction=False) as pipe:
        pipe.zadd(queue_name, {job_id: score_ms})
        pipe.lpush(keys.wake(queue_name), job_id)
        pipe.ltrim(keys.wake(queue_name), 0, _WAKE_BACKLOG - 1)
        await pipe.execute()


# KEYS: the owner's background slots, the queue's. ARGV: job id. Both given back in one step.
_RELEASE_BACKGROUND = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
"""


async def release_background(queue: Redis, queue_name: str, job_id: str) -> None:
    """Give back the slots the background job `job_id` held (its owner's and the queue's):
    the job ended."""
    owner = background_owner(job_id)
    if owner is None:
        return
    slot_keys = [keys.background_jobs(owner), keys.queued_background(queue_name)]
    await queue.register_script(_RELEASE_BACKGROUND)(keys=slot_keys, args=[job_id])
