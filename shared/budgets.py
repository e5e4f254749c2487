"""What one user may store, and how the counts behind those budgets are kept in Redis.

A conversation counts its own bytes inside the append script, so its cap holds atomically;
the owner's ledger (another hash slot) counts every conversation's bytes and the requests
finished turns keep, beside the append in the same pipeline, checked when a request is
admitted. Conversations per user and tool calls waiting for a decision are counted in the
owner's slot too. docs/redis.md ("Storage budgets") says how each count can overshoot, and
by how much.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from shared import keys
from shared.scripts import in_pipeline

__all__ = [
    "ACCOUNT",
    "COUNTED_FROM",
    "GRACE_S",
    "TOTAL",
    "Usage",
    "account",
    "account_call",
    "count_pending",
    "counted_bytes",
    "forget",
    "forget_turns",
    "keep_turn",
    "kept_until",
    "pending_confirmation_count",
    "queue_usage",
    "read_usage",
    "settle_pending",
    "usage_of",
]

# The ledger's field holding the sum: no conversation id can be "*".
TOTAL = "*"
# How long past its retention a conversation's index entry is still taken for a live one:
# its keys expire at the last use the script saw, a little after the score the client sent.
GRACE_S = 60
# Expired entries dropped per read of the ledger: the rest go at the next reads.
_FORGET_PER_READ = 100

# A turn's kept request up to this many bytes is not counted: options alone stay far below
# it, so only what the client sent to be shown back (instructions, tools) is.
COUNTED_FROM = 4096

# Lua: forget conversation `id` of the ledger KEYS[1] and the index KEYS[2], and the turn
# `id` of the ledger and the kept turns KEYS[3]. A ledger that expired counts nothing.
_FORGET_ONE = """
local function drop(field)
  local held = redis.call('HGET', KEYS[1], field)
  if held then
    redis.call('HINCRBY', KEYS[1], '*', -tonumber(held))
    redis.call('HDEL', KEYS[1], field)
  end
end
local function forget(id)
  drop(id)
  redis.call('ZREM', KEYS[2], id)
end
local function forget_turn(id)
  drop('t/' .. id)
  redis.call('ZREM', KEYS[3], id)
end
"""

# KEYS: ledger, index. ARGV: conversation id, bytes added (negative: given back), the time of
# its use ('' for an append that is no use: call records), retention s. Counts the bytes
# of a conversation the index lists (one deleted or expired is no longer the owner's to
# count) and, for a use, moves it up the index. Returns 1 counted, 0 not listed.
# The ledger must outlive each entry it counts, which lives until its index score (the
# conversation's last use, or its creation) plus the retention and `GRACE_S`: a use renews
# it; an append that is no use renews it only when the conversation's entry held nothing
# before (the ledger itself may be new then), as its score may be its creation's, which
# renewed nothing here. Later appends that are no use find the ledger renewed past their
# entry's expiry already: one EXPIRE fewer each (a turn's call records, a tool's output).
# A use moves the entry first (`CH`: 1 when it is there and moved), so only a use at the
# very score it had, or an append that is no use, asks ZSCORE whether the index lists it.
ACCOUNT = f"""
local used = ARGV[3] ~= ''
if not (used and redis.call('ZADD', KEYS[2], 'XX', 'CH', ARGV[3], ARGV[1]) == 1)
   and not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 0
end
local held = redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[1], '*', ARGV[2])
if used or held == tonumber(ARGV[2]) then
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]) + {GRACE_S})
end
if used then redis.call('EXPIRE', KEYS[2], ARGV[4]) end
return 1
"""

# KEYS: ledger, index. ARGV: conversation ids. Drops them from both (deleted, or gone).
_FORGET = f"""
{_FORGET_ONE}
for i = 1, #ARGV do forget(ARGV[i]) end
return #ARGV
"""

# KEYS: ledger, index, kept turns. ARGV: now, retention s, a conversation id ('' for none).
# Forgets the conversations that expired and the turns whose records are gone (some of
# them: the rest at the next read), then returns {the bytes the owner stores, how many
# conversations they have, whether the id is one}.
_USAGE = f"""
{_FORGET_ONE}
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf',
                           tonumber(ARGV[1]) - tonumber(ARGV[2]) - {GRACE_S},
                           'LIMIT', 0, {_FORGET_PER_READ})
for _, id in ipairs(expired) do forget(id) end
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1],
                          'LIMIT', 0, {_FORGET_PER_READ})
for _, id in ipairs(lapsed) do forget_turn(id) end
local count = redis.call('ZCARD', KEYS[2])
if count == 0 and redis.call('ZCARD', KEYS[3]) == 0 then redis.call('DEL', KEYS[1]) end
local known = 0
if ARGV[3] ~= '' and redis.call('ZSCORE', KEYS[2], ARGV[3]) then known = 1 end
return {{tonumber(redis.call('HGET', KEYS[1], '*') or '0'), count, known}}
"""


# KEYS: ledger, index, kept turns. ARGV: turn id, bytes, when its record is gone by, now.
# Counts the turn's kept request once, until then; both keys outlive the entry.
_KEEP_TURN = """
local field = 't/' .. ARGV[1]
if redis.call('HSETNX', KEYS[1], field, ARGV[2]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], '*', ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
local ttl = math.ceil(tonumber(ARGV[3]) - tonumber(ARGV[4]))
for _, key in ipairs({KEYS[1], KEYS[3]}) do
  if redis.call('TTL', key) < ttl then redis.call('EXPIRE', key, ttl) end
end
return 1
"""

# KEYS: ledger, index, kept turns. ARGV: turn ids. Gives back what the turns' entries count.
_FORGET_TURNS = f"""
{_FORGET_ONE}
for i = 1, #ARGV do forget_turn(ARGV[i]) end
return #ARGV
"""


@dataclass(frozen=True, slots=True)
class Usage:
    """What one user stores: `bytes` of conversation history in `conversations`
    conversations; `known` whether the conversation asked about is one of them."""

    bytes: int
    conversations: int
    known: bool = False


def _user_keys(owner: str) -> list[str]:
    return [keys.usage(owner), keys.conversations(owner), keys.kept_turns(owner)]


def counted_bytes(size: int) -> int:
    """What the ledger counts of a kept request of `size` bytes (see `COUNTED_FROM`)."""
    return size if size > COUNTED_FROM else 0


def keep_turn(pipe: Pipeline, owner: str, turn_id: str, size: int, *, until: float) -> None:
    """Queue on `pipe` counting the turn's kept request, `size` bytes, until its record is
    gone by `until` (epoch s); counting it again changes nothing."""
    args = [turn_id, size, repr(until), repr(time.time())]
    in_pipeline(pipe, _KEEP_TURN, _user_keys(owner), args)


def kept_until(pipe: Pipeline, owner: str, turn_id: str, until: float) -> None:
    """Queue on `pipe` moving the lapse of the turn's count to `until` (it ended: its
    record goes then); nothing for a turn that is not counted."""
    pipe.zadd(keys.kept_turns(owner), {turn_id: until}, xx=True)


def forget_turns(pipe: Pipeline, owner: str, turn_ids: Sequence[str]) -> None:
    """Queue on `pipe` giving back what the ledger counts of the turns (forgotten)."""
    if turn_ids:
        in_pipeline(pipe, _FORGET_TURNS, _user_keys(owner), list(turn_ids))


def account(
    pipe: Pipeline,
    owner: str,
    conversation_id: str,
    size: int,
    *,
    used_at: float | None,
    retention_s: int,
) -> None:
    """Queue on `pipe` the ledger's share of an append of `size` bytes to the conversation
    (a negative `size` gives bytes back); `used_at` moves the conversation up its owner's
    index (an append of messages), None leaves it (call records)."""
    in_pipeline(
        pipe,
        ACCOUNT,
        *account_call(owner, conversation_id, size, used_at=used_at, retention_s=retention_s),
    )


def account_call(
    owner: str, conversation_id: str, size: int, *, used_at: float | None, retention_s: int
) -> tuple[list[str], list[Any]]:
    """The keys and arguments of `ACCOUNT` for `account`'s share of an append, for a
    caller that runs it inside another script (shared/records/writes.py)."""
    used = "" if used_at is None else repr(used_at)
    return _user_keys(owner), [conversation_id, size, used, retention_s]


def forget(pipe: Pipeline, owner: str, conversation_ids: Sequence[str]) -> None:
    """Queue on `pipe` dropping the conversations from their owner's ledger and index."""
    if conversation_ids:
        in_pipeline(pipe, _FORGET, _user_keys(owner), list(conversation_ids))


def queue_usage(
    pipe: Pipeline, owner: str, *, retention_s: int, conversation_id: str | None = None
) -> None:
    """Queue on `pipe` reading the owner's usage (its reply is read by `usage_of`),
    forgetting on the way the conversations that expired."""
    args = [repr(time.time()), retention_s, conversation_id or ""]
    in_pipeline(pipe, _USAGE, _user_keys(owner), args)


def usage_of(reply: Sequence[int]) -> Usage:
    """The `Usage` a `queue_usage` read answered."""
    total, count, known = (int(value) for value in reply)
    return Usage(bytes=total, conversations=count, known=bool(known))


async def read_usage(
    redis: Redis, owner: str, *, retention_s: int, conversation_id: str | None = None
) -> Usage:
    """The owner's usage, in one round trip (see `queue_usage`)."""
    async with redis.pipeline(transaction=False) as pipe:
        queue_usage(pipe, owner, retention_s=retention_s, conversation_id=conversation_id)
        (reply,) = await pipe.execute()
    return usage_of(reply)


async def pending_confirmation_count(redis: Redis, owner: str) -> int:
    """How many of the owner's tool calls wait for a decision (and have not lapsed)."""
    return int(await redis.zcount(keys.pending_confirmations(owner), time.time(), "+inf"))


async def count_pending(redis: Redis, owner: str, lapses: dict[str, float]) -> None:
    """Count the owner's new proposals, by confirmation id, each until it lapses."""
    if not lapses:
        return
    key = keys.pending_confirmations(owner)
    now = time.time()
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zremrangebyscore(key, "-inf", now)
        pipe.zadd(key, lapses)
        pipe.expire(key, max(1, int(max(lapses.values()) - now) + 1))
        await pipe.execute()


async def settle_pending(redis: Redis, owner: str, confirmation_ids: Sequence[str]) -> None:
    """The proposals were decided (or their conversation deleted): they no longer count."""
    if confirmation_ids:
        await redis.zrem(keys.pending_confirmations(owner), *confirmation_ids)
