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

from api.sse import SSE_HEADERS, FrameResponse, encode, encoded

FRAMES = [
    ServerSentEvent(data='{"choices":[{"delta":{"content":"hi"}}]}', id="1700000000000-0"),
    ServerSentEvent(data="[DONE]"),
    ServerSentEvent(data="[DONE]", id="1-2:1"),
    ServerSentEvent(data='{"text":"a"}', event="text_delta", id="5-0"),
    ServerSentEvent(data="", id="1-0"),
    ServerSentEvent(data='{"content":"é😀 ünïcode"}'),
    ServerSentEvent(comment="ping"),
    ServerSentEvent(data="two\nlines"),
    ServerSentEvent(data="cr\rand\r\ncrlf"),
    ServerSentEvent(data="x", id="bad\nid"),
    ServerSentEvent(data="x", event="multi\nline"),
    ServerSentEvent(data="x", retry=3000),
    ServerSentEvent(data=42),
    ServerSentEvent(event="named only"),
    ServerSentEvent(),
    ServerSentEvent(data="x", sep="\n"),
]


@pytest.mark.parametrize("frame", FRAMES, ids=lambda f: repr(f.encode())[:40])
def test_one_frame_is_the_librarys_bytes(frame: ServerSentEvent) -> None:
    assert encode([frame]) == frame.encode()


def test_a_batch_is_its_frames_one_after_another() -> None:
    assert encode(FRAMES) == b"".join(frame.encode() for frame in FRAMES)
    assert encode([]) == b""


async def test_closing_the_chunks_closes_the_batches_at_once() -> None:
    closed = []

    async def batches():  # type: ignore[no-untyped-def]
        try:
            yield [ServerSentEvent(data="a")]
            yield [ServerSentEvent(data="b"), ServerSentEvent(data="c")]
        finally:
            closed.append(True)

    chunks = encoded(batches())
    assert await anext(chunks) == b"data: a\r\n\r\n"
    await chunks.aclose()
    assert closed == [True]


async def _served(response: Response) -> tuple[int, dict[str, str], bytes]:
    app = Starlette(routes=[Route("/", lambda _request: response)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        reply = await c.get("/")
    return reply.status_code, dict(reply.headers), reply.content


async def _batches() -> AsyncGenerator[list[ServerSentEvent], None]:
    yield FRAMES[:3]
    yield []
    yield FRAMES[3:]


@pytest.mark.parametrize(
    "frames", [_batches, lambda: list(FRAMES)], ids=["batches as they come", "frames known now"]
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
