"""compat/sse_starlette.py: a response's sends without sse-starlette's
per-send cancel scope when it has no timeout (and with it when it has one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import contextmanager
from typing import Any

import pytest
import sse_starlette.sse
from starlette.types import Message

from compat.sse_starlette import UntimedSends


async def _chunks() -> AsyncGenerator[bytes, None]:
    for chunk in (b"data: a\r\n\r\n", b"data: b\r\n\r\n"):
        yield chunk


async def _run(response: UntimedSends) -> list[Message]:
    sent: list[Message] = []
    scope: dict[str, Any] = {"type": "http", "method": "GET", "path": "/", "headers": []}

    async def receive() -> Message:
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError

    async def send(message: Message) -> None:
        sent.append(message)

    async with asyncio.timeout(5):
        await response(scope, receive, send)
    return sent


class ScopeOpened(Exception):
    pass


@contextmanager
def _no_scope(*args: Any, **kwargs: Any) -> Any:
    raise ScopeOpened
    yield


async def test_without_a_timeout_every_body_goes_out_with_no_cancel_scope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sse_starlette.sse.anyio, "move_on_after", _no_scope)
    sent = await _run(UntimedSends(_chunks(), ping=0))
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body" and m["body"]]
    assert bodies == [b"data: a\r\n\r\n", b"data: b\r\n\r\n"]
    # With a timeout, the library's own send (its scope) carries them.
    with pytest.raises(ScopeOpened):
        await _run(UntimedSends(_chunks(), ping=0, send_timeout=5))
