"""shared/backends.py: each topology's backend, told from its client, and what it says of
itself; appends carrying their wake-up, on a real server (a Cluster node's channel wake-up
is a sharded publish, which one server answers too; the Cluster itself runs in
tests/test_topologies.py)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid

import pytest
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError

from shared import keys
from shared.backends import (
    Backend,
    ClusterBackend,
    ClusterNodeBackend,
    Kind,
    SentinelBackend,
    Wake,
    backend_of,
    holds_queue,
    parse_url,
)
from shared.connection import connect, connect_data, wait_until_reachable
from shared.redis_pool import backoff_s
from tests.support.session_redis import session_redis_url


@pytest.mark.parametrize(
    ("url", "backend", "kind", "wake", "described"),
    [
        ("redis://127.0.0.1:6390/2", Backend, "single", Wake.XREAD, "redis://127.0.0.1:6390/2"),
        ("unix:///tmp/r.sock", Backend, "single", Wake.XREAD, "unix:///tmp/r.sock"),
        (
            "redis+sentinel://127.0.0.1:26390,127.0.0.1:26391/main",
            SentinelBackend,
            "sentinel",
            Wake.XREAD,
            "redis+sentinel://127.0.0.1:26390,127.0.0.1:26391/main",
        ),
        (
            "redis+cluster://127.0.0.1:7390,127.0.0.1:7391",
            ClusterBackend,
            "cluster",
            Wake.CHANNEL,
            "redis+cluster://127.0.0.1:7390,127.0.0.1:7391",
        ),
    ],
)
async def test_a_clients_backend_is_its_topologys(
    url: str, backend: type[Backend], kind: Kind, wake: Wake, described: str
) -> None:
    client = connect_data(url)  # nothing is connected yet
    try:
        found = backend_of(client)
        assert type(found) is backend
        assert (found.kind, found.wake, found.describe()) == (kind, wake, described)
        assert found.failovers() == 0
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("kind", "holds"), [("single", True), ("sentinel", True), ("cluster", False)]
)
def test_arqs_queue_lives_on_one_primary_never_a_cluster(kind: Kind, holds: bool) -> None:
    assert holds_queue(kind) is holds


@pytest.mark.parametrize(
    ("url", "splits"),
    [("redis://h", False), ("redis+sentinel://h/mymaster", False), ("redis+cluster://h", True)],
)
def test_only_a_cluster_sends_a_command_of_many_keys_one_per_slot(url: str, splits: bool) -> None:
    assert parse_url(url).backend.splits_by_slot is splits


@pytest.mark.parametrize(
    ("failures", "seconds"), [(0, 0.05), (1, 0.1), (2, 0.2), (4, 0.8), (5, 1.0), (30, 1.0)]
)
def test_a_loop_waits_for_redis_as_the_clients_retries_do(failures: int, seconds: float) -> None:
    assert backoff_s(failures) == pytest.approx(seconds)


async def test_one_servers_append_is_the_entries_and_their_expiry_and_wakes_no_channel() -> None:
    client = connect(session_redis_url())
    stream_id = f"test-backend-{uuid.uuid4().hex}"
    try:
        async with client.pipeline(transaction=False) as pipe:
            after = backend_of(client).append(
                pipe, stream_id, "e", [b"one", b"two"], maxlen=10, expire_s=60
            )
            replies = await pipe.execute()
        assert after == 1, "the expiry's reply follows the entries'"
        assert len(replies) == 3
        entries = await client.xrange(keys.events(stream_id))
        assert [fields for _, fields in entries] == [{b"e": b"one"}, {b"e": b"two"}]
        assert 0 < await client.ttl(keys.events(stream_id)) <= 60
    finally:
        await client.delete(keys.events(stream_id))
        await client.aclose()


async def _woken(pubsub: PubSub) -> bytes:
    """The channel of the next sharded message `pubsub` receives."""
    async with asyncio.timeout(5):
        while True:
            message = await pubsub.parse_response(block=True)
            if message[0] == b"smessage":
                return bytes(message[1])


async def test_an_append_on_a_cluster_node_publishes_the_streams_wake_up_after_it() -> None:
    client = Redis.from_url(session_redis_url())
    stream_id = f"test-backend-{uuid.uuid4().hex}"
    pubsub = client.pubsub()
    try:
        await pubsub.execute_command("SSUBSCRIBE", keys.stream_wake(stream_id))
        node = ClusterNodeBackend(client)
        async with client.pipeline(transaction=False) as pipe:
            after = node.append(pipe, stream_id, "e", [b"one"], maxlen=10)
            entry_id, delivered = await pipe.execute()
        assert (after, delivered) == (1, 1), "one reader woken, by the reply after the entry's"
        assert await _woken(pubsub) == keys.stream_wake(stream_id).encode()
        assert await client.xrange(keys.events(stream_id)) == [(entry_id, {b"e": b"one"})]
    finally:
        await pubsub.aclose()
        await client.delete(keys.events(stream_id))
        await client.aclose()


async def test_a_script_that_appends_is_followed_by_the_wake_up_on_a_cluster_node() -> None:
    client = Redis.from_url(session_redis_url())
    stream_id = f"test-backend-{uuid.uuid4().hex}"
    script = client.register_script("return redis.call('XADD', KEYS[1], '*', 'e', ARGV[1])")
    stream = keys.events(stream_id)
    pubsub = client.pubsub()
    try:
        await pubsub.execute_command("SSUBSCRIBE", keys.stream_wake(stream_id))
        single = await backend_of(client).run_and_wake(script, [stream], ["a"], stream_id)
        node = await ClusterNodeBackend(client).run_and_wake(script, [stream], ["b"], stream_id)
        assert [single, node] == [entry_id for entry_id, _ in await client.xrange(stream)]
        assert await _woken(pubsub) == keys.stream_wake(stream_id).encode(), "once: the node's"
        assert await pubsub.get_message(timeout=0.1) is None
    finally:
        await pubsub.aclose()
        await client.delete(stream)
        await client.aclose()


def _dead_port() -> int:
    """A port nothing listens on (bound, then let go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("url", "pool_class", "service"),
    [
        ("redis://127.0.0.1:{port}/3", ConnectionPool, None),
        ("redis+sentinel://127.0.0.1:{port}/main/3", SentinelConnectionPool, "main"),
    ],
)
async def test_a_probe_asks_the_same_servers_once_and_gives_up_soon(
    url: str, pool_class: type[ConnectionPool], service: str | None
) -> None:
    client = connect(url.format(port=_dead_port()))
    probe = backend_of(client).probe()
    try:
        assert type(probe.connection_pool) is pool_class
        assert probe.connection_pool.connection_kwargs["db"] == 3
        assert getattr(probe.connection_pool, "service_name", None) == service
        started = time.monotonic()
        with pytest.raises(RedisConnectionError):
            await probe.ping()
        # The client itself would retry for some 30 s.
        assert time.monotonic() - started < 2.0
    finally:
        await probe.aclose()
        await client.aclose()


async def test_a_process_waits_for_its_redis_saying_so(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.backends")
    up = connect(session_redis_url())
    down = connect(f"redis://127.0.0.1:{_dead_port()}/0")
    try:
        async with asyncio.timeout(5):
            await wait_until_reachable(up, logger)
        with caplog.at_level(logging.ERROR, logger="test.backends"), pytest.raises(TimeoutError):
            async with asyncio.timeout(1.0):
                await wait_until_reachable(down, logger, every_s=0.1)
        (said,) = [record.getMessage() for record in caplog.records]
        assert said.startswith(f"Redis at {backend_of(down).describe()} does not answer")
    finally:
        await up.aclose()
        await down.aclose()
