"""shared/conversation_state.py: every transition from every status, against the real Redis.

Each test's machine belongs to an owner of its own, so its keys are its own; the fixture
deletes exactly those afterwards. A conversation here is `running` when a turn claimed it
moments ago and has no record (as between the API's claim and its creating the turn), so
no turn records are needed: `may_run` says such a turn may still run.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from shared import budgets, keys
from shared.connection import connect
from shared.conversation_state import (
    TABLE,
    ConversationMachine,
    ConversationStatus,
    ConversationTransition,
    Outcome,
    Strategy,
    derive_status,
    may_run,
    refusals,
)
from shared.records.conversation import ConversationLostError
from shared.records.keeper import RecordKeeper
from tests.support.session_redis import session_redis_url

ABSENT, IDLE, RUNNING, AWAITING = (
    ConversationStatus.ABSENT,
    ConversationStatus.IDLE,
    ConversationStatus.RUNNING,
    ConversationStatus.AWAITING_CONFIRMATION,
)
ID = "kitchen"
HOLDER, OTHER, RESUMER, WAITER = "turn-holder", "turn-other", "turn-resumer", "turn-waiter"


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    client = connect(session_redis_url())
    yield client
    await client.aclose()


@pytest.fixture
async def machine(redis: Redis) -> AsyncIterator[ConversationMachine]:
    owner = f"test-owner-{uuid.uuid4().hex}"
    yield ConversationMachine(redis, owner, retention_s=600)
    written = [key async for key in redis.scan_iter(match=f"bernard:{{c:{owner}/*")]
    written += [keys.conversations(owner)]
    await redis.delete(*written)


def proposal(confirmation_id: str, turn_id: str = HOLDER, ttl_s: float = 600) -> dict[str, Any]:
    call = {"id": f"call-{confirmation_id}", "name": "flip_switch", "arguments": '{"on": true}'}
    return {
        "confirmation_id": confirmation_id,
        "turn_id": turn_id,
        "tool_call": call,
        "summary": "Flip the switch",
        "expires_at": time.time() + ttl_s,
        "parameters": {"type": "object"},
    }


async def status(machine: ConversationMachine) -> ConversationStatus:
    """The conversation's status, from what is stored."""
    conversation = await RecordKeeper(machine._redis, machine.owner).get_conversation(ID)
    if conversation is None:
        return ABSENT
    now = time.time()
    return derive_status(
        exists=True,
        active_turn=conversation.active_turn,
        paused_turn=conversation.paused_turn,
        paused_until=conversation.paused_until,
        active_may_run=may_run(None, conversation.active_since, now),
        now=now,
        waiting=bool(conversation.waiting),
    )


async def prepare(machine: ConversationMachine, start: str) -> None:
    """Put the conversation in the state named `start`."""
    if start == "absent":
        return
    assert await machine.create(ID, turn_id=None if start == "idle" else HOLDER) is Outcome.CREATED
    if start == "awaiting":
        assert await machine.pause(ID, HOLDER, [proposal("c1")]) is Outcome.PAUSED
    if start == "awaiting two":
        assert await machine.pause(ID, HOLDER, [proposal("c1"), proposal("c2")]) is Outcome.PAUSED
    if start in ("running, one in line", "running, line full"):
        waiting = 1 if start == "running, one in line" else 2
        for n in range(waiting):
            claim = await machine.start(
                ID, f"{WAITER}{n or ''}", ended=None, strategy=Strategy.ENQUEUE, max_waiting=2
            )
            assert claim.outcome is Outcome.WAITING


Action = Callable[[ConversationMachine], Awaitable[Outcome]]


async def _decide(machine: ConversationMachine) -> Outcome:
    return (await machine.decide(ID, "c1", "approve", turn_id=RESUMER)).outcome


async def _answer(machine: ConversationMachine) -> Outcome:
    return (await machine.answer(ID, RESUMER)).outcome


async def _delete(machine: ConversationMachine) -> Outcome:
    return (await machine.delete(ID)).outcome


async def _start(machine: ConversationMachine) -> Outcome:
    return (await machine.start(ID, "turn-new", ended=None)).outcome


def _start_as(strategy: Strategy) -> Action:
    async def start(machine: ConversationMachine) -> Outcome:
        claim = await machine.start(ID, "turn-new", ended=None, strategy=strategy, max_waiting=2)
        return claim.outcome

    return start


def _advance(ended: str) -> Action:
    async def advance(machine: ConversationMachine) -> Outcome:
        return (await machine.advance(ID, ended)).outcome

    return advance


def _unclaim(turn: str) -> Action:
    async def unclaim(machine: ConversationMachine) -> Outcome:
        return (await machine.unclaim(ID, turn)).outcome

    return unclaim


ACTIONS: dict[str, Action] = {
    "create": lambda m: m.create(ID),
    "start": _start,
    "pause by the holder": lambda m: m.pause(ID, HOLDER, [proposal("p9")]),
    "pause by another": lambda m: m.pause(ID, OTHER, [proposal("p9", OTHER)]),
    "decide": _decide,
    "answer": _answer,
    "start, interrupt": _start_as(Strategy.INTERRUPT),
    "start, enqueue": _start_as(Strategy.ENQUEUE),
    "start, reject": _start_as(Strategy.REJECT),
    "unclaim by the holder": _unclaim(HOLDER),
    "unclaim by another": _unclaim(OTHER),
    "unclaim by one in line": _unclaim(WAITER),
    "advance, the holder ended": _advance(HOLDER),
    "advance, one in line ended": _advance(WAITER),
    "advance, another ended": _advance(OTHER),
    "delete": _delete,
    "announce": lambda m: m.announce(ID, {"role": "assistant", "content": "rang"}, ended=None),
    "announce, the holder ended": lambda m: m.announce(
        ID, {"role": "assistant", "content": "rang"}, ended=HOLDER
    ),
}

ROWS = [
    ("absent", "create", Outcome.CREATED, IDLE),
    ("idle", "create", Outcome.EXISTS, IDLE),
    ("running", "create", Outcome.EXISTS, RUNNING),
    ("awaiting", "create", Outcome.EXISTS, AWAITING),
    ("absent", "start", Outcome.NOT_FOUND, ABSENT),
    ("idle", "start", Outcome.STARTED, RUNNING),
    ("running", "start", Outcome.BUSY, RUNNING),
    ("awaiting", "start", Outcome.AWAITING_DECISION, AWAITING),
    ("idle", "start, interrupt", Outcome.STARTED, RUNNING),
    ("running", "start, interrupt", Outcome.WAITING, RUNNING),
    ("running", "start, enqueue", Outcome.WAITING, RUNNING),
    ("running", "start, reject", Outcome.BUSY, RUNNING),
    ("running, one in line", "start, enqueue", Outcome.WAITING, RUNNING),
    ("running, line full", "start, interrupt", Outcome.LINE_FULL, RUNNING),
    ("running, line full", "start, enqueue", Outcome.LINE_FULL, RUNNING),
    ("awaiting", "start, interrupt", Outcome.AWAITING_DECISION, AWAITING),
    ("absent", "pause by the holder", Outcome.NOT_FOUND, ABSENT),
    ("idle", "pause by another", Outcome.NOT_HOLDER, IDLE),
    ("running", "pause by the holder", Outcome.PAUSED, AWAITING),
    ("running", "pause by another", Outcome.NOT_HOLDER, RUNNING),
    ("awaiting", "pause by the holder", Outcome.NOT_HOLDER, AWAITING),
    ("absent", "decide", Outcome.NOT_FOUND, ABSENT),
    ("idle", "decide", Outcome.NO_PROPOSAL, IDLE),
    ("running", "decide", Outcome.NO_PROPOSAL, RUNNING),
    ("awaiting", "decide", Outcome.RESUMED, RUNNING),
    ("awaiting two", "decide", Outcome.DECIDED, AWAITING),
    ("absent", "answer", Outcome.NOT_FOUND, ABSENT),
    ("idle", "answer", Outcome.NO_PROPOSAL, IDLE),
    ("running", "answer", Outcome.BUSY, RUNNING),
    ("awaiting", "answer", Outcome.ANSWERING, RUNNING),
    ("awaiting two", "answer", Outcome.ANSWERING, RUNNING),
    ("absent", "unclaim by the holder", Outcome.NOT_FOUND, ABSENT),
    ("idle", "unclaim by another", Outcome.NOT_HOLDER, IDLE),
    ("running", "unclaim by the holder", Outcome.UNCLAIMED, IDLE),
    ("running", "unclaim by another", Outcome.NOT_HOLDER, RUNNING),
    ("awaiting", "unclaim by the holder", Outcome.NOT_HOLDER, AWAITING),
    ("running, one in line", "unclaim by one in line", Outcome.UNCLAIMED, RUNNING),
    ("running, one in line", "unclaim by the holder", Outcome.UNCLAIMED, RUNNING),
    ("absent", "advance, the holder ended", Outcome.NOT_FOUND, ABSENT),
    ("idle", "advance, the holder ended", Outcome.UNCHANGED, IDLE),
    ("running", "advance, the holder ended", Outcome.UNCHANGED, RUNNING),
    ("running, one in line", "advance, the holder ended", Outcome.ADVANCED, RUNNING),
    ("running, one in line", "advance, one in line ended", Outcome.LEFT, RUNNING),
    ("running, one in line", "advance, another ended", Outcome.UNCHANGED, RUNNING),
    ("awaiting", "advance, the holder ended", Outcome.UNCHANGED, AWAITING),
    ("absent", "delete", Outcome.NOT_FOUND, ABSENT),
    ("idle", "delete", Outcome.DELETED, ABSENT),
    ("running", "delete", Outcome.DELETED, ABSENT),
    ("awaiting", "delete", Outcome.DELETED, ABSENT),
    ("absent", "announce", Outcome.NOT_FOUND, ABSENT),
    ("idle", "announce", Outcome.ANNOUNCED, IDLE),
    ("running", "announce", Outcome.BUSY, RUNNING),
    ("running", "announce, the holder ended", Outcome.ANNOUNCED, RUNNING),
    ("awaiting", "announce", Outcome.AWAITING_DECISION, AWAITING),
    ("awaiting", "announce, the holder ended", Outcome.AWAITING_DECISION, AWAITING),
]


@pytest.mark.parametrize(("start", "action", "outcome", "after"), ROWS)
async def test_each_transition_from_each_status(
    machine: ConversationMachine,
    start: str,
    action: str,
    outcome: Outcome,
    after: ConversationStatus,
) -> None:
    await prepare(machine, start)
    assert await ACTIONS[action](machine) is outcome
    assert await status(machine) is after


@pytest.mark.parametrize(
    "transition", [t for t in ConversationTransition if t is not ConversationTransition.FINISH]
)
def test_the_table_says_what_each_transition_does_from_every_status(
    transition: ConversationTransition,
) -> None:
    covered = {status for rule in TABLE if rule.transition is transition for status in rule.source}
    assert covered == set(ConversationStatus)


@pytest.mark.parametrize(
    ("transition", "refused"),
    [
        (
            ConversationTransition.CREATE,
            {IDLE: Outcome.EXISTS, RUNNING: Outcome.EXISTS, AWAITING: Outcome.EXISTS},
        ),
        (
            ConversationTransition.START,
            {ABSENT: Outcome.NOT_FOUND, AWAITING: Outcome.AWAITING_DECISION},
        ),
        (ConversationTransition.ADVANCE, {ABSENT: Outcome.NOT_FOUND, IDLE: Outcome.UNCHANGED}),
        (
            ConversationTransition.PAUSE,
            {ABSENT: Outcome.NOT_FOUND, IDLE: Outcome.NOT_HOLDER, AWAITING: Outcome.NOT_HOLDER},
        ),
        (ConversationTransition.DECIDE, {ABSENT: Outcome.NOT_FOUND}),
        (
            ConversationTransition.ANSWER,
            {ABSENT: Outcome.NOT_FOUND, IDLE: Outcome.NO_PROPOSAL, RUNNING: Outcome.BUSY},
        ),
        (
            ConversationTransition.UNCLAIM,
            {ABSENT: Outcome.NOT_FOUND, IDLE: Outcome.NOT_HOLDER, AWAITING: Outcome.NOT_HOLDER},
        ),
        (ConversationTransition.DELETE, {ABSENT: Outcome.NOT_FOUND}),
        (
            ConversationTransition.ANNOUNCE,
            {ABSENT: Outcome.NOT_FOUND, RUNNING: Outcome.BUSY, AWAITING: Outcome.AWAITING_DECISION},
        ),
    ],
)
def test_what_a_script_refuses_whatever_else_holds_is_the_tables(
    transition: ConversationTransition, refused: dict[ConversationStatus, Outcome]
) -> None:
    assert refusals(transition) == refused


def test_every_process_sends_the_same_script_text() -> None:
    # Each process salts its str hashes (PYTHONHASHSEED), and so orders sets its own way:
    # a text that followed one would be a script of its own in Redis for every process.
    probe = "from shared.conversation_state import _SHAS; print(sorted(_SHAS.values()))"
    texts = {
        subprocess.run(
            [sys.executable, "-c", probe],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            check=True,
            text=True,
        ).stdout
        for seed in ("0", "1", "2", "3")
    }
    assert len(texts) == 1


NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("exists", "active", "paused", "until", "may", "waiting", "expected"),
    [
        (False, None, None, None, False, False, ABSENT),
        (True, None, None, None, False, False, IDLE),
        (True, "t1", None, None, True, False, RUNNING),
        (True, "t1", None, None, False, False, IDLE),  # its turn ended: finishing needs no script
        (True, "t1", None, None, False, True, RUNNING),  # ended, its line not moved on yet
        (True, "t1", "t1", NOW + 1, False, False, AWAITING),
        (True, "t1", "t1", NOW + 1, True, False, AWAITING),  # paused, its record not ended yet
        (True, "t1", "t1", NOW - 1, False, False, IDLE),  # the step lapsed undecided
        (True, "t2", "t1", NOW + 1, True, False, RUNNING),  # the decisions' turn holds it
    ],
)
def test_a_status_derives_from_the_metadata_and_the_active_turn(
    exists: bool,
    active: str | None,
    paused: str | None,
    until: float | None,
    may: bool,
    waiting: bool,
    expected: ConversationStatus,
) -> None:
    derived = derive_status(
        exists=exists,
        active_turn=active,
        paused_turn=paused,
        paused_until=until,
        active_may_run=may,
        now=NOW,
        waiting=waiting,
    )
    assert derived is expected


@pytest.mark.parametrize(
    ("turn_status", "since", "expected"),
    [
        ("queued", NOW - 100, True),
        ("running", NOW - 100, True),
        ("completed", NOW, False),
        ("failed", NOW, False),
        ("cancelled", NOW, False),
        ("awaiting_confirmation", NOW, False),
        (None, NOW - 1, True),  # claimed, its record about to be created
        (None, NOW - 31, False),  # claimed, and its creation never came
        (None, None, False),
    ],
)
def test_an_active_turn_may_run_while_its_record_says_so_or_its_creation_may_come(
    turn_status: str | None, since: float | None, expected: bool
) -> None:
    assert may_run(turn_status, since, NOW) is expected


# -- what each transition leaves -------------------------------------------------------------


async def test_a_start_names_the_turn_it_found_ended_and_is_refused_if_another_holds_it(
    machine: ConversationMachine,
) -> None:
    await prepare(machine, "running")
    assert (await machine.start(ID, "t-next", ended=HOLDER)).outcome is Outcome.STARTED
    # The caller saw the holder end, but the turn just started holds it now.
    refused = await machine.start(ID, "t-late", ended=HOLDER)
    assert (refused.outcome, refused.active_turn) == (Outcome.BUSY, "t-next")


async def test_the_last_decision_hands_back_the_steps_decisions_and_holds_it_for_their_turn(
    machine: ConversationMachine,
) -> None:
    await prepare(machine, "awaiting two")
    first = await machine.decide(ID, "c2", "reject", turn_id="turn-a")
    last = await machine.decide(ID, "c1", "approve", turn_id=RESUMER, arguments={"on": False})
    assert (first.outcome, first.waiting) == (Outcome.DECIDED, 1)
    assert last.outcome is Outcome.RESUMED
    assert [(p["confirmation_id"], p["state"], p.get("arguments")) for p in last.decided] == [
        ("c1", "approved", {"on": False}),
        ("c2", "rejected", None),
    ]
    assert (
        await RecordKeeper(machine._redis, machine.owner).get_conversation(ID)
    ).active_turn == RESUMER  # type: ignore[union-attr]
    again = await machine.decide(ID, "c1", "reject", turn_id="turn-b")
    assert again.outcome is Outcome.ALREADY_APPROVED
    assert (await machine.decide(ID, "c2", "approve", turn_id="turn-b")).outcome is (
        Outcome.ALREADY_REJECTED
    )


async def test_a_decision_after_its_call_lapsed_is_expired_and_stays_so(
    machine: ConversationMachine,
) -> None:
    await machine.create(ID, turn_id=HOLDER)
    await machine.pause(ID, HOLDER, [proposal("c1", ttl_s=-1)])
    assert (await machine.decide(ID, "c1", "approve", turn_id=RESUMER)).outcome is Outcome.EXPIRED
    assert (await machine.decide(ID, "c1", "approve", turn_id=RESUMER)).outcome is Outcome.EXPIRED
    proposals = await RecordKeeper(machine._redis, machine.owner).proposals(ID)
    assert [p["state"] for p in proposals] == ["expired"]


async def test_the_last_decision_of_a_step_lapses_the_calls_of_it_nobody_decided_in_time(
    machine: ConversationMachine,
) -> None:
    await machine.create(ID, turn_id=HOLDER)
    await machine.pause(ID, HOLDER, [proposal("c1"), proposal("c2", ttl_s=-1)])
    resumed = await machine.decide(ID, "c1", "approve", turn_id=RESUMER)
    assert [p["confirmation_id"] for p in resumed.decided] == ["c1"]
    proposals = await RecordKeeper(machine._redis, machine.owner).proposals(ID)
    assert {p["confirmation_id"]: p["state"] for p in proposals} == {
        "c1": "approved",
        "c2": "expired",
    }


async def test_a_new_message_after_a_step_lapsed_undecided_lapses_its_calls(
    machine: ConversationMachine,
) -> None:
    """The new turn answers them "not run": none of them may be decided after it."""
    await machine.create(ID, turn_id=HOLDER)
    await machine.pause(ID, HOLDER, [proposal("c1", ttl_s=-1)])
    assert (await machine.start(ID, "t-next", ended=HOLDER)).outcome is Outcome.STARTED
    proposals = await RecordKeeper(machine._redis, machine.owner).proposals(ID)
    assert [p["state"] for p in proposals] == ["expired"]


async def test_a_steps_proposals_leave_when_the_next_step_pauses_however_many_steps(
    machine: ConversationMachine,
) -> None:
    """The hash holds the latest step's calls: an earlier step's go, answered or lapsed
    undecided (a new message went on), and deciding one of them finds nothing."""
    stored = machine.keys(ID)[1]
    await machine.create(ID, turn_id="turn-0")
    for step in range(11):
        turn, following = f"turn-{step}", f"turn-{step + 1}"
        answered = step % 2 == 0
        # 8 calls: as many as a step may propose (the per-conversation budget's default).
        calls = [proposal(f"c{step}-{n}", turn, ttl_s=600 if answered else -1) for n in range(8)]
        assert await machine.pause(ID, turn, calls) is Outcome.PAUSED
        assert await machine._redis.hlen(stored) == 8, f"step {step}"  # type: ignore[misc]
        if answered:
            for call in calls:
                await machine.decide(ID, call["confirmation_id"], "approve", turn_id=following)
        else:
            assert (await machine.start(ID, following, ended=turn)).outcome is Outcome.STARTED
    fields = await machine._redis.hkeys(stored)  # type: ignore[misc]
    assert sorted(field.decode() for field in fields) == [f"c10-{n}" for n in range(8)]
    for earlier in ("c8-0", "c9-0"):  # answered, lapsed
        decided = await machine.decide(ID, earlier, "approve", turn_id="turn-late")
        assert decided.outcome is Outcome.NO_PROPOSAL


async def test_an_answer_in_words_hands_the_steps_waiting_calls_to_its_turn_and_out_of_budget(
    machine: ConversationMachine,
) -> None:
    await machine.create(ID, turn_id=HOLDER)
    await machine.pause(ID, HOLDER, [proposal("c1"), proposal("c2"), proposal("c3", ttl_s=-1)])
    assert await budgets.pending_confirmation_count(machine._redis, machine.owner) == 2
    handed = await machine.answer(ID, RESUMER)
    assert handed.outcome is Outcome.ANSWERING
    assert [p["confirmation_id"] for p in handed.decided] == ["c1", "c2"]
    stored = await RecordKeeper(machine._redis, machine.owner).proposals(ID)
    assert {p["confirmation_id"]: (p["state"], p.get("resumed_by")) for p in stored} == {
        "c1": ("answering", RESUMER),
        "c2": ("answering", RESUMER),
        "c3": ("expired", None),
    }
    conversation = await RecordKeeper(machine._redis, machine.owner).get_conversation(ID)
    assert conversation is not None and conversation.active_turn == RESUMER
    assert await budgets.pending_confirmation_count(machine._redis, machine.owner) == 0
    # Nobody decides them on the side meanwhile, nor answers them twice.
    assert (await machine.decide(ID, "c1", "approve", turn_id="t-late")).outcome is (
        Outcome.EXPIRED
    )
    assert (await machine.answer(ID, "t-late")).outcome is Outcome.BUSY


async def test_unclaiming_the_turn_of_an_answer_in_words_lets_the_calls_wait_again(
    machine: ConversationMachine,
) -> None:
    await prepare(machine, "awaiting")
    await machine.answer(ID, RESUMER)
    assert (await machine.unclaim(ID, RESUMER)).outcome is Outcome.UNCLAIMED
    assert await status(machine) is AWAITING
    (waiting,) = await RecordKeeper(machine._redis, machine.owner).proposals(ID)
    assert (waiting["state"], "resumed_by" in waiting) == ("pending", False)


async def test_unclaiming_the_turn_of_a_steps_decisions_lets_them_be_made_again(
    machine: ConversationMachine,
) -> None:
    await prepare(machine, "awaiting")
    await machine.decide(ID, "c1", "approve", turn_id=RESUMER, arguments={"on": False})
    assert (await machine.unclaim(ID, RESUMER)).outcome is Outcome.UNCLAIMED
    assert await status(machine) is AWAITING
    (waiting,) = await RecordKeeper(machine._redis, machine.owner).proposals(ID)
    assert (waiting["state"], "arguments" in waiting, "resumed_by" in waiting) == (
        "pending",
        False,
        False,
    )
    turns = await machine._redis.zrange(machine.keys(ID)[2], 0, -1)
    assert turns == [HOLDER.encode()]
    again = await machine.decide(ID, "c1", "reject", turn_id="turn-again")
    assert again.outcome is Outcome.RESUMED


async def test_deleting_hands_back_every_turn_that_held_it_and_leaves_no_key(
    machine: ConversationMachine,
) -> None:
    await prepare(machine, "awaiting")
    await machine.decide(ID, "c1", "approve", turn_id=RESUMER)
    deleted = await machine.delete(ID)
    assert (deleted.outcome, deleted.active_turn, sorted(deleted.turn_ids)) == (
        Outcome.DELETED,
        RESUMER,
        [HOLDER, RESUMER],
    )
    assert [k async for k in machine._redis.scan_iter(match=f"bernard:{{c:{machine.owner}/*")] == []
    assert await machine._redis.zscore(keys.conversations(machine.owner), ID) is None


async def test_a_conversation_created_again_is_a_new_incarnation_without_the_old_ones_keys(
    machine: ConversationMachine, redis: Redis
) -> None:
    keeper = RecordKeeper(redis, machine.owner)
    await machine.create(ID, turn_id=HOLDER)
    first = (await keeper.get_conversation(ID)).incarnation  # type: ignore[union-attr]
    await machine.delete(ID)
    # A summary job of the old one finishes after the deletion.
    await redis.set(keys.conversation_summary(machine.owner, ID), b'{"text": "old"}', ex=60)
    await machine.create(ID)
    second = (await keeper.get_conversation(ID)).incarnation  # type: ignore[union-attr]
    assert first and second and first != second
    assert await keeper.summary(ID) is None
    await keeper.save_summary(ID, "old news", covers_to=3, incarnation=first)
    assert await keeper.summary(ID) is None, "another incarnation's summary is refused"
    await keeper.save_summary(ID, "new news", covers_to=3, incarnation=second)
    assert (await keeper.summary(ID) or {})["text"] == "new news"


async def test_a_turn_that_does_not_hold_the_conversation_writes_nothing_into_it(
    machine: ConversationMachine, redis: Redis
) -> None:
    keeper = RecordKeeper(redis, machine.owner)
    await machine.create(ID, turn_id=HOLDER)
    await keeper.append_messages(ID, [{"role": "user", "content": "mine"}], turn_id=HOLDER)
    for write in (
        keeper.append_messages(ID, [{"role": "assistant", "content": "stale"}], turn_id=OTHER),
        keeper.append_new_messages(ID, [{"role": "user", "content": "new"}], turn_id=OTHER),
        keeper.append_new_messages(ID, [], turn_id=OTHER),  # nothing new: still checked
        keeper.propose(ID, [proposal("p1", OTHER)], turn_id=OTHER),
    ):
        with pytest.raises(ConversationLostError):
            await write
    assert await keeper.messages(ID) == [{"role": "user", "content": "mine"}]
    assert await keeper.proposals(ID) == []


async def test_an_announcement_is_a_row_after_the_others_counted_as_any_append(
    machine: ConversationMachine,
) -> None:
    await prepare(machine, "idle")
    keeper = RecordKeeper(machine._redis, machine.owner)
    await keeper.append_messages(ID, [{"role": "user", "content": "hi"}])
    before = await budgets.read_usage(machine._redis, machine.owner, retention_s=60)
    message = {"role": "assistant", "content": "rang"}
    assert await machine.announce(ID, message, ended=None) is Outcome.ANNOUNCED
    rows, _ = await keeper.rows(ID)
    assert [(r["id"], r["role"], r["content"], r["turn_id"]) for r in rows] == [
        ("msg_1", "user", "hi", None),
        ("msg_2", "assistant", "rang", None),
    ]
    first, stored = await machine._redis.lrange(
        keys.conversation_messages(machine.owner, ID), 0, -1
    )  # type: ignore[misc]
    after = await budgets.read_usage(machine._redis, machine.owner, retention_s=60)
    conversation = await keeper.get_conversation(ID)
    assert conversation is not None and conversation.bytes == len(first) + len(stored)
    assert after.bytes - before.bytes == len(stored), "the owner's ledger counts it too"


async def test_no_announcement_stands_between_calls_and_their_results(
    machine: ConversationMachine,
) -> None:
    """Idle, but the history ends on a call nobody answered yet (a step that lapsed
    undecided): refused until the next turn answered it."""
    await prepare(machine, "idle")
    keeper = RecordKeeper(machine._redis, machine.owner)
    call = {"id": "call-1", "type": "function", "function": {"name": "flip", "arguments": "{}"}}
    await keeper.append_messages(ID, [{"role": "assistant", "content": "", "tool_calls": [call]}])
    message = {"role": "assistant", "content": "rang"}
    assert await machine.announce(ID, message, ended=None) is Outcome.OPEN_CALLS
    await keeper.append_messages(
        ID, [{"role": "tool", "content": "Not run.", "tool_call_id": "call-1", "name": "flip"}]
    )
    assert await machine.announce(ID, message, ended=None) is Outcome.ANNOUNCED
    assert [m["role"] for m in await keeper.messages(ID)] == ["assistant", "tool", "assistant"]


async def test_the_set_of_turns_forgets_those_older_than_a_turns_keys_live(redis: Redis) -> None:
    owner = f"test-owner-{uuid.uuid4().hex}"
    machine = ConversationMachine(redis, owner, retention_s=600, turn_keep_s=1)
    try:
        await machine.create(ID, turn_id="t-old")
        await asyncio.sleep(1.1)
        await machine.start(ID, "t-new", ended="t-old")
        assert (await machine.delete(ID)).turn_ids == ("t-new",)
    finally:
        await redis.delete(keys.conversations(owner))


# -- two requests at once --------------------------------------------------------------------


async def test_the_last_decision_and_a_new_message_at_once_always_leave_the_decision_standing(
    machine: ConversationMachine,
) -> None:
    """Whichever script runs first, the decision holds the conversation for its turn and
    the message is refused: never a message running while the call waits or was decided."""
    for n in range(50):
        conversation = f"race-{n}"
        await machine.create(conversation, turn_id=HOLDER)
        await machine.pause(conversation, HOLDER, [proposal(f"c{n}")])
        decision, claim = await asyncio.gather(
            machine.decide(conversation, f"c{n}", "approve", turn_id=RESUMER),
            machine.start(conversation, "turn-message", ended=HOLDER),
        )
        assert decision.outcome is Outcome.RESUMED
        assert claim.outcome in (Outcome.BUSY, Outcome.AWAITING_DECISION)
        await machine.delete(conversation)


async def test_a_deletion_and_a_new_message_at_once_never_leave_a_turn_holding_nothing(
    machine: ConversationMachine,
) -> None:
    """Either the message's turn started first, and the deletion hands it back to be ended,
    or the deletion came first and the message finds no conversation."""
    for n in range(50):
        conversation = f"race-{n}"
        await machine.create(conversation)
        deletion, claim = await asyncio.gather(
            machine.delete(conversation), machine.start(conversation, f"t{n}", ended=None)
        )
        assert deletion.outcome is Outcome.DELETED
        if claim.outcome is Outcome.STARTED:
            assert (deletion.active_turn, deletion.turn_ids) == (f"t{n}", (f"t{n}",))
        else:
            assert claim.outcome is Outcome.NOT_FOUND
            assert (deletion.active_turn, deletion.turn_ids) == (None, ())


# -- the line: messages that came while a turn ran ---------------------------------------------


async def line_of(machine: ConversationMachine) -> tuple[str | None, tuple[str, ...]]:
    """The conversation's holder and its line, first first."""
    conversation = await RecordKeeper(machine._redis, machine.owner).get_conversation(ID)
    assert conversation is not None
    return conversation.active_turn, conversation.waiting


async def test_an_interrupting_message_names_the_running_turn_to_stop_and_waits_behind_it(
    machine: ConversationMachine,
) -> None:
    await prepare(machine, "running")
    claim = await machine.start(ID, "t-b", ended=None, strategy=Strategy.INTERRUPT, max_waiting=3)
    assert (claim.outcome, claim.active_turn, claim.waiting, claim.stop) == (
        Outcome.WAITING,
        HOLDER,
        1,
        HOLDER,
    )
    # A message racing it waits behind it, and interrupts the same running turn: no turn
    # of a message stops another message's.
    racer = await machine.start(ID, "t-c", ended=None, strategy=Strategy.INTERRUPT, max_waiting=3)
    assert (racer.outcome, racer.waiting, racer.stop) == (Outcome.WAITING, 2, HOLDER)
    queued = await machine.start(ID, "t-d", ended=None, strategy=Strategy.ENQUEUE, max_waiting=3)
    assert (queued.outcome, queued.waiting, queued.stop) == (Outcome.WAITING, 3, None)
    assert await line_of(machine) == (HOLDER, ("t-b", "t-c", "t-d"))
    full = await machine.start(ID, "t-e", ended=None, strategy=Strategy.INTERRUPT, max_waiting=3)
    assert (full.outcome, full.active_turn) == (Outcome.LINE_FULL, HOLDER)
    turns = await machine._redis.zrange(machine.keys(ID)[2], 0, -1)
    assert sorted(turns) == sorted(t.encode() for t in (HOLDER, "t-b", "t-c", "t-d")), "deletable"


async def test_a_message_behind_an_ended_turn_whose_line_did_not_move_stops_nothing(
    machine: ConversationMachine,
) -> None:
    """The holder ended, the line behind it not moved on yet: a new message joins the line
    (it must not pass the one waiting) and has nothing to stop."""
    await prepare(machine, "running, one in line")
    claim = await machine.start(
        ID, "t-new", ended=HOLDER, strategy=Strategy.INTERRUPT, max_waiting=3
    )
    assert (claim.outcome, claim.waiting, claim.stop) == (Outcome.WAITING, 2, None)


async def test_the_line_moves_one_turn_at_a_time_as_each_ends(
    machine: ConversationMachine,
) -> None:
    await prepare(machine, "running")
    for turn in ("t-b", "t-c"):
        await machine.start(ID, turn, ended=None, strategy=Strategy.ENQUEUE, max_waiting=3)
    # Any number of enders may report the same ending: the line moves once.
    first = await machine.advance(ID, HOLDER)
    again = await machine.advance(ID, HOLDER)
    assert (first.outcome, first.holder, first.waiting) == (Outcome.ADVANCED, "t-b", 1)
    assert again.outcome is Outcome.UNCHANGED
    assert await line_of(machine) == ("t-b", ("t-c",))
    last = await machine.advance(ID, "t-b")
    assert (last.outcome, last.holder, last.waiting) == (Outcome.ADVANCED, "t-c", 0)
    assert await line_of(machine) == ("t-c", ())
    assert (await machine.advance(ID, "t-c")).outcome is Outcome.UNCHANGED


async def test_a_turn_that_ends_while_it_waits_leaves_the_line_and_is_never_handed_it(
    machine: ConversationMachine,
) -> None:
    await prepare(machine, "running")
    for turn in ("t-b", "t-c"):
        await machine.start(ID, turn, ended=None, strategy=Strategy.ENQUEUE, max_waiting=3)
    assert (await machine.advance(ID, "t-b")).outcome is Outcome.LEFT  # cancelled while queued
    advanced = await machine.advance(ID, HOLDER)
    assert (advanced.outcome, advanced.holder) == (Outcome.ADVANCED, "t-c")


async def test_the_line_moves_past_a_paused_turn_and_its_calls_lapse(
    machine: ConversationMachine,
) -> None:
    await prepare(machine, "running, one in line")
    assert await machine.pause(ID, HOLDER, [proposal("c1")]) is Outcome.PAUSED
    advanced = await machine.advance(ID, HOLDER)
    assert (advanced.outcome, advanced.holder) == (Outcome.ADVANCED, WAITER)
    (lapsed,) = await RecordKeeper(machine._redis, machine.owner).proposals(ID)
    assert lapsed["state"] == "expired"
    assert await status(machine) is RUNNING


async def test_a_turn_in_line_that_was_never_created_leaves_it_and_the_holder_hands_it_on(
    machine: ConversationMachine,
) -> None:
    await prepare(machine, "running")
    for turn in ("t-b", "t-c"):
        await machine.start(ID, turn, ended=None, strategy=Strategy.ENQUEUE, max_waiting=3)
    gone = await machine.unclaim(ID, "t-b")
    assert (gone.outcome, gone.holder) == (Outcome.UNCLAIMED, None)
    assert await line_of(machine) == (HOLDER, ("t-c",))
    handed = await machine.unclaim(ID, HOLDER)
    assert (handed.outcome, handed.holder) == (Outcome.UNCLAIMED, "t-c")
    assert await line_of(machine) == ("t-c", ())


async def test_deleting_names_the_turns_that_waited_in_line(machine: ConversationMachine) -> None:
    await prepare(machine, "running, line full")
    deleted = await machine.delete(ID)
    assert (deleted.active_turn, deleted.waiting) == (HOLDER, (WAITER, f"{WAITER}1"))
    assert sorted(deleted.turn_ids) == sorted([HOLDER, WAITER, f"{WAITER}1"])
