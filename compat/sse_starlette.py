"""sse-starlette (bounded in pyproject.toml), past its interface: a response's sends without
the per-send timeout scope when it has no timeout.

`EventSourceResponse._send_with_timeout(send, message)` carries every message of the
response, each in an anyio cancel scope for `send_timeout`, even when that is None (no
timeout): the scope alone cost about 4 µs a send, a tenth of the API's CPU per relayed frame
at 100 streams. `UntimedSends` sends straight through when there is no timeout (and as the
library does when there is one).

tests/compat/test_sse_starlette.py holds it.
"""

from __future__ import annotations

from sse_starlette import EventSourceResponse
from starlette.types import Message, Send

__all__ = ["UntimedSends"]


class UntimedSends(EventSourceResponse):
    """An `EventSourceResponse` whose sends open no cancel scope when `send_timeout` is None."""

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is not None:
            await super()._send_with_timeout(send, message)
            return
        await send(message)
