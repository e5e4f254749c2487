"""A stdio MCP server's stdout, read a line at a time, each line at most `max_bytes`
(`BERNARD_MCP_RESPONSE_MAX_BYTES`).

The SDK's stdio client reads each line whole, however long, copying it again for each 64 KiB
that comes (compat/mcp_stdio.py has the figures); `BoundedLines` is what it reads through
instead. It finds the line ends in each chunk as it comes and joins a line's pieces once, so
reading a line costs its length; and it hands the client whole lines only.

A line longer than `max_bytes` is not kept: only its first and last `EDGE_BYTES` are, while
the rest is read and dropped. When they show it is the answer to one call (a `result` or
`error` first among the keys other than `jsonrpc` and `id`, and the `id` before it, as the
Python SDK writes an answer, or at the end of the line, as the TypeScript SDK does), the
client reads in its place an error answer to that call: that call fails, saying why, and the
session goes on. Any other line (a request or notification, or a line whose id cannot be
found) is dropped with a warning; a call it answered fails at its timeout.
"""

from __future__ import annotations

import json
import logging
import re

import anyio
from anyio.abc import ByteReceiveStream
from mcp.types import PARSE_ERROR

__all__ = ["EDGE_BYTES", "BoundedLines", "too_long"]

logger = logging.getLogger("bernard.worker.mcp")

# The bytes kept of each end of a line over the bound: where its id is.
EDGE_BYTES = 512
# A JSON scalar short enough to be an id or the protocol's version.
_SCALAR = rb'(?:-?\d{1,30}|"(?:[^"\\]|\\.){0,256}"|true|false|null)'
_MEMBER = rb'\s*"(?:jsonrpc|id)"\s*:\s*' + _SCALAR + rb"\s*"
_ID = re.compile(rb'"id"\s*:\s*(' + _SCALAR + rb")")
# The start of a line: `{`, its `jsonrpc` and `id` members, and the name of the next key.
_HEAD = re.compile(rb"\A\s*\{((?:" + _MEMBER + rb",)*)\s*\"([A-Za-z]{1,16})\"\s*:")
# The end of a line: its last members, when they are `jsonrpc` and `id`, and the closing `}`.
_TAIL = re.compile(rb"((?:," + _MEMBER + rb")+)\}\s*\Z")


def too_long(max_bytes: int) -> str:
    """Why an answer was not read."""
    return (
        f"the answer is longer than {max_bytes} bytes, the most Bernard reads of one "
        "(BERNARD_MCP_RESPONSE_MAX_BYTES)"
    )


class BoundedLines:
    """The text of a server's stdout in chunks of whole lines, each line at most `max_bytes`
    (see the module docstring); `server` names it in a warning."""

    def __init__(
        self,
        pipe: ByteReceiveStream,
        max_bytes: int,
        *,
        server: str,
        encoding: str = "utf-8",
        errors: str = "strict",
    ) -> None:
        self._pipe = pipe
        self._max = max_bytes
        self._server = server
        self._encoding = encoding
        self._errors = errors
        self._parts: list[bytes] = []  # the line so far, while within the bound
        self._size = 0
        # Over the bound: its first and last bytes, its size so far.
        self._over: tuple[bytes, bytes] | None = None

    def __aiter__(self) -> BoundedLines:
        return self

    async def __anext__(self) -> str:
        while True:
            try:
                chunk = await self._pipe.receive()
            except anyio.EndOfStream:
                raise StopAsyncIteration from None
            lines = self.feed(chunk)
            if lines:
                return b"".join(line + b"\n" for line in lines).decode(self._encoding, self._errors)

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines `chunk` ends (without their newlines), in order."""
        ended: list[bytes] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            self._add(chunk[start:] if end < 0 else chunk[start:end])
            if end < 0:
                return ended
            line = self._take()
            if line is not None:
                ended.append(line)
            start = end + 1

    def _add(self, piece: bytes) -> None:
        if not piece:
            return
        self._size += len(piece)
        if self._over is not None:
            head, tail = self._over
            self._over = head, (tail + piece[-EDGE_BYTES:])[-EDGE_BYTES:]
        elif self._size > self._max:
            self._parts.append(piece)
            self._over = _first(self._parts, EDGE_BYTES), _last(self._parts, EDGE_BYTES)
            self._parts = []
        else:
            self._parts.append(piece)

    def _take(self) -> bytes | None:
        """The line that just ended (or what the client reads in its place; None: nothing),
        and a new one begun."""
        parts, size, over = self._parts, self._size, self._over
        self._parts, self._size, self._over = [], 0, None
        if over is None:
            return b"".join(parts)
        call = _answered(*over)
        logger.warning(
            "MCP server %s sent a line of %d bytes, over BERNARD_MCP_RESPONSE_MAX_BYTES (%d): %s",
            self._server,
            size,
            self._max,
            "dropped" if call is None else f"the call {call.decode(errors='replace')} fails",
            extra={"mcp_server": self._server},
        )
        if call is None:
            return None
        error = json.dumps(
            {"code": PARSE_ERROR, "message": too_long(self._max)}, separators=(",", ":")
        )
        return b'{"jsonrpc":"2.0","id":' + call + b',"error":' + error.encode() + b"}"


def _answered(head: bytes, tail: bytes) -> bytes | None:
    """The id (as JSON) of the call a line beginning with `head` and ending with `tail`
    answers; None when it is not an answer or its id is not in them."""
    start = _HEAD.match(head)
    if start is None or start.group(2) not in (b"result", b"error"):
        return None
    found = _ID.search(start.group(1))
    if found is None:
        end = _TAIL.search(tail)
        found = _ID.search(end.group(1)) if end is not None else None
    return found.group(1) if found is not None else None


def _first(parts: list[bytes], n: int) -> bytes:
    kept = bytearray()
    for part in parts:
        kept += part[: n - len(kept)]
        if len(kept) >= n:
            break
    return bytes(kept)


def _last(parts: list[bytes], n: int) -> bytes:
    kept = b""
    for part in reversed(parts):
        kept = part[-(n - len(kept)) :] + kept
        if len(kept) >= n:
            break
    return kept
