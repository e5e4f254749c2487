"""One Redis backend per topology (one server, a primary behind Sentinels, a Cluster), behind
one interface: how its URL reads and its client is built, and what the rest of Bernard asks
of the Redis a client reaches, without asking which topology it is.

A URL's scheme picks its backend (`parse_url`, from `_BY_SCHEME`); shared/connection.py's
`connect` and `connect_data` build its client through it (`Backend.connect`), and
`backend_of(client)` gives the backend of a client so built. Each says

- which URLs name it (`schemes`, `parse`) and how its client is built (`connect`, `probe`);
- how an append to a stream wakes that stream's readers (`append`, `woken`, `wake`): on one
  server or behind Sentinels a reader blocks on `XREAD` of the streams themselves, and the
  appended entry is its wake-up; on a Cluster a reader waits on the stream's sharded pub/sub
  channel (`keys.stream_wake`, in the stream's slot, so on the same node and after the
  appends), which each append is followed by (api/cluster_hub.py reads so);
- where a loop that sends a pipeline at a time, many a second (a worker's stream writer),
  gets its pipelines (`pipelines`: on a connection it keeps, or a Cluster client's);
- how a script whose stream's readers must be woken runs (`run_and_wake`: on a Cluster,
  in one pipeline with the wake-up);
- what its servers are and how each is doing (`describe`, `servers_info`,
  `servers_config`), and how many failovers its client followed (`failovers`), of the
  primary holding a given stream's keys (a Cluster's shards fail over one by one);
- whether arq's queue can live there (`holds_queue`, `queue_refused`: one primary, never a
  Cluster).

Adding a topology is one class here, its `kind` and its line in `_BACKENDS`; a topology
whose readers wake by something new also needs a hub in api/ (api/main.py `_HUBS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol, cast
from urllib.parse import parse_qs, unquote, urlsplit

from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterNode, get_node_name
from redis.asyncio.connection import SSLConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.crc import key_slot
from redis.exceptions import ConnectionError, TimeoutError

from compat.redis_cluster import AskingCluster
from shared import keys
from shared.redaction import redact_url
from shared.redis_pool import (
    RETRIES,
    HeldConnection,
    HeldPipeline,
    PromptPool,
    pool_options,
    pooled_client,
    pooled_connection,
    retry_policy,
)
from shared.scripts import in_pipeline

_SENTINEL_PORT = 26379
_REDIS_PORT = 6379
# A Cluster client retries a failed node briefly, then asks the cluster where the slot went
# (each round re-reads the topology), for about as long as `RETRIES`: a shard's failover
# takes the cluster's node timeout and an election.
_NODE_RETRIES = 3
_CLUSTER_ROUNDS = 20


class Kind(StrEnum):
    """Which topology a Redis URL names (`RedisAddress.kind`, `Backend.kind`, and
    shared/status.py's `RedisStatus.kind`)."""

    SINGLE = "single"
    SENTINEL = "sentinel"
    CLUSTER = "cluster"


@dataclass(frozen=True, slots=True)
class RedisAddress:
    """Where a role's Redis is, as its URL says (`parse_url`)."""

    kind: Kind
    url: str
    hosts: tuple[tuple[str, int], ...] = ()
    service: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    sentinel_password: str | None = None

    @property
    def backend(self) -> type[Backend]:
        """The backend of that topology."""
        return _BACKENDS[self.kind]


def parse_url(url: str) -> RedisAddress:
    """Read a Redis URL of any of the forms shared/connection.py lists; `ValueError` for one
    it cannot use."""
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ValueError(f"not a Redis URL: {redact_url(url)!r}")
    # Any other scheme is redis-py's to read, or to refuse, as one server.
    return _BY_SCHEME.get(scheme.lower(), Backend).parse(url)


@dataclass(frozen=True, slots=True)
class _HostList:
    """What a URL naming several hosts says before its topology reads its path and query."""

    hosts: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    ssl: bool
    query: dict[str, str]
    path: list[str]


def _host_list(url: str, default_port: int) -> _HostList:
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    return _HostList(
        hosts=tuple(_host_port(item, default_port, url) for item in hostlist.split(",")),
        username=username,
        password=password,
        ssl=parts.scheme.lower().startswith("rediss"),
        query={name: values[-1] for name, values in parse_qs(parts.query).items()},
        path=[piece for piece in parts.path.split("/") if piece],
    )


def _host_port(item: str, default_port: int, url: str) -> tuple[str, int]:
    host, colon, port = item.strip().rpartition(":")
    if not colon:
        host, port = port, ""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or (port and not port.isdigit()):
        raise ValueError(f"bad host:port {item!r} in {redact_url(url)!r}")
    return host, int(port) if port else default_port


def _database(text: str, url: str) -> int:
    if not text.isdigit():
        raise ValueError(f"bad database {text!r} in {redact_url(url)!r}")
    return int(text)


class Wake(StrEnum):
    """What a stream's readers wait on to learn of its new entries."""

    # A blocking XREAD of the streams themselves (api/hub.py's `StreamHub`).
    XREAD = "xread"
    # The stream's sharded pub/sub channel, published after each append
    # (api/cluster_hub.py's `ClusterHub`).
    CHANNEL = "channel"


class Pipelines(Protocol):
    """Pipelines for a loop that sends one at a time (`Backend.pipelines`)."""

    def pipeline(self) -> Pipeline | HeldPipeline: ...

    async def aclose(self) -> None: ...


class Backend:
    """The Redis a client reaches, as one server (the base: every topology but a Cluster
    behaves so for what Bernard asks)."""

    kind: ClassVar[Kind] = Kind.SINGLE
    # The URL schemes that name this topology (one server: any scheme the others leave).
    schemes: ClassVar[tuple[str, ...]] = ("redis", "rediss", "unix")
    wake: ClassVar[Wake] = Wake.XREAD
    # Why arq's queue cannot live there, for the person who put it there ("": it can).
    queue_refused: ClassVar[str] = ""
    # Whether redis-py reads its URLs itself (`redis.Redis.from_url`, sync or asyncio).
    redis_py_url: ClassVar[bool] = True
    # Whether a command of many keys is sent as one command per slot: then an `EXISTS` of
    # many turns' keys costs one command a turn (worker/liveness.py looks at fewer a time).
    splits_by_slot: ClassVar[bool] = False

    def __init__(self, client: Redis) -> None:
        self.client = client

    @classmethod
    def parse(cls, url: str) -> RedisAddress:
        """Its URL, as `parse_url` gives it; redis-py reads one server's itself."""
        return RedisAddress(cls.kind, url)

    @classmethod
    def connect(
        cls,
        address: RedisAddress,
        *,
        retries: int = RETRIES,
        max_connections: int = 512,
        **kwargs: object,
    ) -> Redis:
        """A client of `address`'s servers that retries connection errors with backoff, as
        shared/connection.py `connect` describes, as the topology builds it (`_client`):
        `retries` times, on a pool of `max_connections` (`kwargs` override its options)."""
        return cls._client(address, retries, pool_options(retries, max_connections, kwargs))

    @classmethod
    def _client(cls, address: RedisAddress, retries: int, options: dict[str, Any]) -> Redis:
        """One server's: arq's `ArqRedis` on a `PromptPool` of `options`
        (shared/redis_pool.py)."""
        return pooled_client(PromptPool.from_url(address.url, **options))

    @classmethod
    def built(cls, client: Redis) -> bool:
        """Whether this backend's `connect` built `client` (`backend_of`); one server's
        takes what no other backend does."""
        return True

    def probe(self) -> Redis:
        """A client of the same server that tries each command once, and soon gives up
        (shared/connection.py `wait_until_reachable`); closing it closes its pool."""
        source = self.client.connection_pool
        pool = ConnectionPool(connection_class=source.connection_class, **_probing(source))
        return _owning(pool)

    def describe(self) -> str:
        """Where the client connects, for people to read (never the password)."""
        kwargs = self.client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix://{kwargs['path']}"
        host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
        return f"redis://{host}:{port}/{kwargs.get('db', 0)}"

    def pipelines(self) -> Pipelines:
        """Pipelines for a loop that sends one at a time, on one connection of the client's
        pool that the loop keeps (`HeldConnection`: about half a pipeline's CPU); close
        them to give it back."""
        return HeldConnection(self.client.connection_pool)

    def append(
        self,
        pipe: Pipeline | HeldPipeline,
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

    def woken(self, pipe: Pipeline | HeldPipeline, stream_id: str) -> int:
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

    async def servers_info(self, section: str | None = None) -> dict[str, dict[str, Any]]:
        """`INFO` (`section` of it) of each server holding data, by node name ("" for a lone
        server). Redis errors propagate."""
        info = await self.client.info(section) if section else await self.client.info()
        return {"": cast(dict[str, Any], info)}

    async def servers_config(self, name: str) -> dict[str, dict[str, Any]]:
        """`CONFIG GET name` of each server holding data, by node name as `servers_info`.
        Redis errors propagate (CONFIG is often disabled on managed Redis)."""
        return {"": cast(dict[str, Any], await self.client.config_get(name))}

    def failovers(self, stream_id: str | None = None) -> int:
        """How many failovers the client has followed so far: of the primary holding
        `stream_id`'s keys (a turn's, or an owner's), or of any primary (None)."""
        return 0


class PromptSentinelConnection(SentinelManagedConnection):
    """A connection to the primary the Sentinels name, that asks them again at each try.

    redis-py's connects to the address they gave through `Connection.connect`, which runs
    the whole retry policy (half a minute, for a restart) against that one address before
    the Sentinels are asked again: after a failover every connection kept knocking on the
    dead primary for as long. Here each try is one attempt at the address named now.
    """

    async def connect_to(self, address: Any) -> None:
        retry, self.retry = self.retry, Retry(NoBackoff(), 0)
        try:
            await super().connect_to(address)
        finally:
            self.retry = retry


class PromptSentinelSSLConnection(PromptSentinelConnection, SSLConnection):
    pass


class PromptSentinelPool(SentinelConnectionPool, PromptPool):
    """The primary the Sentinels name, through a `PromptPool` (blocking, prompt checks).

    It also counts failovers: each time the Sentinels name a primary other than the one its
    connections last reached (`failovers`, read by worker/supervisor.py).
    """

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any) -> None:
        super().__init__(service_name, sentinel_manager, **kwargs)
        self.failovers = 0

    async def get_master_address(self) -> Any:
        before = self.master_address
        address = await super().get_master_address()
        if before is not None and address != before:
            self.failovers += 1
        return address

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        if inuse_connections:  # closing the client: the Sentinels' connections go too
            for sentinel in self.sentinel_manager.sentinels:
                await sentinel.aclose()


class SentinelBackend(Backend):
    """The primary that Sentinels name for a service (`PromptSentinelPool`):
    `redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]`."""

    kind: ClassVar[Kind] = Kind.SENTINEL
    schemes: ClassVar[tuple[str, ...]] = ("redis+sentinel", "rediss+sentinel")
    redis_py_url: ClassVar[bool] = False

    @classmethod
    def parse(cls, url: str) -> RedisAddress:
        found = _host_list(url, _SENTINEL_PORT)
        if set(found.query) - {"sentinel_password"}:
            raise ValueError(f"unknown option(s) {sorted(found.query)} in {redact_url(url)!r}")
        if not found.path or len(found.path) > 2:
            raise ValueError(
                f"name the Sentinel service: redis+sentinel://host:port/service "
                f"(got {redact_url(url)!r})"
            )
        return RedisAddress(
            cls.kind,
            url,
            hosts=found.hosts,
            service=unquote(found.path[0]),
            db=_database(found.path[1], url) if len(found.path) == 2 else 0,
            username=found.username,
            password=found.password,
            ssl=found.ssl,
            sentinel_password=found.query.get("sentinel_password"),
        )

    @classmethod
    def _client(cls, address: RedisAddress, retries: int, options: dict[str, Any]) -> Redis:
        """`Backend._client`'s, on a `PromptSentinelPool`: a connection lost to a dead
        primary reconnects to the one the Sentinels promote."""
        assert address.service is not None
        sentinel_kwargs: dict[str, Any] = {"socket_connect_timeout": 1.0, "socket_timeout": 2.0}
        if address.sentinel_password:
            sentinel_kwargs["password"] = address.sentinel_password
        if address.ssl:
            sentinel_kwargs["ssl"] = True
        sentinel = Sentinel(list(address.hosts), sentinel_kwargs=sentinel_kwargs)
        connection_class = PromptSentinelSSLConnection if address.ssl else PromptSentinelConnection
        pool = PromptSentinelPool(
            address.service,
            sentinel,
            is_master=True,
            db=address.db,
            username=address.username,
            password=address.password,
            **{**options, "connection_class": connection_class},
        )
        return pooled_client(pool)

    @classmethod
    def built(cls, client: Redis) -> bool:
        # A Cluster client has no `connection_pool`.
        return isinstance(getattr(client, "connection_pool", None), PromptSentinelPool)

    def probe(self) -> Redis:
        source = self._pool
        kwargs = _probing(source)
        kwargs.pop("connection_pool", None)  # each Sentinel pool sets its own
        pool = SentinelConnectionPool(
            source.service_name,
            source.sentinel_manager,
            connection_class=source.connection_class,
            **kwargs,
        )
        return _owning(pool)

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

    def failovers(self, stream_id: str | None = None) -> int:
        """Each new primary its connections reached (`PromptSentinelPool.failovers`): one
        primary holds every key."""
        return self._pool.failovers


class _ChannelWake(Backend):
    """A Cluster's, whole or one node of it: readers wait on each stream's channel."""

    kind: ClassVar[Kind] = Kind.CLUSTER
    wake: ClassVar[Wake] = Wake.CHANNEL
    # arq's multi-key transactions (the job, the queue, in-progress) would cross slots.
    queue_refused: ClassVar[str] = (
        "arq (the queue role) cannot use a Redis Cluster (arq has no Cluster support): "
        "BERNARD_QUEUE_REDIS_URL must name one primary (redis:// or redis+sentinel://)"
    )

    def woken(self, pipe: Pipeline | HeldPipeline, stream_id: str) -> int:
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


@dataclass(frozen=True, slots=True)
class _ClientPipelines:
    """A client's pipelines, each on the connections it takes (`Backend.pipelines`)."""

    client: Redis

    def pipeline(self) -> Pipeline:
        return self.client.pipeline(transaction=False)

    async def aclose(self) -> None:
        return None


@dataclass(slots=True)
class Failovers:
    """The failovers a Cluster client followed: of each slot's primary, and in all (one
    for each new view of the cluster that found some)."""

    by_slot: dict[int, int] = field(default_factory=dict)
    total: int = 0


class _StartupNodes(dict[str, ClusterNode]):
    """A Cluster client's startup nodes, whose `values()` is a copy: the library iterates
    them across awaits while other commands pop from them (`FailoverCountingCluster`)."""

    def values(self) -> list[ClusterNode]:  # type: ignore[override]
        return list(super().values())


class FailoverCountingCluster(AskingCluster):
    """An `AskingCluster` that follows failovers, and counts them slot by slot.

    Counts: each time its view of the cluster, read again (`initialize`, after a node
    failed a command or a slot moved), gives a slot another primary that was that slot's
    replica, or whose old primary is no primary any more (dead, or a replica now). A slot
    that migrated to another primary is no failover: nothing was lost on the way.

    Follows: redis-py reads the cluster again from its startup nodes alone, and drops a
    node from them at each connection error (a live node's too, when another command's
    reset closed the connection under it) and at each view without it. Once they are all
    gone no view can be read again, and every command fails for good ("Redis Cluster
    cannot be connected", a worker and an API did so after a primary's SIGKILL): the nodes
    its URL named (`seeds`) join them again, after the others, before each read. And it
    reads them while other commands drop some: the library's loop over them failed with
    "dictionary changed size during iteration", which killed an API's stream hub (its
    every stream kept alive, never read again). They are `_StartupNodes`, read from a
    copy."""

    # What it followed; None until its first failover.
    followed: Failovers | None = None
    # The nodes its URL named (`ClusterBackend._client`).
    seeds: tuple[tuple[str, int], ...] = ()

    async def initialize(self) -> RedisCluster:
        manager = self.nodes_manager
        for host, port in self.seeds:
            name = get_node_name(host, port)
            if name not in manager.startup_nodes:
                manager.startup_nodes[name] = ClusterNode(host, port, **manager.connection_kwargs)
        before = manager.slots_cache
        await super().initialize()
        after = self.nodes_manager.slots_cache
        if before and after is not before:
            self._count_failovers(before, after)
        return self

    def _count_failovers(
        self, before: dict[int, list[ClusterNode]], after: dict[int, list[ClusterNode]]
    ) -> None:
        # A range of slots shares one list of nodes: each pair of lists is looked at once.
        promoted: dict[tuple[int, int], bool] = {}
        primaries = {node.name for node in self.get_primaries()}
        counts = self.followed or Failovers()
        found = False
        for slot, nodes in after.items():
            old = before.get(slot)
            if not old or not nodes:
                continue
            pair = (id(old), id(nodes))
            if pair not in promoted:
                primary, was = nodes[0].name, old[0].name
                promoted[pair] = primary != was and (
                    was not in primaries or any(replica.name == primary for replica in old[1:])
                )
            if promoted[pair]:
                counts.by_slot[slot] = counts.by_slot.get(slot, 0) + 1
                found = True
        if found:
            counts.total += 1
            self.followed = counts


class ClusterNodeBackend(_ChannelWake):
    """One primary of a Cluster, on a plain client to it (bench/writer.py `by_primary`): it
    takes only keys of its own slots."""


class ClusterBackend(_ChannelWake):
    """A Redis Cluster (`RedisCluster`): streams spread over its primaries by slot;
    `redis+cluster://[[user]:password@]host:port[,host:port...]`, the data role only."""

    schemes: ClassVar[tuple[str, ...]] = ("redis+cluster", "rediss+cluster")
    redis_py_url: ClassVar[bool] = False
    splits_by_slot: ClassVar[bool] = True

    @classmethod
    def parse(cls, url: str) -> RedisAddress:
        found = _host_list(url, _REDIS_PORT)
        if found.query:
            raise ValueError(f"unknown option(s) {sorted(found.query)} in {redact_url(url)!r}")
        if found.path and found.path != ["0"]:
            raise ValueError(f"a Redis Cluster has only database 0 (got {redact_url(url)!r})")
        return RedisAddress(
            cls.kind,
            url,
            hosts=found.hosts,
            username=found.username,
            password=found.password,
            ssl=found.ssl,
        )

    @classmethod
    def _client(cls, address: RedisAddress, retries: int, options: dict[str, Any]) -> Redis:
        """A `RedisCluster`, typed as the `Redis` it stands in for: it offers the same
        commands, and what differs is this backend's. Its nodes are reached directly (no
        pool lock to wait on), so `PromptPool` and its `options` do not apply, nor
        `max_connections`: a Cluster node past its limit fails the command at once rather
        than wait for a free connection (1,000 requests at once failed so), so each node
        gets as many connections as the process has commands in flight to it. Its ASK
        redirects (a slot migrating) hold: compat/redis_cluster.py; it counts the failovers
        it follows, slot by slot (`FailoverCountingCluster`)."""
        cluster = FailoverCountingCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in address.hosts],
            username=address.username,
            password=address.password,
            ssl=address.ssl,
            retry=retry_policy(min(retries, _NODE_RETRIES)),
            retry_on_error=[ConnectionError, TimeoutError, OSError],
            cluster_error_retry_attempts=_CLUSTER_ROUNDS if retries > _NODE_RETRIES else retries,
            # A MOVED answer (a slot that moved) updates that slot alone, never the whole
            # client: redis-py 5 resets every node's connections every 5th MOVED by default,
            # and a pipeline in flight meanwhile fails on the missing default node.
            reinitialize_steps=0,
            health_check_interval=30,
            socket_connect_timeout=5.0,
        )
        # Every node's connections, the startup nodes' and those found later.
        packed = pooled_connection(cluster.connection_kwargs["connection_class"])
        cluster.connection_kwargs["connection_class"] = packed
        for node in cluster.nodes_manager.startup_nodes.values():
            node.connection_class = packed
        cluster.nodes_manager.startup_nodes = _StartupNodes(cluster.nodes_manager.startup_nodes)
        cluster.seeds = address.hosts
        return cast(Redis, cluster)

    @classmethod
    def built(cls, client: Redis) -> bool:
        return isinstance(client, RedisCluster)

    @property
    def _cluster(self) -> RedisCluster:
        return cast(RedisCluster, self.client)

    def pipelines(self) -> Pipelines:
        """The client's own: a Cluster pipeline sends each node its share on that node's
        connections."""
        return _ClientPipelines(self.client)

    def failovers(self, stream_id: str | None = None) -> int:
        """The failovers of the shard holding `stream_id`'s slot the client followed (of
        any shard: None); a client built elsewhere follows none."""
        followed = getattr(self.client, "followed", None)
        if not isinstance(followed, Failovers):
            return 0
        if stream_id is None:
            return followed.total
        return followed.by_slot.get(key_slot(keys.events(stream_id).encode()), 0)

    def describe(self) -> str:
        nodes = self._cluster.nodes_manager.startup_nodes.values()
        return "redis+cluster://" + ",".join(f"{n.host}:{n.port}" for n in nodes)

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
    backend = next(backend for backend in _BACKENDS.values() if backend.built(client))
    return backend(client)


def holds_queue(kind: Kind) -> bool:
    """Whether arq's queue can live on Redis of that topology."""
    return not _BACKENDS[kind].queue_refused


def _probing(source: ConnectionPool) -> dict[str, Any]:
    """`source`'s connection options, less its retries and with short timeouts."""
    return {
        **source.connection_kwargs,
        "retry": None,
        "retry_on_error": [],
        "socket_connect_timeout": 1.0,
        "socket_timeout": 2.0,
    }


def _owning(pool: ConnectionPool) -> Redis:
    probe = Redis(connection_pool=pool)
    probe.auto_close_connection_pool = True  # its aclose() closes the pool
    return probe


# Every topology, by its kind; one server's last, since it takes any client (`built`).
_BACKENDS: dict[Kind, type[Backend]] = {
    backend.kind: backend for backend in (SentinelBackend, ClusterBackend, Backend)
}
_BY_SCHEME: dict[str, type[Backend]] = {
    scheme: backend for backend in _BACKENDS.values() for scheme in backend.schemes
}
