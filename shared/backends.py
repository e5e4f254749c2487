"""One Redis backend per topology (one server, a primary behind Sentinels, a Cluster), behind
one interface: what the rest of Bernard asks of the Redis a client reaches, without asking
which topology it is.

`backend_of(client)` gives the backend of a client from shared/connection.py. Each says

- how an append to a stream wakes that stream's readers (`append`, `woken`, `wake`): on one
  server or behind Sentinels a reader blocks on `XREAD` of the streams themselves, and the
  appended entry is its wake-up; on a Cluster a reader waits on the stream's sharded pub/sub
  channel (`keys.stream_wake`, in the stream's slot, so on the same node and after the
  appends), which each append is followed by (api/cluster_hub.py reads so);
- how a script whose stream's readers must be woken runs (`run_and_wake`: on a Cluster,
  in one pipeline with the wake-up);
- what its servers are and how each is doing (`describe`, `servers_info`,
  `servers_config`), and how many failovers its client followed (`failovers`);
- whether arq's queue can live there (`holds_queue`: one primary, never a Cluster).

Adding a topology is one class here (and its client in shared/connection.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any, ClassVar, cast

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript

from shared import keys
from shared.connection import Kind, PromptSentinelPool
from shared.scripts import in_pipeline


class Wake(StrEnum):
    """What a stream's readers wait on to learn of its new entries."""

    # A blocking XREAD of the streams themselves (api/hub.py's `StreamHub`).
    XREAD = "xread"
    # The stream's sharded pub/sub channel, published after each append
    # (api/cluster_hub.py's `ClusterHub`).
    CHANNEL = "channel"


class Backend:
    """The Redis a client reaches, as one server (the base: every topology but a Cluster
    behaves so for what Bernard asks)."""

    kind: ClassVar[Kind] = "single"
    wake: ClassVar[Wake] = Wake.XREAD
    holds_queue: ClassVar[bool] = True

    def __init__(self, client: Redis) -> None:
        self.client = client

    def describe(self) -> str:
        """Where the client connects, for people to read (never the password)."""
        kwargs = self.client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix://{kwargs['path']}"
        host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
        return f"redis://{host}:{port}/{kwargs.get('db', 0)}"

    def append(
        self,
        pipe: Pipeline,
        stream_id: str,
        field: str,
        values: Sequence[bytes],
        *,
        maxlen: int,
        nomkstream: bool = False,
        expire_s: int | None = None,
    ) -> int:
        """Queue on `pipe` an `XADD` of each of `values` (an entry of one `field`) to
        `stream_id`'s stream (trimmed to about `maxlen`; never creating a stream that is
        gone with `nomkstream`), then its expiry (`expire_s`), then what wakes its readers.
        Returns how many replies follow the entries' (the expiry's, the wake-up's), for a
        caller that reads them."""
        stream = keys.events(stream_id)
        for value in values:
            pipe.xadd(
                stream, {field: value}, maxlen=maxlen, approximate=True, nomkstream=nomkstream
            )
        after = 0
        if expire_s is not None:
            pipe.expire(stream, expire_s)
            after += 1
        return after + self.woken(pipe, stream_id)

    def woken(self, pipe: Pipeline, stream_id: str) -> int:
        """Queue on `pipe`, after appends to `stream_id`'s stream queued there (by a script,
        say), what wakes its readers; returns how many replies that adds. The entries
        themselves wake an `XREAD`: nothing."""
        return 0

    async def run_and_wake(
        self, script: AsyncScript, script_keys: Sequence[str], args: Sequence[Any], stream_id: str
    ) -> Any:
        """Run `script` (one that appends to `stream_id`'s stream), then wake the stream's
        readers; its reply."""
        return await script(keys=script_keys, args=args)

    async def by_primary(self, stream_ids: list[str]) -> list[tuple[Backend, list[str]]]:
        """The streams grouped by the primary holding them, each with a backend reaching
        that primary alone (no Cluster client work per command: bench/writer.py). The
        caller closes the clients of backends other than this one."""
        return [(self, stream_ids)]

    async def servers_info(self, section: str | None = None) -> dict[str, dict[str, Any]]:
        """`INFO` (`section` of it) of each server holding data, by node name ("" for a lone
        server). Redis errors propagate."""
        info = await self.client.info(section) if section else await self.client.info()
        return {"": cast(dict[str, Any], info)}

    async def servers_config(self, name: str) -> dict[str, dict[str, Any]]:
        """`CONFIG GET name` of each server holding data, by node name as `servers_info`.
        Redis errors propagate (CONFIG is often disabled on managed Redis)."""
        return {"": cast(dict[str, Any], await self.client.config_get(name))}

    def failovers(self) -> int:
        """How many failovers the client has followed so far."""
        return 0


class SentinelBackend(Backend):
    """The primary that Sentinels name for a service (`PromptSentinelPool`)."""

    kind: ClassVar[Kind] = "sentinel"

    @property
    def _pool(self) -> PromptSentinelPool:
        return cast(PromptSentinelPool, self.client.connection_pool)

    def describe(self) -> str:
        pool = self._pool
        hosts = ",".join(
            f"{s.connection_pool.connection_kwargs['host']}:"
            f"{s.connection_pool.connection_kwargs['port']}"
            for s in pool.sentinel_manager.sentinels
        )
        return f"redis+sentinel://{hosts}/{pool.service_name}"

    def failovers(self) -> int:
        """Each new primary its connections reached (`PromptSentinelPool.failovers`)."""
        return self._pool.failovers


class _ChannelWake(Backend):
    """A Cluster's, whole or one node of it: readers wait on each stream's channel."""

    kind: ClassVar[Kind] = "cluster"
    wake: ClassVar[Wake] = Wake.CHANNEL
    # arq's multi-key transactions (the job, the queue, in-progress) would cross slots.
    holds_queue: ClassVar[bool] = False

    def woken(self, pipe: Pipeline, stream_id: str) -> int:
        pipe.execute_command("SPUBLISH", keys.stream_wake(stream_id), "")
        return 1

    async def run_and_wake(
        self, script: AsyncScript, script_keys: Sequence[str], args: Sequence[Any], stream_id: str
    ) -> Any:
        # One round trip: a Cluster pipeline takes a script as its text (shared/scripts.py).
        async with self.client.pipeline(transaction=False) as pipe:
            in_pipeline(pipe, cast(str, script.script), script_keys, args)
            self.woken(pipe, stream_id)
            reply, _ = await pipe.execute()
        return reply


class ClusterNodeBackend(_ChannelWake):
    """One primary of a Cluster, on a plain client to it (`ClusterBackend.by_primary`): it
    takes only keys of its own slots."""


class ClusterBackend(_ChannelWake):
    """A Redis Cluster (`RedisCluster`): streams spread over its primaries by slot."""

    @property
    def _cluster(self) -> RedisCluster:
        return cast(RedisCluster, self.client)

    def describe(self) -> str:
        nodes = self._cluster.nodes_manager.startup_nodes.values()
        return "redis+cluster://" + ",".join(f"{n.host}:{n.port}" for n in nodes)

    async def by_primary(self, stream_ids: list[str]) -> list[tuple[Backend, list[str]]]:
        # Nothing moves slots while the caller writes.
        await self._cluster.initialize()
        by_node: dict[tuple[str, int], list[str]] = {}
        for stream_id in stream_ids:
            node = self._cluster.get_node_from_key(keys.events(stream_id))
            assert node is not None
            by_node.setdefault((node.host, int(node.port)), []).append(stream_id)
        return [
            (ClusterNodeBackend(Redis(host=host, port=port)), ids)
            for (host, port), ids in by_node.items()
        ]

    async def servers_info(self, section: str | None = None) -> dict[str, dict[str, Any]]:
        """Each primary's (a replica is read once it is promoted: the client knows the
        primaries alone)."""
        args = (section,) if section else ()
        replies = await self._cluster.info(*args, target_nodes=RedisCluster.PRIMARIES)
        return self._by_node(replies)

    async def servers_config(self, name: str) -> dict[str, dict[str, Any]]:
        replies = await self._cluster.config_get(name, target_nodes=RedisCluster.PRIMARIES)
        return self._by_node(replies)

    def _by_node(self, replies: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Replies by node name: redis-py answers the reply of a single primary alone (an
        INFO or CONFIG reply, whose values are not all replies themselves)."""
        if replies and all(isinstance(reply, dict) for reply in replies.values()):
            return replies
        (node,) = self._cluster.get_primaries()
        return {str(node.name): replies}


def backend_of(client: Redis) -> Backend:
    """The backend of a client from shared/connection.py (`connect`, `connect_data`)."""
    if isinstance(client, RedisCluster):
        return ClusterBackend(client)
    if isinstance(client.connection_pool, PromptSentinelPool):
        return SentinelBackend(client)
    return Backend(client)


def holds_queue(kind: Kind) -> bool:
    """Whether arq's queue can live on Redis of that topology."""
    return _BACKENDS[kind].holds_queue


_BACKENDS: dict[Kind, type[Backend]] = {
    backend.kind: backend for backend in (Backend, SentinelBackend, ClusterBackend)
}
