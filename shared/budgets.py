"""What one user may store, and how the counts behind those budgets are kept in Redis.

**Bytes per conversation** (`BERNARD_MAX_CONVERSATION_BYTES`). A conversation counts what it
stores (its messages and call records, as stored) in its own metadata (`bytes`), inside
the append script (shared/records/keeper.py `_APPEND`), so the cap holds atomically: an append of
a request's messages that would take the conversation over it is refused whole, before
anything of it is stored, however many append at once. What a turn appends once it runs
(its tool results, call records and answer) is never refused: a turn must not lose its
answer halfway, nor leave a tool call without its result. So a conversation can go over
its cap by one turn's own output; then the next request on it is refused (413
`conversation_too_large`, api/admission.py).

**Bytes per user, across conversations** (`BERNARD_MAX_USER_BYTES`). A conversation's keys
and its owner's are in different hash slots (a Cluster's), so no one script can count
both. The owner's ledger (`keys.usage`, in the owner's slot) holds the bytes of each
conversation the owner's index (`keys.conversations`) lists, and their sum (field `*`,
which no conversation id can be). An append adds what it appended to the ledger in the
same pipeline as the append (`account`: no round trip more), and only for a conversation
the index still lists; an append Redis refused gives it back (a round trip on that path
only). Entries leave the ledger with their index entry: at once when the conversation is
deleted (`forget`, in the delete's pipeline), and when it expires, the next time the
ledger is read (`usage`): the index's score is the conversation's last use, so an entry
scored more than the retention ago (plus `GRACE_S`) is a conversation Redis has dropped.

Precision: the sum is checked when a request is admitted (api/admission.py), not at each
append, so a user can go over it by what the turns admitted at once then store: at most
one request's messages and one turn's output per turn running at once
(`BERNARD_MAX_ACTIVE_TURNS_PER_USER`). A process that dies between an append Redis refused
and its give-back leaves the sum high by that append until the conversation is deleted or
expires. Conversations stored before the ledger existed count from their next append.

**A turn's kept request**, counted with the conversations against the same sum. A finished
turn's record keeps its request's options and what its encoding shows back of it (the
Responses API's `instructions` and `tools`, for `GET /v1/responses/{id}`) for
`BERNARD_TURN_RETENTION_S`; over `COUNTED_FROM` bytes (more than options alone ever take),
they are counted (`keep_turn`, in the pipeline that creates the turn: no round trip more)
under the turn's own entry of the ledger (`t/<turn id>`: no conversation id holds a `/`),
until the record is gone: the owner's `keys.kept_turns` scores each entry at the time it
lapses, the longest the record can live when it is created (unfinished, plus the
retention), moved to its ending plus the retention when it ends (`kept_until`, from
`TurnStore.finish`). A turn forgotten (its conversation or itself deleted, or delivered
unkept) gives them back at once (`forget_turns`); lapsed entries go at the next reads of
the ledger, as expired conversations do. What a turn holds only while it runs (its
messages, the client's tools) is bounded per request (api/limits.py) and never counted:
ending the turn drops it.

**Conversations per user** (`BERNARD_MAX_CONVERSATIONS_PER_USER`): the index's size, read
with the ledger at admission; creations admitted at once may overshoot it by their number.

**Tool calls waiting for a decision** (`BERNARD_MAX_PENDING_CONFIRMATIONS_PER_CONVERSATION`,
`..._PER_USER`). A turn that would pause on more calls than either allows lets the first
ones wait and answers the rest at once with a tool error the model reads (worker/harness/
router.py). The owner's count (`keys.pending_confirmations`, in the owner's slot) gains a
turn's proposals once they are stored, loses each when it is decided or its conversation
deleted (shared/conversation_state.py: `pause`, `decide`, `delete`), and lets each lapse at
its expiry. It is read when a turn pauses, so turns pausing at once may overshoot the
per-user cap by one turn's calls each; decisions handed back to wait again (their turn
could not start: `unclaim`) are not counted again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from shared import keys
from shared.scripts import in_pipeline

__all__ = [
    "COUNTED_FROM",
    "GRACE_S",
    "TOTAL",
    "Usage",
    "account",
    "count_pending",
    "counted_bytes",
    "forget",
    "forget_turns",
    "keep_turn",
    "kept_until",
    "pending_confirmations",
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
_ACCOUNT = f"""
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
    used = "" if used_at is None else repr(used_at)
    in_pipeline(pipe, _ACCOUNT, _user_keys(owner), [conversation_id, size, used, retention_s])


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


async def pending_confirmations(redis: Redis, owner: str) -> int:
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
