"""redis-py (5.x, bounded in pyproject.toml), past its interface: whether a pooled asyncio
connection is fit to reuse, told from what it already received.

Before handing out a connection, redis-py 5's pool makes sure nothing is left to read on it
with a zero-timeout read, which suspends the caller until the loop's next iteration; on a
busy worker every command then waited behind everything else ready to run (the p99 of an
XADD at 100 streams was 14 ms). redis-py 7 replaced that read with a look at the
connection's reader (#4063), but arq pins redis < 6. `unfit` makes redis-py 7's check on
redis-py 5: the connection's `_reader` (its `asyncio.StreamReader`, None before it
connects) has seen the server's EOF, or holds bytes nobody read. shared/redis_pool.py's
`PromptPool` uses it; tests/compat/test_redis.py holds it.
"""

from __future__ import annotations

from redis.asyncio.connection import AbstractConnection

from compat.asyncio_streams import has_unread

__all__ = ["unfit"]


def unfit(connection: AbstractConnection) -> bool:
    """Whether `connection` (connected or not) must not be reused as it is: what it
    received ended or was left unread."""
    reader = connection._reader
    if reader is None:
        return False
    return reader.at_eof() or has_unread(reader)
