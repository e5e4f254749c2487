"""api/sse.py writes frames exactly as sse-starlette's `ServerSentEvent.encode` does, and
its response sends what the library's `EventSourceResponse` sends."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import httpx
import pytest
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from api.sse import PING, SSE_HEADERS, FrameResponse, text

# (data, event, id): what `text` writes, each as the library would.
FIELDS = [
    ('{"choices":[{"delta":{"content":"hi"}}]}', None, "1700000000000-0"),
    ("[DONE]", None, None),
    ("[DONE]", None, "1-2:1"),
    ('{"text":"a"}', "text_delta", "5-0"),
    ('{"text":"a"}', "text_delta", None),
    ("", None, "1-0"),
    ('{"content":"é😀 ünïcode"}', None, None),
    ("two\nlines", None, None),
    ("cr\rand\r\ncrlf", "named", "1-0"),
    ("x", None, "bad\nid"),
    ("x", "multi\nline", None),
    ("x", "bad\rname", "1-0"),
]
FRAMES = [ServerSentEvent(data=data, event=event, id=id_) for data, event, id_ in FIELDS]


@pytest.mark.parametrize(("data", "event", "frame_id"), FIELDS, ids=lambda f: repr(f)[:30])
def test_one_frame_is_the_librarys_bytes(
    data: str, event: str | None, frame_id: str | None
) -> None:
    library = ServerSentEvent(data=data, event=event, id=frame_id).encode()
    assert text(data, event, frame_id).encode() == library


def test_the_ping_is_the_librarys_comment() -> None:
    assert PING.encode() == ServerSentEvent(comment="ping").encode() == b": ping\r\n\r\n"


async def _served(response: Response) -> tuple[int, dict[str, str], bytes]:
    app = Starlette(routes=[Route("/", lambda _request: response)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        reply = await c.get("/")
    return reply.status_code, dict(reply.headers), reply.content


def _chunk(frames: list[ServerSentEvent]) -> bytes:
    return b"".join(frame.encode() for frame in frames)


async def _chunks() -> AsyncGenerator[bytes, None]:
    yield _chunk(FRAMES[:3])
    yield b""
    yield _chunk(FRAMES[3:])


@pytest.mark.parametrize(
    "frames", [_chunks, lambda: _chunk(FRAMES)], ids=["chunks as they come", "frames known now"]
)
async def test_a_frame_response_is_what_the_librarys_response_sends(frames: Any) -> None:
    """Status, headers and bytes: FrameResponse only sends them in fewer, cheaper sends."""
    headers = {"X-Bernard-Turn-Id": "t1"}
    ours = await _served(FrameResponse(frames(), headers=headers))
    library = await _served(
        EventSourceResponse(iter(FRAMES), headers={**SSE_HEADERS, **headers}, ping=3600)
    )
    assert ours == library
    assert ours[1]["x-bernard-turn-id"] == "t1"
    assert ours[1]["cache-control"] == "no-cache"
