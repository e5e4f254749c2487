"""The OpenAI client's connections on plain asyncio sockets (worker/upstream_sockets.py)
behave as on anyio's, httpcore2's default: the same answers, the same errors for the same
faults, and kept-alive connections reused or dropped alike. Every test runs both against
the same real server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpcore2
import httpx2
import openai
import pytest
import trustme

from tests.support.upstream import Reply, ScriptedUpstream
from worker.upstream_sockets import AsyncioStream, use_asyncio_sockets

BACKENDS = ["anyio", "asyncio"]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def client_on(backend: str, **options: Any) -> httpx2.AsyncClient:
    """The SDK's default HTTP client, as the worker builds it (worker/llm.py)."""
    client = openai.DefaultAsyncHttpxClient(**options)
    return use_asyncio_sockets(client) if backend == "asyncio" else client


class RawServer:
    """A loopback TCP server running `handler` per connection; counts the connections."""

    def __init__(self, handler: Handler, ssl_context: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.ssl_context = ssl_context
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            with contextlib.suppress(ConnectionError):
                await self.handler(reader, writer)
            writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=self.ssl_context)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One HTTP/1.1 request's head and its `Content-Length` body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


def response(body: bytes, *, close: bool = False) -> bytes:
    connection = b"Connection: close\r\n" if close else b""
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
        + connection
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


async def outcome(call: Awaitable[httpx2.Response]) -> tuple[str, object]:
    """What a request came to: its status and body, or the type of its error."""
    try:
        answer = await call
    except httpx2.HTTPError as exc:
        return "error", type(exc)
    return "answer", (answer.status_code, answer.content)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_sdk_gets_the_same_answers(backend: str, upstream: ScriptedUpstream) -> None:
    """A whole answer and a streamed one, through the SDK on its own client."""
    http = client_on(backend)
    sdk = openai.AsyncOpenAI(base_url=upstream.base_url, api_key="k", http_client=http)
    try:
        upstream.script(Reply.text(["One", " whole"], usage=(3, 2)))
        whole = await sdk.chat.completions.create(model="m", messages=[])
        upstream.script(Reply.text(["Hel", "lo", " there"], usage=(3, 3)))
        stream = await sdk.chat.completions.create(
            model="m", messages=[], stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
    finally:
        await sdk.close()
    assert whole.choices[0].message.content == "One whole"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there"
    assert [c.usage.total_tokens for c in chunks if c.usage] == [6]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_large_body_arrives_whole(backend: str) -> None:
    """Read in the pool's pieces (at most 64 KiB a read), and sent past the socket's
    buffer (the write waits for the server to read)."""
    sent = bytes(range(256)) * 16_384  # 4 MiB

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        writer.write(response(request[-len(sent) :]))
        await writer.drain()

    async with RawServer(echo) as server, client_on(backend) as http:
        answer = await http.post(f"http://127.0.0.1:{server.port}/", content=sent)
    assert answer.content == sent


@pytest.mark.parametrize("backend", BACKENDS)
async def test_kept_alive_connections_are_reused(backend: str) -> None:
    async def answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(response(b"ok"))
            await writer.drain()

    async with RawServer(answer_each) as server, client_on(backend) as http:
        for _ in range(5):
            assert (await http.get(f"http://127.0.0.1:{server.port}/")).content == b"ok"
    assert server.connections == 1


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_connection_the_server_closed_is_not_reused(backend: str) -> None:
    """The server closes its side after answering (keep-alive on its lips): the pool sees
    the idle connection is over before reusing it, and the next request opens another."""

    async def answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response(b"ok"))
        await writer.drain()

    async with RawServer(answer_then_close) as server, client_on(backend) as http:
        url = f"http://127.0.0.1:{server.port}/"
        first = await http.get(url)
        await asyncio.sleep(0.1)  # the server's close reaches the client
        second = await http.get(url)
    assert (first.content, second.content) == (b"ok", b"ok")
    assert server.connections == 2


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await asyncio.sleep(5)


async def _cut_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(response(b"0123456789")[:-5])  # the head promises 10 bytes; 5 come
    await writer.drain()


async def _never_reads(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(5)


async def _garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"this is not HTTP\r\n\r\n")
    await writer.drain()


@pytest.mark.parametrize(
    ("handler", "body", "error"),
    [
        (_silent, b"", httpx2.ReadTimeout),
        (_cut_short, b"", httpx2.RemoteProtocolError),
        (_never_reads, b"x" * 64 * 1024 * 1024, httpx2.WriteTimeout),
        (_garbage, b"", httpx2.RemoteProtocolError),
    ],
    ids=["no answer", "body cut short", "request never read", "not HTTP"],
)
async def test_both_fail_the_same_way(handler: Handler, body: bytes, error: type) -> None:
    results = []
    for backend in BACKENDS:
        async with RawServer(handler) as server, client_on(backend, timeout=0.3) as http:
            call = http.post(f"http://127.0.0.1:{server.port}/", content=body)
            results.append(await outcome(call))
    assert results == [("error", error)] * 2


async def test_both_fail_to_connect_the_same_way() -> None:
    async with RawServer(_silent) as server:
        port = server.port  # closed below: nothing listens there any more
    results = []
    for backend in BACKENDS:
        async with client_on(backend) as http:
            results.append(await outcome(http.get(f"http://127.0.0.1:{port}/")))
    assert results == [("error", httpx2.ConnectError)] * 2


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


@contextlib.asynccontextmanager
async def tls_server(authority: trustme.CA) -> AsyncIterator[RawServer]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(context)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response(b"secret", close=True))
        await writer.drain()

    async with RawServer(answer, context) as server:
        yield server


@pytest.mark.parametrize(
    ("host", "expected"),
    [("localhost", ("answer", (200, b"secret"))), ("127.0.0.1", ("error", httpx2.ConnectError))],
    ids=["the certificate's name", "another name"],
)
async def test_both_speak_tls_alike(
    authority: trustme.CA, host: str, expected: tuple[str, object]
) -> None:
    """HTTPS, as to a hosted provider: the certificate is checked against the host."""
    verify = ssl.create_default_context()
    authority.configure_trust(verify)
    results = []
    async with tls_server(authority) as server:
        for backend in BACKENDS:
            async with client_on(backend, verify=verify) as http:
                results.append(await outcome(http.get(f"https://{host}:{server.port}/")))
    assert results == [expected] * 2


async def test_a_read_returns_what_has_arrived_without_waiting() -> None:
    """What makes it cheap: bytes already received are handed over at once, up to the
    size asked for, the rest kept for the next read."""
    arrived = asyncio.Event()

    async def send_twice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"abcdef")
        await writer.drain()
        arrived.set()
        await asyncio.sleep(1)

    from worker.upstream_sockets import AsyncioBackend

    async with RawServer(send_twice) as server:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", server.port)
        assert isinstance(stream, AsyncioStream)
        await arrived.wait()
        await asyncio.sleep(0.05)
        assert stream.get_extra_info("is_readable")
        assert await stream.read(4, timeout=0) == b"abcd"
        assert await stream.read(4, timeout=0) == b"ef"
        assert not stream.get_extra_info("is_readable")
        with pytest.raises(httpcore2.ReadTimeout):
            await stream.read(4, timeout=0.05)
        await stream.aclose()


async def test_a_socket_option_the_system_refuses_fails_the_connection_alike() -> None:
    """A bad `socket_options` entry is a failed connection with either backend, not an
    option silently left out."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response(b"ok"))
        await writer.drain()

    refused = [(socket.SOL_SOCKET, 0x7FFF, 1)]  # an option no system has
    results = []
    async with RawServer(answer) as server:
        for backend in BACKENDS:
            transport = httpx2.AsyncHTTPTransport(socket_options=refused)
            client = httpx2.AsyncClient(transport=transport)
            if backend == "asyncio":
                use_asyncio_sockets(client)
            async with client:
                results.append(await outcome(client.get(f"http://127.0.0.1:{server.port}/")))
    assert results == [("error", httpx2.ConnectError)] * 2
