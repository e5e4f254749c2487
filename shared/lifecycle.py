"""A turn's lifecycle as one state machine: its statuses, the transitions between them (one
Lua script each, with named results), and how it ends short of completing, for every cause
and whoever meets it.

A turn is `queued` when the API creates it, `running` once a worker claims it, and ends
`completed`, `failed`, `cancelled` or `awaiting_confirmation` (shared/events.py,
`TurnStatus`). `TRANSITIONS` says what each move does from each status; the scripts below
apply them over the turn's own keys (one hash slot), so a worker, a reaper and a cancel can
race and still exactly one of them ends the turn, with exactly one `done` entry in its
stream. shared/turns/ (`TurnStore`) runs them; tests/shared/test_turn_lifecycle.py holds every
row against Redis.

Which ending a turn gets is decided here alone. Whoever stops a turn names what happened, a
`Cause` — the worker running it (worker/supervisor.py: what its task raised, or why it was
told to stop), any process that finds it stuck (a reaper, a reader waiting on it:
`TurnStore.settle`), the API (a cancel, a deleted conversation, a creation that failed), or
a reader that can read no further — and `RULES` says how the turn ends for that cause: its
error code (whose words, type and HTTP status are shared/endings.py's), which guard the
ending script checks, and what follows. A reader's causes write nothing: they are what its
client reads when the stream itself cannot say.

The record and its stream live on the data role; arq's job, the running set and the owner's
count of active turns on the queue role (shared/keys.py says why, and how each move splits
into a data half and a queue half that a crash between them cannot strand).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from shared.endings import ENDINGS as PRESENTED
from shared.endings import ending_events
from shared.errors import ErrorCode
from shared.events import TERMINAL_STATUSES, Done, Event, TurnStatus
from shared.state_table import Row, row

__all__ = [
    "FORGET_GRACE_S",
    "RENEWAL_STOPS",
    "RULES",
    "SEALED_ID",
    "STRANDED_AFTER_S",
    "TRANSITIONS",
    "After",
    "Cause",
    "Claimed",
    "EndingRule",
    "Finished",
    "Guard",
    "Move",
    "Renewal",
    "TurnTransition",
    "Who",
    "done_for",
    "ending_events_of",
    "stuck",
]

QUEUED, RUNNING = TurnStatus.QUEUED, TurnStatus.RUNNING
_ENDED = TERMINAL_STATUSES


# -- transitions -------------------------------------------------------------------------


class TurnTransition(StrEnum):
    """What can happen to a turn's record. Each is one script."""

    CREATE = "create"  # the API stores the record and its stream: `queued`
    CLAIM = "claim"  # a worker takes it: `running`, its record naming the worker
    FINISH = "finish"  # it ends, once: its `done` is appended and seals the stream
    FORGET = "forget"  # its conversation was deleted: every read takes it for gone


class Claimed(StrEnum):
    """CLAIM's results besides the status it found a turn in that no worker may take."""

    CLAIMED = "claimed"
    MISSING = "missing"  # no record (expired, or a Redis restart lost it)


class Renewal(StrEnum):
    """What a renewal of its worker's liveness finds of a running turn (shared/liveness.py,
    worker/liveness.py): whether it goes on."""

    RENEWED = "renewed"
    CANCEL_REQUESTED = "cancel_requested"  # somebody asked it to stop
    # Over for this worker: its record is gone (a Redis restart without persistence) or
    # another process ended it (a reaper that took a stalled worker for dead).
    OVER = "over"


class Finished(StrEnum):
    """FINISH's results."""

    ENDED = "ended"  # this call ended it
    OVER = "over"  # it had ended already: nothing written
    # Its record is gone (a Redis restart lost it): what its worker wrote since is dropped,
    # which nothing can read without the record and which would never expire.
    GONE = "gone"
    REFUSED = "refused"  # the guard failed (`Guard`): left as it was


class Guard(StrEnum):
    """What FINISH checks before ending a turn, beside that it has not ended yet. Whether a
    running turn's worker lives is on the queue role, which no data script can read: the
    caller looks first (shared/liveness.py)."""

    ALWAYS = "always"
    QUEUED = "queued"  # only if no worker took it yet


# A row of the turn's table: a source status of None is no record; a `target` of None
# leaves the turn as it was, but for FINISH's `ENDED`: the status of the `done` it appends.
# CREATE's outcome is the status it creates (its script returns the `start` entry's id);
# FORGET has no row: it moves no status, and every read takes a forgotten turn for gone.
Move = Row[TurnTransition, TurnStatus | None, StrEnum]


_T, _F = TurnTransition, Finished
TRANSITIONS: tuple[Move, ...] = (
    row(_T.CREATE, None, QUEUED, QUEUED),
    row(_T.CLAIM, QUEUED, Claimed.CLAIMED, RUNNING),
    row(_T.CLAIM, None, Claimed.MISSING),
    *(row(_T.CLAIM, status, status) for status in (RUNNING, *sorted(_ENDED))),
    row(_T.FINISH, frozenset({QUEUED, RUNNING}), _F.ENDED, None, "to the `done`'s status"),
    row(_T.FINISH, RUNNING, _F.REFUSED, None, "guard `queued`"),
    row(_T.FINISH, frozenset(_ENDED), _F.OVER),
    row(_T.FINISH, None, _F.GONE),
)
del _T, _F


# KEYS: turn, events, attached. ARGV: ttl s, the `start` entry, attachment id ('' for
# none), attachment lapse (epoch s), attachment ttl s, then the record's fields and values.
# The data half of creating a turn: its record and its stream, both expiring, and the
# client watching it from the start. Returns the `start` entry's id.
CREATE = """
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('EXPIRE', KEYS[1], ARGV[1])
local start = redis.call('XADD', KEYS[2], '*', 'e', ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[1])
if ARGV[3] ~= '' then
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
  redis.call('EXPIRE', KEYS[3], ARGV[5])
end
return start
"""

# KEYS: turn, cancel. ARGV: worker id, now. Moves `queued` → `running` under the worker
# the record now names (`worker`: whose liveness says whether the turn still runs,
# shared/liveness.py) and returns {'claimed', the cancel key's value (nil: no cancel asked
# for; shared/cancel.py `Stop`), the record's fields}; else {the status found, or
# 'missing'} (`Claimed`), with the record's webhook target and owner when it has a target
# (an ended turn's delivery that no job took yet: FINISH). One round trip
# (beside the queue half: the running set, the worker's turns) for everything a worker
# needs before the turn's first model call. The record is read once, before the move, and
# answered as the move leaves it: its status read from it, its moved fields put in it.
CLAIM = """
local record = redis.call('HGETALL', KEYS[1])
local moved = {status = 'running', started_at = ARGV[2], worker = ARGV[1]}
local read = {status = false, webhook = false, owner = false}
for i = 1, #record, 2 do
  if read[record[i]] == false then read[record[i]] = record[i + 1] end
end
local status = read.status
if status ~= 'queued' then
  if read.webhook then return {status, read.webhook, read.owner} end
  return {status or 'missing'}
end
redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[2], 'worker', ARGV[1])
for i = 1, #record, 2 do
  if moved[record[i]] then
    record[i + 1] = moved[record[i]]
    moved[record[i]] = nil
  end
end
for _, name in ipairs({'status', 'started_at', 'worker'}) do
  if moved[name] then
    table.insert(record, name)
    table.insert(record, moved[name])
  end
end
return {'claimed', redis.call('GET', KEYS[2]), record}
"""

# The id of every turn's `done` entry: the largest a Redis Stream entry can have. Once it
# is in, Redis refuses every later `XADD *` to the stream ("exhausted the last possible
# ID"): a worker that was taken for dead and wakes up cannot append after the turn's end,
# and it costs no command beyond the XADD itself (shared/streams.py).
SEALED_ID = f"{2**64 - 1}-{2**64 - 1}"

# KEYS: turn, events, attached.
# ARGV: status, finished_at, error json, result json, retention s, maxlen, guard (`Guard`), sealed
# id, payload... Appends the payloads (the last is `done`, under the sealed id) and drops the
# request's messages (the prompt: the conversation keeps them) and the client's tools (what the
# encoding shows back of them is in `request`) only if the turn has not ended yet and the guard
# holds. Returns a `Finished`; `ended` or `over` with the record's webhook target, the bytes its
# owner's ledger counts of the record and its conversation, {'ended', target or nil, bytes or nil,
# conversation or nil}, when it has any of them (`over` never with the bytes): a target left on an
# ended turn is a delivery no job has taken yet (its job deletes it: shared/webhooks.py), which the
# call that ended it may have died before queueing; the bytes (`counted`, shared/budgets.py) then
# lapse with the retention; the conversation's line moves on once its turn has ended
# (shared/conversation_state.py `ADVANCE`), which that call may have died before doing. The data
# half of ending a turn (`TurnStore.finish` releases it on the queue, queues the webhook, moves the
# count's lapse and the conversation's line). The cancel key is never touched here: it is set with
# a TTL of the turns' retention at most (shared/cancel.py), so it goes no later than the record,
# and nothing reads it once the turn has ended. Each command here runs once a turn. Its first
# write is a DEL, which Redis runs at its maxmemory: Redis checks a script's first write alone
# against maxmemory (it cannot stop one half done), so a full Redis still takes a turn's ending (a
# few hundred bytes, which its retention and the messages it drops give back) and every client
# reads it.
FINISH = """
local read = redis.call('HMGET', KEYS[1], 'status', 'webhook', 'counted', 'conversation_id')
local status = read[1]
if not status then
  redis.call('DEL', KEYS[2])
  return 'gone'
end
if status ~= 'queued' and status ~= 'running' then
  if read[2] or read[4] then return {'over', read[2], false, read[4]} end
  return 'over'
end
if ARGV[7] == 'queued' and status ~= 'queued' then return 'refused' end
redis.call('DEL', KEYS[3])
for i = 9, #ARGV do
  local id = '*'
  if i == #ARGV then id = ARGV[8] end
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], id, 'e', ARGV[i])
end
local fields = {'status', ARGV[1], 'finished_at', ARGV[2]}
if ARGV[3] ~= '' then table.insert(fields, 'error'); table.insert(fields, ARGV[3]) end
if ARGV[4] ~= '' then table.insert(fields, 'result'); table.insert(fields, ARGV[4]) end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('HDEL', KEYS[1], 'messages', 'tools')
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
if read[2] or read[3] or read[4] then return {'ended', read[2], read[3], read[4]} end
return 'ended'
"""

# KEYS: turn, events, attached, cancel. ARGV: grace s, sealed id. Forgets a turn
# whose conversation was deleted: its record loses what it held of the conversation (the
# request, its messages and tools, its preview, the result) and is marked `forgotten`,
# which every read takes for gone; its stream keeps only its `done` entry. Both go after
# the grace, which lets a client still reading the stream read its ending; the rest goes
# at once (an ended turn's worker learns it is over at its next liveness renewal:
# shared/liveness.py). A write of its worker still running finds the stream sealed, or
# gone, and never creates it again (`NOMKSTREAM`: shared/streams.py). Returns 1.
FORGET = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HDEL', KEYS[1], 'request', 'messages', 'tools', 'preview', 'result')
  redis.call('HSET', KEYS[1], 'forgotten', '1')
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('XTRIM', KEYS[2], 'MINID', ARGV[2])
  redis.call('EXPIRE', KEYS[2], ARGV[1])
end
redis.call('DEL', KEYS[3], KEYS[4])
return 1
"""
# How long a forgotten turn's emptied keys stay, for the readers of its stream.
FORGET_GRACE_S = 60


# -- endings -----------------------------------------------------------------------------


class Cause(StrEnum):
    """What stopped a turn short of completing, or a reader short of its `done`. The
    reasons a running turn is told to stop (`RENEWAL_STOPS`, a failover) are causes too."""

    CANCELLED = "cancelled"  # a cancel reached its worker: as it claimed it, or while it ran
    CANCELLED_QUEUED = "cancelled_queued"  # a cancel of a turn no worker took yet (the API)
    # A newer message in its conversation stopped it (shared/cancel.py `Stop.INTERRUPT`): as
    # a cancel, while it ran or before any worker took it.
    INTERRUPTED = "interrupted"
    INTERRUPTED_QUEUED = "interrupted_queued"
    CONVERSATION_DELETED = "conversation_deleted"  # the API deleted its conversation
    CONVERSATION_GONE = "conversation_gone"  # its worker found the conversation gone
    INVALID_REQUEST = "invalid_request"  # the request could not be made into a turn
    UPSTREAM_FAILED = "upstream_failed"
    UPSTREAM_TIMED_OUT = "upstream_timed_out"
    CONVERSATION_FULL = "conversation_full"  # its messages were refused (shared/budgets.py)
    TIMED_OUT = "timed_out"  # it ran past `turn_timeout_s`
    CRASHED = "crashed"  # anything else it raised: a bug
    SHUT_DOWN = "shut_down"  # arq cancelled the job (the worker shutting down)
    FAILED_OVER = "failed_over"  # the data role failed over while it ran (docs/scaling.md)
    # Redis refused a write for its maxmemory: while the turn ran, or as a worker took it.
    STORE_FULL = "store_full"
    STORE_FULL_QUEUED = "store_full_queued"
    # Over for its worker: another process ended it, its record is gone, or its stream
    # refused a write (shared/streams.py, `TurnOverError`).
    OVER = "over"
    LEASE_LAPSED = "lease_lapsed"  # running, and its worker's liveness lapsed: it died
    # Running, and its live worker let go of it without an ending that landed (its store
    # could not take one: shared/liveness.py).
    LET_GO = "let_go"
    STRANDED = "stranded"  # queued past `STRANDED_AFTER_S` with no job on the queue
    NOT_CREATED = "not_created"  # its creation failed after the record was stored
    RECORD_GONE = "record_gone"  # a reader waits on a turn whose record is gone
    UNREADABLE = "unreadable"  # Redis refused a reader's read of the stream
    # Entries the reader had not read yet were trimmed from the stream (MAXLEN).
    TRIMMED = "trimmed"


class Who(StrEnum):
    """Who ends a turn for a cause."""

    WORKER = "worker"  # the worker running it (worker/supervisor.py)
    ANY = "any"  # any process that finds it stuck: a reaper, a reader (`TurnStore.settle`)
    API = "api"  # the API, on a client's request or its own failure
    READER = "reader"  # nobody: only what a reader's client reads (api/relay.py)


class After(StrEnum):
    """What the worker does once it has ended its turn this way."""

    RETURN = "return"
    RAISE = "raise"  # the job's cancellation goes on to arq, which must not run it again
    FORGET = "forget"  # the turn is forgotten, as its conversation's other turns were
    # Its writes not sent yet are dropped first, and the job reports the turn "lost": the
    # ending is the reaper's, written only if nobody ended it yet.
    ABANDON = "abandon"


@dataclass(frozen=True, slots=True)
class EndingRule:
    """A turn stopped for `cause` ends with `code` (and the status shared/endings.py gives
    it), written by `who` under `guard`, then `after`; `usage`: its `done` carries the
    tokens spent so far; `partial`: what it answered so far is stored in its conversation,
    marked as stopped with `code` (worker/recording.py), so a reload shows it and the next
    turn reads it."""

    cause: Cause
    code: ErrorCode
    who: Who
    guard: Guard = Guard.ALWAYS
    after: After = After.RETURN
    usage: bool = False
    partial: bool = False

    @property
    def status(self) -> TurnStatus:
        """The status the turn ends with."""
        return PRESENTED[self.code].status


_C, _E, _W, _G = Cause, ErrorCode, Who, Guard
RULES: dict[Cause, EndingRule] = {
    rule.cause: rule
    for rule in (
        EndingRule(_C.CANCELLED, _E.TURN_CANCELLED, _W.WORKER, usage=True, partial=True),
        EndingRule(_C.CANCELLED_QUEUED, _E.TURN_CANCELLED, _W.API, _G.QUEUED),
        EndingRule(_C.INTERRUPTED, _E.TURN_INTERRUPTED, _W.WORKER, usage=True, partial=True),
        EndingRule(_C.INTERRUPTED_QUEUED, _E.TURN_INTERRUPTED, _W.API, _G.QUEUED),
        EndingRule(_C.CONVERSATION_DELETED, _E.CONVERSATION_DELETED, _W.API),
        EndingRule(_C.CONVERSATION_GONE, _E.CONVERSATION_DELETED, _W.WORKER, after=After.FORGET),
        EndingRule(_C.INVALID_REQUEST, _E.INVALID_TURN, _W.WORKER),
        EndingRule(_C.UPSTREAM_FAILED, _E.UPSTREAM_ERROR, _W.WORKER),
        EndingRule(_C.UPSTREAM_TIMED_OUT, _E.UPSTREAM_TIMEOUT, _W.WORKER),
        EndingRule(_C.CONVERSATION_FULL, _E.CONVERSATION_TOO_LARGE, _W.WORKER),
        EndingRule(_C.TIMED_OUT, _E.TURN_TIMEOUT, _W.WORKER),
        EndingRule(_C.CRASHED, _E.INTERNAL_ERROR, _W.WORKER),
        EndingRule(_C.SHUT_DOWN, _E.WORKER_SHUTDOWN, _W.WORKER, after=After.RAISE),
        EndingRule(_C.FAILED_OVER, _E.STORE_FAILOVER, _W.WORKER),
        EndingRule(_C.STORE_FULL, _E.STORE_FULL, _W.WORKER),
        EndingRule(_C.STORE_FULL_QUEUED, _E.STORE_FULL, _W.WORKER, _G.QUEUED),
        EndingRule(_C.OVER, _E.WORKER_LOST, _W.WORKER, after=After.ABANDON),
        EndingRule(_C.LEASE_LAPSED, _E.WORKER_LOST, _W.ANY),
        EndingRule(_C.LET_GO, _E.STORE_FAILOVER, _W.ANY),
        EndingRule(_C.STRANDED, _E.TURN_LOST, _W.ANY, _G.QUEUED),
        EndingRule(_C.NOT_CREATED, _E.TURN_LOST, _W.API, _G.QUEUED),
        EndingRule(_C.RECORD_GONE, _E.TURN_LOST, _W.READER),
        EndingRule(_C.UNREADABLE, _E.STREAM_UNREADABLE, _W.READER),
        EndingRule(_C.TRIMMED, _E.STREAM_TRIMMED, _W.READER),
    )
}
del _C, _E, _W, _G

# Why the liveness thread tells a turn running here to stop (worker/liveness.py).
RENEWAL_STOPS: dict[Renewal, Cause] = {
    Renewal.CANCEL_REQUESTED: Cause.CANCELLED,
    Renewal.OVER: Cause.OVER,
}


def ending_events_of(
    cause: Cause, message: str | None = None, *, usage: dict[str, int] | None = None
) -> list[Event]:
    """What the stream of a turn stopped for `cause` ends with: its `done` (with `message`
    for the table's words, and `usage` if the ending carries it), after a failed turn's
    `error` event (shared/endings.py, `ending_events`)."""
    rule = RULES[cause]
    events = ending_events(rule.code, message)
    done = events[-1]
    assert isinstance(done, Done)
    if rule.usage:
        done.usage = usage
    return events


def done_for(cause: Cause, message: str | None = None) -> Done:
    """The `done` a reader's client reads for `cause`."""
    done = ending_events_of(cause, message)[-1]
    assert isinstance(done, Done)
    return done


# A turn still `queued` this long after its creation, with no job on the queue, is one no
# worker will ever run (`stuck`). Well above the moment between the halves of
# `TurnStore.create`.
STRANDED_AFTER_S = 30.0


def stuck(
    status: TurnStatus | None, *, leased: bool, created_at: float, now: float
) -> Cause | None:
    """Why a turn can never end on its own, if it cannot: `running` with no live worker
    (`LEASE_LAPSED`, as a reaper would end it), or `queued` past `STRANDED_AFTER_S`
    (`STRANDED`, if its job is not on the queue either: the caller looks). None for a turn
    that may still end, or has."""
    if status is RUNNING and not leased:
        return Cause.LEASE_LAPSED
    if status is QUEUED and created_at < now - STRANDED_AFTER_S:
        return Cause.STRANDED
    return None
