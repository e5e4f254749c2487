"""The sockets under the OpenAI client's HTTP connections: plain asyncio, not anyio.

The SDK's HTTP client (httpx2 over httpcore2) reaches the network through a *network
backend*, httpcore's documented extension point (`AsyncNetworkBackend`, the connections,
reads, writes and `get_extra_info` queries of its connection pool). Its default on asyncio
is anyio's, which is correct and costs, measured alone on this box
(docs/benchmarks.md, cost per token):

- every read and every write opens an anyio cancel scope for its timeout inside an
  exception-mapping context manager: 9.3 µs, against 0.06 µs for the read itself when its
  bytes have arrived. A streamed answer is one read per token;
- every request, as it enters and as it leaves the pool, asks each idle connection whether
  its server closed it (`is_readable`): anyio builds the socket's whole attribute table
  for it, then `poll()`s the socket, about 11 µs a connection, so a worker holding a
  hundred idle connections spent over a millisecond per request on it.

`AsyncioBackend` keeps the same contract with an asyncio `Protocol`: a read returns what
has arrived without waiting or arming a timer, waits (under one timer) only when nothing
has; a write goes straight to the transport and waits only while it pushes back; a
connection's "readable" is whether the loop has already seen its bytes or its end. Errors
and timeouts are httpcore2's own (`ReadError`, `ReadTimeout`, `WriteError`,
`WriteTimeout`, `ConnectError`, `ConnectTimeout`), so httpx2 and the SDK see what they see
with anyio's backend (tests/worker/test_upstream_sockets.py runs both against the same
servers). `use_asyncio_sockets` puts an SDK HTTP client on it; reaching the pool takes
private attributes of httpx2 and httpcore2, as httpx has no argument for a backend
(compat/httpx2.py, compat/httpcore2.py).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterable
from typing import Any, cast

import httpcore2
import httpx2
from httpcore2 import AsyncNetworkBackend, AsyncNetworkStream

from compat.httpcore2 import set_network_backend
from compat.httpx2 import connection_pools

__all__ = ["AsyncioBackend", "use_asyncio_sockets"]

# Bytes a connection buffers from its server before it stops reading the socket.
_READ_HIGH_WATER = 256 * 1024
# httpcore2's socket options: the arguments of `socket.setsockopt`.
SocketOption = (
    tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
)


class _Buffered(asyncio.Protocol):
    """The bytes a connection has received and not yet read, and how it ended."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.eof = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused_reading = False
        self.drained: asyncio.Future[None] | None = None
        self.paused_writing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not `asyncio.Transport` subclasses: same interface.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size > _READ_HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
            self.paused_reading = True
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close our side too: HTTP/1.1 has no use for a half-open connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()
        _resolve(self.drained)

    def pause_writing(self) -> None:
        self.paused_writing = True

    def resume_writing(self) -> None:
        self.paused_writing = False
        _resolve(self.drained)

    def _wake(self) -> None:
        _resolve(self.waiter)

    def take(self, max_bytes: int) -> bytes:
        data = b"".join(self.chunks) if len(self.chunks) > 1 else self.chunks[0]
        if len(data) > max_bytes:
            self.chunks = [data[max_bytes:]]
            data = data[:max_bytes]
        else:
            self.chunks = []
        self.size -= len(data)
        if self.paused_reading and self.size <= _READ_HIGH_WATER // 2:
            assert self.transport is not None
            self.transport.resume_reading()
            self.paused_reading = False
        return data


def _resolve(future: asyncio.Future[None] | None) -> None:
    """Wake whoever waits on `future`, if anyone still does."""
    if future is not None and not future.done():
        future.set_result(None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


async def _wait(
    future: asyncio.Future[None], seconds: float | None, timed_out: type[Exception]
) -> None:
    """Wait for `future`; raise `timed_out` after `seconds` (None: no limit). One timer
    handle, cheaper than a timeout context."""
    if seconds is None:
        await future
        return
    timer = asyncio.get_running_loop().call_later(seconds, _expire, future)
    try:
        await future
    except TimeoutError as exc:
        raise timed_out(f"no progress with the upstream in {seconds} s") from exc
    finally:
        timer.cancel()


class AsyncioStream(AsyncNetworkStream):
    """One connection to the upstream: `httpcore2.AsyncNetworkStream` on an asyncio
    transport."""

    def __init__(self, transport: asyncio.Transport, protocol: _Buffered) -> None:
        self._transport = transport
        self._protocol = protocol

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        protocol = self._protocol
        while not protocol.chunks:
            if protocol.eof:
                if protocol.error is not None:
                    raise httpcore2.ReadError(str(protocol.error)) from protocol.error
                return b""
            protocol.waiter = asyncio.get_running_loop().create_future()
            try:
                await _wait(protocol.waiter, timeout, httpcore2.ReadTimeout)
            finally:
                protocol.waiter = None
        return protocol.take(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        protocol = self._protocol
        if protocol.eof or self._transport.is_closing():
            raise httpcore2.WriteError("the connection is closed")
        try:
            self._transport.write(buffer)
        except (OSError, RuntimeError) as exc:
            raise httpcore2.WriteError(str(exc)) from exc
        if protocol.paused_writing:
            protocol.drained = asyncio.get_running_loop().create_future()
            try:
                await _wait(protocol.drained, timeout, httpcore2.WriteTimeout)
            finally:
                protocol.drained = None
            if protocol.error is not None:
                raise httpcore2.WriteError(str(protocol.error)) from protocol.error

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(
                    self._transport, self._protocol, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError as exc:
            self._transport.close()
            raise httpcore2.ConnectTimeout("timed out starting TLS") from exc
        except (OSError, ssl.SSLError) as exc:
            self._transport.close()
            raise httpcore2.ConnectError(str(exc)) from exc
        tls = cast(asyncio.Transport, transport)
        self._protocol.transport = tls  # reading pauses and resumes above the TLS layer
        return AsyncioStream(tls, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # The loop reads every connection as bytes arrive: an idle one whose server
            # closed it, or sent anything at all, has it in its buffer already.
            protocol = self._protocol
            return bool(protocol.chunks) or protocol.eof or self._transport.is_closing()
        if info == "ssl_object":
            return self._transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info == "socket":
            return self._transport.get_extra_info("socket")
        return None


class AsyncioBackend(AsyncNetworkBackend):
    """httpcore2's network backend on the running asyncio loop."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        local = (local_address, 0) if local_address else None
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_connection(
                    _Buffered, host, port, local_addr=local
                )
        except TimeoutError as exc:
            raise httpcore2.ConnectTimeout(f"timed out connecting to {host}:{port}") from exc
        except OSError as exc:
            raise httpcore2.ConnectError(str(exc)) from exc
        return _stream(transport, protocol, socket_options)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_unix_connection(_Buffered, path)
        except TimeoutError as exc:
            raise httpcore2.ConnectTimeout(f"timed out connecting to {path}") from exc
        except OSError as exc:
            raise httpcore2.ConnectError(str(exc)) from exc
        return _stream(transport, protocol, socket_options)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _stream(
    transport: asyncio.BaseTransport,
    protocol: _Buffered,
    socket_options: Iterable[SocketOption] | None,
) -> AsyncioStream:
    transport = cast(asyncio.Transport, transport)
    sock: socket.socket | None = transport.get_extra_info("socket")
    if sock is not None:
        try:
            for option in socket_options or ():
                sock.setsockopt(*option)
        except OSError as exc:  # as anyio's backend: the connection fails, its socket closed
            transport.close()
            raise httpcore2.ConnectError(str(exc)) from exc
    return AsyncioStream(transport, protocol)


def use_asyncio_sockets(client: Any) -> Any:
    """Put `client`'s connection pools (an httpx2 `AsyncClient`: its own transport and any
    proxy mounts) on `AsyncioBackend`; returns `client`. Pools of another HTTP library
    (the Anthropic SDK's httpx) are left as they are."""
    if not isinstance(client, httpx2.AsyncClient):
        return client
    backend = AsyncioBackend()
    for pool in connection_pools(client):
        set_network_backend(pool, backend)
    return client
