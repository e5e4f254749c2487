"""The load generator's HTTP client: one raw HTTP/1.1 request per connection, SSE parsed by hand.

On two cores the client competes with the API, the worker, Redis and the upstream for CPU,
so it does as little as it can while a measurement runs: it timestamps each TCP read once
(wall and monotonic clock), splits it into SSE frames and stores the raw `data` bytes; JSON
is parsed only until the first content frame is found, and everything else is decoded and
checked after the run. No httpx, no h11: a protocol object per connection.

Each request says `Connection: close`, so a response ends when its chunked body ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import orjson

Endpoint = tuple[str, int]


class HttpError(Exception):
    """The server answered with a status other than the one expected."""


# The Responses API's text delta event, named on its `event:` line (api/encodings/responses.py).
TEXT_DELTA = b"response.output_text.delta"


@dataclass(slots=True)
class Frame:
    """One SSE data frame as received: receipt times, its `id`, its raw `data`, and its
    `event` name as sent (b"" for an unnamed frame, as every chat frame is)."""

    wall: float
    mono: float
    id: str
    data: bytes
    event: bytes = b""


@dataclass(slots=True)
class _Chunked:
    """Decoder state of a chunked transfer-encoded body."""

    left: int = -1  # bytes of chunk data still to read; -1 = reading a size line
    skip: int = 0  # CRLF bytes after chunk data still to skip


@dataclass(eq=False)
class Call(asyncio.Protocol):
    """One request on its own connection; `frames` fill as the response streams in."""

    frames: list[Frame] = field(default_factory=list)
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    sent_at: float = 0.0  # monotonic
    sent_wall: float = 0.0
    first_content_at: float | None = None  # monotonic receipt of the first content frame
    ended_at: float | None = None
    error: str | None = None
    aborted: bool = False

    def __post_init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.finished: asyncio.Future[None] = loop.create_future()
        self.first_content: asyncio.Future[float] = loop.create_future()
        self.first_frame: asyncio.Future[None] = loop.create_future()
        self._head = bytearray()
        self._in_body = False
        self._chunked: _Chunked | None = None
        self._length: int | None = None
        self._sse = bytearray()
        self._size_line = bytearray()
        self._eol: bytes | None = None
        self._is_sse = False

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        wall, mono = time.time(), time.monotonic()
        if not self._in_body:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            self._parse_head(bytes(self._head[:end]))
            data = bytes(self._head[end + 4 :])
            self._head.clear()
            self._in_body = True
        if self._chunked is not None:
            self._feed_chunked(data, wall, mono)
        else:
            self._feed_payload(data, wall, mono)
            if self._length is not None and len(self.body) >= self._length:
                self._finish()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            if not self.aborted and self._length is None and self._chunked is None:
                self._finish()  # a close-delimited body
                return
            if not self.aborted:
                self.error = f"connection lost mid-response ({exc or 'closed'})"
            self._finish()

    # -- parsing ---------------------------------------------------------------------

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        self.status = int(lines[0].split(b" ", 2)[1])
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            self.headers[name.strip().lower().decode()] = value.strip().decode()
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            self._chunked = _Chunked()
        elif "content-length" in self.headers:
            self._length = int(self.headers["content-length"])
        self._is_sse = self.headers.get("content-type", "").startswith("text/event-stream")

    def _feed_chunked(self, data: bytes, wall: float, mono: float) -> None:
        state = self._chunked
        assert state is not None
        pos, size_line = 0, self._size_line
        while pos < len(data):
            if state.skip:
                take = min(state.skip, len(data) - pos)
                state.skip -= take
                pos += take
            elif state.left < 0:
                if size_line.endswith(b"\r") and data[pos : pos + 1] == b"\n":
                    line, pos = bytes(size_line[:-1]), pos + 1
                else:
                    end = data.find(b"\r\n", pos)
                    if end < 0:
                        size_line += data[pos:]
                        return
                    line, pos = bytes(size_line) + data[pos:end], end + 2
                size_line.clear()
                size = int(line.split(b";", 1)[0], 16)
                if size == 0:
                    self._finish()
                    return
                state.left = size
            else:
                take = min(state.left, len(data) - pos)
                self._feed_payload(data[pos : pos + take], wall, mono)
                pos += take
                state.left -= take
                if state.left == 0:
                    state.left, state.skip = -1, 2

    def _feed_payload(self, data: bytes, wall: float, mono: float) -> None:
        if not self._is_sse:
            self.body += data
            return
        sse = self._sse
        sse += data
        if self._eol is None:
            cut = sse.find(b"\n")
            if cut < 0:
                return
            self._eol = b"\r\n" if sse[cut - 1 : cut] == b"\r" else b"\n"
        eol = self._eol
        blank = eol + eol
        start = 0
        while True:
            end = sse.find(blank, start)
            if end < 0:
                break
            self._event(bytes(sse[start:end]).split(eol), wall, mono)
            start = end + len(blank)
        if start:
            del sse[:start]

    def _event(self, lines: list[bytes], wall: float, mono: float) -> None:
        event_id = ""
        name = b""
        data: bytes | None = None
        for line in lines:
            if line.startswith(b"data: "):
                data = line[6:]
            elif line.startswith(b"id: "):
                event_id = line[4:].decode()
            elif line.startswith(b"event: "):
                name = line[7:]
        if data is None:
            return
        self.frames.append(Frame(wall, mono, event_id, data, name))
        if not self.first_frame.done():
            self.first_frame.set_result(None)
        if self.first_content_at is None and is_content(name, data):
            self.first_content_at = mono
            if not self.first_content.done():
                self.first_content.set_result(mono)

    def _finish(self) -> None:
        self.ended_at = time.monotonic()
        if not self.finished.done():
            self.finished.set_result(None)
        if not self.first_content.done():
            self.first_content.set_exception(
                HttpError(self.error or f"no content frame (HTTP {self.status})")
            )
            self.first_content.exception()  # mark retrieved: not every caller awaits it
        if not self.first_frame.done():
            self.first_frame.set_result(None)
        if self.transport is not None:
            self.transport.close()

    # -- driving ---------------------------------------------------------------------

    def send(self, request: bytes) -> None:
        """Write the request and note the time (monotonic) it went out."""
        assert self.transport is not None
        self.sent_wall = time.time()
        self.sent_at = time.monotonic()
        self.transport.write(request)

    def abort(self) -> None:
        """Close the connection now (FIN), as a client that goes away would."""
        self.aborted = True
        if self.transport is not None:
            self.transport.close()

    @property
    def turn_id(self) -> str:
        """The turn behind this response (`X-Bernard-Turn-Id`), "" when there is none."""
        return self.headers.get("x-bernard-turn-id", "")

    def json(self) -> object:
        """The body of a non-stream response."""
        return orjson.loads(bytes(self.body))


def is_content(event: bytes, data: bytes) -> bool:
    """Whether a frame carries answer text: an unnamed (chat) frame's `delta.content`, or a
    `response.output_text.delta` event's `delta`. The name and a substring decide first, so
    only a frame that may carry text is parsed: about one per turn until the first is seen."""
    if event:
        return event == TEXT_DELTA and bool(_json(data).get("delta"))
    if b'"content"' not in data:
        return False
    choices = _json(data).get("choices") or []
    return bool(choices and (choices[0].get("delta") or {}).get("content"))


def _json(data: bytes) -> dict[str, Any]:
    """A frame's JSON object; {} when it is not one (`[DONE]`, a comment)."""
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


def request_bytes(
    endpoint: Endpoint,
    method: str,
    path: str,
    body: object | None = None,
    headers: Mapping[str, str] | None = None,
) -> bytes:
    """A complete HTTP/1.1 request; `body` is sent as JSON, with `headers` besides ours."""
    host, port = endpoint
    payload = b"" if body is None else orjson.dumps(body)
    head = [
        f"{method} {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Accept: text/event-stream, application/json",
        "Connection: close",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


async def connect(endpoint: Endpoint) -> Call:
    """Open a connection; the request goes out later with `Call.send`."""
    loop = asyncio.get_running_loop()
    _, call = await loop.create_connection(Call, endpoint[0], endpoint[1])
    return call


async def request(
    endpoint: Endpoint,
    method: str,
    path: str,
    body: object | None = None,
    headers: Mapping[str, str] | None = None,
) -> Call:
    """Send one request and wait for the whole response."""
    call = await connect(endpoint)
    call.send(request_bytes(endpoint, method, path, body, headers))
    await call.finished
    return call


def responses_body(message: str) -> dict[str, object]:
    """A streamed `/v1/responses` body with one user message."""
    return {"model": "bernard-v1", "input": message, "stream": True}


def chat_body(message: str, *, stream: bool = True, **extra: object) -> dict[str, object]:
    """A `/v1/chat/completions` body with one user message."""
    return {
        "model": "bernard-v1",
        "messages": [{"role": "user", "content": message}],
        "stream": stream,
        **extra,
    }
