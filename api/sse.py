"""SSE frames on the wire: many at once, written the way sse-starlette encodes them.

The streams are sent by `FrameResponse`, sse-starlette's `EventSourceResponse` (which keeps
the connection's disconnect and server-shutdown handling), given the bytes to send. What
this module changes is what a frame costs on the way out:

- how it becomes bytes: a frame whose fields hold no line break (every JSON payload, every
  cursor) is one string concatenation (`text`), with no `ServerSentEvent` built for it;
  anything else goes through the library's own `ServerSentEvent.encode`;
- how many go out per write: api/session.py hands over every frame a reader holds at once
  as one bytes chunk, so one ASGI send (through every middleware, to one socket write)
  carries them all;
- what a send costs: the library wraps every send in a cancel scope for its per-send
  timeout, which Bernard does not set (a client that stops reading is a socket write that
  blocks one relay, and its disconnect ends it); with no timeout the scope only costs,
  about 4 µs a send, a tenth of the API's CPU per relayed frame at 100 streams
  (compat/sse_starlette.py sends without it).

tests/api/test_sse.py holds both to the library's own behaviour.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping

from sse_starlette import ServerSentEvent

from compat.sse_starlette import UntimedSends

__all__ = ["PING", "SSE_HEADERS", "FrameResponse", "text"]

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# The streams send their own keepalives (api/relay.py), so the library's pings are off:
# 0 spawns no ping task at all (sse-starlette >= 3.7; before it, 0 pinged without pause).
_NO_PING = 0

_SEP = ServerSentEvent.DEFAULT_SEPARATOR
# The comment a stream sends after a quiet while when its encoding has no keepalive frame.
PING = ": ping" + _SEP + _SEP


def _one_line(text: str | None) -> bool:
    return text is None or ("\n" not in text and "\r" not in text)


def text(data: str, event: str | None = None, frame_id: str | None = None) -> str:
    """One frame as text: the same as `ServerSentEvent(data, event, frame_id).encode()`."""
    if "\n" in data or "\r" in data or not (_one_line(frame_id) and _one_line(event)):
        return ServerSentEvent(data=data, event=event, id=frame_id).encode().decode("utf-8")
    if event is None:
        if frame_id is None:
            return "data: " + data + _SEP + _SEP
        return "id: " + frame_id + _SEP + "data: " + data + _SEP + _SEP
    head = "" if frame_id is None else "id: " + frame_id + _SEP
    return head + "event: " + event + _SEP + "data: " + data + _SEP + _SEP


class FrameResponse(UntimedSends):
    """An SSE response of byte chunks as they come (each one send), or of a few frames
    known now (one chunk), with Bernard's stream headers."""

    def __init__(
        self,
        chunks: AsyncGenerator[bytes, None] | bytes,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            _once(chunks) if isinstance(chunks, bytes) else chunks,
            headers={**SSE_HEADERS, **(headers or {})},
            ping=_NO_PING,
        )


async def _once(chunk: bytes) -> AsyncGenerator[bytes, None]:
    yield chunk
