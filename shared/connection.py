"""Redis clients that ride out a Redis restart instead of dying on the first error."""

from __future__ import annotations

from arq.connections import ArqRedis, RedisSettings
from redis.asyncio import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

# About 30 s of retries with backoff capped at 1 s: long enough for a Redis restart.
_RETRIES = 40


def _retry(retries: int = _RETRIES) -> Retry:
    return Retry(ExponentialBackoff(cap=1.0, base=0.05), retries)


def connect(
    url: str, *, retries: int = _RETRIES, max_connections: int = 512, **kwargs: object
) -> ArqRedis:
    """A client for `url` that retries connection errors with backoff.

    It is arq's `ArqRedis` (a redis-py client that can also enqueue jobs), so one client
    serves both. The API passes few `retries`: a request should get its 503 quickly.

    The pool is redis-py's `BlockingConnectionPool`: the default pool holds its lock while it
    checks a connection, which takes an event-loop iteration, so under load every command
    of the process queued behind the previous one (redis/redis-py#3692). This one checks
    outside the lock, and waits for a free connection rather than failing past the limit.
    """
    pool = BlockingConnectionPool.from_url(
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


def arq_settings(url: str) -> RedisSettings:
    """arq's connection settings for `url`, with the same retry policy (arq #435, #498)."""
    settings = RedisSettings.from_dsn(url)
    settings.retry = _retry()
    settings.retry_on_error = [ConnectionError, TimeoutError, OSError]
    settings.conn_retries = _RETRIES
    settings.conn_retry_delay = 1
    return settings
