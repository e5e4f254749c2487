"""A connection a loop keeps for its pipelines (shared/redis_pool.py `HeldConnection`): each
round's replies are what a redis-py pipeline hands back, error replies in their place, on
the one connection it keeps, sent again on a new one when the server closed it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis_asyncio
from redis.exceptions import ResponseError

from shared.backends import backend_of
from shared.connection import connect_data
from shared.redis_pool import HeldConnection


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[redis_asyncio.Redis]:
    """Bernard's own client of the session's Redis (its pool, packing and retries)."""
    redis = connect_data(redis_url)
    yield redis
    await redis.aclose()


@pytest.fixture
async def key(client: redis_asyncio.Redis) -> AsyncIterator[str]:
    """A stream of one entry, `1-1`, deleted afterwards."""
    name = f"bernard:test:held:{uuid.uuid4().hex}"
    await client.xadd(name, {"e": b"first"}, id="1-1")
    yield name
    await client.delete(name, f"{name}:gone", f"{name}:text")


async def test_a_round_hands_back_each_reply_in_its_place(
    client: redis_asyncio.Redis, key: str
) -> None:
    held = HeldConnection(client.connection_pool)
    async with held.pipeline() as pipe:
        pipe.xadd(key, {"e": b"second"}, id="2-1", maxlen=100, approximate=True)
        pipe.xadd(f"{key}:gone", {"e": b"x"}, nomkstream=True)  # no stream: nothing made
        pipe.xadd(key, {"e": b"old"}, id="1-5")  # behind the stream's last id: refused
        pipe.expire(key, 60)
        pipe.execute_command("SET", f"{key}:text", "ünï")
        replies = await pipe.execute(raise_on_error=False)
    await held.aclose()

    assert replies[0] == b"2-1"
    assert replies[1] is None
    assert isinstance(replies[2], ResponseError)
    assert "equal or smaller than the target stream top item" in str(replies[2])
    assert replies[3:] == [1, b"OK"]
    assert await client.xrange(key) == [(b"1-1", {b"e": b"first"}), (b"2-1", {b"e": b"second"})]
    assert await client.exists(f"{key}:gone") == 0
    assert await client.get(f"{key}:text") == "ünï".encode()


async def test_its_rounds_go_on_one_connection_it_keeps_until_closed(
    client: redis_asyncio.Redis, key: str
) -> None:
    held = HeldConnection(client.connection_pool)
    ids = [(await held.run([("CLIENT", "ID")]))[0] for _ in range(3)]
    others = {await client.client_id() for _ in range(3)}  # the pool's other connections
    await held.aclose()
    given_back = await client.connection_pool.get_connection()
    await given_back.send_command("CLIENT", "ID")
    given_back_id = await given_back.read_response()
    await client.connection_pool.release(given_back)

    assert len(set(ids)) == 1
    assert ids[0] not in others
    assert given_back_id == ids[0]


async def test_a_round_after_the_server_closed_its_connection_goes_on_a_new_one(
    client: redis_asyncio.Redis, key: str
) -> None:
    held = HeldConnection(client.connection_pool)
    (first,) = await held.run([("CLIENT", "ID")])
    await client.client_kill_filter(_id=first)

    (second,) = await held.run([("CLIENT", "ID")])
    (added,) = await held.run([("XADD", key, "3-1", "e", b"third")])
    await held.aclose()

    assert second != first
    assert added == b"3-1"


async def test_a_topology_of_one_server_keeps_a_connection_for_its_pipelines(
    client: redis_asyncio.Redis,
) -> None:
    pipelines = backend_of(client).pipelines()
    await pipelines.aclose()

    assert isinstance(pipelines, HeldConnection)


async def test_an_empty_round_sends_nothing(client: redis_asyncio.Redis) -> None:
    held = HeldConnection(client.connection_pool)
    async with held.pipeline() as pipe:
        assert await pipe.execute() == []
    assert held._connection is None
