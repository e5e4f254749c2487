"""asyncio's `StreamReader`, past its interface: whether bytes arrived that nobody read.

`StreamReader` has no public way to ask that without reading; `_buffer` (a `bytearray`) is
where it keeps them. shared/redis_pool.py's pool asks it of a Redis connection before
reusing it (compat/redis.py), instead of redis-py 5's zero-timeout read, which cost every
command a loop iteration. tests/compat/test_asyncio_streams.py holds it.
"""

from __future__ import annotations

import asyncio

__all__ = ["has_unread"]


def has_unread(reader: asyncio.StreamReader) -> bool:
    """Whether `reader` holds bytes that arrived and were not read yet."""
    buffer: bytearray = reader._buffer  # type: ignore[attr-defined]
    return bool(buffer)
