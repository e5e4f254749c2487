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

What differs by topology (reading its URL, building its client) is its backend's
(shared/backends.py); `connect` and `connect_data` hand the URL to it. What is here serves
every topology: the pool, hiredis packing, the retries and their backoff.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, cast

import hiredis
from arq.connections import ArqRedis
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    ClusterDownError,
    ConnectionError,
    RedisClusterException,
    RedisError,
    TimeoutError,
)

from compat.redis import unfit
from shared.redaction import redact_url
from shared.settings import Settings

# The name the rest of the code imports from here; the one implementation is
# shared/redaction.py's, which knows every URL's credentials, not Redis's alone.
redact = redact_url

# About 30 s of retries with backoff capped at 1 s: long enough for a Redis restart, or for
# Sentinels to notice a dead primary and promote its replica.
RETRIES = 40

# What a Redis call can raise when Redis is down or unreachable. A Cluster client raises
# its own `RedisClusterException` (no `RedisError`) when no node answers or a slot has no
# primary (a shard failing over); loops that must outlive an outage catch all three.
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException, OSError)
# Of those, what a call raises once its client's own retries gave up on reaching the Redis
# that holds its keys (down, unreachable, failing over, a Cluster slot with no primary):
# the store lost, not an answer of Redis's. Trying again later may land.
STORE_LOST: tuple[type[Exception], ...] = (
    ConnectionError,
    TimeoutError,
    ClusterDownError,
    RedisClusterException,
)


# 50 ms doubling to 1 s: each client's retries, and every loop that waits for Redis to
# come back (`backoff_s`).
_BACKOFF = ExponentialBackoff(cap=1.0, base=0.05)


def reply_text(value: bytes | str) -> str:
    """A Redis reply's string as text: our clients answer bytes (no `decode_responses`),
    a RESP3 map's keys or a client that decodes give `str`."""
    return value.decode() if isinstance(value, bytes) else value


def backoff_s(failures: int) -> float:
    """How long a loop that has failed `failures` times in a row waits before it tries Redis
    again: as the clients' own retries wait."""
    return float(_BACKOFF.compute(failures))


def retry_policy(retries: int = RETRIES) -> Retry:
    """A client's retries: `retries` of them, waiting as `backoff_s` says."""
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


def pool_options(
    retries: int, max_connections: int, overrides: dict[str, object]
) -> dict[str, Any]:
    """The options of a client's pool (a `PromptPool`'s, of any topology): it retries
    connection errors with backoff (`retries` times) and waits for a free connection past
    `max_connections`; `overrides` win."""
    return {
        "max_connections": max_connections,
        "timeout": 30,
        "retry": retry_policy(retries),
        "retry_on_error": [ConnectionError, TimeoutError, OSError],
        "health_check_interval": 30,
        **overrides,
    }


def pooled_client(pool: ConnectionPool) -> ArqRedis:
    """arq's `ArqRedis` on `pool`, packing its commands with hiredis and owning the pool."""
    # After `from_url`, which picks the class for the URL's scheme (TLS, a Unix socket).
    pool.connection_class = hiredis_packing(pool.connection_class)
    client = ArqRedis(pool)
    client.auto_close_connection_pool = True  # the client owns its pool: aclose() closes it
    return client


def connect(
    url: str, *, retries: int = RETRIES, max_connections: int = 512, **kwargs: object
) -> ArqRedis:
    """A client for `url` (one server, or a primary behind Sentinels) that retries
    connection errors with backoff; `ValueError` for a URL of a topology arq cannot use
    (a Cluster: see `connect_data`).

    It is arq's `ArqRedis` (a redis-py client that can also enqueue jobs), so one client
    serves both, the arq worker's own included. The API passes few `retries`: a request
    should get its 503 quickly.

    The pool is a `PromptPool`, a `BlockingConnectionPool`: redis-py's default pool holds
    its lock while it checks a connection, so under load every command of the process
    queued behind the previous one (redis/redis-py#3692); this one checks outside the lock,
    without waiting for the loop, and waits for a free connection rather than failing past
    the limit. The URL's topology builds it (shared/backends.py `Backend.connect`).
    """
    from shared.backends import parse_url  # it builds on this module

    address = parse_url(url)
    if address.backend.queue_refused:
        raise ValueError(address.backend.queue_refused)
    client = address.backend.connect(
        address, retries=retries, max_connections=max_connections, **kwargs
    )
    return cast(ArqRedis, client)


def connect_data(url: str, *, retries: int = RETRIES, max_connections: int = 512) -> Redis:
    """A client for the data role: `connect`'s, or a client of any topology that holds
    data alone (a `RedisCluster`, typed as the `Redis` it stands in for), as the URL's
    topology builds it (shared/backends.py `Backend.connect`)."""
    from shared.backends import parse_url  # it builds on this module

    address = parse_url(url)
    return address.backend.connect(address, retries=retries, max_connections=max_connections)


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

    backend = backend_of(redis)
    where = backend.describe()
    probe = backend.probe()
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
        await probe.aclose()  # and its pool
