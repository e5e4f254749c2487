"""The store of turns in Redis: `TurnStore` admits, creates, reads and moves turn records
(shared/turn_record.py) between their states.

The moves themselves (their scripts, their named results) and how a turn ends for each
cause are shared/lifecycle.py's; `TurnStore` runs them. Its reads (`get`, `recent`) write
nothing; `settle` is the read that writes: it ends a turn that never can end on its own.
Admission's script (`_ADMIT`) is this module's, its reply named by `TurnAdmission`.

The record and its stream live on the data role; arq's job, the running set and the
owner's count of active turns on the queue role (shared/keys.py says why, and how each
move splits into a data half and a queue half that a crash between them cannot strand).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson
from arq.constants import in_progress_key_prefix, job_key_prefix
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import OutOfMemoryError, RedisError, ResponseError

from shared import budgets, keys
from shared import conversation_state as conversation_machine
from shared.backends import backend_of
from shared.cancel import Stop
from shared.connection import REDIS_ERRORS
from shared.conversation_state import Advance, may_run
from shared.events import TERMINAL_STATUSES, Done, Event, Start, TurnStatus, decode, encode
from shared.lifecycle import (
    CLAIM,
    CREATE,
    FINISH,
    FORGET,
    FORGET_GRACE_S,
    RULES,
    SEALED_ID,
    STRANDED_AFTER_S,
    Cause,
    Claimed,
    Finished,
    Guard,
    Who,
    ending_events_of,
    stuck,
)
from shared.liveness import Liveness
from shared.queue import enqueue, promote
from shared.rate_limit import TAKE_TOKENS_FUNCTION, Rate, RateLimitedError
from shared.results import TurnResult
from shared.scripts import TAKE_SLOT, in_pipeline
from shared.turn_record import TurnRecord
from shared.webhooks import TARGET_FIELD, Target, enqueue_delivery, subject_of

logger = logging.getLogger("bernard.turns")

__all__ = [
    "Admitted",
    "Claim",
    "InLine",
    "TooManyTurnsError",
    "TurnAdmission",
    "TurnStore",
    "admission_of",
]


@dataclass(slots=True)
class Claim:
    """What claiming a turn found: `CLAIMED` with the record, or the status that refused
    (or `MISSING`)."""

    outcome: Claimed | TurnStatus
    record: TurnRecord | None = None
    cancel_requested: bool = False
    # What the cancel asked for, when one was (shared/cancel.py).
    stop: Stop = Stop.CANCEL


def _claimed(reply: bytes) -> Claimed | TurnStatus:
    text = reply.decode()
    return Claimed(text) if text in Claimed.__members__.values() else TurnStatus(text)


# What `TurnStore.recent` reads of each turn: everything but the prompt (`messages`).
_LISTED_FIELDS = (
    "id",
    "owner",
    "model",
    "status",
    "created_at",
    "request",
    "conversation_id",
    "started_at",
    "finished_at",
    "error",
    "result",
    "preview",
)


class InLine(StrEnum):
    """Where a turn that joined its conversation's line stands (`TurnStore.take_turn`)."""

    HOLDS = "holds"  # its turn came: it holds the conversation
    WAITS = "waits"  # behind a turn that may still run
    OUT = "out"  # the conversation is gone, or the turn left the line


class TooManyTurnsError(Exception):
    """The owner already has as many queued and running turns as they may."""


# KEYS: active turns, rate bucket. ARGV: TAKE_SLOT's, then the refill per s ('' for no
# limit), burst, cost. A turn's admission: its tokens (shared/rate_limit.py), then its
# slot, in one step. Returns TAKE_SLOT's 1 or 0 (the tokens are spent: a refused attempt
# is a request too), or minus the milliseconds until the bucket could pay: `admission_of`
# names them.
_ADMIT = f"""
{TAKE_TOKENS_FUNCTION}
if ARGV[6] ~= '' then
  local wait = take(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[6]), tonumber(ARGV[7]),
                    tonumber(ARGV[8]))
  if wait > 0 then return -wait end
end
{TAKE_SLOT}
"""


class Admitted(StrEnum):
    """What `_ADMIT` (and `TAKE_SLOT`, its second half) did with a turn."""

    ADMITTED = "admitted"  # its tokens paid and its slot taken
    AT_LIMIT = "at_limit"  # its tokens paid, but the owner has no slot left
    RATE_LIMITED = "rate_limited"  # the bucket cannot pay yet: nothing taken


@dataclass(frozen=True, slots=True)
class TurnAdmission:
    """`_ADMIT`'s reply, named: what it did, and for `RATE_LIMITED` the milliseconds until
    the bucket could pay."""

    outcome: Admitted
    wait_ms: int = 0


def admission_of(reply: int | bytes) -> TurnAdmission:
    """Name `_ADMIT`'s (or `TAKE_SLOT`'s) reply: 1 admitted, 0 at the limit, minus the
    wait in ms when rate limited."""
    value = int(reply)
    if value < 0:
        return TurnAdmission(Admitted.RATE_LIMITED, -value)
    if value == 0:
        return TurnAdmission(Admitted.AT_LIMIT)
    if value == 1:
        return TurnAdmission(Admitted.ADMITTED)
    raise ValueError(f"no admission replies {value}")


def _raise_unless_counts_refused(replies: Sequence[Any], queued: bool) -> None:
    """Raise the first error among the replies of `finish`'s queue half, unless Redis at its
    maxmemory only refused to count the ending (the releases, ZREMs, always run): a full
    Redis loses a count, not the turn's release. `queued`: a delivery was queued too."""
    errors = [reply for reply in replies if isinstance(reply, Exception)]
    if not errors:
        return
    if queued or not all(isinstance(error, OutOfMemoryError) for error in errors):
        raise errors[0]
    logger.warning("turn ending not counted: %s", errors[0])


class TurnStore:
    """Creates, reads and moves turn records; the one place that writes a turn's status.

    `redis` is the data role, `queue` the queue role (the same client when one Redis holds
    both: then halves that need not wait on each other go in one pipeline).
    """

    def __init__(
        self,
        redis: Redis,
        *,
        retention_s: int,
        stream_maxlen: int,
        queue: Redis | None = None,
        queue_name: str | None = None,
    ) -> None:
        self.redis = redis
        self.queue = queue if queue is not None else redis
        # Where the jobs of turns waiting in a conversation's line are made due once it
        # moves (`advance`); None: nowhere (they start when their deferral ends).
        self.queue_name = queue_name
        self.retention_s = retention_s
        self.stream_maxlen = stream_maxlen
        self._one_client = self.queue is self.redis
        self.backend = backend_of(redis)
        # The owner's active turns: queued or running, each leaving the set when it ends
        # (`finish`), or at its deadline should that never happen.
        self._admit = self.queue.register_script(_ADMIT)
        self._take_slot = self.queue.register_script(TAKE_SLOT)
        self._finish = redis.register_script(FINISH)
        self.liveness = Liveness(self.queue)

    async def admit(
        self,
        owner: str,
        turn_id: str,
        *,
        limit: int,
        ttl_s: int,
        rate: Rate | None = None,
        beside: Callable[[Pipeline], None] | None = None,
    ) -> list[Any]:
        """Take the turn's tokens from the owner's bucket (`rate`; None: no limit) and count
        `turn_id` among the owner's queued and running turns, in one step; raise
        `RateLimitedError` when the bucket cannot pay, `TooManyTurnsError` when they
        already have `limit` turns. The entry leaves when the turn ends (`finish`), on
        `release`, or after `ttl_s` should neither happen. At the limit, the entries of
        turns that have ended (or that no worker will ever run: `settle`) without being
        released are dropped first: one a crash between the halves of a `finish` left
        behind.

        `beside` queues reads of the data role that go with the admission (its budgets:
        api/admission.py): in the admission's own pipeline when one Redis holds both roles,
        else at the same time; their replies are returned.
        """
        now = time.time()
        args: list[str | float | int] = [now, limit, turn_id, now + ttl_s, ttl_s]
        paid = [*args, *rate.args(rate.turn_cost, now)[1:]] if rate is not None else [*args, ""]
        slot_keys = [keys.active_turns(owner), keys.rate(owner)]
        read: list[Any] = []
        if beside is None:
            reply = await self._admit(keys=slot_keys, args=paid)
        elif self._one_client:
            async with self.queue.pipeline(transaction=False) as pipe:
                in_pipeline(pipe, _ADMIT, slot_keys, paid)
                beside(pipe)
                reply, *read = await pipe.execute()
        else:
            reply, read = await asyncio.gather(
                self._admit(keys=slot_keys, args=paid), self._read(beside)
            )
        admission = admission_of(reply)
        if admission.outcome is Admitted.RATE_LIMITED:
            raise RateLimitedError(admission.wait_ms)
        if admission.outcome is Admitted.AT_LIMIT and await self._release_ended(owner, ttl_s=ttl_s):
            # The tokens are spent already: only the slot is taken again.
            admission = admission_of(await self._take_slot(keys=slot_keys[:1], args=args))
        if admission.outcome is Admitted.AT_LIMIT:
            raise TooManyTurnsError(owner)
        return read

    async def _read(self, queue_reads: Callable[[Pipeline], None]) -> list[Any]:
        async with self.redis.pipeline(transaction=False) as pipe:
            queue_reads(pipe)
            return list(await pipe.execute())

    async def _release_ended(self, owner: str, *, ttl_s: int) -> bool:
        """Drop the owner's active entries whose turn has ended or is gone; whether any
        went. Only entries admitted over `STRANDED_AFTER_S` ago are looked at: a younger
        one may be a turn whose creation is under way (admitted, not stored yet). An
        entry's score is its admission plus `ttl_s`."""
        active = await self.queue.zrangebyscore(
            keys.active_turns(owner), "-inf", time.time() + ttl_s - STRANDED_AFTER_S
        )
        turn_ids = [raw.decode() for raw in active]
        statuses = await self.settle_many(turn_ids) if turn_ids else []
        ended_ids = [
            turn_id
            for turn_id, status in zip(turn_ids, statuses, strict=True)
            if status is None or status in TERMINAL_STATUSES
        ]
        if ended_ids:
            await self.queue.zrem(keys.active_turns(owner), *ended_ids)
        return bool(ended_ids)

    async def release(self, owner: str, turn_id: str) -> None:
        """Undo `admit` for a turn that was never created."""
        await self.queue.zrem(keys.active_turns(owner), turn_id)

    async def create(
        self,
        record: TurnRecord,
        *,
        ttl_s: int,
        queue_name: str | None,
        attachment: str | None = None,
        attachment_expiry: float = 0.0,
        defer_s: float = 0.0,
    ) -> str:
        """Store the record and open its stream with a `start` entry (one script), then
        enqueue its job on `queue_name` (None: no job), deferred `defer_s` (a turn waiting
        in its conversation's line: due once the line reaches it, `advance`); return the
        `start` entry's id.

        `attachment` counts a client as watching the turn from the start
        (api/attachments.py), until `attachment_expiry` (epoch seconds). `ttl_s` bounds a
        turn that no worker ever finishes; finishing resets it to retention. The turn also
        enters its owner's index (`recent`), which outlives every turn it lists. Should the
        enqueue fail, the turn is ended `turn_lost` before the error goes on.
        """
        stored = record.to_redis()
        counted = int(stored.get("counted", 0))
        fields = [item for pair in stored.items() for item in pair]
        webhook_url = record.request.delivery.webhook_url
        if webhook_url is not None and queue_name is not None:
            # Where its ending finds it (`finish`).
            subject = subject_of(record.request.delivery.encoding, record.id)
            fields += [TARGET_FIELD, Target(webhook_url, queue_name, subject).stored()]
        lapse_s = max(1, int(attachment_expiry - time.time()) + 1)
        index = keys.turns(record.owner)
        async with self.redis.pipeline(transaction=False) as pipe:
            in_pipeline(
                pipe,
                CREATE,
                [keys.turn(record.id), keys.events(record.id), keys.attached(record.id)],
                [
                    ttl_s,
                    encode(Start()),
                    attachment or "",
                    attachment_expiry,
                    lapse_s,
                    *fields,
                ],
            )
            pipe.zadd(index, {record.id: record.created_at})
            pipe.zremrangebyrank(index, 0, -keys.TURN_INDEX_MAX - 1)
            pipe.expire(index, ttl_s + self.retention_s)
            if counted:
                # Until the longest its record can live: `finish` moves it to the end's.
                until = time.time() + ttl_s + self.retention_s
                budgets.keep_turn(pipe, record.owner, record.id, counted, until=until)
            if queue_name is not None and self._one_client:
                enqueue(pipe, queue_name, record.id, record.owner, defer_s)
            start, *_ = await pipe.execute()
        start_id = start.decode() if isinstance(start, bytes) else str(start)
        if queue_name is None or self._one_client:
            return start_id
        try:
            async with self.queue.pipeline(transaction=False) as pipe:
                enqueue(pipe, queue_name, record.id, record.owner, defer_s)
                await pipe.execute()
        except BaseException:
            with contextlib.suppress(RedisError, OSError):
                await self.end(record.id, record.owner, Cause.NOT_CREATED)
            raise
        return start_id

    async def get(self, turn_id: str) -> TurnRecord | None:
        """The turn's record; None once it is gone or forgotten (`forget`)."""
        raw = await self.redis.hgetall(keys.turn(turn_id))  # type: ignore[misc]
        if not raw or b"forgotten" in raw:
            return None
        return TurnRecord.from_redis(raw)

    async def forget(self, owner: str, turn_ids: Sequence[str]) -> None:
        """Forget the owner's turns (their conversation was deleted): every read takes them
        for gone at once, and what their keys held of the conversation goes with it
        (shared/lifecycle.py, FORGET). End a turn that may still run first (`end`): its
        ending is what is left for the clients still reading it."""
        if not turn_ids:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for turn_id in turn_ids:
                in_pipeline(
                    pipe,
                    FORGET,
                    [
                        keys.turn(turn_id),
                        keys.events(turn_id),
                        keys.attached(turn_id),
                        keys.cancel(turn_id),
                        keys.lease(turn_id),
                    ],
                    [FORGET_GRACE_S, SEALED_ID],
                )
            pipe.zrem(keys.turns(owner), *turn_ids)
            budgets.forget_turns(pipe, owner, turn_ids)
            await pipe.execute()

    async def never_ran(self, turn_id: str, owner: str) -> bool:
        """Make sure a turn whose creation failed never runs: ended `turn_lost` if no worker
        took it yet; whether no worker ever did (its record is gone, or ended unclaimed)."""
        await self.end(turn_id, owner, Cause.NOT_CREATED)
        fields = ["status", "started_at"]
        status, started_at = await self.redis.hmget(keys.turn(turn_id), fields)  # type: ignore[misc]
        return status is None or (status.decode() in TERMINAL_STATUSES and not started_at)

    async def settle(self, turn_id: str) -> TurnStatus | None:
        """The turn's status, None once it is gone; first ends a turn that never can end
        on its own (shared/lifecycle.py, `stuck`), which is what makes it a write.

        Those are a turn `running` whose worker's liveness lapsed (`LEASE_LAPSED`, as a
        reaper would) and one still `queued` past `STRANDED_AFTER_S` with no job on the queue
        (`STRANDED`: its creation stopped between its halves, or a failover of the queue
        lost the job). Called by whoever waits on a quiet turn, so no turn waits forever on
        a worker that cannot come.
        """
        (status,) = await self.settle_many([turn_id])
        return status

    async def settle_many(self, turn_ids: Sequence[str]) -> list[TurnStatus | None]:
        """`settle` each turn, in order, with what decides each one's status read in one
        round trip (only the turns it ends, or may end, take more)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for turn_id in turn_ids:
                pipe.hmget(keys.turn(turn_id), ["status", "owner", "created_at", "worker"])
                # The lease a worker of before issue 25 renews (shared/lifecycle.py, `Guard`).
                pipe.exists(keys.lease(turn_id))
            replies = await pipe.execute()
        stored, leases = replies[::2], replies[1::2]
        # The workers of the running ones: whether each lives is on the queue role.
        workers = [
            _text(values[3]) if values[0] == b"running" and values[3] else "" for values in stored
        ]
        alive = await self.liveness.alive([w for w in workers if w])
        return [
            await self._settle_one(turn_id, values[:3], bool(lease) or worker in alive)
            for turn_id, values, lease, worker in zip(
                turn_ids, stored, leases, workers, strict=True
            )
        ]

    async def _settle_one(
        self, turn_id: str, stored: list[bytes | None], leased: bool
    ) -> TurnStatus | None:
        """`settle` one turn, from its stored status, owner and creation time and whether a
        live worker holds it."""
        raw_status, raw_owner, created_at = stored
        if raw_status is None:
            return None
        status, owner = TurnStatus(raw_status.decode()), raw_owner.decode() if raw_owner else ""
        now = time.time()
        cause = stuck(status, leased=leased, created_at=float(created_at or 0), now=now)
        if cause is Cause.STRANDED:
            async with self.queue.pipeline(transaction=False) as pipe:
                pipe.exists(job_key_prefix + turn_id)
                pipe.exists(in_progress_key_prefix + turn_id)
                job, taken = await pipe.execute()
            if job or taken:  # a worker will take it yet
                cause = None
        if cause is not None and await self.end(turn_id, owner, cause) is Finished.ENDED:
            return RULES[cause].status
        return status

    async def recent(
        self, owner: str, *, after: str | None = None, limit: int = 20
    ) -> tuple[list[TurnRecord], bool]:
        """The owner's turns, newest first, from just after the one with id `after`; at most
        `limit`, and whether more follow. A listed turn comes without its prompt. Entries of
        turns that expired are dropped from the index on the way."""
        index = keys.turns(owner)
        start = 0
        if after is not None:
            rank = await self.redis.zrevrank(index, after)
            if rank is None:
                return [], False
            start = rank + 1
        found: list[TurnRecord] = []
        gone: list[str] = []
        while len(found) <= limit:
            raw = await self.redis.zrevrange(index, start, start + limit)
            if not raw:
                break
            start += len(raw)
            turn_ids = [item.decode() for item in raw]
            async with self.redis.pipeline(transaction=False) as pipe:
                for turn_id in turn_ids:
                    pipe.hmget(keys.turn(turn_id), list(_LISTED_FIELDS))
                replies = await pipe.execute()
            for turn_id, values in zip(turn_ids, replies, strict=True):
                fields = {
                    name.encode(): value
                    for name, value in zip(_LISTED_FIELDS, values, strict=True)
                    if value is not None
                }
                if b"request" not in fields:
                    gone.append(turn_id)
                elif fields[b"owner"].decode() == owner:
                    found.append(TurnRecord.from_redis(fields))
        if gone:
            await self.redis.zrem(index, *gone)
        return found[:limit], len(found) > limit

    async def claim(self, turn_id: str, worker_id: str, overdue_s: float) -> Claim:
        """Move `queued` → `running` under `worker_id`, once the turn is on the reapers'
        lists: among the worker's turns, which are ended should its liveness lapse
        (shared/liveness.py), and in the running set, where it is overdue `overdue_s` from
        now whatever its worker (`reap_lapsed`)."""
        now = time.time()
        claim_keys = [keys.turn(turn_id), keys.cancel(turn_id)]
        claim_args = [worker_id, repr(now)]
        running = {turn_id: now + overdue_s}
        if self._one_client:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zadd(keys.RUNNING_TURNS, running)
                Liveness.claiming(pipe, worker_id, turn_id)
                in_pipeline(pipe, CLAIM, claim_keys, claim_args)
                *_, reply = await pipe.execute()
        else:
            async with self.queue.pipeline(transaction=False) as pipe:
                pipe.zadd(keys.RUNNING_TURNS, running)
                Liveness.claiming(pipe, worker_id, turn_id)
                await pipe.execute()
            async with self.redis.pipeline(transaction=False) as pipe:
                in_pipeline(pipe, CLAIM, claim_keys, claim_args)
                (reply,) = await pipe.execute()
        outcome = _claimed(reply[0])
        if outcome is not Claimed.CLAIMED:
            # A turn that ended while queued (a cancel, say) whose ending process died before
            # queueing its webhook: its job is the one thing left that finds it (FINISH).
            ended = outcome in TERMINAL_STATUSES
            webhook = Target.restored(reply[1]) if ended and len(reply) > 1 else None
            ending = await self._ending_of(turn_id) if webhook is not None else None
            async with self.queue.pipeline(transaction=False) as pipe:
                if outcome is not TurnStatus.RUNNING:  # ended or gone: nothing reaps it
                    pipe.zrem(keys.RUNNING_TURNS, turn_id)
                pipe.srem(keys.worker_turns(worker_id), turn_id)  # another worker's, or none's
                if webhook is not None and ending is not None:
                    enqueue_delivery(pipe, webhook, _text(reply[2]), turn_id, *ending)
                await pipe.execute()
            return Claim(outcome)
        fields = reply[2]
        record = TurnRecord.from_redis(dict(zip(fields[::2], fields[1::2], strict=True)))
        asked = reply[1]
        return Claim(outcome, record, cancel_requested=asked is not None, stop=Stop.of(asked))

    async def finish(
        self,
        turn_id: str,
        owner: str,
        done: Done,
        *,
        before: Sequence[Event] = (),
        result: TurnResult | None = None,
        guard: Guard = Guard.ALWAYS,
    ) -> Finished:
        """End the turn: append `before` then `done`, set status, start retention. Once only
        (shared/lifecycle.py, FINISH).

        `guard` `LAPSED` leaves alone a turn whose old worker still renews its lease; `QUEUED`
        one that a worker has taken. Then, unless the guard refused, release it on the queue
        (the running set, the owner's active turns) and, if this call ended it, count how it
        ended.
        """
        payloads = [encode(event) for event in [*before, done]]
        now = time.time()
        finish_keys = [
            keys.turn(turn_id),
            keys.events(turn_id),
            keys.lease(turn_id),
            keys.attached(turn_id),
        ]
        finish_args = [
            done.status,
            repr(now),
            orjson.dumps(done.error) if done.error else "",
            orjson.dumps(result) if result is not None else "",
            self.retention_s,
            self.stream_maxlen,
            guard,
            SEALED_ID,
            *payloads,
        ]
        # Its `done` entry, and what wakes the stream's readers.
        reply = await self.backend.run_and_wake(self._finish, finish_keys, finish_args, turn_id)
        # `ended` comes with the turn's webhook target when it has one, `over` when no
        # delivery job took it yet; `ended` with the bytes its owner's ledger counts; both
        # with its conversation, when it has one.
        listed = isinstance(reply, list)
        webhook = Target.restored(reply[1]) if listed and reply[1] else None
        counted = listed and len(reply) > 2 and reply[2] is not None
        conversation = _text(reply[3]) if listed and len(reply) > 3 and reply[3] else None
        finished = Finished(_text(reply[0] if listed else reply))
        if conversation is not None and finished in (Finished.ENDED, Finished.OVER):
            # Before the queue half: should this process die first, the turn stays on the
            # reapers' lists, and their ending ("over") moves the line on.
            await self._advance_quietly(owner, conversation, turn_id)
        ending: tuple[Done, float] | None = None
        if finished is Finished.OVER and webhook is not None:
            # The call that ended it may have died before its queue half (or be about to run
            # it): queued again, under the same job id, so at most one waits on the queue.
            ending = await self._ending_of(turn_id)
        if counted and not self._one_client:
            # The record now goes with the retention, and its count with it (on the data
            # role: with one Redis, beside the release below).
            async with self.redis.pipeline(transaction=False) as pipe:
                budgets.kept_until(pipe, owner, turn_id, now + self.retention_s)
                await pipe.execute()
        if finished is not Finished.REFUSED:
            async with self.queue.pipeline(transaction=False) as pipe:
                if counted and self._one_client:
                    budgets.kept_until(pipe, owner, turn_id, now + self.retention_s)
                pipe.zrem(keys.RUNNING_TURNS, turn_id)
                pipe.zrem(keys.active_turns(owner), turn_id)
                if finished is Finished.ENDED:
                    pipe.hincrby(keys.METRICS, done.status, 1)
                    if done.error:
                        pipe.hincrby(keys.METRICS, f"{done.status}:{done.error['code']}", 1)
                    if webhook is not None:
                        # The call that ended the turn queues its delivery; should it die
                        # first, the next call that finds the turn ended queues it (above).
                        enqueue_delivery(pipe, webhook, owner, turn_id, done, now)
                elif webhook is not None and ending is not None:
                    enqueue_delivery(pipe, webhook, owner, turn_id, *ending)
                try:
                    replies = await pipe.execute(raise_on_error=False)
                    _raise_unless_counts_refused(replies, webhook is not None)
                except BaseException:
                    if webhook is not None:
                        # Left pending in the record: the reaper's ending queues it.
                        logger.error("the webhook of turn %s was not queued yet", turn_id)
                    raise
        return finished

    async def _advance_quietly(self, owner: str, conversation_id: str, ended: str) -> None:
        """`advance`; a Redis failure is logged, not raised: the turn has ended whatever
        its line does, and the waiting turn's deferred job finds the line as it was."""
        try:
            await self.advance(owner, conversation_id, ended)
        except REDIS_ERRORS as exc:
            logger.warning(
                "conversation %s: the turn after %s was not started (%s)",
                conversation_id,
                ended,
                exc,
            )

    async def advance(self, owner: str, conversation_id: str, ended: str) -> Advance:
        """`ended` (a turn of the owner's conversation that has ended, or "" for no active
        turn) leaves the conversation's line; if it held the conversation, the first turn
        in line holds it now, and its job is made due (shared/conversation_state.py,
        `ADVANCE`)."""
        advanced = await conversation_machine.advance(self.redis, owner, conversation_id, ended)
        if advanced.holder is not None:
            await self.promote(advanced.holder)
        return advanced

    async def promote(self, turn_id: str) -> None:
        """Make the deferred job of `turn_id` due now (shared/queue.py `promote`)."""
        if self.queue_name is None:
            return
        async with self.queue.pipeline(transaction=False) as pipe:
            promote(pipe, self.queue_name, turn_id)
            await pipe.execute()

    async def take_turn(self, owner: str, conversation_id: str, turn_id: str) -> InLine:
        """Where `turn_id`, a turn that joined its conversation's line, stands: `HOLDS` the
        conversation, `WAITS` behind a turn that may still run, or is `OUT` of it (the
        conversation is gone, or the turn left the line). A holder found ended moves the
        line on first (`advance`): a move whoever ended it did not live to make is made
        here."""
        meta = keys.conversation(owner, conversation_id)
        for _ in range(3):  # the line moved between the read and the advance
            fields = ["active_turn", "active_since", "waiting"]
            active_raw, since, waiting = await self.redis.hmget(meta, fields)  # type: ignore[misc]
            active = _text(active_raw) if active_raw else None
            if active == turn_id:
                return InLine.HOLDS
            if turn_id not in _text(waiting or b"").split():
                return InLine.OUT
            now = time.time()
            if active is not None:
                status = await self.settle(active)
                if may_run(status, float(since) if since else None, now):
                    return InLine.WAITS
            await self.advance(owner, conversation_id, active or "")
        return InLine.WAITS

    async def _ending_of(self, turn_id: str) -> tuple[Done, float] | None:
        """The `done` an ended turn's stream closes with, and when the turn ended; None if
        its stream no longer holds it (forgotten, trimmed away)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xrange(keys.events(turn_id), SEALED_ID, SEALED_ID)
            pipe.hget(keys.turn(turn_id), "finished_at")
            entries, finished_at = await pipe.execute()
        if not entries or finished_at is None:
            return None
        done = decode(entries[0][1][b"e"]).event
        return (done, float(finished_at)) if isinstance(done, Done) else None

    async def end(
        self,
        turn_id: str,
        owner: str,
        cause: Cause,
        message: str | None = None,
        *,
        usage: dict[str, int] | None = None,
    ) -> Finished:
        """End the turn short of completing, as shared/lifecycle.py's `RULES[cause]` says
        (its code, under its guard), unless it already ended; `message` replaces the code's
        words, and `usage` goes into a `done` that carries it."""
        rule = RULES[cause]
        if rule.who is Who.READER:
            raise ValueError(f"{cause} is a reader's ending: nothing is written for it")
        *before, done = ending_events_of(cause, message, usage=usage)
        assert isinstance(done, Done)
        return await self.finish(turn_id, owner, done, before=before, guard=rule.guard)

    async def reap_lapsed(self, *, skip: Container[str] = (), limit: int = 50) -> list[str]:
        """End the turns of workers whose liveness lapsed (they died: `LEASE_LAPSED`), then
        running turns their live worker let go of (`LET_GO`: a negative score in the
        running set, shared/liveness.py), then those overdue whatever their worker (past
        the deadline their claim set: a claim or a finish cut off between its halves);
        return the ids of those this call ended, at most `limit` looked at.

        Any process may call this: the turn ends once, whoever gets there first. What it
        costs does not grow with the turns running: one look at each worker's liveness and
        one range of the running set; only a dead worker's turns are read one by one.
        """
        lost: list[str] = []
        for worker_id in await self.liveness.lapsed():
            turn_ids = [t for t in await self.liveness.turns_of(worker_id, limit) if t not in skip]
            if not turn_ids:
                await self.liveness.forget(worker_id)
                continue
            lost += await self.end_lapsed(turn_ids, worker_id=worker_id)
            limit -= len(turn_ids)
            if limit <= 0:
                return lost
        due = await self.queue.zrangebyscore(
            keys.RUNNING_TURNS, "-inf", time.time(), start=0, num=limit, withscores=True
        )
        let_go: list[str] = []
        overdue: list[str] = []
        for raw, score in due:
            turn_id = _text(raw)
            if turn_id not in skip:
                (let_go if score < 0 else overdue).append(turn_id)
        lost += await self.end_lapsed(let_go, cause=Cause.LET_GO)
        return lost + await self.end_lapsed(overdue)

    async def end_lapsed(
        self,
        turn_ids: Sequence[str],
        *,
        worker_id: str | None = None,
        cause: Cause = Cause.LEASE_LAPSED,
    ) -> list[str]:
        """End `turns_ids` for `cause` (`LEASE_LAPSED` or `LET_GO`), as a reaper does (those
        another process ended are left as they ended, and released), and let the worker
        `worker_id` go of them; log and return the ids of those this call ended."""
        if not turn_ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for turn_id in turn_ids:
                pipe.hget(keys.turn(turn_id), "owner")
            owners = await pipe.execute()
        lost, handled = [], []
        for turn_id, owner in zip(turn_ids, owners, strict=True):
            # No record: the finish script only drops what is left of it.
            name = owner.decode() if isinstance(owner, bytes) else (owner or "")
            try:
                finished = await self.end(turn_id, name, cause)
            except ResponseError as exc:
                # Its keys are not what a turn's are (a stream clobbered by another write): no
                # script can end it. Left on the running set, it would come first in every
                # sweep and stop every process's reaping here, so it leaves; its record
                # expires with its TTL.
                logger.error("turn %s cannot be ended (%s); no longer reaping it", turn_id, exc)
                await self.queue.zrem(keys.RUNNING_TURNS, turn_id)
                handled.append(turn_id)
                continue
            if finished is not Finished.REFUSED:
                handled.append(turn_id)
            if finished is Finished.ENDED:
                lost.append(turn_id)
                ending = RULES[cause]
                logger.warning(
                    "turn %s failed: %s",
                    turn_id,
                    _REAPED[cause],
                    extra={"turn_id": turn_id, "status": ending.status, "error": ending.code},
                )
        if worker_id is not None:
            await self.liveness.let_go(worker_id, handled)
        return lost


# What a reaper's log line says of a turn it ended, by cause.
_REAPED = {Cause.LEASE_LAPSED: "its worker was lost", Cause.LET_GO: "its worker let go of it"}


def _text(reply: bytes | str) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)
