"""Which conversation a chat request continues, giving it back when its turn could not be
created, and deleting one: ids are their owner's."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis_asyncio

from api.conversations import (
    check_conversation_id,
    conversation_not_found,
    delete_conversation,
    give_back,
    is_conversation_id,
    open_conversation,
)
from api.errors import ApiError
from shared import keys
from shared.conversation_state import ConversationMachine, Outcome
from shared.endings import completed
from shared.errors import ErrorCode
from shared.lifecycle import Cause
from shared.records.keeper import RecordKeeper
from shared.requests import AgentRequest, Delivery, TurnRequest
from shared.turn_record import TurnRecord
from shared.turns import TurnStore

RETENTION_S = 600


@pytest.fixture
async def owners(redis: redis_asyncio.Redis) -> AsyncIterator[list[str]]:
    """Two owners of this test alone; every conversation key of theirs is deleted after."""
    names = [f"owner-{uuid.uuid4().hex}" for _ in range(2)]
    yield names
    for owner in names:
        pattern = f"{keys.PREFIX}:{{c:{owner}/*"
        found = [key async for key in redis.scan_iter(match=pattern, count=1000)]
        if found:
            await redis.delete(*found)


def turns(redis: redis_asyncio.Redis) -> TurnStore:
    return TurnStore(redis, retention_s=RETENTION_S, stream_maxlen=100)


async def opened(redis: redis_asyncio.Redis, owner: str, conversation_id: str | None) -> str:
    """The conversation a chat turn of `owner` naming `conversation_id` continues; the turn
    then ends at once, so nothing keeps the conversation busy."""
    store = turns(redis)
    turn_id = f"turn-{uuid.uuid4().hex}"
    claimed = await open_conversation(
        redis, store, owner, conversation_id, turn_id, retention_s=RETENTION_S
    )
    opened_id = claimed.conversation_id
    request = TurnRequest(AgentRequest([]), Delivery("conversation"))
    record = TurnRecord(turn_id, owner, request, "bernard-v1", conversation_id=opened_id)
    await store.create(record, ttl_s=RETENTION_S, queue_name=None)
    await store.finish(turn_id, owner, completed("stop", None))
    return opened_id


async def exists(redis: redis_asyncio.Redis, owner: str, conversation_id: str) -> bool:
    keeper = RecordKeeper(redis, owner)
    return await keeper.get_conversation(conversation_id) is not None


@pytest.mark.parametrize(
    "conversation_id",
    [
        "a",
        "kitchen-satellite",
        "Room_1.living:room-2",
        "0123456789",
        "x" * 128,
        "a.b",
        "a..b",
        "_kitchen",
        "-kitchen-",
        "1.0",
    ],
)
def test_ids_of_1_to_128_letters_digits_and_underscore_dot_colon_dash_are_accepted(
    conversation_id: str,
) -> None:
    assert is_conversation_id(conversation_id)
    check_conversation_id(conversation_id)


@pytest.mark.parametrize(
    "conversation_id",
    [
        "",
        "x" * 129,
        "kitchen\n",  # `$` would take it; the response header could not carry it back
        "\nkitchen",
        "kit chen",
        "kitchen/den",
        "{kitchen}",
        "küche",
        "٣",  # a digit of another script
        "kitchen*",
        # path-dot forms: `.` and `..` are removed from a URL's path by every client
        ".",
        "..",
        "...",
        ".kitchen",
        "kitchen.",
        "." * 128,
    ],
)
def test_any_other_id_is_a_400_naming_the_parameter(conversation_id: str) -> None:
    assert not is_conversation_id(conversation_id)
    with pytest.raises(ApiError) as raised:
        check_conversation_id(conversation_id)
    error = raised.value
    assert (error.status, error.param, error.code) == (
        400,
        "conversation_id",
        ErrorCode.INVALID_VALUE,
    )
    assert error.message == (
        "conversation_id must be 1-128 letters, digits or _ . : -, neither first nor last a dot"
    )


def test_a_refused_id_names_the_parameter_it_came_in() -> None:
    with pytest.raises(ApiError) as raised:
        check_conversation_id("no spaces", "X-Bernard-Conversation-Id")
    assert raised.value.param == "X-Bernard-Conversation-Id"


def test_a_missing_conversation_is_a_404_naming_it() -> None:
    error = conversation_not_found("kitchen")
    assert error.body() == {
        "error": {
            "message": "no conversation with id 'kitchen'",
            "type": "not_found_error",
            "param": "conversation_id",
            "code": "conversation_not_found",
        }
    }
    assert error.status == 404


async def test_no_id_starts_a_conversation_under_a_fresh_id(
    redis: redis_asyncio.Redis, owners: list[str]
) -> None:
    owner = owners[0]
    first = await opened(redis, owner, None)
    second = await opened(redis, owner, None)
    assert first != second
    assert first.startswith("conv_") and second.startswith("conv_")
    assert await exists(redis, owner, first) and await exists(redis, owner, second)
    assert 0 < await redis.ttl(keys.conversation(owner, first)) <= RETENTION_S


async def test_an_unknown_id_starts_a_conversation_under_that_id_for_the_retention(
    redis: redis_asyncio.Redis, owners: list[str]
) -> None:
    owner = owners[0]
    assert await opened(redis, owner, "den") == "den"
    assert await exists(redis, owner, "den")
    assert RETENTION_S - 5 <= await redis.ttl(keys.conversation(owner, "den")) <= RETENTION_S


async def test_a_known_id_continues_that_conversation(
    redis: redis_asyncio.Redis, owners: list[str]
) -> None:
    owner = owners[0]
    keeper = RecordKeeper(redis, owner, retention_s=RETENTION_S)
    await opened(redis, owner, "den")
    await keeper.append_messages("den", [{"role": "user", "content": "hello"}])
    assert await opened(redis, owner, "den") == "den"
    assert [m["content"] for m in await keeper.messages("den")] == ["hello"]


async def test_the_same_id_of_another_owner_is_a_conversation_of_their_own(
    redis: redis_asyncio.Redis, owners: list[str]
) -> None:
    alice, bob = owners
    await opened(redis, bob, "den")
    await RecordKeeper(redis, bob).append_messages("den", [{"role": "user", "content": "bob's"}])
    assert await opened(redis, alice, "den") == "den"
    assert await RecordKeeper(redis, alice).messages("den") == []
    assert [m["content"] for m in await RecordKeeper(redis, bob).messages("den")] == ["bob's"]


async def test_an_invalid_id_is_refused_before_anything_is_stored(
    redis: redis_asyncio.Redis, owners: list[str]
) -> None:
    owner = owners[0]
    with pytest.raises(ApiError) as raised:
        await opened(redis, owner, "den\n")
    assert raised.value.status == 400
    assert [key async for key in redis.scan_iter(match=f"{keys.PREFIX}:{{c:{owner}/*")] == []


async def test_deleting_removes_the_owners_conversation_and_everything_in_it(
    redis: redis_asyncio.Redis, owners: list[str]
) -> None:
    owner = owners[0]
    keeper = RecordKeeper(redis, owner, retention_s=RETENTION_S)
    await opened(redis, owner, "den")
    await keeper.append_messages("den", [{"role": "user", "content": "hello"}])
    await delete_conversation(redis, turns(redis), owner, "den", retention_s=RETENTION_S)
    assert not await exists(redis, owner, "den")
    assert await redis.exists(keys.conversation_messages(owner, "den")) == 0


@pytest.mark.parametrize("conversation_id", ["never-made", "den\n", "x" * 129, ""])
async def test_deleting_a_conversation_the_owner_does_not_have_is_a_404(
    redis: redis_asyncio.Redis, owners: list[str], conversation_id: str
) -> None:
    """Whether nobody has it or the id could not even exist: the same 404."""
    with pytest.raises(ApiError) as raised:
        await delete_conversation(
            redis, turns(redis), owners[0], conversation_id, retention_s=RETENTION_S
        )
    assert raised.value.body() == conversation_not_found(conversation_id).body()
    assert raised.value.status == 404


async def test_deleting_another_owners_conversation_is_a_404_and_leaves_it_alone(
    redis: redis_asyncio.Redis, owners: list[str]
) -> None:
    alice, bob = owners
    await opened(redis, bob, "den")
    with pytest.raises(ApiError) as raised:
        await delete_conversation(redis, turns(redis), alice, "den", retention_s=RETENTION_S)
    assert raised.value.status == 404
    assert await exists(redis, bob, "den")


# -- giving a conversation back ----------------------------------------------------------------


async def decided(redis: redis_asyncio.Redis, owner: str, resumer: str) -> ConversationMachine:
    """Conversation "den" whose turn paused on one call, decided: `resumer` holds it."""
    machine = ConversationMachine(redis, owner, retention_s=RETENTION_S)
    await machine.create("den", turn_id="turn-paused")
    call = {"id": "call_1", "name": "save_note", "arguments": "{}"}
    proposal = {"confirmation_id": "c1", "turn_id": "turn-paused", "tool_call": call}
    await machine.pause("den", "turn-paused", [{**proposal, "expires_at": time.time() + 600}])
    decision = await machine.decide("den", "c1", "approve", turn_id=resumer)
    assert decision.outcome is Outcome.RESUMED
    return machine


async def created(redis: redis_asyncio.Redis, owner: str, turn_id: str) -> TurnStore:
    store = turns(redis)
    request = TurnRequest(AgentRequest([]), Delivery("conversation"))
    record = TurnRecord(turn_id, owner, request, "bernard-v1", conversation_id="den")
    await store.create(record, ttl_s=RETENTION_S, queue_name=None)
    return store


async def states(redis: redis_asyncio.Redis, owner: str) -> list[str]:
    return [p["state"] for p in await RecordKeeper(redis, owner).proposals("den")]


@pytest.mark.parametrize("record", ["never stored", "stored, still queued"])
async def test_a_decision_whose_turn_could_not_be_created_waits_to_be_made_again(
    redis: redis_asyncio.Redis, owners: list[str], record: str
) -> None:
    owner, resumer = owners[0], f"turn-{uuid.uuid4().hex}"
    machine = await decided(redis, owner, resumer)
    store = await created(redis, owner, resumer) if record != "never stored" else turns(redis)

    await give_back(machine, store, "den", resumer)

    assert await states(redis, owner) == ["pending"]
    conversation = await RecordKeeper(redis, owner).get_conversation("den")
    assert conversation is not None and conversation.paused_turn == "turn-paused"
    if record != "never stored":  # no worker may take it now
        assert (await store.get(resumer)).status == "failed"  # type: ignore[union-attr]
    again = await machine.decide("den", "c1", "reject", turn_id=f"turn-{uuid.uuid4().hex}")
    assert again.outcome is Outcome.RESUMED


async def test_a_turn_a_worker_took_keeps_its_conversation_and_decisions(
    redis: redis_asyncio.Redis, owners: list[str]
) -> None:
    owner, resumer = owners[0], f"turn-{uuid.uuid4().hex}"
    machine = await decided(redis, owner, resumer)
    store = await created(redis, owner, resumer)
    assert (await store.claim(resumer, "worker-1", 5.0)).outcome == "claimed"

    await give_back(machine, store, "den", resumer)

    assert await states(redis, owner) == ["approved"]
    conversation = await RecordKeeper(redis, owner).get_conversation("den")
    assert conversation is not None and conversation.active_turn == resumer
    await store.end(resumer, owner, Cause.OVER)
