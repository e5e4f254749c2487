"""compat/asyncio_streams.py: a `StreamReader`'s unread bytes, as asyncio keeps them."""

from __future__ import annotations

import asyncio

from compat.asyncio_streams import has_unread


async def test_bytes_fed_and_not_read_are_unread_until_read() -> None:
    reader = asyncio.StreamReader()
    assert has_unread(reader) is False
    reader.feed_data(b"+PONG\r\n")
    assert has_unread(reader) is True
    assert await reader.readexactly(7) == b"+PONG\r\n"
    assert has_unread(reader) is False
