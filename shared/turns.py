"""Turn records in Redis, and the atomic moves between their states.

A turn is `queued` when the API creates it, `running` once a worker claims it, and ends
`completed`, `failed` or `cancelled`. Claiming and finishing are Lua scripts over the
turn's own keys (one hash slot), so a worker, the lease reaper and a cancel can race and
still exactly one of them ends the turn, with exactly one `done` entry in its stream.
"""

from __future__ import annotations

import time
from collections.abc import Container, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import orjson
from redis.asyncio import Redis

from shared import keys
from shared.endings import ended
from shared.errors import ErrorCode
from shared.events import TERMINAL_STATUSES, Done, Error, Event, Start, TurnStatus, encode
from shared.queue import enqueue

# How the turn's events reach clients: OpenAI chat chunks, legacy text completions, or
# the conversation endpoints' named events (api/encoding.py).
TurnKind = Literal["chat", "completion", "conversation"]
ToolEventsMode = Literal["bernard", "delta", "none"]
DisconnectPolicy = Literal["cancel", "continue"]
STREAM_FIELD = "e"


@dataclass(slots=True)
class TurnRequest:
    """What the worker needs to run a turn, as validated by the API."""

    messages: list[dict[str, Any]]
    kind: TurnKind = "chat"
    stream: bool = True
    include_usage: bool = False
    tool_events: ToolEventsMode = "bernard"
    trace: bool = False
    on_disconnect: DisconnectPolicy = "cancel"
    background: bool = False
    # Sampling and cost options, passed to the response model as the client sent them.
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None
    # Continuing a paused turn: {"turn_id", "decisions": [{confirmation_id, tool_call,
    # decision, arguments?}]} (worker/harness/resume.py).
    resume: dict[str, Any] | None = None

    def sampling(self) -> dict[str, Any]:
        """The sampling options the client set, as model call keyword arguments."""
        return {
            name: value for name in SAMPLING_OPTIONS if (value := getattr(self, name)) is not None
        }


SAMPLING_OPTIONS = (
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "user",
)


@dataclass(slots=True)
class TurnRecord:
    """The turn hash, as one object."""

    id: str
    owner: str
    request: TurnRequest
    model: str
    created_at: float = field(default_factory=time.time)
    status: TurnStatus = "queued"
    conversation_id: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    error: dict[str, str] | None = None
    result: dict[str, Any] | None = None
    # The W3C trace context of the request that created the turn (tracing on): the worker
    # continues that trace (shared/traces.py).
    traceparent: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def to_redis(self) -> dict[str, bytes | str]:
        fields: dict[str, bytes | str] = {
            "id": self.id,
            "owner": self.owner,
            "model": self.model,
            "status": self.status,
            "created_at": repr(self.created_at),
            # The messages apart: the worker needs them once, and ending the turn drops them
            # (`_FINISH`), so a finished turn keeps its options but not its whole prompt.
            "request": orjson.dumps({**asdict(self.request), "messages": []}),
            "messages": orjson.dumps(self.request.messages),
        }
        if self.conversation_id:
            fields["conversation_id"] = self.conversation_id
        if self.traceparent:
            fields["traceparent"] = self.traceparent
        return fields

    @classmethod
    def from_redis(cls, raw: dict[bytes, bytes]) -> TurnRecord:
        data = {k.decode(): v for k, v in raw.items()}

        def number(name: str) -> float | None:
            value = data.get(name)
            return float(value) if value else None

        def json_field(name: str) -> Any:
            value = data.get(name)
            return orjson.loads(value) if value else None

        request = orjson.loads(data["request"])
        if "messages" in data:
            request["messages"] = orjson.loads(data["messages"])
        return cls(
            id=data["id"].decode(),
            owner=data["owner"].decode(),
            model=data["model"].decode(),
            status=data["status"].decode(),  # type: ignore[arg-type]
            request=TurnRequest(**request),
            created_at=float(data["created_at"]),
            conversation_id=data["conversation_id"].decode() if "conversation_id" in data else None,
            started_at=number("started_at"),
            finished_at=number("finished_at"),
            error=json_field("error"),
            result=json_field("result"),
            traceparent=data["traceparent"].decode() if "traceparent" in data else None,
        )


# KEYS: turn, lease, cancel, running turns. ARGV: turn id, worker id, now, lease ms, lease
# deadline. Moves `queued` → `running` under a lease and returns {"claimed", whether a
# cancel is already asked for, the record's fields}; else {the status found or "missing"}.
# One round trip for everything a worker needs before the turn's first model call.
_CLAIM = """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' then return {status or 'missing'} end
redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[3])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[4])
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[1])
return {'claimed', redis.call('EXISTS', KEYS[3]), redis.call('HGETALL', KEYS[1])}
"""

# KEYS: the owner's active turns. ARGV: now, limit, turn id, deadline, ttl s.
# Counts the owner's turns that are queued or running (each leaves the set when it ends,
# see _FINISH, or at its deadline should that never happen) and admits one more below the
# limit. Returns 1 admitted, 0 at the limit.
_ADMIT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""

# The id of every turn's `done` entry: the largest a Redis Stream entry can have. Once it
# is in, Redis refuses every later `XADD *` to the stream ("exhausted the last possible
# ID"): a worker that was taken for dead and wakes up cannot append after the turn's end,
# and it costs no command beyond the XADD itself (shared/streams.py).
SEALED_ID = f"{2**64 - 1}-{2**64 - 1}"

# KEYS: turn, events, lease, cancel, attached, the owner's active turns, metrics.
# ARGV: status, finished_at, error json, result json, retention s, maxlen, condition,
# turn id, sealed id, payload... Appends the payloads (the last is `done`, under the sealed
# id) and drops the request's messages (the prompt: the conversation keeps them) only if
# the turn has not ended yet and the condition holds: '' always, 'lapsed' only
# if no worker holds the lease, 'queued' only if no worker took the turn yet. Returns 1
# ended, 0 already ended or missing, 2 the condition failed.
_FINISH = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  -- The record is gone (a Redis restart lost it): drop what the worker wrote since, which
  -- nothing can read without the record and which would never expire.
  redis.call('DEL', KEYS[2])
  redis.call('ZREM', KEYS[6], ARGV[8])
  return 0
end
if status ~= 'queued' and status ~= 'running' then return 0 end
if ARGV[7] == 'lapsed' and redis.call('EXISTS', KEYS[3]) == 1 then return 2 end
if ARGV[7] == 'queued' and status ~= 'queued' then return 2 end
for i = 10, #ARGV do
  local id = '*'
  if i == #ARGV then id = ARGV[9] end
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], id, 'e', ARGV[i])
end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'finished_at', ARGV[2])
redis.call('HDEL', KEYS[1], 'messages')
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'error', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'result', ARGV[4]) end
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('DEL', KEYS[3])
redis.call('EXPIRE', KEYS[4], ARGV[5])
redis.call('DEL', KEYS[5])
redis.call('ZREM', KEYS[6], ARGV[8])
redis.call('HINCRBY', KEYS[7], ARGV[1], 1)
if ARGV[3] ~= '' then
  redis.call('HINCRBY', KEYS[7], ARGV[1] .. ':' .. cjson.decode(ARGV[3])['code'], 1)
end
return 1
"""


# KEYS: lease, cancel, turn. ARGV: worker id, lease ms. Renews the lease and says whether
# the turn should go on: 0 yes, 1 somebody asked it to stop, 2 it is over for this worker:
# its record is gone (a Redis restart without persistence lost it) or another process
# already ended it (a reaper that took a stalled worker for dead).
_RENEW = """
local status = redis.call('HGET', KEYS[3], 'status')
if status ~= 'running' then return 2 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
return 0
"""
RENEWED, CANCEL_REQUESTED, TURN_OVER = 0, 1, 2

FinishCondition = Literal["", "lapsed", "queued"]


@dataclass(slots=True)
class Claim:
    """What claiming a turn found: "claimed" with the record, or the status that refused."""

    outcome: str
    record: TurnRecord | None = None
    cancel_requested: bool = False


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
)


class TooManyTurnsError(Exception):
    """The owner already has as many queued and running turns as they may."""


class TurnStore:
    """Creates, reads and moves turn records; the one place that writes a turn's status."""

    def __init__(self, redis: Redis, *, retention_s: int, stream_maxlen: int) -> None:
        self.redis = redis
        self.retention_s = retention_s
        self.stream_maxlen = stream_maxlen
        self._claim = redis.register_script(_CLAIM)
        self._admit = redis.register_script(_ADMIT)
        self._finish = redis.register_script(_FINISH)
        self._renew = redis.register_script(_RENEW)

    async def admit(self, owner: str, turn_id: str, *, limit: int, ttl_s: int) -> None:
        """Count `turn_id` among the owner's queued and running turns, or raise
        `TooManyTurnsError` when they already have `limit`. The entry leaves when the turn
        ends (`finish`), on `release`, or after `ttl_s` should neither happen."""
        now = time.time()
        admitted = await self._admit(
            keys=[keys.active_turns(owner)], args=[now, limit, turn_id, now + ttl_s, ttl_s]
        )
        if not int(admitted):
            raise TooManyTurnsError(owner)

    async def release(self, owner: str, turn_id: str) -> None:
        """Undo `admit` for a turn that was never created."""
        await self.redis.zrem(keys.active_turns(owner), turn_id)

    async def create(
        self,
        record: TurnRecord,
        *,
        ttl_s: int,
        queue_name: str | None,
        attachment: str | None = None,
        attachment_expiry: float = 0.0,
    ) -> None:
        """Store the record, open its stream with a `start` entry and enqueue its job on
        `queue_name` (None: no job), in one transaction.

        `attachment` counts a client as watching the turn from the start
        (api/attachments.py), until `attachment_expiry` (epoch seconds). `ttl_s` bounds a
        turn that no worker ever finishes; finishing resets it to retention. The turn also
        enters its owner's index (`recent`), which outlives every turn it lists.
        """
        index = keys.turns(record.owner)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.turn(record.id), mapping=record.to_redis())
            pipe.expire(keys.turn(record.id), ttl_s)
            pipe.zadd(index, {record.id: record.created_at})
            pipe.zremrangebyrank(index, 0, -keys.TURN_INDEX_MAX - 1)
            pipe.expire(index, ttl_s + self.retention_s)
            pipe.xadd(keys.events(record.id), {STREAM_FIELD: encode(Start())})
            pipe.expire(keys.events(record.id), ttl_s)
            if attachment is not None:
                pipe.zadd(keys.attached(record.id), {attachment: attachment_expiry})
                lapse_s = max(1, int(attachment_expiry - time.time()) + 1)
                pipe.expire(keys.attached(record.id), lapse_s)
            if queue_name is not None:
                enqueue(pipe, queue_name, record.id)
            await pipe.execute()

    async def get(self, turn_id: str) -> TurnRecord | None:
        raw = await self.redis.hgetall(keys.turn(turn_id))  # type: ignore[misc]
        return TurnRecord.from_redis(raw) if raw else None

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

    async def claim(self, turn_id: str, worker_id: str, lease_ttl_s: float) -> Claim:
        """Move `queued` → `running` under a lease (and onto the reapers' list)."""
        now = time.time()
        reply = await self._claim(
            keys=[
                keys.turn(turn_id),
                keys.lease(turn_id),
                keys.cancel(turn_id),
                keys.RUNNING_TURNS,
            ],
            args=[turn_id, worker_id, repr(now), int(lease_ttl_s * 1000), now + lease_ttl_s],
        )
        outcome = reply[0].decode()
        if outcome != "claimed":
            return Claim(outcome)
        fields = reply[2]
        record = TurnRecord.from_redis(dict(zip(fields[::2], fields[1::2], strict=True)))
        return Claim(outcome, record, cancel_requested=bool(reply[1]))

    async def finish(
        self,
        turn_id: str,
        owner: str,
        done: Done,
        *,
        before: Sequence[Event] = (),
        result: dict[str, Any] | None = None,
        condition: FinishCondition = "",
    ) -> bool:
        """End the turn: append `before` then `done`, set status, start retention. Once only.

        `condition` "lapsed" leaves alone a turn whose worker still renews its lease;
        "queued" one that a worker has taken.
        """
        payloads = [encode(event) for event in [*before, done]]
        ended_now = await self._finish(
            keys=[
                keys.turn(turn_id),
                keys.events(turn_id),
                keys.lease(turn_id),
                keys.cancel(turn_id),
                keys.attached(turn_id),
                keys.active_turns(owner),
                keys.METRICS,
            ],
            args=[
                done.status,
                repr(time.time()),
                orjson.dumps(done.error) if done.error else "",
                orjson.dumps(result) if result is not None else "",
                self.retention_s,
                self.stream_maxlen,
                condition,
                turn_id,
                SEALED_ID,
                *payloads,
            ],
        )
        if ended_now != 2:
            await self.redis.zrem(keys.RUNNING_TURNS, turn_id)
        return bool(ended_now == 1)

    async def end(
        self,
        turn_id: str,
        owner: str,
        code: ErrorCode,
        message: str | None = None,
        *,
        condition: FinishCondition = "",
    ) -> bool:
        """End the turn short of completing, as `ENDINGS[code]` says, unless it already ended.

        A failed turn's stream also gets a non-fatal-style `error` event before its `done`,
        for clients that show Bernard's events but not the terminal frame.
        """
        done = ended(code, message)
        before: list[Event] = []
        if done.status == "failed" and done.error is not None:
            before.append(Error(message=done.error["message"], code=code))
        return await self.finish(turn_id, owner, done, before=before, condition=condition)

    async def renew(
        self, turn_ids: Sequence[str], worker_id: str, lease_ttl_s: float
    ) -> dict[str, int]:
        """Renew the leases of `turn_ids` in one round trip; each maps to RENEWED,
        CANCEL_REQUESTED or TURN_OVER."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for turn_id in turn_ids:
                await self._renew(
                    keys=[keys.lease(turn_id), keys.cancel(turn_id), keys.turn(turn_id)],
                    args=[worker_id, int(lease_ttl_s * 1000)],
                    client=pipe,
                )
            replies = await pipe.execute()
        return dict(zip(turn_ids, (int(r) for r in replies), strict=True))

    async def reap_lapsed(self, *, skip: Container[str] = (), limit: int = 50) -> list[str]:
        """Fail running turns whose lease lapsed (their worker died); return their ids.

        Any process may call this: the turn ends once, whoever gets there first, and a
        turn whose worker renewed its lease meanwhile is left alone.
        """
        due = await self.redis.zrangebyscore(
            keys.RUNNING_TURNS, "-inf", time.time(), start=0, num=limit
        )
        candidates = [raw.decode() for raw in due if raw.decode() not in skip]
        if not candidates:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for turn_id in candidates:
                pipe.hget(keys.turn(turn_id), "owner")
            owners = await pipe.execute()
        lost = []
        for turn_id, owner in zip(candidates, owners, strict=True):
            # No record: the finish script only drops what is left of it.
            name = owner.decode() if isinstance(owner, bytes) else (owner or "")
            if await self.end(turn_id, name, ErrorCode.WORKER_LOST, condition="lapsed"):
                lost.append(turn_id)
        return lost
