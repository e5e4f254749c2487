"""SSE frames on the wire: many at once, encoded the way sse-starlette encodes them.

The streams' frames are sse-starlette `ServerSentEvent`s, sent by `FrameResponse`, its
`EventSourceResponse` (which keeps the connection's disconnect and server-shutdown
handling). What this module changes is what a frame costs on the way out:

- how many go out per write: the relay hands over every frame a reader holds at once, and
  `encode` turns them into one bytes chunk, so one ASGI send (through every middleware, to
  one socket write) carries them all. A frame whose fields hold no line break (every JSON
  payload, every cursor) is one string concatenation here; anything else goes through the
  library's own `ServerSentEvent.encode`;
- what a send costs: the library wraps every send in a cancel scope for its per-send
  timeout, which Bernard does not set (a client that stops reading is a socket write that
  blocks one relay, and its disconnect ends it); with no timeout the scope only costs,
  about 4 µs a send, a tenth of the API's CPU per relayed frame at 100 streams
  (compat/sse_starlette.py sends without it).

tests/api/test_sse.py holds both to the library's own behaviour.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping
from contextlib import aclosing

from sse_starlette import ServerSentEvent

from compat.sse_starlette import UntimedSends, separator

__all__ = ["SSE_HEADERS", "FrameResponse", "encode", "encoded"]

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# The streams send their own keepalives (api/relay.py), so the library's pings are off:
# 0 spawns no ping task at all (sse-starlette >= 3.7; before it, 0 pinged without pause).
_NO_PING = 0

_SEP = ServerSentEvent.DEFAULT_SEPARATOR


def _one_line(text: str | None) -> bool:
    return text is None or ("\n" not in text and "\r" not in text)


def _encode_one(event: ServerSentEvent) -> str:
    data = None if event.data is None else str(event.data)
    if (
        event.comment is not None
        or event.retry is not None
        or separator(event) != _SEP
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


class FrameResponse(UntimedSends):
    """An SSE response of frame batches (each one chunk: `encoded`), or of a few frames
    known now (one chunk), with Bernard's stream headers."""

    def __init__(
        self,
        frames: AsyncGenerator[list[ServerSentEvent], None] | list[ServerSentEvent],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            encoded(frames) if isinstance(frames, AsyncGenerator) else _once(encode(frames)),
            headers={**SSE_HEADERS, **(headers or {})},
            ping=_NO_PING,
        )


async def _once(chunk: bytes) -> AsyncGenerator[bytes, None]:
    yield chunk
