"""Storage budgets' counts against the real Redis (shared/budgets.py): a conversation's cap
of bytes under concurrent appends, and the owner's ledger through appends, refusals,
deletion and expiry.

Each test's keeper belongs to an owner of its own; the fixture deletes that owner's keys.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from shared import budgets, keys
from shared.connection import connect
from shared.conversation_state import ConversationMachine, Outcome
from shared.records.call_log import llm_completed, llm_started
from shared.records.conversation import ConversationFullError, ConversationNotFoundError
from shared.records.keeper import RecordKeeper
from tests.support.messages import user
from tests.support.session_redis import session_redis_url

RETENTION_S = 3600


@pytest.fixture
def owner() -> str:
    return f"test-budget-{uuid.uuid4().hex}"


@pytest.fixture
async def redis(owner: str) -> AsyncIterator[Redis]:
    client = connect(session_redis_url())
    yield client
    written = [key async for key in client.scan_iter(match=f"bernard:*{owner}*")]
    if written:
        await client.delete(*written)
    await client.aclose()


@pytest.fixture(params=["one script", "side by side"])
def keeper(request: pytest.FixtureRequest, redis: Redis, owner: str) -> RecordKeeper:
    """On one server an append and its ledger share are one script; a Cluster's keeper
    sends them side by side (`Recorder._counting` None), as every test here does too."""
    kept = RecordKeeper(redis, owner, retention_s=RETENTION_S)
    if request.param == "side by side":
        kept.__dict__["_counting"] = None
    return kept


async def stored_bytes(redis: Redis, owner: str, conversation_id: str) -> int:
    """What the conversation's lists hold, measured from the lists themselves."""
    total = 0
    for key in (
        keys.conversation_messages(owner, conversation_id),
        keys.conversation_calls(owner, conversation_id),
    ):
        total += sum(len(item) for item in await redis.lrange(key, 0, -1))  # type: ignore[misc]
    return total


async def usage(redis: Redis, owner: str) -> budgets.Usage:
    return await budgets.read_usage(redis, owner, retention_s=RETENTION_S)


async def test_a_conversations_cap_holds_under_concurrent_appends(
    keeper: RecordKeeper, redis: Redis, owner: str
) -> None:
    await keeper.create_conversation("c")
    text = "x" * 1_000  # each message stores about 1,080 bytes
    cap = 5_000

    async def send(n: int) -> str:
        try:
            await keeper.append_new_messages("c", [user(f"{n} {text}")], limit=cap)
        except ConversationFullError:
            return "full"
        return "stored"

    outcomes = await asyncio.gather(*(send(n) for n in range(8)))

    assert sorted(outcomes) == ["full"] * 4 + ["stored"] * 4
    conversation = await keeper.get_conversation("c")
    assert conversation is not None and conversation.message_count == 4
    held = await stored_bytes(redis, owner, "c")
    assert conversation.bytes == held
    assert 4_000 < held <= cap


async def test_an_append_over_the_cap_stores_nothing_and_says_which_setting(
    keeper: RecordKeeper, redis: Redis, owner: str
) -> None:
    await keeper.create_conversation("c")
    await keeper.append_new_messages("c", [user("a" * 500)], limit=1_000)

    with pytest.raises(ConversationFullError, match="BERNARD_MAX_CONVERSATION_BYTES"):
        await keeper.append_new_messages("c", [user("b" * 500)], limit=1_000)

    assert [m["content"] for m in await keeper.messages("c")] == ["a" * 500]
    assert (await usage(redis, owner)).bytes == await stored_bytes(redis, owner, "c")


async def test_what_a_turn_stores_once_it_runs_is_never_refused(
    keeper: RecordKeeper, redis: Redis, owner: str
) -> None:
    """The cap refuses a request's messages; a turn's answer and call records go over it
    (then the next request is refused)."""
    await keeper.create_conversation("c")
    await keeper.append_new_messages("c", [user("question")], limit=300)
    await keeper.record_calls("c", [llm_started("t", "router", "m")])
    await keeper.append_messages("c", [{"role": "assistant", "content": "y" * 400}])

    conversation = await keeper.get_conversation("c")
    assert conversation is not None and conversation.message_count == 2
    assert conversation.bytes == await stored_bytes(redis, owner, "c") > 300
    with pytest.raises(ConversationFullError):
        await keeper.append_new_messages("c", [user("next")], limit=300)


async def test_call_records_appended_with_messages_are_counted_once(
    keeper: RecordKeeper, redis: Redis, owner: str
) -> None:
    """A turn's last call records go in its answer's append (worker/recording.py finish):
    the conversation and the ledger count both, as two appends would."""
    await keeper.create_conversation("c")
    await keeper.append_new_messages("c", [user("question")])
    started = llm_started("t", "response", "m")
    await keeper.record_calls("c", [started])
    await keeper.append_messages(
        "c",
        [{"role": "assistant", "content": "answer"}],
        calls=[llm_completed(started.call_id, latency_ms=1)],
    )

    stored = await stored_bytes(redis, owner, "c")
    conversation = await keeper.get_conversation("c")
    assert conversation is not None and conversation.bytes == stored
    assert await usage(redis, owner) == budgets.Usage(bytes=stored, conversations=1)
    assert await redis.llen(keys.conversation_calls(owner, "c")) == 2  # type: ignore[misc]


async def test_the_ledger_counts_every_conversation_of_its_owner(
    keeper: RecordKeeper, redis: Redis, owner: str
) -> None:
    for conversation_id in ("a", "b"):
        await keeper.create_conversation(conversation_id)
        await keeper.append_new_messages(conversation_id, [user(f"hi {conversation_id}")])
        await keeper.record_calls(conversation_id, [llm_started("t", "router", "m")])

    expected = await stored_bytes(redis, owner, "a") + await stored_bytes(redis, owner, "b")
    assert await usage(redis, owner) == budgets.Usage(bytes=expected, conversations=2)


async def test_a_refused_append_is_given_back_to_the_ledger(
    keeper: RecordKeeper, redis: Redis, owner: str
) -> None:
    await keeper.create_conversation("c")
    await keeper.append_new_messages("c", [user("a" * 100)], limit=200)
    before = await usage(redis, owner)

    with pytest.raises(ConversationFullError):
        await keeper.append_new_messages("c", [user("b" * 100)], limit=200)

    assert await usage(redis, owner) == before


async def test_deleting_a_conversation_takes_its_bytes_out_of_the_ledger(
    keeper: RecordKeeper, redis: Redis, owner: str
) -> None:
    for conversation_id in ("kept", "gone"):
        await keeper.create_conversation(conversation_id)
        await keeper.append_new_messages(conversation_id, [user(conversation_id * 50)])

    deleted = await ConversationMachine(redis, owner, retention_s=RETENTION_S).delete("gone")
    assert deleted.outcome is Outcome.DELETED

    kept = await stored_bytes(redis, owner, "kept")
    assert await usage(redis, owner) == budgets.Usage(bytes=kept, conversations=1)
    assert await redis.hkeys(keys.usage(owner)) == [b"kept", b"*"]  # type: ignore[misc]


async def test_a_late_append_to_a_deleted_conversation_is_not_counted(
    keeper: RecordKeeper, redis: Redis, owner: str
) -> None:
    await keeper.create_conversation("c")
    await ConversationMachine(redis, owner, retention_s=RETENTION_S).delete("c")

    with pytest.raises(ConversationNotFoundError):
        await keeper.append_messages("c", [user("too late")])
    with pytest.raises(ConversationNotFoundError):
        await keeper.record_calls("c", [llm_started("t", "router", "m")])

    assert await redis.hkeys(keys.usage(owner)) == []  # type: ignore[misc]
    assert await usage(redis, owner) == budgets.Usage(bytes=0, conversations=0)


async def test_an_expired_conversation_stops_counting_when_the_ledger_is_read(
    keeper: RecordKeeper, redis: Redis, owner: str
) -> None:
    for conversation_id in ("old", "new"):
        await keeper.create_conversation(conversation_id)
        await keeper.append_new_messages(conversation_id, [user(conversation_id * 50)])
    # What Redis does once "old" has not been used for the retention: its keys go, and its
    # index entry is that old.
    await redis.delete(keys.conversation(owner, "old"), keys.conversation_messages(owner, "old"))
    await redis.zadd(keys.conversations(owner), {"old": 1.0})

    new = await stored_bytes(redis, owner, "new")
    assert await usage(redis, owner) == budgets.Usage(bytes=new, conversations=1)
    assert await redis.zrange(keys.conversations(owner), 0, -1) == [b"new"]


async def test_the_ledger_outlives_every_conversation_it_counts(
    keeper: RecordKeeper, redis: Redis, owner: str
) -> None:
    """A use renews the ledger past its conversation's expiry; call records renew it only
    for a conversation they are the first bytes of (its index entry may be its creation's,
    which renewed nothing), as later ones find it renewed already."""
    ledger = keys.usage(owner)
    lives = RETENTION_S + budgets.GRACE_S
    await keeper.create_conversation("used")
    await keeper.append_new_messages("used", [user("question")])
    assert lives - 5 <= await redis.ttl(ledger) <= lives

    await redis.expire(ledger, 100)  # as if its last use were long ago
    await keeper.record_calls("used", [llm_started("t", "router", "m")])
    assert await redis.ttl(ledger) <= 100

    await keeper.create_conversation("calls only")
    await keeper.record_calls("calls only", [llm_started("t", "router", "m")])
    assert lives - 5 <= await redis.ttl(ledger) <= lives

    await redis.expire(ledger, 100)
    await keeper.append_messages("used", [{"role": "assistant", "content": "answer"}])
    assert lives - 5 <= await redis.ttl(ledger) <= lives


async def test_usage_says_whether_a_conversation_is_the_owners(
    keeper: RecordKeeper, redis: Redis, owner: str
) -> None:
    await keeper.create_conversation("mine")

    mine = await budgets.read_usage(redis, owner, retention_s=60, conversation_id="mine")
    other = await budgets.read_usage(redis, owner, retention_s=60, conversation_id="other")

    assert (mine.known, other.known) == (True, False)


def test_no_conversation_id_can_be_the_ledgers_sum() -> None:
    from api.conversations import is_conversation_id

    assert not is_conversation_id(budgets.TOTAL)
