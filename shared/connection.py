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
every topology: what a Redis call raises when Redis is lost; the pool, hiredis packing and
the retries are shared/redis_pool.py's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from arq.connections import ArqRedis
from redis.asyncio import Redis
from redis.exceptions import (
    ClusterDownError,
    ConnectionError,
    RedisClusterException,
    RedisError,
    TimeoutError,
)

from shared.backends import backend_of, parse_url
from shared.redaction import redact_url
from shared.redis_pool import RETRIES

if TYPE_CHECKING:
    from shared.settings import Settings

# The name the rest of the code imports from here; the one implementation is
# shared/redaction.py's, which knows every URL's credentials, not Redis's alone.
redact = redact_url

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


def reply_text(value: bytes | str) -> str:
    """A Redis reply's string as text: our clients answer bytes (no `decode_responses`),
    a RESP3 map's keys or a client that decodes give `str`."""
    return value.decode() if isinstance(value, bytes) else str(value)


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
