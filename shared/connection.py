"""Redis clients that ride out a Redis restart instead of dying on the first error."""

from __future__ import annotations

from arq.connections import ArqRedis, RedisSettings
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

# About 30 s of retries with backoff capped at 1 s: long enough for a Redis restart.
_RETRIES = 40


def _retry(retries: int = _RETRIES) -> Retry:
    return Retry(ExponentialBackoff(cap=1.0, base=0.05), retries)


def connect(url: str, *, retries: int = _RETRIES, **kwargs: object) -> ArqRedis:
    """A client for `url` that retries connection errors with backoff.

    It is arq's `ArqRedis` (a redis-py client that can also enqueue jobs), so one client
    serves both. The API passes few `retries`: a request should get its 503 quickly.
    """
    return ArqRedis.from_url(
        url,
        retry=_retry(retries),
        retry_on_error=[ConnectionError, TimeoutError, OSError],
        health_check_interval=30,
        **kwargs,  # type: ignore[arg-type]
    )


def arq_settings(url: str) -> RedisSettings:
    """arq's connection settings for `url`, with the same retry policy (arq #435, #498)."""
    settings = RedisSettings.from_dsn(url)
    settings.retry = _retry()
    settings.retry_on_error = [ConnectionError, TimeoutError, OSError]
    settings.conn_retries = _RETRIES
    settings.conn_retry_delay = 1
    return settings
