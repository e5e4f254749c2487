"""api/session.py: the one loop that reads a stream for a client, as the routes use it
beyond the relay (tests/api/test_relay.py): the cancel's wait for the turn's end, and the
user's own event stream, which ends like a turn's stream when Redis refuses to read it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis_asyncio

from api.cursors import Resume
from api.encodings.user_events import UserEventsEncoder
from api.hub import StreamHub
from api.relay import relay
from api.session import QUIET, Broken, StreamSession
from shared import keys
from shared.endings import completed
from shared.events import Delta, Event, Start, TimerFired, encode
from shared.lifecycle import Cause, done_for
from shared.streams import STREAM_FIELD


@pytest.fixture
async def stream_id(redis: redis_asyncio.Redis) -> AsyncIterator[str]:
    stream_id = uuid.uuid4().hex
    yield stream_id
    await redis.delete(keys.events(stream_id))


async def write(redis: redis_asyncio.Redis, stream_id: str, *events: Event) -> None:
    for event in events:
        await redis.xadd(keys.events(stream_id), {STREAM_FIELD: encode(event)})


async def test_the_cancel_wait_ends_at_the_done(
    redis: redis_asyncio.Redis, hub: StreamHub, stream_id: str
) -> None:
    await write(redis, stream_id, Start(), Delta(text="a"), completed("stop", None))
    async with asyncio.timeout(5):
        assert await StreamSession(hub, stream_id, 2.0).wait_for_done() is True


async def test_the_cancel_wait_gives_up_after_a_quiet_while(
    redis: redis_asyncio.Redis, hub: StreamHub, stream_id: str
) -> None:
    await write(redis, stream_id, Start())
    async with asyncio.timeout(5):
        assert await StreamSession(hub, stream_id, 0.05).wait_for_done() is False


async def test_the_cancel_wait_ends_when_redis_refuses_the_stream(
    redis: redis_asyncio.Redis, hub: StreamHub, stream_id: str
) -> None:
    await redis.set(keys.events(stream_id), "not a stream")
    async with asyncio.timeout(5):
        assert await StreamSession(hub, stream_id, 2.0).wait_for_done() is False


async def test_a_watch_sees_batches_quiet_whiles_and_its_end(
    redis: redis_asyncio.Redis, hub: StreamHub, stream_id: str
) -> None:
    asked = []

    async def alive() -> bool:
        asked.append(True)
        return len(asked) < 2

    await write(redis, stream_id, Start())
    session = StreamSession(hub, stream_id, 0.05, alive=alive)
    async with asyncio.timeout(5):
        seen = [batch async for batch in session.watch()]
    assert [type(b).__name__ if not isinstance(b, list) else len(b) for b in seen] == [
        1,
        "Quiet",
        "Broken",
    ]
    assert seen[1] is QUIET and seen[2] == Broken(Cause.RECORD_GONE)


async def test_the_user_stream_relays_named_events_under_their_ids(
    redis: redis_asyncio.Redis, hub: StreamHub, stream_id: str
) -> None:
    fired = TimerFired(timer_id="t1", label="tea", conversation_id=None, due_at=1700000000.5)
    entry_id = (await redis.xadd(keys.events(stream_id), {STREAM_FIELD: encode(fired)})).decode()
    chunks = relay(hub, UserEventsEncoder(), stream_id, resume=Resume(), keepalive_s=5)
    async with asyncio.timeout(5):
        chunk = await anext(chunks)
    await chunks.aclose()
    assert (
        chunk
        == (
            f"id: {entry_id}\r\nevent: timer_fired\r\n"
            'data: {"timer_id":"t1","label":"tea","conversation_id":null,"due_at":1700000000.5}'
            "\r\n\r\n"
        ).encode()
    )


async def test_the_user_stream_ends_with_an_error_when_redis_refuses_to_read_it(
    redis: redis_asyncio.Redis, hub: StreamHub, stream_id: str
) -> None:
    await redis.set(keys.events(stream_id), "not a stream")
    chunks = relay(hub, UserEventsEncoder(), stream_id, resume=Resume(), keepalive_s=5)
    async with asyncio.timeout(5):
        sent = b"".join([chunk async for chunk in chunks])
    assert sent == (
        b"event: error\r\n"
        b'data: {"message":"the turn\'s stream could not be read",'
        b'"code":"stream_unreadable"}\r\n\r\n'
    )


async def test_a_wait_that_keeps_events_ends_stream_trimmed_and_one_that_keeps_none_does_not(
    redis: redis_asyncio.Redis, stream_id: str
) -> None:
    """The non-stream answer's wait reads from the stream's start: when its first entries
    were trimmed (MAXLEN), an answer built from the events it keeps would lack some, so it
    ends `stream_trimmed`; one built from its `done` (and the turn's record) alone reads on."""
    hub = StreamHub(redis, block_ms=200, maxlen=10)
    await hub.start()
    try:
        await write(redis, stream_id, Start())
        for k in range(300):
            payload = encode(Delta(text=f"{k}"))
            await redis.xadd(keys.events(stream_id), {STREAM_FIELD: payload}, maxlen=10)
        await write(redis, stream_id, completed("stop", None))
        async with asyncio.timeout(5):
            _, done = await StreamSession(hub, stream_id, 2.0).read_to_done(keep=(Delta,))
            assert done == done_for(Cause.TRIMMED)
            _, done = await StreamSession(hub, stream_id, 2.0).read_to_done()
            assert done.status == "completed"
    finally:
        await hub.stop()
