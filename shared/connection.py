"""Redis clients that ride out a Redis restart instead of dying on the first error."""

from __future__ import annotations

from arq.connections import ArqRedis
from redis.asyncio import BlockingConnectionPool
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

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
