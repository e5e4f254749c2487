"""The worker's stream writer: one write in flight per process, every turn's order kept."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as redis_asyncio
from redis.exceptions import ResponseError

from shared import keys
from shared.events import Delta, Start, ToolCall
from shared.streams import StreamBatcher, parse_entries


async def entries(redis: redis_asyncio.Redis, turn_id: str) -> list[object]:
    return [s.event for _, s in parse_entries(await redis.xrange(keys.events(turn_id)))]


@pytest.fixture
def turn_ids(redis: redis_asyncio.Redis) -> list[str]:
    return [uuid.uuid4().hex for _ in range(3)]


async def test_each_turn_keeps_its_order_and_its_queued_deltas_join(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    batcher = StreamBatcher(redis, maxlen=1000)
    writers = [batcher.writer(t) for t in turn_ids]
    try:
        for writer in writers:
            batcher.add(writer.key, Start())  # the first round starts with these
        for k, writer in enumerate(writers):
            # Queued before the round goes out: one entry per turn, joined.
            for piece in ("a", "b", "c"):
                batcher.add(writer.key, Delta(text=f"{k}{piece}"))
            batcher.add(writer.key, ToolCall(id="c1", name="t", arguments="{}", index=0))
        for writer in writers:
            await writer.flush()
        for k, turn_id in enumerate(turn_ids):
            assert await entries(redis, turn_id) == [
                Start(),
                Delta(text=f"{k}a{k}b{k}c"),
                ToolCall(id="c1", name="t", arguments="{}", index=0),
            ]
    finally:
        await redis.delete(*(keys.events(t) for t in turn_ids))


async def test_a_failed_write_surfaces_at_its_own_turn_only(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    broken, healthy = turn_ids[0], turn_ids[1]
    await redis.set(keys.events(broken), "not a stream")
    batcher = StreamBatcher(redis, maxlen=1000)
    try:
        bad, good = batcher.writer(broken), batcher.writer(healthy)
        await bad.write(Delta(text="x"))
        await good.write(Delta(text="y"))
        with pytest.raises(ResponseError):
            await bad.flush()
        await good.flush()
        assert await entries(redis, healthy) == [Delta(text="y")]
    finally:
        await redis.delete(keys.events(broken), keys.events(healthy))


async def test_a_discarded_turn_writes_nothing_more(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    batcher = StreamBatcher(redis, maxlen=1000)
    first, second = batcher.writer(turn_ids[0]), batcher.writer(turn_ids[1])
    try:
        batcher.add(first.key, Start())  # in flight
        batcher.add(second.key, Delta(text="queued"))
        second.discard()
        await first.flush()
        await second.flush()
        assert await redis.exists(keys.events(turn_ids[1])) == 0
    finally:
        await redis.delete(*(keys.events(t) for t in turn_ids))
