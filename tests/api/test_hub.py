"""The API's stream hub: many turns' streams read in lanes, every entry to its readers."""

from __future__ import annotations

import contextlib
import uuid

import redis.asyncio as redis_asyncio

from api.hub import Reader, StreamHub
from shared import keys
from shared.events import Delta, encode
from shared.turns import STREAM_FIELD


async def append(redis: redis_asyncio.Redis, turn_id: str, text: str) -> None:
    await redis.xadd(keys.events(turn_id), {STREAM_FIELD: encode(Delta(text=text))})


async def texts(reader: Reader, count: int) -> list[str]:
    got = []
    for _ in range(count):
        _, stamped = await reader.next(wait_s=2)
        assert isinstance(stamped.event, Delta)
        got.append(stamped.event.text)
    return got


async def test_turns_spread_over_the_lanes_each_get_their_own_entries_in_order(
    redis: redis_asyncio.Redis,
) -> None:
    hub = StreamHub(redis, block_ms=1000, lanes=3)
    await hub.start()
    turn_ids = [uuid.uuid4().hex for _ in range(5)]
    try:
        async with contextlib.AsyncExitStack() as stack:
            readers = [await stack.enter_async_context(hub.read(t)) for t in turn_ids]
            assert sorted(len(lane.readers) for lane in hub._lanes) == [1, 2, 2]
            for k in range(3):
                for turn_id in turn_ids:
                    await append(redis, turn_id, f"{turn_id}:{k}")
            for turn_id, reader in zip(turn_ids, readers, strict=True):
                assert await texts(reader, 3) == [f"{turn_id}:{k}" for k in range(3)]
    finally:
        await hub.stop()
        await redis.delete(*(keys.events(t) for t in turn_ids))


async def test_a_second_reader_of_a_turn_shares_its_lane_and_sees_every_entry(
    redis: redis_asyncio.Redis,
) -> None:
    hub = StreamHub(redis, block_ms=1000, lanes=1)
    await hub.start()
    turn_id = uuid.uuid4().hex
    try:
        async with hub.read(turn_id) as first:
            await append(redis, turn_id, "a")
            assert await texts(first, 1) == ["a"]
            async with hub.read(turn_id) as second:
                assert len(hub._lanes) == 1
                await append(redis, turn_id, "b")
                assert await texts(first, 1) == ["b"]
                assert await texts(second, 2) == ["a", "b"]
    finally:
        await hub.stop()
        await redis.delete(keys.events(turn_id))
