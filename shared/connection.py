"""Redis clients that ride out a Redis restart or a failover instead of dying on the first
error, for either role (shared/keys.py) and any of the three ways Redis is deployed:

- `redis://`, `rediss://`, `unix://`: one server, as redis-py reads the URL.
- `redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]`: the primary
  that the Sentinels at those addresses name for `service` (port 26379 when left out);
  `?sentinel_password=...` when the Sentinels want one of their own. `rediss+sentinel://`
  speaks TLS to the primary.
- `redis+cluster://[[user]:password@]host:port[,host:port...]`: a Redis Cluster reached
  through any of those nodes (port 6379 when left out); the data role only (`connect_data`).
  `rediss+cluster://` speaks TLS.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis
from arq.connections import ArqRedis
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection, SSLConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError, RedisClusterException, RedisError, TimeoutError

from compat.redis import unfit
from shared.redaction import redact_url
from shared.settings import Settings

# The name the rest of the code imports from here; the one implementation is
# shared/redaction.py's, which knows every URL's credentials, not Redis's alone.
redact = redact_url

# About 30 s of retries with backoff capped at 1 s: long enough for a Redis restart, or for
# Sentinels to notice a dead primary and promote its replica.
_RETRIES = 40
# A Cluster client retries a failed node briefly, then asks the cluster where the slot went
# (each round re-reads the topology), for about as long: a shard's failover takes the
# cluster's node timeout and an election.
_NODE_RETRIES = 3
_CLUSTER_ROUNDS = 20
_SENTINEL_PORT = 26379
_REDIS_PORT = 6379

Kind = Literal["single", "sentinel", "cluster"]

# What a Redis call can raise when Redis is down or unreachable. A Cluster client raises
# its own `RedisClusterException` (no `RedisError`) when no node answers or a slot has no
# primary (a shard failing over); loops that must outlive an outage catch all three.
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException, OSError)


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


def parse_url(url: str) -> RedisAddress:
    """Read a Redis URL of any of the forms above; `ValueError` for one it cannot use."""
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ValueError(f"not a Redis URL: {redact_url(url)!r}")
    if scheme not in ("redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster"):
        return RedisAddress("single", url)
    kind: Kind = "cluster" if scheme.endswith("+cluster") else "sentinel"
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    hosts = tuple(
        _host_port(item, _SENTINEL_PORT if kind == "sentinel" else _REDIS_PORT, url)
        for item in hostlist.split(",")
    )
    query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    unknown = set(query) - {"sentinel_password"}
    if unknown or (kind == "cluster" and query):
        raise ValueError(f"unknown option(s) {sorted(query)} in {redact_url(url)!r}")
    path = [piece for piece in parts.path.split("/") if piece]
    service, db = None, 0
    if kind == "sentinel":
        if not path or len(path) > 2:
            raise ValueError(
                f"name the Sentinel service: redis+sentinel://host:port/service "
                f"(got {redact_url(url)!r})"
            )
        service = unquote(path[0])
        db = _database(path[1], url) if len(path) == 2 else 0
    elif path and path != ["0"]:
        raise ValueError(f"a Redis Cluster has only database 0 (got {redact_url(url)!r})")
    return RedisAddress(
        kind,
        url,
        hosts=hosts,
        service=service,
        db=db,
        username=username,
        password=password,
        ssl=scheme.startswith("rediss"),
        sentinel_password=query.get("sentinel_password"),
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


# 50 ms doubling to 1 s: each client's retries, and every loop that waits for Redis to
# come back (`backoff_s`).
_BACKOFF = ExponentialBackoff(cap=1.0, base=0.05)


def backoff_s(failures: int) -> float:
    """How long a loop that has failed `failures` times in a row waits before it tries Redis
    again: as the clients' own retries wait."""
    return float(_BACKOFF.compute(failures))


def _retry(retries: int = _RETRIES) -> Retry:
    return Retry(_BACKOFF, retries)


class PromptPool(BlockingConnectionPool):
    """redis-py's `BlockingConnectionPool`, minus an event-loop iteration per command.

    Before handing out a connection, redis-py 5 makes sure nothing is left to read on it
    with a zero-timeout read, which suspends the caller until the loop's next iteration:
    on a busy worker every command then waited behind everything else ready to run (the
    p99 of an XADD at 100 streams was 14 ms). redis-py 7 replaced that read (#4063); arq
    pins redis < 6. This pool looks at what the connection has already received instead
    (compat/redis.py): leftover bytes or the server's EOF mean it is not fit to reuse, so
    it reconnects. A connection that dies unnoticed fails its command, which the client's
    retry policy sends again on a fresh one.
    """

    async def ensure_connection(self, connection: AbstractConnection) -> None:
        await connection.connect()
        if unfit(connection):
            await connection.disconnect()
            await connection.connect()


class HiredisPacking:
    """A redis-py asyncio connection that packs commands with hiredis's C packer.

    redis-py 5's asyncio connection packs every command in Python (its sync one already
    uses hiredis): 4.4 µs for a turn's `XADD`, 9.4 µs for the `EVAL` that creates a turn,
    against 0.6 and 1.4 µs here (measured alone on this box; about 40 commands a turn
    between the API and the worker, and one `XADD` per streamed token). Arguments hiredis
    does not take (a bool, None) go through redis-py's packer, which refuses them with its
    own `DataError`. tests/shared/test_redis_packing.py holds the bytes to redis-py's.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        # As redis-py does: a command name with a space holds several words ("CONFIG GET").
        head = args[0]
        if isinstance(head, str):
            args = (*head.encode().split(), *args[1:])
        elif b" " in head:
            args = (*head.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:
            return cast(list[bytes], super().pack_command(*args))  # type: ignore[misc]


def hiredis_packing(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """`connection_class` packing its commands with hiredis (`HiredisPacking`)."""
    if issubclass(connection_class, HiredisPacking):
        return connection_class
    packed = _PACKED.get(connection_class)
    if packed is None:
        name = f"Hiredis{connection_class.__name__}"
        packed = type(name, (HiredisPacking, connection_class), {})
        _PACKED[connection_class] = packed
    return packed


_PACKED: dict[type[AbstractConnection], type[AbstractConnection]] = {}


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


def connect(
    url: str, *, retries: int = _RETRIES, max_connections: int = 512, **kwargs: object
) -> ArqRedis:
    """A client for `url` (one server, or a primary behind Sentinels) that retries
    connection errors with backoff; `ValueError` for a Cluster URL (see `connect_data`).

    It is arq's `ArqRedis` (a redis-py client that can also enqueue jobs), so one client
    serves both, the arq worker's own included. The API passes few `retries`: a request
    should get its 503 quickly.

    The pool is a `PromptPool`, a `BlockingConnectionPool`: redis-py's default pool holds
    its lock while it checks a connection, so under load every command of the process
    queued behind the previous one (redis/redis-py#3692); this one checks outside the lock,
    without waiting for the loop, and waits for a free connection rather than failing past
    the limit. Behind Sentinels it is a `PromptSentinelPool`: a connection lost to a dead
    primary reconnects to the one the Sentinels promote.
    """
    address = parse_url(url)
    if address.kind == "cluster":
        raise ValueError(
            "arq (the queue role) cannot use a Redis Cluster: BERNARD_QUEUE_REDIS_URL must "
            "name one primary (redis:// or redis+sentinel://)"
        )
    options: dict[str, Any] = {
        "max_connections": max_connections,
        "timeout": 30,
        "retry": _retry(retries),
        "retry_on_error": [ConnectionError, TimeoutError, OSError],
        "health_check_interval": 30,
        **kwargs,
    }
    pool: ConnectionPool
    if address.kind == "sentinel":
        pool = _sentinel_pool(address, options)
    else:
        pool = PromptPool.from_url(url, **options)
    # After `from_url`, which picks the class for the URL's scheme (TLS, a Unix socket).
    pool.connection_class = hiredis_packing(pool.connection_class)
    client = ArqRedis(pool)
    client.auto_close_connection_pool = True  # the client owns its pool: aclose() closes it
    return client


def _sentinel_pool(address: RedisAddress, options: dict[str, Any]) -> PromptSentinelPool:
    assert address.service is not None
    sentinel_kwargs: dict[str, Any] = {"socket_connect_timeout": 1.0, "socket_timeout": 2.0}
    if address.sentinel_password:
        sentinel_kwargs["password"] = address.sentinel_password
    if address.ssl:
        sentinel_kwargs["ssl"] = True
    sentinel = Sentinel(list(address.hosts), sentinel_kwargs=sentinel_kwargs)
    options["connection_class"] = (
        PromptSentinelSSLConnection if address.ssl else PromptSentinelConnection
    )
    return PromptSentinelPool(
        address.service,
        sentinel,
        is_master=True,
        db=address.db,
        username=address.username,
        password=address.password,
        **options,
    )


def connect_data(url: str, *, retries: int = _RETRIES, max_connections: int = 512) -> Redis:
    """A client for the data role: `connect`'s, or a `RedisCluster` for a Cluster URL.

    A `RedisCluster` is typed as the `Redis` it stands in for: it offers the same commands,
    and what differs is its backend's (shared/backends.py). Its nodes are
    reached directly (no pool lock to wait on), so `PromptPool` does not apply, and
    `max_connections` neither: a Cluster node past its limit fails the command at once
    rather than wait for a free connection (1,000 requests at once failed so), so each node
    gets as many connections as the process has commands in flight to it.
    """
    address = parse_url(url)
    if address.kind != "cluster":
        return connect(url, retries=retries, max_connections=max_connections)
    cluster = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in address.hosts],
        username=address.username,
        password=address.password,
        ssl=address.ssl,
        retry=_retry(min(retries, _NODE_RETRIES)),
        retry_on_error=[ConnectionError, TimeoutError, OSError],
        cluster_error_retry_attempts=_CLUSTER_ROUNDS if retries > _NODE_RETRIES else retries,
        # A MOVED answer (a slot that moved) updates that slot alone, never the whole client:
        # redis-py 5 resets every node's connections every 5th MOVED by default, and a
        # pipeline in flight meanwhile fails on the missing default node.
        reinitialize_steps=0,
        health_check_interval=30,
        socket_connect_timeout=5.0,
    )
    # Every node's connections, the startup nodes' and those found later.
    packed = hiredis_packing(cluster.connection_kwargs["connection_class"])
    cluster.connection_kwargs["connection_class"] = packed
    for node in cluster.nodes_manager.startup_nodes.values():
        node.connection_class = packed
    return cast(Redis, cluster)


def queue_client(settings: Settings, data: Redis, own: Callable[[], ArqRedis]) -> ArqRedis:
    """The queue role's client (shared/keys.py): the data client `data` when one Redis holds
    both roles (so the two halves of a move share a pipeline), else the one `own` gives
    (the caller closes it apart from `data`). `data` is then `connect`'s, never a Cluster
    client: `Settings` refuses a Cluster for the queue role."""
    if settings.queue_url == settings.redis_url:
        return cast(ArqRedis, data)
    return own()


async def wait_until_reachable(
    redis: Redis, logger: logging.Logger, *, every_s: float = 1.0, remind_s: float = 30.0
) -> None:
    """Return once the server behind `redis` answers PING; until then say so at once, then
    every `remind_s`, and keep trying every `every_s`.

    A client from `connect` retries each command for some 30 s without a word; a process
    starting against a Redis that is down should say what it waits for from the start.
    """
    from shared.backends import backend_of  # it builds on this module

    where = backend_of(redis).describe()
    source = redis.connection_pool
    kwargs = {
        **source.connection_kwargs,
        "retry": None,
        "retry_on_error": [],
        "socket_connect_timeout": 1.0,
        "socket_timeout": 2.0,
    }
    pool: ConnectionPool
    if isinstance(source, SentinelConnectionPool):
        kwargs.pop("connection_pool", None)  # each Sentinel pool sets its own
        pool = SentinelConnectionPool(
            source.service_name,
            source.sentinel_manager,
            connection_class=source.connection_class,
            **kwargs,
        )
    else:
        pool = ConnectionPool(connection_class=source.connection_class, **kwargs)
    probe = Redis(connection_pool=pool)
    waited_since: float | None = None
    reminded = 0.0
    try:
        while True:
            try:
                await probe.ping()
            except (RedisError, OSError) as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # redis-py reports a cancel during a read as a lost connection.
                    raise asyncio.CancelledError from exc
                now = time.monotonic()
                if waited_since is None:
                    waited_since = reminded = now
                    logger.error(
                        "Redis at %s does not answer (%s); retrying every %g s",
                        where,
                        exc,
                        every_s,
                    )
                elif now - reminded >= remind_s:
                    reminded = now
                    logger.error(
                        "still waiting for Redis at %s (%.0f s so far): %s",
                        where,
                        now - waited_since,
                        exc,
                    )
                await asyncio.sleep(every_s)
                continue
            if waited_since is not None:
                logger.info("Redis at %s answers; starting", where)
            return
    finally:
        await probe.aclose()
        await pool.disconnect()
