"""compat/redis_cluster.py: an ASK redirect answered on one connection, held to redis-py 5.3.

The first test fails when redis-py's command loop changes (compare the copy again); the
second shows, on a real Cluster with a slot mid-migration, that redis-py's own client still
loses its `ASKING` (when it stops losing it, the departure can go) and that
`AskingCluster` reads the moved key.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from pathlib import Path

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import ClusterError

from compat.redis_cluster import AskingCluster
from tests.support.topologies import ClusterNode as Server
from tests.support.topologies import RedisClusterTopology, started_cluster, topologies_missing

# sha256 of redis-py 5.3.1's `RedisCluster._execute_command` source, first 16 hex digits.
_LOOP_COPIED = "181e71143d5bf53d"


def test_the_command_loop_it_copies_is_redis_pys_as_copied() -> None:
    source = inspect.getsource(RedisCluster._execute_command)
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == _LOOP_COPIED, (
        "redis-py's RedisCluster._execute_command changed: compare compat/redis_cluster.py's "
        "copy with it, and check whether ASKING now goes out on the command's connection"
    )
    assert list(inspect.signature(ClusterNode.execute_pipeline).parameters) == [
        "self",
        "commands",
    ]


@pytest.mark.topology
@pytest.mark.skipif(topologies_missing() is not None, reason=str(topologies_missing()))
async def test_a_key_whose_slot_is_migrating_is_read_where_it_moved(tmp_path: Path) -> None:
    key = "{ask-test}:moved"
    async with started_cluster(tmp_path / "cluster") as cluster:
        await _set(cluster, key, b"here")
        source = await cluster.primary_of(key)
        target = next(n for n in await cluster.primaries() if n is not source)
        assert await cluster.move_keys(key, target) == 1
        for client_class, reads in ((RedisCluster, False), (AskingCluster, True)):
            client = client_class(host="127.0.0.1", port=source.port)
            try:
                await _open_connections(client, target, 4)
                if reads:
                    assert await client.get(key) == b"here"
                else:
                    with pytest.raises(ClusterError, match="TTL exhausted"):
                        await client.get(key)
            finally:
                await client.aclose()
        await cluster.hand_over(key, source, target)


async def _set(cluster: RedisClusterTopology, key: str, value: bytes) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    try:
        await client.set(key, value)
    finally:
        await client.aclose()


async def _open_connections(client: RedisCluster, node: Server, count: int) -> None:
    """`count` connections of `client` open to `node` at once, then free: the case in which
    redis-py's node hands the command another connection than the one `ASKING` went on."""
    await client.initialize()
    own = client.get_node(host="127.0.0.1", port=node.port)
    assert own is not None
    await asyncio.gather(*(own.execute_command("PING") for _ in range(count)))


@pytest.mark.topology
@pytest.mark.skipif(topologies_missing() is not None, reason=str(topologies_missing()))
async def test_a_script_of_several_keys_waits_out_its_slots_migration(tmp_path: Path) -> None:
    """Mid-migration, a script naming a key that moved and one that does not exist is
    answered TRYAGAIN until the slot is handed over (here after a second): redis-py's client
    gives up after about 0.4 s, `AskingCluster` waits and gets the script's reply."""
    key, absent = "{tryagain-test}:here", "{tryagain-test}:absent"
    script = "return {redis.call('GET', KEYS[1]), redis.call('EXISTS', KEYS[2])}"
    async with started_cluster(tmp_path / "cluster") as cluster:
        await _set(cluster, key, b"v")
        source = await cluster.primary_of(key)
        target = next(n for n in await cluster.primaries() if n is not source)
        for client_class, waits in ((RedisCluster, False), (AskingCluster, True)):
            assert await cluster.move_keys(key, target) == 1
            client = client_class(host="127.0.0.1", port=source.port)
            try:
                await client.initialize()

                async def hand_over_later(source: Server = source, to: Server = target) -> None:
                    await asyncio.sleep(1.0)
                    await cluster.hand_over(key, source, to)

                handing = asyncio.create_task(hand_over_later())
                if waits:
                    assert await client.eval(script, 2, key, absent) == [b"v", 0]
                else:
                    with pytest.raises(ClusterError, match="TTL exhausted"):
                        await client.eval(script, 2, key, absent)
                await handing
            finally:
                await client.aclose()
            source, target = target, source  # and back, for the next client
