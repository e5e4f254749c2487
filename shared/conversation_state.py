"""A conversation's state machine: its statuses, the transitions between them, and the one
Lua script that applies each transition atomically in Redis.

A conversation is `idle`, `running`, `awaiting_confirmation` or `absent`; `TABLE` says what
every transition does from every status, and the scripts' refusals are generated from it
(tests/shared/test_conversation_state.py holds each row against Redis). Whatever two requests
do at once, one script runs after the other. Only the turn that holds the conversation writes
into it. docs/redis.md ("A conversation's state machine") says what each status derives from.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

import orjson
from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from shared import budgets, keys, scripts
from shared.connection import reply_text
from shared.lifecycle import STRANDED_AFTER_S
from shared.state_table import Row, row

__all__ = [
    "TABLE",
    "Advance",
    "ConversationClaim",
    "ConversationMachine",
    "ConversationRule",
    "ConversationStatus",
    "ConversationTransition",
    "Decision",
    "Deletion",
    "Outcome",
    "Strategy",
    "advance",
    "derive_status",
    "may_run",
]

# A turn's keys live at most this long (a week unfinished, then a day's retention): the
# conversation's set of turns drops entries older than that (`hold`).
DEFAULT_TURN_KEEP_S = 8 * 86_400
# Tries of `announce` when messages keep arriving between its read and its append.
_ANNOUNCE_RETRIES = 10


class ConversationStatus(StrEnum):
    """Where a conversation stands. The API shows the last three; `absent` is a 404."""

    ABSENT = "absent"
    IDLE = "idle"
    RUNNING = "running"
    AWAITING_CONFIRMATION = "awaiting_confirmation"


class Strategy(StrEnum):
    """What a new message does while a turn runs on its conversation (LangGraph's
    `multitask_strategy`): stop the running turn, which keeps what it said so far, and run
    next; wait in line behind it; or be refused (409)."""

    INTERRUPT = "interrupt"
    ENQUEUE = "enqueue"
    REJECT = "reject"


class ConversationTransition(StrEnum):
    """What can happen to a conversation. Each is one script, but `FINISH`: a turn's ending
    is its record's (shared/turns/), and the status derives from it."""

    CREATE = "create"  # POST /v1/conversations, or a chat completion's first turn
    START = "start"  # a new message: its turn claims the conversation
    PAUSE = "pause"  # the holding turn stores tool calls for the user's decision
    DECIDE = "decide"  # the user decides one proposed call
    ANSWER = "answer"  # a message answers the waiting calls in words, for the model to read
    UNCLAIM = "unclaim"  # the turn that claimed it could not be created: give it back
    ANNOUNCE = "announce"  # a writer that is no turn appends a message (a timer rang)
    FINISH = "finish"  # the active turn's record ends (derived: no script)
    ADVANCE = "advance"  # a turn ended: it leaves the line; the first waiting one holds it
    DELETE = "delete"  # DELETE /v1/conversations/{id}


class Outcome(StrEnum):
    """What a transition did, or why it did nothing."""

    CREATED = "created"
    EXISTS = "exists"
    STARTED = "started"
    WAITING = "waiting"  # in line behind the running turn, until it ends
    LINE_FULL = "line_full"  # as many turns wait already as may (BERNARD_MAX_WAITING_TURNS)
    BUSY = "busy"  # a turn holds it
    AWAITING_DECISION = "awaiting_decision"  # tool calls wait for the user's decision
    PAUSED = "paused"
    NOT_HOLDER = "not_holder"  # the writing turn does not hold the conversation
    DECIDED = "decided"  # others of the same step still wait
    RESUMED = "resumed"  # the step's last decision: the turn carrying them holds it now
    ANSWERING = "answering"  # the turn that reads the answer holds it, with the step's calls
    ALREADY_APPROVED = "already_approved"
    ALREADY_REJECTED = "already_rejected"
    EXPIRED = "expired"
    NO_PROPOSAL = "no_proposal"
    UNCLAIMED = "unclaimed"
    ANNOUNCED = "announced"
    OPEN_CALLS = "open_calls"  # the history ends on tool calls without their results
    FINISHED = "finished"
    ADVANCED = "advanced"  # the ended turn held it: the first waiting turn holds it now
    LEFT = "left"  # the ended turn waited in line: it left it
    UNCHANGED = "unchanged"  # the ended turn neither held it nor waited
    DELETED = "deleted"
    NOT_FOUND = "not_found"


# A row of the conversation's table (its rules).
ConversationRule = Row[ConversationTransition, ConversationStatus, Outcome]


_ABSENT, _IDLE, _RUNNING, _AWAITING = (
    ConversationStatus.ABSENT,
    ConversationStatus.IDLE,
    ConversationStatus.RUNNING,
    ConversationStatus.AWAITING_CONFIRMATION,
)
_EXISTING = frozenset({_IDLE, _RUNNING, _AWAITING})


T, Out = ConversationTransition, Outcome
TABLE: tuple[ConversationRule, ...] = (
    row(T.CREATE, _ABSENT, Out.CREATED, _IDLE, "without a turn"),
    row(T.CREATE, _ABSENT, Out.CREATED, _RUNNING, "with its first turn, which holds it"),
    row(T.CREATE, _EXISTING, Out.EXISTS),
    row(T.START, _ABSENT, Out.NOT_FOUND),
    row(T.START, _IDLE, Out.STARTED, _RUNNING),
    row(T.START, _RUNNING, Out.BUSY, None, "strategy reject"),
    row(T.START, _RUNNING, Out.WAITING, _RUNNING, "strategy interrupt or enqueue: in line"),
    row(T.START, _RUNNING, Out.LINE_FULL, None, "strategy interrupt or enqueue: line full"),
    row(T.START, _AWAITING, Out.AWAITING_DECISION),
    row(T.PAUSE, _ABSENT, Out.NOT_FOUND),
    row(T.PAUSE, _RUNNING, Out.PAUSED, _AWAITING, "by the turn that holds it"),
    row(T.PAUSE, _RUNNING, Out.NOT_HOLDER, None, "by another turn"),
    row(T.PAUSE, frozenset({_IDLE, _AWAITING}), Out.NOT_HOLDER),
    row(T.DECIDE, _ABSENT, Out.NOT_FOUND),
    row(T.DECIDE, _AWAITING, Out.DECIDED, _AWAITING, "another call of its step still waits"),
    row(T.DECIDE, _AWAITING, Out.RESUMED, _RUNNING, "the last call of its step waiting"),
    row(T.DECIDE, _EXISTING, Out.ALREADY_APPROVED, None, "the call was approved"),
    row(T.DECIDE, _EXISTING, Out.ALREADY_REJECTED, None, "the call was rejected"),
    row(T.DECIDE, _EXISTING, Out.EXPIRED, None, "the call lapsed, or its step no longer waits"),
    row(T.DECIDE, _EXISTING, Out.NO_PROPOSAL, None, "no such call was proposed"),
    row(T.ANSWER, _ABSENT, Out.NOT_FOUND),
    row(T.ANSWER, _AWAITING, Out.ANSWERING, _RUNNING),
    row(T.ANSWER, _IDLE, Out.NO_PROPOSAL),
    row(T.ANSWER, _RUNNING, Out.BUSY),
    row(T.UNCLAIM, _ABSENT, Out.NOT_FOUND),
    row(T.UNCLAIM, _RUNNING, Out.UNCLAIMED, _AWAITING, "the turn was to carry decisions out"),
    row(T.UNCLAIM, _RUNNING, Out.UNCLAIMED, _IDLE, "the turn was a new message's"),
    row(T.UNCLAIM, _RUNNING, Out.UNCLAIMED, None, "the turn waited in line: it leaves it"),
    row(T.UNCLAIM, _RUNNING, Out.NOT_HOLDER, None, "another turn holds it"),
    row(T.UNCLAIM, frozenset({_IDLE, _AWAITING}), Out.NOT_HOLDER),
    row(T.ANNOUNCE, _ABSENT, Out.NOT_FOUND),
    row(T.ANNOUNCE, _IDLE, Out.ANNOUNCED, _IDLE, "no call the history ends on lacks its result"),
    row(T.ANNOUNCE, _IDLE, Out.OPEN_CALLS, None, "the history ends on calls without results"),
    row(T.ANNOUNCE, _RUNNING, Out.BUSY),
    row(T.ANNOUNCE, _AWAITING, Out.AWAITING_DECISION),
    row(T.FINISH, _RUNNING, Out.FINISHED, _IDLE, "the active turn's record ends"),
    row(T.ADVANCE, _ABSENT, Out.NOT_FOUND),
    row(T.ADVANCE, _IDLE, Out.UNCHANGED),
    row(T.ADVANCE, frozenset({_RUNNING, _AWAITING}), Out.ADVANCED, _RUNNING, "it held it"),
    row(T.ADVANCE, _RUNNING, Out.LEFT, None, "it waited in line"),
    row(T.ADVANCE, frozenset({_RUNNING, _AWAITING}), Out.UNCHANGED, None, "neither"),
    row(T.DELETE, _ABSENT, Out.NOT_FOUND),
    row(T.DELETE, _EXISTING, Out.DELETED, _ABSENT),
)
del T, Out


def refusals(transition: ConversationTransition) -> dict[ConversationStatus, Outcome]:
    """The statuses `TABLE` refuses `transition` from, whatever else holds: its rules that
    leave the conversation as it was and need no `when`."""
    return {
        status: rule.outcome
        for rule in TABLE
        if rule.transition is transition and rule.target is None and not rule.when
        for status in rule.source
    }


def may_run(turn_status: str | None, active_since: float | None, now: float) -> bool:
    """Whether a conversation's active turn may still run: its record says `queued` or
    `running` (`turn_status`), or it has none yet (None) and claimed the conversation
    (`active_since`) less than `STRANDED_AFTER_S` ago."""
    if turn_status is None:
        return active_since is not None and now - active_since < STRANDED_AFTER_S
    return turn_status in ("queued", "running")


def derive_status(
    *,
    exists: bool,
    active_turn: str | None,
    paused_turn: str | None,
    paused_until: float | None,
    active_may_run: bool,
    now: float,
    waiting: bool = False,
) -> ConversationStatus:
    """A conversation's status from its metadata, whether its active turn may still run
    (`may_run`) and whether turns wait in line. The scripts' `status_of` decides the same
    way."""
    if not exists:
        return _ABSENT
    if paused_turn and paused_turn == active_turn and (paused_until or 0) >= now:
        return _AWAITING
    if (active_turn and active_may_run) or waiting:
        return _RUNNING
    return _IDLE


# Lua shared by every transition. KEYS, always: 1 meta, 2 proposals, 3 turns, 4 messages,
# 5 calls, 6 summary. ARGV, always first: 1 now, 2 retention s, 3 how long a turn's keys
# live at most (its entry in the set of turns goes after that).
_PRELUDE = """
local now, retention_s, keep_s = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])

-- The status as derive_status has it; `ended`: the active turn the caller found ended.
local function status_of(ended)
  if redis.call('EXISTS', KEYS[1]) == 0 then return 'absent' end
  local meta = redis.call('HMGET', KEYS[1], 'active_turn', 'paused_turn', 'paused_until',
                          'waiting')
  local active, paused = meta[1] or '', meta[2] or ''
  if paused ~= '' and paused == active and tonumber(meta[3]) >= now then
    return 'awaiting_confirmation'
  end
  if active ~= '' and active ~= ended then return 'running' end
  if (meta[4] or '') ~= '' then return 'running' end
  return 'idle'
end

-- The turns waiting in line, first first.
local function line()
  local out = {}
  for turn in string.gmatch(redis.call('HGET', KEYS[1], 'waiting') or '', '%S+') do
    table.insert(out, turn)
  end
  return out
end

local function set_line(turns)
  if #turns == 0 then
    redis.call('HDEL', KEYS[1], 'waiting')
  else
    redis.call('HSET', KEYS[1], 'waiting', table.concat(turns, ' '))
  end
end

-- `turn` leaves the line; whether it was in it.
local function leave(turn)
  local turns, left = line(), false
  for i = #turns, 1, -1 do
    if turns[i] == turn then
      table.remove(turns, i)
      left = true
    end
  end
  if left then set_line(turns) end
  return left
end

-- `turn` enters the conversation's set of turns (which deleting hands back).
local function count_in(turn)
  redis.call('ZADD', KEYS[3], now, turn)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - keep_s)
  redis.call('EXPIRE', KEYS[3], retention_s)
end

-- `turn` claims the conversation: it is the active turn, and one of the conversation's.
local function hold(turn)
  redis.call('HSET', KEYS[1], 'active_turn', turn, 'active_since', ARGV[1])
  redis.call('HDEL', KEYS[1], 'paused_turn', 'paused_until')
  count_in(turn)
end

-- Each proposal as {field, decoded}.
local function proposals()
  local all, out = redis.call('HGETALL', KEYS[2]), {}
  for i = 1, #all, 2 do table.insert(out, {all[i], cjson.decode(all[i + 1])}) end
  return out
end

local function store(pair) redis.call('HSET', KEYS[2], pair[1], cjson.encode(pair[2])) end

-- The calls `turn` proposed that still wait lapse: nobody decided on them in time.
local function lapse(turn)
  for _, pair in ipairs(proposals()) do
    if pair[2]['turn_id'] == turn and pair[2]['state'] == 'pending' then
      pair[2]['state'] = 'expired'
      store(pair)
    end
  end
end
"""

# ARGV: 4 id, 5 owner, 6 metadata json, 7 incarnation, 8 first turn ('' for none).
_CREATE = """
local status = status_of('')
if REFUSE[status] then return {REFUSE[status]} end
-- What an earlier conversation of this id left behind is not this one's.
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
local fields = {'id', ARGV[4], 'owner', ARGV[5], 'created_at', ARGV[1], 'updated_at', ARGV[1],
                'metadata', ARGV[6], 'incarnation', ARGV[7]}
-- `hold` in the same HSET: a new hash has no paused turn to clear, and the set of turns
-- just emptied none to drop.
if ARGV[8] ~= '' then
  for _, item in ipairs({'active_turn', ARGV[8], 'active_since', ARGV[1]}) do
    table.insert(fields, item)
  end
  redis.call('ZADD', KEYS[3], now, ARGV[8])
  redis.call('EXPIRE', KEYS[3], retention_s)
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], retention_s)
return {'created'}
"""

# ARGV: 4 turn, 5 the active turn the caller found ended ('' for none), 6 the `Strategy`
# while a turn runs, 7 how many turns may wait in line. Refused: also the active turn, for
# the caller to look at. In line: {'waiting', the active turn, how many wait now (this one
# last), the turn to stop ('' for none: only `interrupt` stops one, and only while it may
# still run)}.
_START = """
local status = status_of(ARGV[5])
local active = redis.call('HGET', KEYS[1], 'active_turn') or ''
if REFUSE[status] then return {REFUSE[status], active} end
if status == 'running' then
  if ARGV[6] == 'reject' then return {'busy', active} end
  local turns = line()
  if #turns >= tonumber(ARGV[7]) then return {'line_full', active} end
  table.insert(turns, ARGV[4])
  set_line(turns)
  count_in(ARGV[4])
  local stop = ''
  if ARGV[6] == 'interrupt' and active ~= ARGV[5] then stop = active end
  return {'waiting', active, #turns, stop}
end
-- A step nobody decided on in time: the new turn answers its calls "not run"
-- (worker/recording.py), so none of them may be decided any more.
local paused = redis.call('HGET', KEYS[1], 'paused_turn')
if paused then lapse(paused) end
hold(ARGV[4])
return {'started'}
"""

# ARGV: 4 a turn of the conversation that ended (the caller made sure; '' for none, when
# no turn holds the conversation). It leaves the line; if it held the conversation (or
# none does), the first turn in line holds it now (its proposals, if it
# paused, lapse: the message that waited answers them "not run", as a new message does)
# and is returned, with how many still wait: {'advanced', turn, waiting}.
_ADVANCE = """
local status = status_of('')
if REFUSE[status] then return {REFUSE[status]} end
local left = leave(ARGV[4])
local turns = line()
if (redis.call('HGET', KEYS[1], 'active_turn') or '') ~= ARGV[4] or #turns == 0 then
  if left then return {'left'} end
  return {'unchanged'}
end
local first = table.remove(turns, 1)
set_line(turns)
local paused = redis.call('HGET', KEYS[1], 'paused_turn')
if paused then lapse(paused) end
redis.call('HSET', KEYS[1], 'active_turn', first, 'active_since', ARGV[1])
redis.call('HDEL', KEYS[1], 'paused_turn', 'paused_until')
return {'advanced', first, #turns}
"""

# ARGV: 4 turn, 5 when the last proposal lapses, then pairs: confirmation id, proposal json.
_PAUSE = """
local status = status_of('')
if REFUSE[status] then return {REFUSE[status]} end
if redis.call('HGET', KEYS[1], 'active_turn') ~= ARGV[4] then return {'not_holder'} end
-- The earlier steps are over (this turn holds the conversation: their decisions resumed
-- it, or they lapsed) and their calls answered in the history: their proposals go, so the
-- hash holds one step's, however many steps the conversation takes.
redis.call('DEL', KEYS[2])
for i = 6, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[2], retention_s)
redis.call('HSET', KEYS[1], 'paused_turn', ARGV[4], 'paused_until', ARGV[5])
return {'paused'}
"""

# ARGV: 4 the turn that carries the step's decisions out if this is its last, 5 confirmation
# id, 6 'approve' or 'reject', 7 edited arguments json ('' for none). Returns {'decided',
# how many still wait} or {'resumed', json list of the step's decided proposals}.
_DECIDE = """
local status = status_of('')
if REFUSE[status] then return {REFUSE[status]} end
local raw = redis.call('HGET', KEYS[2], ARGV[5])
if not raw then return {'no_proposal'} end
local pair = {ARGV[5], cjson.decode(raw)}
local proposal = pair[2]
if proposal['state'] == 'approved' then return {'already_approved'} end
if proposal['state'] == 'rejected' then return {'already_rejected'} end
if proposal['state'] ~= 'pending' then return {'expired'} end
local step = redis.call('HGET', KEYS[1], 'paused_turn')
if status ~= 'awaiting_confirmation' or proposal['turn_id'] ~= step
    or tonumber(proposal['expires_at']) < now then
  proposal['state'] = 'expired'
  store(pair)
  return {'expired'}
end
proposal['state'] = ARGV[6] == 'approve' and 'approved' or 'rejected'
if ARGV[7] ~= '' then proposal['arguments'] = cjson.decode(ARGV[7]) end
store(pair)
local waiting, decided = 0, {}
for _, other in ipairs(proposals()) do
  if other[2]['turn_id'] == step then
    local state = other[2]['state']
    if state == 'pending' and tonumber(other[2]['expires_at']) >= now then
      waiting = waiting + 1
    elseif state == 'approved' or state == 'rejected' then
      table.insert(decided, other)
    end
  end
end
if waiting > 0 then return {'decided', waiting} end
-- The step's last decision: its calls that lapsed undecided lapse for good, and the turn
-- that carries the decisions out holds the conversation.
lapse(step)
local out = {}
for _, other in ipairs(decided) do
  other[2]['resumed_by'] = ARGV[4]
  store(other)
  table.insert(out, cjson.encode(other[2]))
end
hold(ARGV[4])
return {'resumed', '[' .. table.concat(out, ',') .. ']'}
"""

# ARGV: 4 the turn that reads the user's answer in words. The step's calls still waiting go
# to it (`answering`, until that turn has carried them out or given them back: UNCLAIM);
# those that lapsed undecided lapse for good. Returns {'answering', json list of the calls}.
_ANSWER = """
local status = status_of('')
if REFUSE[status] then return {REFUSE[status]} end
local step = redis.call('HGET', KEYS[1], 'paused_turn')
local out = {}
for _, pair in ipairs(proposals()) do
  local proposal = pair[2]
  if proposal['turn_id'] == step and proposal['state'] == 'pending'
      and tonumber(proposal['expires_at']) >= now then
    proposal['state'], proposal['resumed_by'] = 'answering', ARGV[4]
    store(pair)
    table.insert(out, cjson.encode(proposal))
  end
end
lapse(step)
hold(ARGV[4])
return {'answering', '[' .. table.concat(out, ',') .. ']'}
"""

# ARGV: 4 the turn that claimed the conversation, or joined its line, and could not be
# created (the caller made sure it never runs). The decisions it was to carry out wait
# again, with the arguments proposed; turns waiting behind it go on: {'unclaimed', the
# first of them, which holds the conversation now}.
_UNCLAIM = """
local status = status_of('')
if REFUSE[status] then return {REFUSE[status]} end
if leave(ARGV[4]) then
  redis.call('ZREM', KEYS[3], ARGV[4])
  return {'unclaimed'}
end
if redis.call('HGET', KEYS[1], 'active_turn') ~= ARGV[4] then return {'not_holder'} end
local step, last = nil, 0
for _, pair in ipairs(proposals()) do
  if pair[2]['resumed_by'] == ARGV[4] then
    pair[2]['state'], pair[2]['arguments'], pair[2]['resumed_by'] = 'pending', nil, nil
    store(pair)
    step, last = pair[2]['turn_id'], math.max(last, tonumber(pair[2]['expires_at']))
  end
end
redis.call('ZREM', KEYS[3], ARGV[4])
if step then
  redis.call('HSET', KEYS[1], 'active_turn', step, 'paused_turn', step,
             'paused_until', string.format('%.6f', last))
  return {'unclaimed'}
end
local turns = line()
if #turns == 0 then
  redis.call('HDEL', KEYS[1], 'active_turn', 'active_since')
  return {'unclaimed'}
end
-- Turns wait behind it: the first holds the conversation now, for the caller to start.
local first = table.remove(turns, 1)
set_line(turns)
redis.call('HSET', KEYS[1], 'active_turn', first, 'active_since', ARGV[1])
return {'unclaimed', first}
"""

# ARGV: 4 the active turn the caller found ended ('' for none), 5 how many messages the
# caller found, 6 the row (its id counts on that length). Appends the row while the
# conversation is idle, counted as `_APPEND` counts (shared/records/writes.py); {'changed'} when
# the list no longer has that length (the caller reads it again). Idle, the history may
# still end on tool calls without their results (a step nobody decided on in time,
# decisions whose turn never ran): the next turn answers them first (shared/records/decisions.py
# `open_calls`), and a message now would stand between them and their answers.
_ANNOUNCE = """
local status = status_of(ARGV[4])
if REFUSE[status] then return {REFUSE[status]} end
if redis.call('LLEN', KEYS[4]) ~= tonumber(ARGV[5]) then return {'changed'} end
local tail, answered = redis.call('LRANGE', KEYS[4], -64, -1), {}
for i = #tail, 1, -1 do
  local row = cjson.decode(tail[i])
  if row['role'] ~= 'tool' then
    if row['role'] == 'assistant' and type(row['tool_calls']) == 'table' then
      for _, call in ipairs(row['tool_calls']) do
        if not answered[call['id']] then return {'open_calls'} end
      end
    end
    break
  end
  answered[row['tool_call_id'] or ''] = true
end
redis.call('RPUSH', KEYS[4], ARGV[6])
redis.call('HINCRBY', KEYS[1], 'bytes', #ARGV[6])
redis.call('HSET', KEYS[1], 'updated_at', ARGV[1])
for _, key in ipairs({KEYS[1], KEYS[4], KEYS[5]}) do redis.call('EXPIRE', key, retention_s) end
return {'announced'}
"""

# Returns {'deleted', the active turn ('' for none), {every turn of the conversation},
# {the turns waiting in line}}.
_DELETE = """
local status = status_of('')
if REFUSE[status] then return {REFUSE[status]} end
local active = redis.call('HGET', KEYS[1], 'active_turn') or ''
local turns = redis.call('ZRANGE', KEYS[3], 0, -1)
local waiting = line()
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
return {'deleted', active, turns, waiting}
"""


def _lua_table(refused: Mapping[ConversationStatus, Outcome]) -> str:
    # In a fixed order: a rule's sources are a set, whose order is the process's own (str
    # hashes are salted), and each process would otherwise load a script of its own.
    pairs = ", ".join(f"['{status}'] = '{outcome}'" for status, outcome in sorted(refused.items()))
    return "{" + pairs + "}"


def _script(transition: ConversationTransition, body: str) -> str:
    """The script of `transition`: the prelude, what `TABLE` refuses it from, its body;
    without its comment lines, which every `EVAL` would send and Redis hash."""
    text = f"local REFUSE = {_lua_table(refusals(transition))}\n{_PRELUDE}\n{body}"
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))


SCRIPTS: dict[ConversationTransition, str] = {
    ConversationTransition.CREATE: _script(ConversationTransition.CREATE, _CREATE),
    ConversationTransition.START: _script(ConversationTransition.START, _START),
    ConversationTransition.PAUSE: _script(ConversationTransition.PAUSE, _PAUSE),
    ConversationTransition.DECIDE: _script(ConversationTransition.DECIDE, _DECIDE),
    ConversationTransition.ANSWER: _script(ConversationTransition.ANSWER, _ANSWER),
    ConversationTransition.UNCLAIM: _script(ConversationTransition.UNCLAIM, _UNCLAIM),
    ConversationTransition.ANNOUNCE: _script(ConversationTransition.ANNOUNCE, _ANNOUNCE),
    ConversationTransition.ADVANCE: _script(ConversationTransition.ADVANCE, _ADVANCE),
    ConversationTransition.DELETE: _script(ConversationTransition.DELETE, _DELETE),
}
_SHAS = {
    transition: hashlib.sha1(script.encode()).hexdigest() for transition, script in SCRIPTS.items()
}


@dataclass(frozen=True, slots=True)
class ConversationClaim:
    """What starting a turn did: `STARTED`; `WAITING` in line (`waiting` turns in it, this
    one last; `stop`: the running turn it interrupts, if it does); or why not. With the
    turn that holds the conversation (`active_turn`, None without one)."""

    outcome: Outcome
    active_turn: str | None = None
    waiting: int = 0
    stop: str | None = None


@dataclass(frozen=True, slots=True)
class Advance:
    """What `ADVANCE` did: `ADVANCED` (`holder` holds the conversation now, `waiting` turns
    still wait behind it), `LEFT`, `UNCHANGED` or `NOT_FOUND`."""

    outcome: Outcome
    holder: str | None = None
    waiting: int = 0


@dataclass(slots=True)
class Decision:
    """What deciding a proposal did: `DECIDED` (`waiting` others of its step still wait),
    `RESUMED` (`decided`: every decided proposal of the step, in the order proposed), or why
    nothing was decided."""

    outcome: Outcome
    waiting: int = 0
    decided: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Deletion:
    """What deleting did: `DELETED`, with the turn that held the conversation last
    (`active_turn`), every turn that ran on it (`turn_ids`) and those that waited in line
    (`waiting`); or `NOT_FOUND`."""

    outcome: Outcome
    active_turn: str | None = None
    turn_ids: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()


class ConversationMachine:
    """The transitions of one owner's conversations, each one script (see the module)."""

    def __init__(
        self,
        redis: Redis,
        owner: str,
        *,
        retention_s: int,
        turn_keep_s: int = DEFAULT_TURN_KEEP_S,
    ) -> None:
        self._redis = redis
        self.owner = owner
        self.retention_s = retention_s
        self.turn_keep_s = turn_keep_s

    def keys(self, conversation_id: str) -> list[str]:
        """Every key of the conversation, in the order the scripts take them."""
        owner = self.owner
        return [
            keys.conversation(owner, conversation_id),
            keys.conversation_proposals(owner, conversation_id),
            keys.conversation_turns(owner, conversation_id),
            keys.conversation_messages(owner, conversation_id),
            keys.conversation_calls(owner, conversation_id),
            keys.conversation_summary(owner, conversation_id),
        ]

    def _args(self, now: float, *rest: Any) -> list[Any]:
        return [repr(now), self.retention_s, self.turn_keep_s, *rest]

    async def _run(
        self, transition: ConversationTransition, conversation_id: str, now: float, *rest: Any
    ) -> list[Any]:
        # By its hash, as redis-py's registered scripts go (shared/scripts.py); its text
        # the first time a server is asked for it.
        script_keys, args = self.keys(conversation_id), self._args(now, *rest)
        try:
            reply = await self._redis.evalsha(_SHAS[transition], 6, *script_keys, *args)  # type: ignore[misc]
        except NoScriptError:
            reply = await self._redis.eval(SCRIPTS[transition], 6, *script_keys, *args)  # type: ignore[misc]
        return list(reply)

    async def create(
        self,
        conversation_id: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        turn_id: str | None = None,
    ) -> Outcome:
        """Create the conversation (`CREATED`: a new incarnation, held by `turn_id` when
        given), unless the owner has one under this id (`EXISTS`). It enters the owner's
        index of conversations."""
        now = time.time()
        index = keys.conversations(self.owner)
        args = self._args(
            now,
            conversation_id,
            self.owner,
            orjson.dumps(metadata or {}),
            uuid.uuid4().hex,
            turn_id or "",
        )
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.execute_command(
                "EVAL",
                SCRIPTS[ConversationTransition.CREATE],
                6,
                *self.keys(conversation_id),
                *args,
            )
            scripts.index(pipe, index, conversation_id, now, ttl_s=self.retention_s, new_only=True)
            reply, *_ = await pipe.execute()
        return Outcome(reply_text(reply[0]))

    async def start(
        self,
        conversation_id: str,
        turn_id: str,
        *,
        ended: str | None,
        strategy: Strategy = Strategy.REJECT,
        max_waiting: int = 0,
    ) -> ConversationClaim:
        """Let `turn_id` hold the conversation if it is idle, `ended` being the active turn
        the caller found ended (None: it found none); while a turn runs, as `strategy`
        says: in line behind it (`WAITING`, unless `max_waiting` wait already:
        `LINE_FULL`), or `BUSY`."""
        reply = await self._run(
            ConversationTransition.START,
            conversation_id,
            time.time(),
            turn_id,
            ended or "",
            strategy,
            max_waiting,
        )
        outcome = Outcome(reply_text(reply[0]))
        active = reply_text(reply[1]) if len(reply) > 1 else ""
        if outcome is Outcome.WAITING:
            stop = reply_text(reply[3])
            return ConversationClaim(
                outcome, active or None, waiting=int(reply[2]), stop=stop or None
            )
        return ConversationClaim(outcome, active or None)

    async def advance(self, conversation_id: str, ended: str) -> Advance:
        """`ended`, a turn of the conversation that has ended, leaves its line; if it held
        the conversation, the first turn in line holds it now."""
        reply = await self._run(ConversationTransition.ADVANCE, conversation_id, time.time(), ended)
        outcome = Outcome(reply_text(reply[0]))
        if outcome is Outcome.ADVANCED:
            return Advance(outcome, reply_text(reply[1]), int(reply[2]))
        return Advance(outcome)

    async def pause(
        self, conversation_id: str, turn_id: str, proposals: Sequence[Mapping[str, Any]]
    ) -> Outcome:
        """Store the calls `turn_id` proposed, each `pending` until decided or lapsed (its
        `expires_at`), keyed by its `confirmation_id`: the conversation awaits the user's
        decision. Only the turn that holds it may (`NOT_HOLDER`)."""
        if not proposals:
            raise ValueError("pausing needs at least one proposal")
        until = max(float(p["expires_at"]) for p in proposals)
        # `position`: the order they were proposed in, which their decisions are carried
        # out in (the scripts' JSON keeps times to 14 digits: they cannot tell).
        pairs = [
            item
            for position, p in enumerate(proposals)
            for item in (
                p["confirmation_id"],
                orjson.dumps({**p, "state": "pending", "position": position}),
            )
        ]
        reply = await self._run(
            ConversationTransition.PAUSE, conversation_id, time.time(), turn_id, repr(until), *pairs
        )
        outcome = Outcome(reply_text(reply[0]))
        if outcome is Outcome.PAUSED:  # they count against the owner's budget
            lapses = {p["confirmation_id"]: float(p["expires_at"]) for p in proposals}
            await budgets.count_pending(self._redis, self.owner, lapses)
        return outcome

    async def decide(
        self,
        conversation_id: str,
        confirmation_id: str,
        decision: Literal["approve", "reject"],
        *,
        turn_id: str,
        arguments: Mapping[str, Any] | None = None,
    ) -> Decision:
        """Decide the proposal `confirmation_id`, once. Is it the last of its step to wait,
        `turn_id` (admitted, not created yet) holds the conversation to carry the step's
        decisions out (`RESUMED`), in the same step."""
        reply = await self._run(
            ConversationTransition.DECIDE,
            conversation_id,
            time.time(),
            turn_id,
            confirmation_id,
            decision,
            orjson.dumps(arguments) if arguments is not None else "",
        )
        outcome = Outcome(reply_text(reply[0]))
        if outcome in (Outcome.DECIDED, Outcome.RESUMED, Outcome.EXPIRED):
            # No longer waits: out of the owner's budget (shared/budgets.py).
            await budgets.settle_pending(self._redis, self.owner, [confirmation_id])
        if outcome is Outcome.DECIDED:
            return Decision(outcome, waiting=int(reply[1]))
        if outcome is Outcome.RESUMED:
            decided = sorted(orjson.loads(reply[1]), key=lambda p: int(p.get("position", 0)))
            return Decision(outcome, decided=decided)
        return Decision(outcome)

    async def answer(self, conversation_id: str, turn_id: str) -> Decision:
        """Hand the calls the conversation waits on to `turn_id` (admitted, not created yet),
        which reads the user's answer in words and decides them itself (`ANSWERING`, their
        `decided` in the order proposed); `NO_PROPOSAL` when nothing waits any more, `BUSY`
        while a turn runs."""
        reply = await self._run(
            ConversationTransition.ANSWER, conversation_id, time.time(), turn_id
        )
        outcome = Outcome(reply_text(reply[0]))
        if outcome is not Outcome.ANSWERING:
            return Decision(outcome)
        handed = sorted(orjson.loads(reply[1]), key=lambda p: int(p.get("position", 0)))
        # Their answer is in: out of the owner's budget of calls waiting (shared/budgets.py).
        ids = [p["confirmation_id"] for p in handed]
        await budgets.settle_pending(self._redis, self.owner, ids)
        return Decision(outcome, decided=handed)

    async def unclaim(self, conversation_id: str, turn_id: str) -> Advance:
        """Give the conversation back from `turn_id`, which claimed it (or joined its line)
        and will never run: the decisions it was to carry out wait again (`UNCLAIMED`,
        with the first turn in line behind it as the `holder` now, if one waited);
        `NOT_HOLDER` if another turn holds it by now."""
        reply = await self._run(
            ConversationTransition.UNCLAIM, conversation_id, time.time(), turn_id
        )
        holder = reply_text(reply[1]) if len(reply) > 1 else None
        return Advance(Outcome(reply_text(reply[0])), holder)

    async def announce(
        self, conversation_id: str, message: Mapping[str, Any], *, ended: str | None
    ) -> Outcome:
        """Append `message` (an OpenAI-shaped message) from a writer that is no turn, while
        the conversation is idle (`ANNOUNCED`), `ended` being the active turn the caller
        found ended (None: it found none). `BUSY` while a turn may run on it,
        `AWAITING_DECISION` while calls wait for the user, `OPEN_CALLS` while its history
        ends on calls without their results (the next turn answers them): the caller tries
        again later.
        The message counts in its owner's ledger (shared/budgets.py), as any append."""
        script_keys = self.keys(conversation_id)
        for _ in range(_ANNOUNCE_RETRIES):
            now = time.time()
            length = int(await self._redis.llen(script_keys[3]))  # type: ignore[misc]
            row = {**message, "id": f"msg_{length + 1}", "turn_id": None, "created_at": now}
            item = orjson.dumps(row)
            reply = await self._run(
                ConversationTransition.ANNOUNCE, conversation_id, now, ended or "", length, item
            )
            done = reply_text(reply[0])
            if done == "changed":
                continue
            if done == Outcome.ANNOUNCED:
                # Counted once appended: a refused try (tried again while the conversation
                # is busy) neither counts nor moves it up its owner's index.
                async with self._redis.pipeline(transaction=False) as pipe:
                    budgets.account(
                        pipe,
                        self.owner,
                        conversation_id,
                        len(item),
                        used_at=now,
                        retention_s=self.retention_s,
                    )
                    await pipe.execute()
            return Outcome(done)
        raise RuntimeError(f"conversation {conversation_id} kept changing while announcing")

    async def delete(self, conversation_id: str) -> Deletion:
        """Remove the conversation and everything recorded in it, and it leaves the owner's
        index; the turns that ran on it are the caller's to end and forget."""
        args = self._args(time.time())
        async with self._redis.pipeline(transaction=False) as pipe:
            # Its calls waiting for a decision, before they go: out of the owner's budget.
            pipe.hkeys(keys.conversation_proposals(self.owner, conversation_id))
            pipe.execute_command(
                "EVAL",
                SCRIPTS[ConversationTransition.DELETE],
                6,
                *self.keys(conversation_id),
                *args,
            )
            # It leaves the owner's index, and its bytes their ledger (shared/budgets.py).
            budgets.forget(pipe, self.owner, [conversation_id])
            proposed, reply, _ = await pipe.execute()
        await budgets.settle_pending(self._redis, self.owner, [reply_text(c) for c in proposed])
        outcome = Outcome(reply_text(reply[0]))
        if outcome is not Outcome.DELETED:
            return Deletion(outcome)
        active = reply_text(reply[1]) or None
        turns = tuple(reply_text(turn) for turn in reply[2])
        return Deletion(outcome, active, turns, tuple(reply_text(turn) for turn in reply[3]))


async def advance(redis: Redis, owner: str, conversation_id: str, ended: str) -> Advance:
    """`ConversationMachine.advance` for a caller that knows no conversation's retention
    (shared/turns/moves.py, as a turn ends): `ADVANCE` renews no TTL."""
    return await ConversationMachine(redis, owner, retention_s=0).advance(conversation_id, ended)
