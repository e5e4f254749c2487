"""Per-user timers, and the per-user event stream they report on.

A timer is a record (`keys.timers(owner)`: timer id → `{id, label, due_at, conversation_id,
state}`) and an arq job deferred to its due time on the queue the workers already run, so
it survives a worker restart: whichever worker is up when it is due runs `fire`. Firing is
once: the record moves `pending` → `fired` in one script, and a cancelled timer (state
`cancelled`) never fires. A fired timer rings at once on the owner's event stream (`GET
/v1/events`, whose key is `keys.events(keys.user_stream_id(owner))`), which a voice
satellite or a UI keeps open, and says so in the conversation it was set from (an assistant
message) once that conversation is idle (shared/conversation_state.py, `ANNOUNCE`): while a
turn runs on it, tool calls wait for the user's decision, or its history ends on calls the
next turn answers, the message would land among that turn's (between a call and its
results, a prompt no model takes), so a later job of the timer's tries again
(`ANNOUNCE_AFTER_S`, longer as the wait grows, for at most `ANNOUNCE_FOR_S`), until the
record says `announced`. The record says `heard` once the event is out: a job stopped after
the timer moved to `fired` (its worker shut down; the job runs again, worker/queue.py)
still publishes it, and says it, on its next run.
Rung and cancelled timers stay listed until a new timer needs their room (`MAX_TIMERS`).

Both keys live as long as conversations do after their last use. They are on the data
role; the timers' jobs on the queue role (shared/keys.py), which `queue` names when the
two are apart.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, cast

import orjson
from arq.connections import ArqRedis
from redis.asyncio import Redis

from shared import keys
from shared.backends import backend_of
from shared.conversation_state import ConversationMachine, Outcome, may_run
from shared.events import TimerFired, encode
from shared.queue import BackgroundKind, background_job_id
from shared.records.keeper import RecordKeeper
from shared.streams import STREAM_FIELD

FIRE_TIMER = "fire_timer"
MAX_TIMERS = 50
MAX_DURATION_S = 7 * 86_400
# What the owner's event stream keeps: the latest entries, for clients that reconnect.
EVENTS_MAXLEN = 1000
# A rung timer's message waits for its busy conversation: tried again after a tenth of the
# wait so far, between these bounds; given up a day after it rang (the event stream told
# the user at once).
ANNOUNCE_AFTER_S = (1.0, 60.0)
ANNOUNCE_FOR_S = 86_400.0

# The one grammar of a duration: parts of an ASCII number (whole, or with up to three
# decimals) and its unit, apart or together ("1h30m"), joined by spaces, commas or "and",
# after an optional "in" or "for". A lone number is seconds. Nothing else: no sign, no
# exponent, no digit of another script (`\d` would take "٥"), no word around it.
_NUMBER = r"[0-9]{1,7}(?:\.[0-9]{1,3})?"
_UNIT = r"days|day|d|hours|hour|hrs|hr|h|minutes|minute|mins|min|m|seconds|second|secs|sec|s"
_PART = rf"{_NUMBER}[ \t]*(?:{_UNIT})"
_DURATION = re.compile(
    rf"[ \t]*(?:(?:in|for)[ \t]+)?(?:{_NUMBER}|{_PART}(?:(?:[ \t]*,[ \t]*(?:and[ \t]+)?"
    rf"|[ \t]+and[ \t]+|[ \t]*){_PART})*)[ \t]*",
    re.ASCII | re.IGNORECASE,
)
_PARTS = re.compile(rf"({_NUMBER})[ \t]*({_UNIT})?", re.ASCII | re.IGNORECASE)
# The same parts inside a sentence ("set a timer for 5 minutes for the pasta").
_WITHIN = re.compile(
    rf"(?<![0-9A-Za-z.+-]){_PART}(?:(?:[ \t]*,[ \t]*(?:and[ \t]+)?|[ \t]+and[ \t]+|[ \t]*){_PART})*"
    r"(?![0-9A-Za-z])",
    re.ASCII | re.IGNORECASE,
)
_MAX_DURATION_CHARS = 100
_UNIT_S = {"d": 86_400, "h": 3600, "m": 60, "s": 1}


class TimerError(ValueError):
    """A timer cannot be set (bad duration, too many timers)."""


@dataclass(slots=True)
class Timer:
    id: str
    label: str
    due_at: float
    conversation_id: str | None
    state: str = "pending"  # pending, fired or cancelled
    # Whether the owner's event stream, and its conversation, hold the news that it rang
    # (`fire_timer`).
    heard: bool = False
    announced: bool = False


def parse_duration(text: str) -> float:
    """Seconds in "90", "90s", "5 minutes", "1h 30m", "2.5 min", "1 hour and 20 seconds".

    Raises `TimerError`, with what the model should say instead, for anything else (the
    grammar above), for zero, and for more than seven days."""
    if len(text) > _MAX_DURATION_CHARS or not _DURATION.fullmatch(text):
        raise TimerError(
            f"{text[:60]!r} is not a duration: say e.g. '5 minutes', '90s' or '1h 30m' "
            "(numbers in digits 0-9, each with its unit)"
        )
    total = sum(
        float(number) * _UNIT_S[(unit or "s")[0].lower()] for number, unit in _PARTS.findall(text)
    )
    if total <= 0:
        raise TimerError("a timer needs a duration above zero")
    if total > MAX_DURATION_S:
        raise TimerError("a timer may run at most 7 days")
    return total


def duration_in(sentence: str) -> str | None:
    """The first duration with its units in the first 200 characters of `sentence`, as
    `parse_duration` reads it ("5 minutes" in "set a timer for 5 minutes"), or None."""
    found = _WITHIN.search(sentence[:200])
    return found[0] if found else None


class TimerStore:
    """One user's timers."""

    def __init__(
        self,
        redis: Redis,
        owner: str,
        *,
        retention_s: int,
        queue_name: str,
        queue: ArqRedis | None = None,
    ) -> None:
        self.redis = redis
        self.queue: ArqRedis = queue if queue is not None else cast(ArqRedis, redis)
        self.owner = owner
        self.key = keys.timers(owner)
        self.retention_s = retention_s
        self.queue_name = queue_name

    async def set(self, seconds: float, label: str, conversation_id: str | None) -> Timer:
        """Record the timer and queue the job that fires it; `TimerError` when the owner
        has `MAX_TIMERS` running (checked and recorded in one script, so concurrent calls
        cannot overrun it)."""
        timer = Timer(
            id=f"timer_{uuid.uuid4().hex[:10]}",
            label=label.strip()[:100] or "timer",
            due_at=time.time() + seconds,
            conversation_id=conversation_id,
        )
        ttl_s = max(self.retention_s, int(seconds) + 3600)
        added = await self.redis.eval(  # type: ignore[misc]
            _ADD, 1, self.key, timer.id, orjson.dumps(timer).decode(), str(MAX_TIMERS), str(ttl_s)
        )
        if not added:
            raise TimerError(f"you already have {MAX_TIMERS} timers running")
        await self.queue.enqueue_job(
            FIRE_TIMER,
            self.owner,
            timer.id,
            _job_id=background_job_id(BackgroundKind.TIMER, self.owner, timer.id),
            _queue_name=self.queue_name,
            _defer_until=datetime.fromtimestamp(timer.due_at, UTC),
        )
        return timer

    async def all(self) -> list[Timer]:
        raw = await self.redis.hvals(self.key)  # type: ignore[misc]
        return sorted((Timer(**orjson.loads(v)) for v in raw), key=lambda t: t.due_at)

    async def cancel(self, timer_id: str) -> Timer | None:
        """Cancel a pending timer; the timer as it now stands, None if there is none."""
        moved, timer = await self.move(timer_id, "cancelled")
        if moved:
            # Its job may still run when due (it was already taken): it finds it cancelled.
            job_id = background_job_id(BackgroundKind.TIMER, self.owner, timer_id)
            await self.queue.zrem(self.queue_name, job_id)
        return timer

    async def mark(self, timer_id: str, flag: str) -> None:
        """Set the timer's `flag` ("heard", "announced"): that news of it is out."""
        await self.redis.eval(_MARK, 1, self.key, timer_id, flag)  # type: ignore[misc]

    async def announce_later(self, timer: Timer, delay_s: float) -> None:
        """Queue a job of the timer that tries its message again in `delay_s` (its own id:
        the job that asks is still running)."""
        due = time.time() + delay_s
        key = f"{timer.id}.{round(due * 1000)}"
        await self.queue.enqueue_job(
            FIRE_TIMER,
            self.owner,
            timer.id,
            _job_id=background_job_id(BackgroundKind.TIMER, self.owner, key),
            _queue_name=self.queue_name,
            _defer_until=datetime.fromtimestamp(due, UTC),
        )

    async def move(self, timer_id: str, state: str) -> tuple[bool, Timer | None]:
        """`pending` → `state`, once: whether this call moved it, and the timer as it now
        stands (None if there is no such timer)."""
        reply = await self.redis.eval(_MOVE, 1, self.key, timer_id, state)  # type: ignore[misc]
        if not reply:
            return False, None
        return bool(int(reply[0])), Timer(**orjson.loads(reply[1]))


# KEYS: timers. ARGV: timer id, timer, limit, TTL s. Records the timer unless `limit` are
# pending; rung and cancelled timers are kept to be listed until room is needed, then
# dropped. Returns 1 recorded, 0 at the limit.
_ADD = """
local limit = tonumber(ARGV[3])
if redis.call('HLEN', KEYS[1]) >= limit then
  local all = redis.call('HGETALL', KEYS[1])
  local done = {}
  for i = 1, #all, 2 do
    if cjson.decode(all[i + 1])['state'] ~= 'pending' then done[#done + 1] = all[i] end
  end
  if #all / 2 - #done >= limit then return 0 end
  if #done > 0 then redis.call('HDEL', KEYS[1], unpack(done)) end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""

# KEYS: timers. ARGV: timer id, flag. Sets the timer's flag (nothing when it is gone).
_MARK = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
local timer = cjson.decode(raw)
timer[ARGV[2]] = true
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(timer))
return 1
"""

# KEYS: timers. ARGV: timer id, new state. Moves a pending timer to the new state. Returns
# {1 moved now or 0 not pending, the timer as it stands}, nil when there is no such timer.
_MOVE = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return false end
local timer = cjson.decode(raw)
if timer['state'] ~= 'pending' then return {0, raw} end
timer['state'] = ARGV[2]
local updated = cjson.encode(timer)
redis.call('HSET', KEYS[1], ARGV[1], updated)
return {1, updated}
"""


async def fire_timer(
    redis: Redis,
    owner: str,
    timer_id: str,
    *,
    retention_s: int,
    queue_name: str,
    queue: ArqRedis | None = None,
) -> str:
    """The job a timer's due time runs: fire it once, unless it was cancelled, and say so in
    its conversation once that is idle (a later job of the timer tries again while it is
    busy). Returns the timer's state after ("fired", "cancelled") or "missing"."""
    store = TimerStore(redis, owner, retention_s=retention_s, queue_name=queue_name, queue=queue)
    moved, timer = await store.move(timer_id, "fired")
    if timer is None:
        return "missing"
    said = timer.announced or timer.conversation_id is None
    if not moved and (timer.state != "fired" or (timer.heard and said)):
        return timer.state  # cancelled, or rung and said by an earlier run of its jobs
    # Said first when it can be: a client the event wakes finds the message in place.
    outcome = Outcome.ANNOUNCED
    if not said:
        outcome = await _announce(redis, owner, timer, retention_s)
    if not timer.heard:  # the user hears it now, wherever they listen
        await publish(
            redis,
            owner,
            TimerFired(
                timer_id=timer.id,
                label=timer.label,
                conversation_id=timer.conversation_id,
                due_at=timer.due_at,
            ),
            retention_s=retention_s,
        )
        await store.mark(timer.id, "heard")
    if outcome in (Outcome.BUSY, Outcome.AWAITING_DECISION, Outcome.OPEN_CALLS):
        waited = time.time() - timer.due_at
        if waited < ANNOUNCE_FOR_S:
            low, high = ANNOUNCE_AFTER_S
            await store.announce_later(timer, min(high, max(low, waited / 10)))
    elif not said:
        # Said, or its conversation is gone (a deleted one is not recreated: the event
        # stream told the user).
        await store.mark(timer.id, "announced")
    return "fired"


async def _announce(redis: Redis, owner: str, timer: Timer, retention_s: int) -> Outcome:
    """The timer's message into its conversation, if that is idle."""
    assert timer.conversation_id is not None
    conversation = await RecordKeeper(redis, owner, retention_s=retention_s).get_conversation(
        timer.conversation_id
    )
    if conversation is None:
        return Outcome.NOT_FOUND
    ended = None
    if conversation.active_turn is not None:
        # The record of the turn that last held it says whether it may still run (the
        # script cannot read it: another hash slot).
        status = await redis.hget(keys.turn(conversation.active_turn), "status")  # type: ignore[misc]
        turn_status = status.decode() if isinstance(status, bytes) else status
        if not may_run(turn_status, conversation.active_since, time.time()):
            ended = conversation.active_turn
    message = {"role": "assistant", "content": f"⏰ Your timer “{timer.label}” is done."}
    machine = ConversationMachine(redis, owner, retention_s=retention_s)
    return await machine.announce(timer.conversation_id, message, ended=ended)


async def publish(redis: Redis, owner: str, event: Any, *, retention_s: int) -> None:
    """Append an event to the owner's event stream (`GET /v1/events`)."""
    stream_id, payload = keys.user_stream_id(owner), encode(event)
    async with redis.pipeline(transaction=False) as pipe:
        backend_of(redis).append(
            pipe, stream_id, STREAM_FIELD, [payload], maxlen=EVENTS_MAXLEN, expire_s=retention_s
        )
        await pipe.execute()


def public(timer: Timer) -> dict[str, Any]:
    return asdict(timer)
