"""The stream hub on a Redis Cluster (api/cluster_hub.py): readers woken by each stream's
writers through sharded pub/sub, wherever its slot lives, even as it moves.

Each hub here sweeps (reads every stream unwoken) only once a minute, so an entry that
arrives within seconds came through its wake-up. Real Cluster (tests/support/topologies.py):
these carry the `topology` marker, and each test runs a Cluster of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from api.cluster_hub import ClusterHub
from api.hub import Reader, StreamTrimmedError
from shared import keys
from shared.connection import connect_data
from shared.endings import completed
from shared.events import Delta, Done, Start, TimerFired
from shared.requests import AgentRequest, TurnRequest
from shared.streams import StreamBatcher
from shared.timers import publish
from shared.turn_record import TurnRecord
from shared.turns import TurnStore
from tests.support.topologies import RedisClusterTopology, topologies_missing

pytestmark = [
    pytest.mark.topology,
    pytest.mark.skipif(topologies_missing() is not None, reason=str(topologies_missing())),
]

# Far above the few seconds every read below may take: only a wake-up delivers in time.
SWEEP_S = 60.0
WAIT_S = 5.0


@pytest.fixture
async def redis(redis_cluster: RedisClusterTopology) -> AsyncIterator[Redis]:
    client = connect_data(redis_cluster.url)
    yield client
    await client.aclose()


@pytest.fixture
async def hub(redis: Redis) -> AsyncIterator[ClusterHub]:
    running = ClusterHub(connect_data_like(redis), sweep_s=SWEEP_S)
    await running.start()
    yield running
    await running.stop()
    await running.redis.aclose()


def connect_data_like(redis: Redis) -> Redis:
    """A second client of the same Cluster, as the API gives its hub one of its own."""
    nodes = redis.nodes_manager.startup_nodes.values()  # type: ignore[attr-defined]
    return connect_data("redis+cluster://" + ",".join(f"{n.host}:{n.port}" for n in nodes))


async def stored_turn(redis: Redis) -> TurnRecord:
    record = TurnRecord(
        id=uuid.uuid4().hex,
        owner="someone",
        request=TurnRequest(AgentRequest([{"role": "user", "content": "hi"}])),
        model="bernard-v1",
    )
    await TurnStore(redis, retention_s=60, stream_maxlen=100).create(
        record, ttl_s=60, queue_name=None
    )
    return record


async def texts(reader: Reader, count: int) -> list[str]:
    got = []
    while len(got) < count:
        _, stamped = await reader.next(wait_s=WAIT_S)
        if isinstance(stamped.event, Delta):
            got.append(stamped.event.text)
    return got


async def test_a_reader_gets_each_batch_the_worker_writes_as_it_lands(
    redis: Redis, hub: ClusterHub
) -> None:
    records = [await stored_turn(redis) for _ in range(6)]  # slots on every node
    batcher = StreamBatcher(redis, maxlen=100)
    async with contextlib.AsyncExitStack() as stack:
        readers = [await stack.enter_async_context(hub.read(r.id)) for r in records]
        for reader in readers:
            assert isinstance((await reader.next(wait_s=WAIT_S))[1].event, Start)
        for k in range(3):
            for record in records:
                writer = batcher.writer(record.id)
                await writer.write(Delta(text=f"{record.id}:{k}"))
                await writer.flush()
            for record, reader in zip(records, readers, strict=True):
                assert await texts(reader, 1) == [f"{record.id}:{k}"]


async def test_the_done_that_ends_a_turn_wakes_its_readers(
    redis: Redis, hub: ClusterHub, redis_url: str
) -> None:
    record = await stored_turn(redis)
    # The queue role on one server, as `Settings` has it beside a Cluster: the session's.
    queue = connect_data(redis_url)
    store = TurnStore(redis, retention_s=60, stream_maxlen=100, queue=queue)
    async with hub.read(record.id) as reader:
        await reader.next(wait_s=WAIT_S)  # start
        await store.finish(record.id, record.owner, completed("stop", None))
        _, stamped = await reader.next(wait_s=WAIT_S)
        assert isinstance(stamped.event, Done) and stamped.event.status == "completed"
    await queue.aclose()


async def test_a_users_event_stream_wakes_its_readers(redis: Redis, hub: ClusterHub) -> None:
    owner = f"user-{uuid.uuid4().hex[:8]}"
    async with hub.read(keys.user_stream_id(owner)) as reader:
        await asyncio.sleep(0.2)
        fired = TimerFired(timer_id="t", label="tea", conversation_id=None, due_at=0)
        await publish(redis, owner, fired, retention_s=60)
        _, stamped = await reader.next(wait_s=WAIT_S)
        assert isinstance(stamped.event, TimerFired) and stamped.event.label == "tea"


async def test_a_reader_keeps_being_woken_after_its_streams_slot_moves(
    redis_cluster: RedisClusterTopology,
    redis: Redis,
    hub: ClusterHub,
) -> None:
    record = await stored_turn(redis)
    batcher = StreamBatcher(redis, maxlen=100)
    writer = batcher.writer(record.id)
    async with hub.read(record.id) as reader:
        await reader.next(wait_s=WAIT_S)
        home = await redis_cluster.primary_of(keys.events(record.id))
        away = next(n for n in await redis_cluster.primaries() if n is not home)
        for step, node in enumerate([away, home]):
            await redis_cluster.migrate_slot(keys.events(record.id), node)
            await writer.write(Delta(text=f"after move {step}"))
            await writer.flush()
            assert await texts(reader, 1) == [f"after move {step}"]


async def test_entries_written_before_a_reader_came_are_read_at_once(
    redis: Redis, hub: ClusterHub
) -> None:
    record = await stored_turn(redis)
    writer = StreamBatcher(redis, maxlen=100).writer(record.id)
    for k in range(3):
        await writer.write(Delta(text=f"early {k}"))
        await writer.flush()  # one entry each (deltas that wait together are joined)
    async with hub.read(record.id) as reader:
        assert await texts(reader, 3) == [f"early {k}" for k in range(3)]


async def test_a_reader_that_comes_as_the_last_one_leaves_is_still_woken(
    redis: Redis, hub: ClusterHub
) -> None:
    record = await stored_turn(redis)
    writer = StreamBatcher(redis, maxlen=100).writer(record.id)
    leaving = hub.read(record.id)
    first = await leaving.__aenter__()
    await first.next(wait_s=WAIT_S)  # the start: its wake channel is subscribed
    # The last reader leaves and the next one comes with no await in between: the
    # unsubscribe and the subscribe of the same channel must reach Redis in that order.
    await leaving.__aexit__(None, None, None)
    async with hub.read(record.id) as reader:
        await reader.next(wait_s=WAIT_S)
        await asyncio.sleep(0.2)  # whatever the hub sent for the leaving reader is done
        await writer.write(Delta(text="after the handover"))
        await writer.flush()
        assert await texts(reader, 1) == ["after the handover"]


async def test_readers_whose_subscriber_connection_drops_are_subscribed_again_in_place(
    redis_cluster: RedisClusterTopology,
    redis: Redis,
    hub: ClusterHub,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = await stored_turn(redis)
    node = await redis_cluster.primary_of(keys.events(first.id))
    second = await stored_turn(redis)
    while await redis_cluster.primary_of(keys.events(second.id)) is not node:
        second = await stored_turn(redis)
    taken_for_moved: list[str] = []
    moved = hub.moved
    monkeypatch.setattr(hub, "moved", lambda cs: (taken_for_moved.extend(cs), moved(cs)))
    batcher = StreamBatcher(redis, maxlen=100)
    async with hub.read(first.id) as one, hub.read(second.id) as other:
        for reader in (one, other):
            await reader.next(wait_s=WAIT_S)
        async with node.client() as client:  # two wake channels of two slots on it
            assert await client.execute_command("CLIENT", "KILL", "TYPE", "pubsub") == 1
        await asyncio.sleep(0.5)  # the hub has connected again
        for record in (first, second):
            writer = batcher.writer(record.id)
            await writer.write(Delta(text=f"{record.id} after the drop"))
            await writer.flush()
        assert await texts(one, 1) == [f"{first.id} after the drop"]
        assert await texts(other, 1) == [f"{second.id} after the drop"]
    assert taken_for_moved == []  # not resubscribed the slow way, stream by stream


async def test_a_reader_behind_what_its_stream_keeps_is_failed_stream_trimmed(
    redis: Redis,
) -> None:
    """Streams trimmed to 10 entries (Redis trims whole nodes of 100): a reader from an
    entry trimmed since is failed rather than handed what is left after the hole; one from
    an entry still there, whose batch the hub checks just as well, gets every entry."""
    hub = ClusterHub(connect_data_like(redis), sweep_s=SWEEP_S, maxlen=10)
    await hub.start()
    try:
        record = await stored_turn(redis)
        stream = keys.events(record.id)
        (start_id, _), *_ = await redis.xrange(stream, count=1)
        writer = StreamBatcher(redis, maxlen=10).writer(record.id)
        for k in range(300):
            await writer.write(Delta(text=f"{k}"))
            await writer.flush()
        held = [entry_id for entry_id, _ in await redis.xrange(stream)]
        assert start_id not in held, "the stream was not trimmed"
        async with hub.read(record.id, after=start_id.decode()) as behind:
            with pytest.raises(StreamTrimmedError):
                await behind.next(wait_s=WAIT_S)
        kept_from = held[-12].decode()
        async with hub.read(record.id, after=kept_from) as whole:
            assert await texts(whole, 11) == [str(k) for k in range(289, 300)]
    finally:
        await hub.stop()
        await hub.redis.aclose()
