"""The record keeper against the real Redis, and conversation continuation.

Each test's keeper belongs to an owner of its own, so its keys are its own; the fixture
deletes exactly those afterwards.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any
from unittest.mock import ANY

import orjson
import pytest
from redis.asyncio import Redis

from shared import budgets, keys
from shared.connection import connect
from shared.conversation_state import ConversationMachine, Deletion, Outcome
from shared.records.call_log import llm_completed, llm_started, tool_completed, tool_started
from shared.records.conversation import (
    ConversationExistsError,
    ConversationLostError,
    ConversationNotFoundError,
)
from shared.records.decisions import APPROVED_STEP_LAPSED, DECIDED_NOT_CARRIED_OUT
from shared.records.history_diff import new_messages
from shared.records.keeper import RecordKeeper
from shared.records.messages import to_openai_message
from shared.records.reads import Archivist
from shared.records.writes import Recorder
from tests.support.messages import assistant, user
from tests.support.session_redis import session_redis_url


@pytest.fixture
def owner() -> str:
    return f"test-owner-{uuid.uuid4().hex}"


def owned_keys(owner: str) -> str:
    """The pattern of every key an owner's conversations have."""
    return f"bernard:{{c:{owner}/*"


@pytest.fixture(params=[False, True], ids=["bytes", "decoded"])
async def client(request: pytest.FixtureRequest, owner: str) -> AsyncIterator[Redis]:
    # Both client flavours: the worker's raw-bytes client and a decode_responses one.
    redis = connect(session_redis_url(), decode_responses=request.param)
    yield redis
    written = [key async for key in redis.scan_iter(match=owned_keys(owner))]
    if written:
        await redis.delete(*written)
    await redis.aclose()


@pytest.fixture
def keeper(client: Redis, owner: str) -> RecordKeeper:
    return RecordKeeper(client, owner)


SYSTEM = {"role": "system", "content": "Be brief."}
ROUTER_STEP = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}
    ],
}
TOOL_RESULT = {"role": "tool", "content": "4", "tool_call_id": "c1", "name": "calculator"}


# --- conversations --------------------------------------------------------------------------


async def test_a_created_conversation_has_its_owner_and_no_messages(
    keeper: RecordKeeper, owner: str
) -> None:
    conversation_id = await keeper.create_conversation()

    conversation = await keeper.get_conversation(conversation_id)

    assert conversation is not None
    assert conversation.id == conversation_id
    assert conversation.owner == owner
    assert conversation.message_count == 0
    assert conversation.created_at == conversation.updated_at > 0


async def test_an_unknown_conversation_is_none(keeper: RecordKeeper) -> None:
    assert await keeper.get_conversation("conv_missing") is None


async def test_a_chosen_conversation_id_can_be_taken_only_once_per_owner(
    keeper: RecordKeeper, client: Redis, owner: str
) -> None:
    assert await keeper.create_conversation("mine") == "mine"
    with pytest.raises(ConversationExistsError):
        await keeper.create_conversation("mine")

    # Another owner's "mine" is another conversation: neither sees the other's.
    other = RecordKeeper(client, f"{owner}-other")
    try:
        assert await other.create_conversation("mine") == "mine"
        await keeper.append_messages("mine", [user("first owner's")])
        assert await other.messages("mine") == []
        assert (await keeper.get_conversation("mine")).owner == owner  # type: ignore[union-attr]
    finally:
        await ConversationMachine(client, f"{owner}-other", retention_s=60).delete("mine")


async def test_conversation_keys_share_one_hash_slot_and_expire(
    keeper: RecordKeeper, client: Redis, owner: str
) -> None:
    conversation_id = await keeper.create_conversation()
    await keeper.append_messages(conversation_id, [user("hi")])
    await keeper.record_calls(conversation_id, [llm_started("turn_1", "router", "m")])

    stored = sorted(_text(k) for k in await client.keys(owned_keys(owner)))

    assert stored == sorted(
        [
            keys.conversation(owner, conversation_id),
            keys.conversation_messages(owner, conversation_id),
            keys.conversation_calls(owner, conversation_id),
        ]
    )
    assert all(f"{{c:{owner}/{conversation_id}}}" in key for key in stored)
    for key in stored:
        assert 0 < await client.ttl(key) <= keeper.retention_s


async def test_call_records_start_their_list_with_the_retention_and_messages_renew_it(
    client: Redis, owner: str
) -> None:
    """Call records give their list the retention when they start it; on a list already
    there they leave it as long as the metadata's (an append of messages renews both)."""
    keeper = RecordKeeper(client, owner, retention_s=100)
    conversation_id = await keeper.create_conversation()
    meta = keys.conversation(owner, conversation_id)
    calls = keys.conversation_calls(owner, conversation_id)
    await keeper.record_calls(conversation_id, [llm_started("turn_1", "router", "m")])
    assert 95 <= await client.ttl(calls) <= 100

    for key in (meta, calls):
        await client.expire(key, 50)  # as if set 50 s ago
    await keeper.record_calls(conversation_id, [llm_started("turn_1", "response", "m")])
    assert 45 <= await client.ttl(calls) <= 50

    await keeper.append_messages(conversation_id, [user("hi")])
    for key in (meta, calls):
        assert 95 <= await client.ttl(key) <= 100


async def test_using_a_conversation_renews_its_retention(client: Redis, owner: str) -> None:
    keeper = RecordKeeper(client, owner, retention_s=100)
    conversation_id = await keeper.create_conversation()
    meta = keys.conversation(owner, conversation_id)
    await client.expire(meta, 5)

    await keeper.append_messages(conversation_id, [user("still here")])

    assert await client.ttl(meta) > 5
    assert await client.ttl(keys.conversation_messages(owner, conversation_id)) > 5


async def test_deleting_a_conversation_removes_every_key(
    keeper: RecordKeeper, client: Redis, owner: str
) -> None:
    conversation_id = await keeper.create_conversation(active_turn="turn_1")
    await keeper.append_messages(conversation_id, [user("hi")], turn_id="turn_1")
    await keeper.record_calls(conversation_id, [llm_started("turn_1", "router", "m")])
    await keeper.save_summary(conversation_id, "they said hi", covers_to=1)
    machine = ConversationMachine(client, owner, retention_s=60)

    deleted = await machine.delete(conversation_id)

    assert deleted == Deletion(Outcome.DELETED, "turn_1", ("turn_1",))
    assert await client.keys(owned_keys(owner)) == []
    assert await machine.delete(conversation_id) == Deletion(Outcome.NOT_FOUND)
    with pytest.raises(ConversationNotFoundError):
        await keeper.append_messages(conversation_id, [user("again")])


# --- messages -------------------------------------------------------------------------------


async def test_each_appended_message_is_stored_exactly_once_in_order(
    keeper: RecordKeeper,
) -> None:
    conversation_id = await keeper.create_conversation(active_turn="t1")

    def ids(rows: list[dict[str, Any]]) -> list[str]:
        return [row["id"] for row in rows]

    first = await keeper.append_messages(conversation_id, [SYSTEM, user("2+2?")], turn_id="t1")
    assert ids(first) == ["msg_1", "msg_2"]
    assert first[1] == {**user("2+2?"), "id": "msg_2", "turn_id": "t1", "created_at": ANY}
    assert ids(await keeper.append_messages(conversation_id, [ROUTER_STEP, TOOL_RESULT])) == [
        "msg_3",
        "msg_4",
    ]
    assert ids(await keeper.append_messages(conversation_id, [assistant("4")])) == ["msg_5"]
    assert await keeper.append_messages(conversation_id, []) == []

    assert await keeper.messages(conversation_id) == [
        SYSTEM,
        user("2+2?"),
        ROUTER_STEP,
        TOOL_RESULT,
        assistant("4"),
    ]
    conversation = await keeper.get_conversation(conversation_id)
    assert conversation is not None
    assert conversation.message_count == 5
    assert conversation.updated_at >= conversation.created_at


@pytest.mark.parametrize(
    ("believed", "reads"),
    [(None, 1), (2, 0), (1, 1), (5, 1)],
    ids=["not given", "right", "behind", "ahead"],
)
async def test_an_append_told_the_length_reads_it_only_when_told_wrong(
    keeper: RecordKeeper, believed: int | None, reads: int
) -> None:
    """A turn tells its final append how many messages it stored: right, that saves a
    read; wrong (another writer appended), the append is refused and made at the end."""
    conversation_id = await keeper.create_conversation()
    await keeper.append_messages(conversation_id, [user("one"), assistant("two")])
    read = keeper._redis.llen
    lengths_read: list[str] = []

    async def counting_llen(key: str) -> int:
        lengths_read.append(key)
        return int(await read(key))  # type: ignore[misc]

    keeper._redis.llen = counting_llen  # type: ignore[method-assign]
    rows = await keeper.append_messages(conversation_id, [user("three")], length=believed)
    assert [row["id"] for row in rows] == ["msg_3"]
    assert await keeper.messages(conversation_id) == [user("one"), assistant("two"), user("three")]
    assert len(lengths_read) == reads


async def test_messages_are_stored_in_openai_shape_only(keeper: RecordKeeper) -> None:
    conversation_id = await keeper.create_conversation()
    await keeper.append_messages(
        conversation_id,
        [
            {"role": "user", "content": "hi", "name": "al", "extra": 1, "tool_calls": None},
            {"role": "assistant"},
            {"role": "tool", "content": "12:00", "tool_call_id": "t1", "name": "f", "x": 1},
        ],
    )

    assert await keeper.messages(conversation_id) == [
        {"role": "user", "content": "hi", "name": "al"},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": "12:00", "tool_call_id": "t1", "name": "f"},
    ]


async def test_appending_to_an_unknown_conversation_fails_and_writes_nothing(
    keeper: RecordKeeper, client: Redis, owner: str
) -> None:
    with pytest.raises(ConversationNotFoundError):
        await keeper.append_messages("conv_missing", [user("hi")])
    with pytest.raises(ConversationNotFoundError):
        await keeper.record_calls("conv_missing", [llm_started("turn_1", "router", "m")])
    for turn_id in (None, "turn_1"):  # a turn's append finds out by appending
        with pytest.raises(ConversationNotFoundError):
            await keeper.append_new_messages("conv_missing", [user("hi")], turn_id=turn_id)

    assert await client.keys(owned_keys(owner)) == []


async def test_a_message_without_a_role_is_refused(keeper: RecordKeeper) -> None:
    conversation_id = await keeper.create_conversation()

    with pytest.raises(ValueError, match="without a role"):
        await keeper.append_messages(conversation_id, [user("ok"), {"content": "no role"}])

    assert await keeper.messages(conversation_id) == []


@pytest.mark.parametrize(
    ("roles", "limit", "expected"),
    [
        (None, None, ["s", "u1", "a1", "t1", "u2", "a2"]),
        (None, 2, ["u2", "a2"]),
        (None, 100, ["s", "u1", "a1", "t1", "u2", "a2"]),
        (None, 0, []),
        ("user", None, ["u1", "u2"]),
        (["user", "assistant"], None, ["u1", "a1", "u2", "a2"]),
        ({"user", "assistant"}, 3, ["a1", "u2", "a2"]),
        (["tool"], 1, ["t1"]),
        (["developer"], None, []),
    ],
)
async def test_messages_filter_by_role_then_keep_the_latest(
    keeper: RecordKeeper, roles: Any, limit: int | None, expected: list[str]
) -> None:
    conversation_id = await keeper.create_conversation()
    await keeper.append_messages(
        conversation_id,
        [
            {"role": "system", "content": "s"},
            user("u1"),
            assistant("a1"),
            {"role": "tool", "content": "t1", "tool_call_id": "x"},
            user("u2"),
            assistant("a2"),
        ],
    )

    found = await keeper.messages(conversation_id, roles=roles, limit=limit)

    assert [m["content"] for m in found] == expected


async def test_an_unknown_conversation_has_no_messages_or_calls(keeper: RecordKeeper) -> None:
    assert await keeper.messages("conv_missing") == []
    assert await keeper.calls("conv_missing") == []


# --- calls ----------------------------------------------------------------------------------


async def test_llm_calls_are_recorded_with_latency_and_tokens(keeper: RecordKeeper) -> None:
    conversation_id = await keeper.create_conversation()
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}

    started = llm_started("turn_1", "router", "gpt-4o-mini")
    call_id = started.call_id
    await keeper.record_calls(conversation_id, [started])
    await keeper.record_calls(
        conversation_id, [llm_completed(call_id, latency_ms=250.5, usage=usage)]
    )

    [call] = await keeper.calls(conversation_id)
    assert call["call_id"] == call_id
    assert call["kind"] == "llm"
    assert call["turn_id"] == "turn_1"
    assert call["stage"] == "router"
    assert call["model"] == "gpt-4o-mini"
    assert call["status"] == "completed"
    assert call["latency_ms"] == 250.5
    assert call["usage"] == usage
    assert call["error"] is None
    assert "messages" not in call, "the prompt is the conversation's, stored once"
    assert call["completed_at"] >= call["started_at"] > 0


async def test_a_failed_or_unfinished_llm_call_says_so(keeper: RecordKeeper) -> None:
    conversation_id = await keeper.create_conversation()
    router = llm_started("turn_1", "router", "m")
    response = llm_started("turn_1", "response", "m")
    failed, running = router.call_id, response.call_id
    await keeper.record_calls(
        conversation_id,
        [router, llm_completed(failed, latency_ms=5, error="timeout"), response],
    )

    calls = await keeper.calls(conversation_id)

    assert [(c["call_id"], c["status"]) for c in calls] == [
        (failed, "failed"),
        (running, "running"),
    ]
    assert calls[0]["error"] == "timeout"
    assert "messages" not in calls[0]
    assert "latency_ms" not in calls[1] and "completed_at" not in calls[1]


async def test_tool_calls_store_their_whole_output(keeper: RecordKeeper) -> None:
    conversation_id = await keeper.create_conversation()
    huge = "x" * 200_000 + "END"

    started = tool_started("turn_1", tool_call_id="c1", name="search", arguments='{"q": "a"}')
    await keeper.record_calls(conversation_id, [started])
    await keeper.record_calls(
        conversation_id, [tool_completed(started.call_id, latency_ms=42.0, content=huge)]
    )

    [call] = await keeper.calls(conversation_id, kind="tool")
    assert call["content"] == huge
    assert call["tool_call_id"] == "c1"
    assert call["name"] == "search"
    assert call["arguments"] == '{"q": "a"}'
    assert call["latency_ms"] == 42.0
    assert call["status"] == "completed"


async def test_calls_of_a_turn_come_back_in_start_order_and_filter_by_kind(
    keeper: RecordKeeper,
) -> None:
    conversation_id = await keeper.create_conversation()
    starts = [
        llm_started("t", "router", "m"),
        tool_started("t", tool_call_id="c1", name="calculator", arguments="{}"),
        llm_started("t", "response", "m"),
    ]
    router, tool, response = (start.call_id for start in starts)
    # Started one by one, completed out of order in one write: the start order still
    # decides the listing.
    for start in starts:
        await keeper.record_calls(conversation_id, [start])
    await keeper.record_calls(
        conversation_id,
        [
            llm_completed(response, latency_ms=3),
            tool_completed(tool, latency_ms=2, content="Error: boom", status="error"),
            llm_completed(router, latency_ms=1),
        ],
    )

    calls = await keeper.calls(conversation_id)

    assert [c["call_id"] for c in calls] == [router, tool, response]
    assert [c["status"] for c in calls] == ["completed", "failed", "completed"]
    assert [c["call_id"] for c in await keeper.calls(conversation_id, kind="llm")] == [
        router,
        response,
    ]
    assert len({router, tool, response}) == 3


async def test_call_records_appended_with_messages_follow_the_calls_already_logged(
    keeper: RecordKeeper,
) -> None:
    """A turn's answer carries its last call records in the same append: they join the
    call log after those written before, and the messages list gets only the messages."""
    conversation_id = await keeper.create_conversation(active_turn="t1")
    router = llm_started("t1", "router", "m")
    response = llm_started("t1", "response", "m")
    await keeper.record_calls(conversation_id, [router], turn_id="t1")
    await keeper.record_calls(
        conversation_id, [llm_completed(router.call_id, latency_ms=1), response], turn_id="t1"
    )

    rows = await keeper.append_messages(
        conversation_id,
        [assistant("4")],
        turn_id="t1",
        calls=[llm_completed(response.call_id, latency_ms=2)],
    )

    assert [row["id"] for row in rows] == ["msg_1"]
    assert await keeper.messages(conversation_id) == [assistant("4")]
    calls = await keeper.calls(conversation_id)
    assert [(c["stage"], c["status"], c["latency_ms"]) for c in calls] == [
        ("router", "completed", 1),
        ("response", "completed", 2),
    ]


async def test_an_append_the_turn_may_not_make_writes_neither_messages_nor_calls(
    keeper: RecordKeeper,
) -> None:
    conversation_id = await keeper.create_conversation(active_turn="t1")
    response = llm_started("t2", "response", "m")

    with pytest.raises(ConversationLostError):
        await keeper.append_messages(
            conversation_id,
            [assistant("4")],
            turn_id="t2",
            calls=[llm_completed(response.call_id, latency_ms=2)],
        )

    assert await keeper.messages(conversation_id) == []
    assert await keeper.calls(conversation_id) == []


# --- the two halves -------------------------------------------------------------------------


async def test_the_archivist_cannot_write_and_the_recorder_cannot_read(
    keeper: RecordKeeper,
) -> None:
    archivist = keeper.as_archivist()
    recorder = keeper.as_recorder()

    assert type(archivist) is Archivist
    assert type(recorder) is Recorder
    assert not hasattr(archivist, "append_messages")
    assert not hasattr(archivist, "record_calls")
    assert not hasattr(recorder, "messages")
    assert not hasattr(recorder, "get_conversation")

    conversation_id = await recorder.create_conversation()
    await recorder.append_messages(conversation_id, [user("hi")])
    assert await archivist.messages(conversation_id) == [user("hi")]


# --- continuation ---------------------------------------------------------------------------

# An answer its turn did not finish: stored as far as it went (shared/records/messages.py).
STOPPED_ANSWER = {"role": "assistant", "content": "Once upon a time", "stopped": "turn_interrupted"}
HISTORY = [SYSTEM, user("2+2?"), ROUTER_STEP, TOOL_RESULT, assistant("4")]


@pytest.mark.parametrize(
    ("stored", "requested", "expected"),
    [
        pytest.param(
            [],
            [SYSTEM, user("hi")],
            [SYSTEM, user("hi")],
            id="nothing stored: the whole request is new",
        ),
        pytest.param(
            HISTORY,
            [SYSTEM, user("2+2?"), assistant("4"), user("and 3+3?")],
            [user("and 3+3?")],
            id="full resend without tool messages",
        ),
        pytest.param(
            HISTORY,
            [*HISTORY, user("and 3+3?")],
            [user("and 3+3?")],
            id="full resend with tool messages",
        ),
        pytest.param(
            [*HISTORY, user("u2"), assistant("a2")],
            [assistant("a2"), user("u3")],
            [user("u3")],
            id="history trimmed at the front",
        ),
        pytest.param(
            HISTORY,
            [
                {"role": "user", "content": [{"type": "text", "text": "2+2?"}]},
                assistant("  4\n"),
                user("next"),
            ],
            [user("next")],
            id="content parts and whitespace compare equal",
        ),
        pytest.param(
            HISTORY,
            [
                user("2+2?"),
                {"role": "assistant", "content": "4", "tool_calls": ROUTER_STEP["tool_calls"]},
                user("next"),
            ],
            [user("next")],
            id="client merged the tool calls into its assistant message",
        ),
        pytest.param(
            HISTORY,
            [user("something else"), assistant("other"), user("new 1"), user("new 2")],
            [user("new 1"), user("new 2")],
            id="no overlap: the trailing user turn is new",
        ),
        pytest.param(
            HISTORY,
            [SYSTEM, user("fresh question")],
            [user("fresh question")],
            id="no overlap, no assistant: system prompt is not new",
        ),
        pytest.param(
            [*HISTORY, user("u2")],
            [SYSTEM, user("2+2?"), assistant("4"), user("u2")],
            [],
            id="retry after a failed turn: nothing new",
        ),
        pytest.param(
            [user("hi"), assistant("hello")],
            [user("hi"), assistant("hello"), user("hi")],
            [user("hi")],
            id="repeated text is new when it follows the history",
        ),
        pytest.param(
            [user("hi"), assistant("hello"), user("hi"), assistant("hello")],
            [user("hi"), assistant("hello"), user("hi"), assistant("hello"), user("hi")],
            [user("hi")],
            id="longest overlap wins over a shorter one",
        ),
        pytest.param(
            [user("u1"), assistant("a1")],
            [user("u1"), assistant("a1"), TOOL_RESULT, user("u2")],
            [TOOL_RESULT, user("u2")],
            id="everything after the overlap is new, whatever its role",
        ),
        pytest.param(
            [user("2+2?"), ROUTER_STEP],
            [user("2+2?"), {**ROUTER_STEP, "content": ""}, TOOL_RESULT],
            [TOOL_RESULT],
            id="a client's own call sent back is stored: only its result is new",
        ),
        pytest.param(
            [user("2+2?"), ROUTER_STEP, TOOL_RESULT],
            [user("2+2?"), ROUTER_STEP, TOOL_RESULT],
            [],
            id="a call and its result sent again: nothing new",
        ),
        pytest.param(
            [user("2+2?"), ROUTER_STEP, TOOL_RESULT, assistant("4")],
            [user("2+2?"), {**ROUTER_STEP, "content": "4"}, TOOL_RESULT, user("next")],
            [user("next")],
            id="a stored call with text sent back still matches by its text",
        ),
        pytest.param(
            [user("story?"), STOPPED_ANSWER],
            [user("story?"), user("weather?")],
            [user("weather?")],
            id="an answer stopped short, not sent back: only the new message is new",
        ),
        pytest.param(
            [user("story?"), STOPPED_ANSWER],
            [user("story?"), assistant("Once upon"), user("weather?")],
            [user("weather?")],
            id="an answer stopped short, sent back as far as the client got it",
        ),
        pytest.param(
            [user("story?"), STOPPED_ANSWER],
            [user("story?"), assistant("Once upon a time"), user("weather?")],
            [user("weather?")],
            id="an answer stopped short, sent back whole",
        ),
        pytest.param(
            [user("story?"), STOPPED_ANSWER, user("weather?"), assistant("Sunny.")],
            [user("story?"), user("weather?"), assistant("Sunny."), user("thanks")],
            [user("thanks")],
            id="the history goes on past an answer stopped short",
        ),
        pytest.param(
            [user("story?"), STOPPED_ANSWER],
            [user("story?"), assistant("A different tale"), user("weather?")],
            [assistant("A different tale"), user("weather?")],
            id="an answer the stopped one does not start with is the client's own",
        ),
    ],
)
def test_new_messages_skip_what_the_client_resent(
    stored: list[dict[str, Any]], requested: list[dict[str, Any]], expected: list[dict[str, Any]]
) -> None:
    assert new_messages(stored, requested) == expected


def test_new_messages_are_normalised_to_openai_shape() -> None:
    fresh = new_messages([user("a"), assistant("b")], [{"role": "user", "content": "c", "x": 1}])

    assert fresh == [user("c")]
    assert to_openai_message({"role": "user", "content": "x", "junk": 1}) == user("x")


async def test_a_conversation_continued_turn_after_turn_stores_each_message_once(
    keeper: RecordKeeper,
) -> None:
    conversation_id = await keeper.create_conversation()

    # Turn 1: the client sends its system prompt and a question; the worker adds the rest.
    first = await keeper.append_new_messages(conversation_id, [SYSTEM, user("2+2?")])
    await keeper.append_messages(conversation_id, [ROUTER_STEP, TOOL_RESULT, assistant("4")])
    # Turn 2: the client resends what it saw, plus a new question.
    second = await keeper.append_new_messages(
        conversation_id, [SYSTEM, user("2+2?"), assistant("4"), user("and 3+3?")]
    )
    await keeper.append_messages(conversation_id, [assistant("6")])
    # The client retries turn 2 verbatim.
    retry = await keeper.append_new_messages(
        conversation_id, [SYSTEM, user("2+2?"), assistant("4"), user("and 3+3?")]
    )

    assert plain(first.new) == [SYSTEM, user("2+2?")]
    assert plain(second.new) == [user("and 3+3?")]
    assert [row["id"] for row in second.new] == ["msg_6"], "rows are numbered in order"
    assert plain(second.history) == [*HISTORY, user("and 3+3?")]
    assert plain(retry.new) == [user("and 3+3?")]
    assert await keeper.messages(conversation_id) == [
        *HISTORY,
        user("and 3+3?"),
        assistant("6"),
        user("and 3+3?"),
    ]


async def test_concurrent_continuations_append_the_new_turn_once(keeper: RecordKeeper) -> None:
    conversation_id = await keeper.create_conversation()
    await keeper.append_messages(conversation_id, [user("u1"), assistant("a1")])
    request = [user("u1"), assistant("a1"), user("u2")]

    results = await asyncio.gather(
        *(keeper.append_new_messages(conversation_id, request) for _ in range(8))
    )

    assert sorted(len(r.new) for r in results) == [0] * 7 + [1]
    assert all(plain(r.history) == request for r in results)
    assert await keeper.messages(conversation_id) == [user("u1"), assistant("a1"), user("u2")]


@pytest.mark.parametrize("answer", ["Not run.", None], ids=["answered", "left open"])
async def test_a_continuation_can_answer_the_calls_the_history_ends_on_in_the_same_append(
    keeper: RecordKeeper, answer: str | None
) -> None:
    conversation_id = await keeper.create_conversation(active_turn="turn_2")
    paused = {**ROUTER_STEP, "tool_calls": [*ROUTER_STEP["tool_calls"], _call("c2", "save_note")]}
    await keeper.append_messages(conversation_id, [user("note and add"), paused, TOOL_RESULT])
    request = [user("note and add"), user("never mind")]

    continuation = await keeper.append_new_messages(
        conversation_id, request, turn_id="turn_2", answer_open_calls=answer
    )

    # c1 has its result; c2 was left waiting, and gets the answer before the new message.
    told = {"role": "tool", "content": answer, "tool_call_id": "c2", "name": "save_note"}
    new = [told, user("never mind")] if answer is not None else [user("never mind")]
    assert plain(continuation.new) == new
    assert [row["id"] for row in continuation.new] == [f"msg_{4 + k}" for k in range(len(new))]
    assert {row["turn_id"] for row in continuation.new} == {"turn_2"}
    assert plain(continuation.history) == [user("note and add"), paused, TOOL_RESULT, *new]
    assert await keeper.messages(conversation_id) == plain(continuation.history)


async def test_a_turn_carrying_decisions_answers_only_the_open_calls_it_carries_none_for(
    keeper: RecordKeeper,
) -> None:
    """A resumed step whose other call lapsed undecided: that one is answered "not run" at
    once, the decided one is the turn's own to answer."""
    conversation_id = await keeper.create_conversation(active_turn="turn_2")
    paused = {**ROUTER_STEP, "tool_calls": [_call("c1", "save_note"), _call("c2", "save_note")]}
    await keeper.append_messages(conversation_id, [user("note two things"), paused])

    continuation = await keeper.append_new_messages(
        conversation_id, [], turn_id="turn_2", answer_open_calls="Not run.", except_calls={"c1"}
    )

    told = {"role": "tool", "content": "Not run.", "tool_call_id": "c2", "name": "save_note"}
    assert plain(continuation.new) == [told]


@pytest.mark.parametrize(
    ("state", "resumed_by", "said"),
    [
        ("pending", None, "Not run."),
        ("expired", None, "Not run."),
        ("approved", "turn_x", DECIDED_NOT_CARRIED_OUT),
        ("approved", None, APPROVED_STEP_LAPSED),
        ("rejected", "turn_x", "The user declined: save_note was not run."),
    ],
)
async def test_an_open_call_the_user_decided_on_is_answered_as_decided(
    keeper: RecordKeeper, state: str, resumed_by: str | None, said: str
) -> None:
    """Its step's turn never carried the decision out (or the step never went on): the
    answer for a call nobody decided on would say the user did not confirm it."""
    conversation_id = await keeper.create_conversation(active_turn="turn_2")
    paused = {**ROUTER_STEP, "tool_calls": [_call("c1", "save_note")]}
    await keeper.append_messages(conversation_id, [user("note it"), paused])
    proposal = {
        "confirmation_id": "conf_1",
        "turn_id": "turn_1",
        "tool_call": {"id": "c1", "name": "save_note", "arguments": "{}"},
        "expires_at": 1.0,
        "state": state,
        **({"resumed_by": resumed_by} if resumed_by else {}),
    }
    key = keys.conversation_proposals(keeper.owner, conversation_id)
    await keeper._redis.hset(key, "conf_1", orjson.dumps(proposal))  # type: ignore[misc]

    continuation = await keeper.append_new_messages(
        conversation_id, [user("and?")], turn_id="turn_2", answer_open_calls="Not run."
    )

    told = {"role": "tool", "content": said, "tool_call_id": "c1", "name": "save_note"}
    assert plain(continuation.new) == [told, user("and?")]


def _call(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


EDITED = '{"text": "dim it to 80 %"}'


async def test_the_calls_approved_edited_are_stored_with_the_arguments_that_ran(
    keeper: RecordKeeper, client: Redis, owner: str
) -> None:
    """Only the call named changes, in its row, which keeps its id, turn and time; the bytes
    it grows by count in the conversation and its owner's ledger."""
    conversation_id = await keeper.create_conversation(active_turn="turn_2")
    paused = {**ROUTER_STEP, "tool_calls": [_call("c1", "save_note"), _call("c2", "save_note")]}
    stored = await keeper.append_messages(
        conversation_id, [user("note two things"), paused], turn_id="turn_2"
    )

    await keeper.amend_tool_calls(conversation_id, {"c2": EDITED}, turn_id="turn_2")

    edited = {
        "id": "c2",
        "type": "function",
        "function": {"name": "save_note", "arguments": EDITED},
    }
    rows = await keeper.rows(conversation_id)
    assert rows[0][1] == stored[1] | {"tool_calls": [_call("c1", "save_note"), edited]}
    listed = await client.lrange(keys.conversation_messages(owner, conversation_id), 0, -1)
    held = sum(len(item.encode() if isinstance(item, str) else item) for item in listed)
    conversation = await keeper.get_conversation(conversation_id)
    assert conversation is not None and conversation.bytes == held
    usage = await budgets.read_usage(client, owner, retention_s=60)
    assert usage.bytes == held


async def test_only_the_turn_holding_the_conversation_amends_its_calls(
    keeper: RecordKeeper,
) -> None:
    conversation_id = await keeper.create_conversation(active_turn="turn_3")
    paused = {**ROUTER_STEP, "tool_calls": [_call("c1", "save_note")]}
    await keeper.append_messages(conversation_id, [user("note it"), paused])

    with pytest.raises(ConversationLostError):
        await keeper.amend_tool_calls(conversation_id, {"c1": EDITED}, turn_id="turn_2")

    assert await keeper.messages(conversation_id) == [user("note it"), paused]


async def test_continuing_an_unknown_conversation_fails(keeper: RecordKeeper) -> None:
    with pytest.raises(ConversationNotFoundError):
        await keeper.append_new_messages("conv_missing", [user("hi")])


def plain(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored rows as the messages they hold (without id, turn and time)."""
    return [to_openai_message(row) for row in rows]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def test_reading_the_summary_renews_it_as_appending_renews_the_messages(
    keeper: RecordKeeper, client: Redis, owner: str
) -> None:
    conversation_id = await keeper.create_conversation()
    await keeper.save_summary(conversation_id, "they talked about lights", covers_to=4)
    key = keys.conversation_summary(owner, conversation_id)
    await client.expire(key, 5)  # as if written a retention ago, in a conversation in use
    assert (await keeper.summary(conversation_id) or {})["text"] == "they talked about lights"
    assert await client.ttl(key) > keeper.retention_s - 60


async def _commands(client: Redis) -> int:
    """Every command Redis ran so far, those of Lua scripts included (INFO counts itself)."""
    stats = await client.info("commandstats")
    return sum(int(value["calls"]) for value in stats.values())


async def test_recording_a_turn_costs_the_commands_it_did_when_this_was_written(
    keeper: RecordKeeper, client: Redis
) -> None:
    """What worker/recording.py writes of a chat turn that called the router and answered,
    each append with its owner's ledger (docs/benchmarks.md, "Redis cost"): a command more
    here is one more on every turn. Counted with INFO commandstats, which counts what the
    scripts run; no other client uses this Redis meanwhile (tests run one at a time)."""
    conversation_id = await keeper.create_conversation(active_turn="turn_1")
    router = llm_started("turn_1", "router", "m")
    response = llm_started("turn_1", "response", "m")
    before = await _commands(client)

    begun = await keeper.append_new_messages(
        conversation_id, [user("hi")], window=50, turn_id="turn_1", limit=10**6
    )
    await keeper.record_calls(conversation_id, [router], turn_id="turn_1")
    await keeper.record_calls(
        conversation_id, [llm_completed(router.call_id, latency_ms=1), response], turn_id="turn_1"
    )
    await keeper.append_messages(
        conversation_id,
        [assistant("hello")],
        turn_id="turn_1",
        length=begun.length,
        calls=[llm_completed(response.call_id, latency_ms=1)],
    )

    spent = await _commands(client) - before - 1  # the INFO of `before`
    # The history read (EVALSHA, LLEN, LRANGE); each append, its ledger's share in the same
    # script (EVALSHA; HMGET, RPUSH per item, HSET or HINCRBY of the bytes, LLEN where a
    # length is expected, EXPIRE of what it renews; ZADD XX CH or ZSCORE, HINCRBY twice,
    # EXPIRE of what a use renews): 3 + (1 + 7 + 5) + (1 + 4 + 3) + (1 + 4 + 3) + (1 + 8 + 5).
    assert spent == 46, spent
