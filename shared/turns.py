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
from shared.events import TERMINAL_STATUSES, Done, Error, Event, Start, TurnStatus, encode
from shared.queue import enqueue

TurnKind = Literal["chat", "completion"]
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
    max_tokens: int | None = None
    temperature: float | None = None
    stop: list[str] | None = None


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
            "request": orjson.dumps(asdict(self.request)),
        }
        if self.conversation_id:
            fields["conversation_id"] = self.conversation_id
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

        return cls(
            id=data["id"].decode(),
            owner=data["owner"].decode(),
            model=data["model"].decode(),
            status=data["status"].decode(),  # type: ignore[arg-type]
            request=TurnRequest(**orjson.loads(data["request"])),
            created_at=float(data["created_at"]),
            conversation_id=data["conversation_id"].decode() if "conversation_id" in data else None,
            started_at=number("started_at"),
            finished_at=number("finished_at"),
            error=json_field("error"),
            result=json_field("result"),
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

# KEYS: turn, events, lease, cancel, attached.
# ARGV: status, finished_at, error json, result json, retention s, maxlen, lapsed-only flag,
# payload... Appends the payloads (the last is `done`) only if the turn has not ended yet,
# and with the flag set only if no worker holds the lease. Returns 1 ended, 0 already
# ended or missing, 2 lease still held.
_FINISH = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  -- The record is gone (a Redis restart lost it): drop what the worker wrote since, which
  -- nothing can read without the record and which would never expire.
  redis.call('DEL', KEYS[2])
  return 0
end
if status == 'completed' or status == 'failed' or status == 'cancelled' then return 0 end
if ARGV[7] == '1' and redis.call('EXISTS', KEYS[3]) == 1 then return 2 end
for i = 8, #ARGV do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'e', ARGV[i])
end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'finished_at', ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'error', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'result', ARGV[4]) end
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('DEL', KEYS[3])
redis.call('EXPIRE', KEYS[4], ARGV[5])
redis.call('DEL', KEYS[5])
return 1
"""


# KEYS: lease, cancel, turn. ARGV: worker id, lease ms. Renews the lease and says whether
# the turn should go on: 0 yes, 1 somebody asked it to stop, 2 it is over for this worker:
# its record is gone (a Redis restart without persistence lost it) or another process
# already ended it (a reaper that took a stalled worker for dead).
_RENEW = """
local status = redis.call('HGET', KEYS[3], 'status')
if (not status) or status == 'completed' or status == 'failed' or status == 'cancelled' then
  return 2
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
return 0
"""
RENEWED, CANCEL_REQUESTED, TURN_OVER = 0, 1, 2


@dataclass(slots=True)
class Claim:
    """What claiming a turn found: "claimed" with the record, or the status that refused."""

    outcome: str
    record: TurnRecord | None = None
    cancel_requested: bool = False


class TurnStore:
    """Creates, reads and moves turn records; the one place that writes a turn's status."""

    def __init__(self, redis: Redis, *, retention_s: int, stream_maxlen: int) -> None:
        self.redis = redis
        self.retention_s = retention_s
        self.stream_maxlen = stream_maxlen
        self._claim = redis.register_script(_CLAIM)
        self._finish = redis.register_script(_FINISH)
        self._renew = redis.register_script(_RENEW)

    async def create(self, record: TurnRecord, *, ttl_s: int, queue_name: str | None) -> None:
        """Store the record, open its stream with a `start` entry and enqueue its job on
        `queue_name` (None: no job), in one transaction and one round trip.

        `ttl_s` bounds a turn that no worker ever finishes; finishing resets it to retention.
        """
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.turn(record.id), mapping=record.to_redis())
            pipe.expire(keys.turn(record.id), ttl_s)
            pipe.xadd(keys.events(record.id), {STREAM_FIELD: encode(Start())})
            pipe.expire(keys.events(record.id), ttl_s)
            if queue_name is not None:
                enqueue(pipe, queue_name, record.id)
            await pipe.execute()

    async def get(self, turn_id: str) -> TurnRecord | None:
        raw = await self.redis.hgetall(keys.turn(turn_id))  # type: ignore[misc]
        return TurnRecord.from_redis(raw) if raw else None

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
        done: Done,
        *,
        before: Sequence[Event] = (),
        result: dict[str, Any] | None = None,
        only_if_lease_lapsed: bool = False,
    ) -> bool:
        """End the turn: append `before` then `done`, set status, start retention. Once only.

        With `only_if_lease_lapsed`, a turn whose worker still renews its lease is left alone.
        """
        payloads = [encode(event) for event in [*before, done]]
        ended = await self._finish(
            keys=[
                keys.turn(turn_id),
                keys.events(turn_id),
                keys.lease(turn_id),
                keys.cancel(turn_id),
                keys.attached(turn_id),
            ],
            args=[
                done.status,
                repr(time.time()),
                orjson.dumps(done.error) if done.error else "",
                orjson.dumps(result) if result is not None else "",
                self.retention_s,
                self.stream_maxlen,
                "1" if only_if_lease_lapsed else "0",
                *payloads,
            ],
        )
        if ended != 2:
            await self.redis.zrem(keys.RUNNING_TURNS, turn_id)
        return ended == 1

    async def fail(
        self, turn_id: str, message: str, code: str, *, only_if_lease_lapsed: bool = False
    ) -> bool:
        """End the turn `failed` with an error event, unless it already ended."""
        return await self.finish(
            turn_id,
            failed_done(message, code),
            before=[Error(message=message, code=code)],
            only_if_lease_lapsed=only_if_lease_lapsed,
        )

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
        lost = []
        for raw in due:
            turn_id = raw.decode()
            if turn_id in skip:
                continue
            if await self.fail(
                turn_id,
                "the worker running this turn stopped responding",
                "worker_lost",
                only_if_lease_lapsed=True,
            ):
                lost.append(turn_id)
        return lost


def failed_done(message: str, code: str) -> Done:
    """The terminal event of a failed turn, carrying the error the client will see."""
    return Done(status="failed", error={"message": message, "type": "server_error", "code": code})
