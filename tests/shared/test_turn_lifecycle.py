"""shared/lifecycle.py: how a turn ends for each cause, when it is stuck, and what each
transition's script does from each status, held against Redis.

Every expected value is written out: the tables are the behaviour, so a change to one must
change this file too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest
import redis.asyncio as redis_asyncio

from shared import keys
from shared.endings import completed
from shared.errors import ErrorCode
from shared.events import Delta, Done, Error, Start, TurnStatus, encode
from shared.lifecycle import (
    RENEWAL_STOPS,
    RULES,
    STRANDED_AFTER_S,
    TRANSITIONS,
    After,
    Cause,
    Claimed,
    Finished,
    Guard,
    Renewal,
    TurnTransition,
    Who,
    ending_events_of,
    stuck,
)
from shared.requests import AgentRequest, TurnRequest
from shared.streams import parse_entries
from shared.turn_record import TurnRecord
from shared.turns import TurnStore

# -- the endings table -------------------------------------------------------------------

# cause, code, status, who ends it, guard, after, whether its `done` keeps the usage, and
# whether what it answered so far is kept in its conversation.
ENDING_ROWS = [
    ("cancelled", "turn_cancelled", "cancelled", "worker", "always", "return", True, True),
    ("cancelled_queued", "turn_cancelled", "cancelled", "api", "queued", "return", False, False),
    ("interrupted", "turn_interrupted", "cancelled", "worker", "always", "return", True, True),
    (
        "interrupted_queued",
        "turn_interrupted",
        "cancelled",
        "api",
        "queued",
        "return",
        False,
        False,
    ),
    (
        "conversation_deleted",
        "conversation_deleted",
        "cancelled",
        "api",
        "always",
        "return",
        False,
        False,
    ),
    (
        "conversation_gone",
        "conversation_deleted",
        "cancelled",
        "worker",
        "always",
        "forget",
        False,
        False,
    ),
    ("invalid_request", "invalid_turn", "failed", "worker", "always", "return", False, False),
    ("upstream_failed", "upstream_error", "failed", "worker", "always", "return", False, False),
    (
        "upstream_timed_out",
        "upstream_timeout",
        "failed",
        "worker",
        "always",
        "return",
        False,
        False,
    ),
    (
        "conversation_full",
        "conversation_too_large",
        "failed",
        "worker",
        "always",
        "return",
        False,
        False,
    ),
    ("timed_out", "turn_timeout", "failed", "worker", "always", "return", False, False),
    ("crashed", "internal_error", "failed", "worker", "always", "return", False, False),
    ("shut_down", "worker_shutdown", "failed", "worker", "always", "raise", False, False),
    ("failed_over", "store_failover", "failed", "worker", "always", "return", False, False),
    ("store_full", "store_full", "failed", "worker", "always", "return", False, False),
    ("store_full_queued", "store_full", "failed", "worker", "queued", "return", False, False),
    ("over", "worker_lost", "failed", "worker", "always", "abandon", False, False),
    ("lease_lapsed", "worker_lost", "failed", "any", "always", "return", False, False),
    ("let_go", "store_failover", "failed", "any", "always", "return", False, False),
    ("stranded", "turn_lost", "failed", "any", "queued", "return", False, False),
    ("not_created", "turn_lost", "failed", "api", "queued", "return", False, False),
    ("record_gone", "turn_lost", "failed", "reader", "always", "return", False, False),
    ("unreadable", "stream_unreadable", "failed", "reader", "always", "return", False, False),
    ("trimmed", "stream_trimmed", "failed", "reader", "always", "return", False, False),
]


def test_every_cause_has_one_ending() -> None:
    assert sorted(RULES) == sorted(row[0] for row in ENDING_ROWS)
    assert sorted(Cause) == sorted(row[0] for row in ENDING_ROWS)


@pytest.mark.parametrize(
    ("cause", "code", "status", "who", "guard", "after", "usage", "partial"), ENDING_ROWS
)
def test_each_cause_ends_a_turn_one_way(
    cause: str,
    code: str,
    status: str,
    who: str,
    guard: str,
    after: str,
    usage: bool,
    partial: bool,
) -> None:
    rule = RULES[Cause(cause)]
    assert (rule.code, rule.status, rule.who, rule.guard, rule.after, rule.usage) == (
        code,
        status,
        who,
        guard,
        after,
        usage,
    )
    assert rule.partial is partial


def test_a_cancelled_turns_done_carries_the_usage_so_far_and_a_failed_ones_does_not() -> None:
    usage = {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    error = {"message": "the turn was cancelled", "type": "cancelled", "code": "turn_cancelled"}
    assert ending_events_of(Cause.CANCELLED, usage=usage) == [
        Done(status=TurnStatus.CANCELLED, usage=usage, error=error)
    ]
    words = "the turn took too long and was stopped"
    assert ending_events_of(Cause.TIMED_OUT, usage=usage) == [
        Error(message=words, code="turn_timeout"),
        Done(
            status=TurnStatus.FAILED,
            error={"message": words, "type": "server_error", "code": "turn_timeout"},
        ),
    ]


def test_the_liveness_thread_stops_a_turn_for_a_cancel_or_when_it_is_over() -> None:
    assert RENEWAL_STOPS == {"cancel_requested": "cancelled", "over": "over"}


NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("status", "leased", "age_s", "cause"),
    [
        ("running", False, 0.0, "lease_lapsed"),
        ("running", True, 0.0, None),
        ("running", True, 3600.0, None),
        ("queued", False, STRANDED_AFTER_S + 1, "stranded"),
        ("queued", False, STRANDED_AFTER_S - 1, None),  # its creation may be under way
        ("completed", False, 3600.0, None),
        ("failed", False, 3600.0, None),
        ("cancelled", False, 3600.0, None),
        ("awaiting_confirmation", False, 3600.0, None),
    ],
)
def test_a_turn_is_stuck_when_nothing_can_end_it_but_a_settle(
    status: str, leased: bool, age_s: float, cause: str | None
) -> None:
    found = stuck(TurnStatus(status), leased=leased, created_at=NOW - age_s, now=NOW)
    assert found == cause


# -- the transitions, against Redis ------------------------------------------------------

OWNER = f"owner-{uuid.uuid4().hex}"  # this module's: its count of active turns is deleted


@pytest.fixture
async def store(redis: redis_asyncio.Redis) -> AsyncIterator[TurnStore]:
    store = TurnStore(redis, retention_s=300, stream_maxlen=1000)
    store.written = []  # type: ignore[attr-defined]
    yield store
    for turn_id in store.written:  # type: ignore[attr-defined]
        doomed = (keys.turn, keys.events, keys.cancel, keys.attached)
        await redis.delete(*(key(turn_id) for key in doomed))
        await redis.zrem(keys.RUNNING_TURNS, turn_id)
    await redis.delete(keys.active_turns(OWNER), keys.turns(OWNER))


Setup = Callable[[TurnStore, str], Awaitable[None]]


async def _queued(store: TurnStore, turn_id: str) -> None:
    request = TurnRequest(AgentRequest([{"role": "user", "content": "hi"}]))
    record = TurnRecord(id=turn_id, owner=OWNER, request=request, model="bernard-v1")
    await store.create(record, ttl_s=60, queue_name=None)


async def _running(store: TurnStore, turn_id: str, worker: str = "worker-1") -> None:
    await _queued(store, turn_id)
    await store.liveness.keep(worker, 30, stale_s=3600)
    assert (await store.claim(turn_id, worker, 30)).outcome == "claimed"


async def _running_worker_lapsed(store: TurnStore, turn_id: str) -> None:
    """Its worker died: the worker's liveness key lapsed (shared/liveness.py)."""
    await _running(store, turn_id, worker="worker-lapsed")
    await store.redis.delete(keys.worker_alive("worker-lapsed"))


async def _running_cancel_asked(store: TurnStore, turn_id: str) -> None:
    await _running(store, turn_id)
    await store.redis.set(keys.cancel(turn_id), b"1")


async def _completed(store: TurnStore, turn_id: str) -> None:
    await _running(store, turn_id)
    await store.finish(turn_id, OWNER, completed("stop", None))


async def _missing(store: TurnStore, turn_id: str) -> None:
    """No record, and a stream its worker wrote after Redis lost the record."""
    await store.redis.xadd(keys.events(turn_id), {"e": encode(Delta(text="late"))})


SETUPS: dict[str, tuple[Setup, str | None]] = {
    # name: how, the status it leaves (None: no record)
    "queued": (_queued, "queued"),
    "running": (_running, "running"),
    "running, worker lapsed": (_running_worker_lapsed, "running"),
    "running, cancel asked": (_running_cancel_asked, "running"),
    "completed": (_completed, "completed"),
    "missing": (_missing, None),
}


def _in_table(transition: TurnTransition, status: str | None, outcome: str) -> bool:
    source = TurnStatus(status) if status is not None else None
    return any(
        move.transition is transition and source in move.source and move.outcome == outcome
        for move in TRANSITIONS
    )


FAILED = Done(status=TurnStatus.FAILED, error={"message": "m", "type": "t", "code": "c"})


@pytest.mark.parametrize(
    ("setup", "guard", "outcome", "after"),
    [
        ("queued", "always", "ended", "failed"),
        ("queued", "queued", "ended", "failed"),
        ("running", "always", "ended", "failed"),
        ("running", "queued", "refused", "running"),
        # Whether the worker lives the caller looked up first (shared/liveness.py).
        ("running, worker lapsed", "always", "ended", "failed"),
        ("completed", "always", "over", "completed"),
        ("missing", "always", "gone", None),
    ],
)
async def test_finishing_ends_a_turn_once_and_only_under_its_guard(
    redis: redis_asyncio.Redis,
    store: TurnStore,
    setup: str,
    guard: str,
    outcome: str,
    after: str | None,
) -> None:
    turn_id = uuid.uuid4().hex
    store.written.append(turn_id)  # type: ignore[attr-defined]
    prepare, status = SETUPS[setup]
    await prepare(store, turn_id)
    assert await store.finish(turn_id, OWNER, FAILED, guard=Guard(guard)) == outcome
    assert _in_table(TurnTransition.FINISH, status, outcome)
    stored = await redis.hget(keys.turn(turn_id), "status")
    assert (stored.decode() if stored else None) == after
    dones = [
        e.event
        for _, e in parse_entries(await redis.xrange(keys.events(turn_id)))
        if isinstance(e.event, Done)
    ]
    if outcome == Finished.ENDED:
        assert dones == [FAILED]
    elif outcome == Finished.GONE:  # what was written after the record went is dropped
        assert await redis.exists(keys.events(turn_id)) == 0
    else:
        assert dones == ([] if status in ("queued", "running") else [completed("stop", None)])


@pytest.mark.parametrize(
    ("setup", "outcome", "after"),
    [
        ("queued", "claimed", "running"),
        ("running", "running", "running"),
        ("completed", "completed", "completed"),
        ("missing", "missing", None),
    ],
)
async def test_claiming_takes_only_a_queued_turn(
    redis: redis_asyncio.Redis, store: TurnStore, setup: str, outcome: str, after: str | None
) -> None:
    turn_id = uuid.uuid4().hex
    store.written.append(turn_id)  # type: ignore[attr-defined]
    prepare, status = SETUPS[setup]
    await prepare(store, turn_id)
    claim = await store.claim(turn_id, "worker-2", 30)
    assert claim.outcome == outcome
    assert (claim.record is not None) is (outcome == Claimed.CLAIMED)
    assert _in_table(TurnTransition.CLAIM, status, outcome)
    stored = await redis.hget(keys.turn(turn_id), "status")
    assert (stored.decode() if stored else None) == after


@pytest.mark.parametrize(
    ("cause", "setup", "outcome", "after"),
    [
        ("cancelled_queued", "queued", "ended", "cancelled"),
        ("cancelled_queued", "running", "refused", "running"),  # its worker heard the cancel
        ("lease_lapsed", "running, worker lapsed", "ended", "failed"),
        ("lease_lapsed", "queued", "ended", "failed"),  # a claim cut off between its halves
        ("not_created", "queued", "ended", "failed"),
        ("over", "completed", "over", "completed"),
    ],
)
async def test_ending_for_a_cause_writes_its_code_under_its_guard(
    redis: redis_asyncio.Redis, store: TurnStore, cause: str, setup: str, outcome: str, after: str
) -> None:
    turn_id = uuid.uuid4().hex
    store.written.append(turn_id)  # type: ignore[attr-defined]
    await SETUPS[setup][0](store, turn_id)
    assert await store.end(turn_id, OWNER, Cause(cause)) == outcome
    assert (await redis.hget(keys.turn(turn_id), "status")) == after.encode()


@pytest.mark.parametrize("cause", [Cause.RECORD_GONE, Cause.UNREADABLE, Cause.TRIMMED])
async def test_a_readers_ending_is_never_written(store: TurnStore, cause: Cause) -> None:
    with pytest.raises(ValueError, match="a reader's ending"):
        await store.end(uuid.uuid4().hex, OWNER, cause)


async def test_settling_ends_a_turn_whose_worker_died_and_reads_the_rest(
    redis: redis_asyncio.Redis, store: TurnStore
) -> None:
    lapsed, live, stranded, gone = (uuid.uuid4().hex for _ in range(4))
    store.written += [lapsed, live, stranded]  # type: ignore[attr-defined]
    await _running_worker_lapsed(store, lapsed)
    await _running(store, live)
    await _queued(store, stranded)
    await redis.hset(keys.turn(stranded), "created_at", repr(time.time() - STRANDED_AFTER_S - 5))
    assert await store.settle_many([lapsed, live, stranded, gone]) == [
        "failed",
        "running",
        "failed",  # no job on the queue either
        None,
    ]
    errors = [await redis.hget(keys.turn(t), "error") for t in (lapsed, live, stranded)]
    assert [e and ErrorCode(orjson.loads(e)["code"]) for e in errors] == [
        "worker_lost",
        None,
        "turn_lost",
    ]
    stream = parse_entries(await redis.xrange(keys.events(lapsed)))
    assert [type(e.event) for _, e in stream] == [Start, Error, Done]


def test_who_ends_and_what_follows_are_the_only_values_the_table_uses() -> None:
    assert {rule.who for rule in RULES.values()} == set(Who)
    assert {rule.after for rule in RULES.values()} == set(After)
    assert {rule.guard for rule in RULES.values()} == set(Guard)
    assert {Renewal(r) for r in RENEWAL_STOPS} == {Renewal.CANCEL_REQUESTED, Renewal.OVER}
