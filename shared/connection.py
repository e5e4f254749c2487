"""Redis clients that ride out a Redis restart instead of dying on the first error."""

from __future__ import annotations

import asyncio
import logging
import time

from arq.connections import ArqRedis
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, RedisError, TimeoutError

# About 30 s of retries with backoff capped at 1 s: long enough for a Redis restart.
_RETRIES = 40


def _retry(retries: int = _RETRIES) -> Retry:
    return Retry(ExponentialBackoff(cap=1.0, base=0.05), retries)


class PromptPool(BlockingConnectionPool):
    """redis-py's `BlockingConnectionPool`, minus an event-loop iteration per command.

    Before handing out a connection, redis-py 5 makes sure nothing is left to read on it
    with a zero-timeout read, which suspends the caller until the loop's next iteration:
    on a busy worker every command then waited behind everything else ready to run (the
    p99 of an XADD at 100 streams was 14 ms). redis-py 7 replaced that read (#4063); arq
    pins redis < 6. This pool looks at what the connection has already received instead:
    leftover bytes or the server's EOF mean it is not fit to reuse, so it reconnects. A
    connection that dies unnoticed fails its command, which the client's retry policy
    sends again on a fresh one.
    """

    async def ensure_connection(self, connection: AbstractConnection) -> None:
        await connection.connect()
        if _unfit(connection):
            await connection.disconnect()
            await connection.connect()


def _unfit(connection: AbstractConnection) -> bool:
    # `_reader` is the connection's asyncio.StreamReader; `_buffer` holds what arrived
    # and nobody read (the same check redis-py 7 makes).
    reader = getattr(connection, "_reader", None)
    if reader is None:
        return False
    return bool(reader.at_eof() or getattr(reader, "_buffer", b""))


def connect(
    url: str, *, retries: int = _RETRIES, max_connections: int = 512, **kwargs: object
) -> ArqRedis:
    """A client for `url` that retries connection errors with backoff.

    It is arq's `ArqRedis` (a redis-py client that can also enqueue jobs), so one client
    serves both, the arq worker's own included. The API passes few `retries`: a request
    should get its 503 quickly.

    The pool is a `PromptPool`, a `BlockingConnectionPool`: redis-py's default pool holds
    its lock while it checks a connection, so under load every command of the process
    queued behind the previous one (redis/redis-py#3692); this one checks outside the lock,
    without waiting for the loop, and waits for a free connection rather than failing past
    the limit.
    """
    pool = PromptPool.from_url(
        url,
        max_connections=max_connections,
        timeout=30,
        retry=_retry(retries),
        retry_on_error=[ConnectionError, TimeoutError, OSError],
        health_check_interval=30,
        **kwargs,
    )
    client = ArqRedis(pool)
    client.auto_close_connection_pool = True  # the client owns its pool: aclose() closes it
    return client


def describe(redis: Redis) -> str:
    """Where `redis` connects, for people to read (never the password)."""
    kwargs = redis.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    host, port, db = kwargs.get("host", "localhost"), kwargs.get("port", 6379), kwargs.get("db", 0)
    return f"redis://{host}:{port}/{db}"


async def wait_until_reachable(
    redis: Redis, logger: logging.Logger, *, every_s: float = 1.0, remind_s: float = 30.0
) -> None:
    """Return once the server behind `redis` answers PING; until then say so at once, then
    every `remind_s`, and keep trying every `every_s`.

    A client from `connect` retries each command for some 30 s without a word; a process
    starting against a Redis that is down should say what it waits for from the start.
    """
    kwargs = {
        **redis.connection_pool.connection_kwargs,
        "retry": None,
        "retry_on_error": [],
        "socket_connect_timeout": 1.0,
        "socket_timeout": 2.0,
    }
    pool = ConnectionPool(connection_class=redis.connection_pool.connection_class, **kwargs)
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
                        describe(redis),
                        exc,
                        every_s,
                    )
                elif now - reminded >= remind_s:
                    reminded = now
                    logger.error(
                        "still waiting for Redis at %s (%.0f s so far): %s",
                        describe(redis),
                        now - waited_since,
                        exc,
                    )
                await asyncio.sleep(every_s)
                continue
            if waited_since is not None:
                logger.info("Redis at %s answers; starting", describe(redis))
            return
    finally:
        await probe.aclose()
        await pool.disconnect()
