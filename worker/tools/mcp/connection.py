"""One configured MCP server, its session kept open for the worker's life.

Each worker holds one session per server, opened in the background as it starts and shared
by every turn's calls, so no call waits for a handshake:

    connecting ──handshake and tools/list──▶ ready ──lost──▶ down ──backoff──▶ connecting

A lost session (its transport ended, a call found it gone, the `PROBE_S` check failed) opens
again after `backoff(n)`. Its tools are checked and bounded as they are listed (shared/
schema_checks.py, worker/tools/mcp/bounds.py), and stay offered while the server is down.
What one answer may bring in is bounded (`response_max_bytes`; compressed HTTP answers are
refused, since a bound on the wire would not hold): an answer over it fails its call alone.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from enum import StrEnum
from typing import Any

import anyio
import httpx2
from anyio.abc import ByteReceiveStream
from langchain_core.tools import ToolException
from mcp import Client, StdioServerParameters
from mcp.client import IncomingMessage, Transport
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    PARSE_ERROR,
    REQUEST_TIMEOUT,
    CallToolResult,
    Implementation,
    Tool,
    ToolListChangedNotification,
)
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from compat.mcp_stdio import stdio_client_reading
from shared.schema_checks import SchemaChecks, Unusable, Usable
from worker.tools.mcp.bounds import Bounds, Listing, arguments_schema, description
from worker.tools.mcp.config import HttpServer, ServerConfig, StdioServer
from worker.tools.mcp.lines import BoundedLines, too_long

__all__ = ["PROBE_S", "Connection", "ConnectionState", "backoff"]

logger = logging.getLogger("bernard.worker.mcp")

CLIENT_INFO = Implementation(name="bernard", version="0.1")
# How often a ready session is checked (and its tools listed again).
PROBE_S = 30.0
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
_BOUNDS = Bounds()
_MAX_PAGES = 10
# HTTP: the SDK's own limits (a response stream may stay open long between events).
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
# How the SDK begins the error it answers a call with when the event stream of that call's
# answer could not be read (an event over its size, or malformed): that answer is lost, not
# the session, which goes on carrying every other call.
_ANSWER_STREAM_FAILED = "SSE stream failed"
_REFUSALS = {
    401: "the server refused the credentials (HTTP {status}): check its headers",
    403: "the server refused the credentials (HTTP {status}): check its headers",
    404: "nothing answers MCP at that address (HTTP {status}): check its url",
}


class ConnectionState(StrEnum):
    CONNECTING = "connecting"
    READY = "ready"
    DOWN = "down"


def backoff(failures: int) -> float:
    """Seconds to wait before opening a session again after `failures` failures in a row."""
    delay = min(BACKOFF_FIRST_S * 2**failures, BACKOFF_MAX_S)
    return delay * random.uniform(0.8, 1.2)


class Connection:
    """One server's session, its state and the tools it lists (see the module docstring).

    `changed` is called (on the worker's loop) when the state or the tools change.
    """

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        *,
        checks: SchemaChecks,
        timeout_s: float,
        result_max_chars: int,
        response_max_bytes: int,
        bounds: Bounds = _BOUNDS,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self.config = config
        # What one call may bring in (BERNARD_MCP_RESULT_MAX_CHARS, _RESPONSE_MAX_BYTES).
        self.result_max_chars = result_max_chars
        self.response_max_bytes = response_max_bytes
        # What its tools may add to each router request (worker/tools/mcp/bounds.py), and
        # where their schemas are checked, and calls' arguments against them.
        self.bounds = bounds
        self.checks = checks
        # A call's limit, and the handshake's: the server's own, within the tool timeout.
        self.timeout_s = min(config.timeout_s or timeout_s, timeout_s)
        self.state = ConnectionState.CONNECTING
        self.error: str | None = None
        self.since = time.time()
        self.tools: tuple[Tool, ...] = ()
        # The tools it lists that are left out, and why.
        self.warnings: tuple[str, ...] = ()
        self._changed = changed
        self._client: Client | None = None
        self._lost: str | None = None
        self._wake: anyio.Event | None = None
        self._ready_at: float | None = None
        # The last refusal an HTTP server answered with (401, 403, 404): the SDK reports
        # them all as one "error response", which says nothing of what to fix.
        self._refused: int | None = None

    @property
    def transport(self) -> str:
        return self.config.transport

    async def run(self) -> None:
        """Keep a session open until cancelled."""
        failures = 0
        while True:
            # A server that is down stays down, not connecting, while it is tried again.
            self._ready_at = self._refused = None
            try:
                await self._session()
                reason = self._lost or "the connection closed"
            except Exception as exc:
                reason = self._refusal() or describe(exc)
            # A session that lasted resets the backoff; one that keeps dying soon after it
            # opened (a server in a crash loop) is retried less and less often.
            lasted = self._ready_at is not None and time.monotonic() - self._ready_at >= (
                BACKOFF_MAX_S
            )
            failures = 0 if lasted else failures + 1
            delay = backoff(max(failures - 1, 0))
            logger.warning(
                "MCP server %s is down (%s); connecting again in %.1f s",
                self.name,
                reason,
                delay,
                extra={"mcp_server": self.name},
            )
            self._set(ConnectionState.DOWN, reason)
            await anyio.sleep(delay)

    async def call(
        self, tool: str, arguments: dict[str, Any], progress: ProgressFnT | None = None
    ) -> CallToolResult:
        """Call `tool` on the server; every failure is a `ToolException` the model reads."""
        client = self._client
        server = f"the MCP server “{self.name}”"
        if client is None:
            why = f"{self.error}; " if self.error else ""
            raise ToolException(
                f"Error: {server} is not connected ({why}Bernard keeps trying to reach it)"
            )
        try:
            return await client.call_tool(
                tool, arguments, read_timeout_seconds=self.timeout_s, progress_callback=progress
            )
        except MCPError as exc:
            if exc.code == PARSE_ERROR or (
                exc.code == CONNECTION_CLOSED and exc.message.startswith(_ANSWER_STREAM_FAILED)
            ):
                raise ToolException(
                    f"Error: could not read the answer of {server} ({exc.message}); the call "
                    "may have run"
                ) from exc
            if exc.code == CONNECTION_CLOSED:
                self._lose(exc.message)
                raise ToolException(
                    f"Error: the connection to {server} ended during the call ({exc.message}); "
                    "the call may have run"
                ) from exc
            if exc.code == REQUEST_TIMEOUT:
                raise ToolException(
                    f"Error: {server} did not answer within {self.timeout_s:g}s; the call "
                    "may still be running there"
                ) from exc
            raise ToolException(f"Error: {server} refused the call: {exc.message}") from exc
        except ValidationError as exc:
            raise ToolException(
                f"Error: {server} answered with something that is not an MCP tool result"
            ) from exc
        except RuntimeError as exc:  # a result its output schema refuses, input asked for
            raise ToolException(
                f"Error: {server} answered in a way Bernard cannot use: {exc}"
            ) from exc
        except Exception as exc:  # the transport's own: the server cannot be reached
            self._lose(describe(exc))
            raise ToolException(f"Error: could not reach {server}: {describe(exc)}") from exc

    # -- one session ---------------------------------------------------------------------

    async def _session(self) -> None:
        """Open a session, list the tools, and keep it until it is lost (a failure to open
        it raises)."""
        self._lost = None
        self._wake = anyio.Event()
        client = Client(
            self._watched(self._transport()),
            mode="auto",
            message_handler=self._on_message,
            client_info=CLIENT_INFO,
            cache=None,
        )
        with anyio.CancelScope(deadline=anyio.current_time() + self.timeout_s) as limit:
            async with client:
                listed = await self._fetch(client)
                # Checking the tools is Bernard's work, not the server's: not within its time.
                limit.deadline = math.inf
                await self._keep(listed)
                self._client, self._ready_at = client, time.monotonic()
                self._set(ConnectionState.READY)
                try:
                    async with anyio.create_task_group() as tasks:
                        if client.protocol_version in MODERN_PROTOCOL_VERSIONS and _notifies(
                            client
                        ):
                            tasks.start_soon(self._listen, client)
                        await self._watch(client)
                        tasks.cancel_scope.cancel()
                finally:
                    self._client = None
        if limit.cancelled_caught:
            raise TimeoutError(f"no answer within {self.timeout_s:g}s")

    async def _watch(self, client: Client) -> None:
        """Until the session is lost: list the tools again when told they changed, and
        every `PROBE_S` (a server that does not answer in time is lost)."""
        while self._lost is None:
            with anyio.move_on_after(PROBE_S):
                assert self._wake is not None
                await self._wake.wait()
            self._wake = anyio.Event()
            if self._lost is not None:
                return
            with anyio.fail_after(self.timeout_s):
                listed = await self._fetch(client)
            await self._keep(listed)

    async def _listen(self, client: Client) -> None:
        """Keep a 2026 session's `subscriptions/listen` stream open: the tool list's
        changes reach `_on_message` through it. Its end ends the session."""
        async with client.listen(tools_list_changed=True) as events:
            async for _ in events:
                pass
        self._lose("the server ended its notification stream")

    async def _fetch(self, client: Client) -> list[Tool]:
        """The tools the server lists, page after page."""
        listed: list[Tool] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            listed += page.tools
            cursor = page.next_cursor
            if cursor is None:
                break
        return listed

    async def _keep(self, listed: list[Tool]) -> None:
        """Keep the tools listed that are usable and within `bounds`."""
        listing = Listing(self.bounds, self.name)
        for tool in listed:
            listing.add(tool, await self._checked(tool) if listing.checking else None)
        tools, warnings = tuple(listing.tools), tuple(listing.warnings())
        # Said once, not at each listing: they are listed again every `PROBE_S`.
        for warning in warnings:
            if warning not in self.warnings:
                logger.warning(
                    "MCP server %s: %s", self.name, warning, extra={"mcp_server": self.name}
                )
        if (tools, warnings) != (self.tools, self.warnings):
            self.tools, self.warnings = tools, warnings
            self._changed()

    async def _checked(self, remote: Tool) -> Usable | Unusable:
        """`remote` as the router would be offered it, or why it cannot be."""
        schema = arguments_schema(remote)
        return await self.checks.tool(remote.name, description(remote, self.name), schema)

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, ToolListChangedNotification):
            self._poke()
        elif isinstance(message, Exception):
            logger.debug("MCP server %s: %s", self.name, describe(message))

    def _lose(self, reason: str) -> None:
        """The session is gone: no call is sent on it from now on, its watcher ends it, and
        `run` opens another."""
        if self._lost is None:
            self._lost = reason
        if self._client is not None:
            self._client = None
            self._set(ConnectionState.DOWN, self._lost)
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _set(self, state: ConnectionState, error: str | None = None) -> None:
        if (state, error) == (self.state, self.error):
            return
        if state is ConnectionState.READY:
            logger.info(
                "MCP server %s is ready: %d tools",
                self.name,
                len(self.tools),
                extra={"mcp_server": self.name},
            )
        self.state, self.error, self.since = state, error, time.time()
        self._changed()

    # -- transports ----------------------------------------------------------------------

    def _transport(self) -> Transport:
        if isinstance(self.config, HttpServer):
            return _http(self.config, self._answered, self.response_max_bytes)
        return _stdio(self.name, self.config, self.response_max_bytes)

    async def _answered(self, response: httpx2.Response) -> None:
        # A refusal that a later answer follows was not the end (a 2025 server may answer
        # the SDK's `server/discover` with a 404 before its handshake succeeds).
        if response.status_code in _REFUSALS:
            self._refused = response.status_code
        elif response.is_success:
            self._refused = None

    def _refusal(self) -> str | None:
        """What the server's refusal says to fix, when it refused."""
        if self._refused is None:
            return None
        return _REFUSALS[self._refused].format(status=self._refused)

    def _watched(self, transport: Transport) -> Transport:
        return _watch_end(transport, lambda: self._lose("the server closed the connection"))


def _notifies(client: Client) -> bool:
    tools = client.server_capabilities.tools
    return bool(tools and tools.list_changed)


@asynccontextmanager
async def _http(
    config: HttpServer, answered: Callable[[httpx2.Response], Awaitable[None]], max_bytes: int
) -> AsyncIterator[tuple[Any, Any]]:
    hooks = {"response": [answered, _bounded(max_bytes)]}
    # Over the server's own headers: an answer is never decompressed (see `_bounded`).
    headers = {**config.headers, "Accept-Encoding": "identity"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=_HTTP_TIMEOUT, event_hooks=hooks) as http,
        streamable_http_client(
            config.url, http_client=http, max_sse_event_size=max_bytes
        ) as streams,
    ):
        yield streams


class AnswerTooLarge(httpx2.StreamError):
    """A server's answer is longer than Bernard reads of one. A `StreamError`: the SDK
    answers the call it was reading with a parse error, and the session goes on."""


class AnswerCompressed(httpx2.StreamError, httpx2.SSEError):
    """A server's answer compressed though Bernard asked for it uncompressed. A `StreamError`
    and an `SSEError`: the SDK answers the call it was reading (a JSON body, or an event
    stream) with an error, and the session goes on."""


def _bounded(max_bytes: int) -> Callable[[httpx2.Response], Awaitable[None]]:
    """A response hook (it runs before the body is read): a compressed body is refused
    before a byte of it is decoded, and one that is not an event stream is read at most
    `max_bytes` (see the module docstring)."""

    async def bound(response: httpx2.Response) -> None:
        encoding = response.headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            response.stream = _Refused(response.stream, encoding)
            return
        kind = response.headers.get("content-type", "").lower()
        if not kind.startswith("text/event-stream"):
            response.stream = _Capped(response.stream, max_bytes)

    return bound


class _Refused(httpx2.AsyncByteStream):
    """A compressed response body: raises `AnswerCompressed` instead of a first chunk."""

    def __init__(self, stream: Any, encoding: str) -> None:
        self._stream = stream
        self._encoding = encoding

    async def __aiter__(self) -> AsyncIterator[bytes]:
        raise AnswerCompressed(
            f"the answer is compressed ({self._encoding[:40]}), which Bernard does not read "
            "(it asks for answers uncompressed: their size is bounded as they arrive)"
        )
        yield b""  # pragma: no cover - an async generator, never reached

    async def aclose(self) -> None:
        await self._stream.aclose()


class _Capped(httpx2.AsyncByteStream):
    """A response body that raises `AnswerTooLarge` once more than `limit` bytes came."""

    def __init__(self, stream: Any, limit: int) -> None:
        self._stream = stream
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for chunk in self._stream:
            read += len(chunk)
            if read > self._limit:
                raise AnswerTooLarge(too_long(self._limit))
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


def _stdio(name: str, config: StdioServer, max_bytes: int) -> Transport:
    # The child's environment is the SDK's safe default (PATH, HOME, ...) and the server's
    # own `env`: never the worker's secrets.
    params = StdioServerParameters(
        command=config.command, args=config.args, env=config.env or None, cwd=config.cwd
    )

    def lines(pipe: ByteReceiveStream, encoding: str, errors: str) -> BoundedLines:
        return BoundedLines(pipe, max_bytes, server=name, encoding=encoding, errors=errors)

    return stdio_client_reading(params, lines)


@asynccontextmanager
async def _watch_end(
    transport: Transport, ended: Callable[[], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """`transport`, whose read stream calls `ended` when it ends."""
    async with transport as (read, write):
        yield _EndWatched(read, ended), write


class _EndWatched:
    """A transport's read stream (the SDK's `ReadStream` protocol) that calls `ended` once
    it ends: a stdio server whose process exited closes its stdout, and nothing else tells
    the session."""

    def __init__(self, stream: Any, ended: Callable[[], None]) -> None:
        self._stream = stream
        self._ended = ended

    async def receive(self) -> Any:
        try:
            return await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._ended()
            raise

    def __aiter__(self) -> _EndWatched:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._stream.__anext__()
        except (StopAsyncIteration, anyio.ClosedResourceError):
            self._ended()
            raise

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> _EndWatched:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        result: bool | None = await self._stream.__aexit__(*exc)
        return result

    def __getattr__(self, name: str) -> Any:
        # `last_context`, which the SDK reads when the stream has it.
        return getattr(self._stream, name)


def describe(exc: BaseException) -> str:
    """What went wrong, for a log line and the model: the first failure inside an
    exception group, with its type when its message says little."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return exc.message
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"cannot start {exc.filename}: no such file"
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
