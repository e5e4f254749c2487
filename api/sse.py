"""SSE frames on the wire: many at once, encoded the way sse-starlette encodes them.

The streams' frames are sse-starlette `ServerSentEvent`s, sent by its `EventSourceResponse`
(which keeps the connection's disconnect and server-shutdown handling). What this module
changes is how many go out per write: the relay hands over every frame a reader holds at
once, and `encode` turns them into one bytes chunk, so one ASGI send (through every
middleware, to one socket write) carries them all. A frame whose fields hold no line break
(every JSON payload, every cursor) is one string concatenation here; anything else goes
through the library's own `ServerSentEvent.encode`. tests/api/test_sse.py holds the two to
the same bytes.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable
from contextlib import aclosing

from sse_starlette import ServerSentEvent

__all__ = ["encode", "encoded"]

_SEP = ServerSentEvent.DEFAULT_SEPARATOR


def _one_line(text: str | None) -> bool:
    return text is None or ("\n" not in text and "\r" not in text)


def _encode_one(event: ServerSentEvent) -> str:
    data = None if event.data is None else str(event.data)
    if (
        event.comment is not None
        or event.retry is not None
        or event._sep != _SEP
        or not (_one_line(event.id) and _one_line(event.event) and _one_line(data))
    ):
        return event.encode().decode("utf-8")
    text = ""
    if event.id is not None:
        text += "id: " + event.id + _SEP
    if event.event is not None:
        text += "event: " + event.event + _SEP
    if data is not None:
        text += "data: " + data + _SEP
    return text + _SEP


def encode(events: Iterable[ServerSentEvent]) -> bytes:
    """The frames as one chunk: the same bytes as each `ServerSentEvent.encode()` joined."""
    return "".join(_encode_one(event) for event in events).encode("utf-8")


async def encoded(
    batches: AsyncGenerator[list[ServerSentEvent], None],
) -> AsyncGenerator[bytes, None]:
    """Each batch as one chunk; closing this closes `batches` (its cleanup runs now)."""
    async with aclosing(batches):
        async for batch in batches:
            yield encode(batch)
