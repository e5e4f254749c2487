"""compat/httpx2.py and compat/httpcore2.py: an httpx2 client's connection pools found, and
their connections opened through the network backend set on them, over a real request."""

from __future__ import annotations

import asyncio
from typing import Any

import httpcore2
import httpx2

from compat.httpcore2 import set_network_backend
from compat.httpx2 import connection_pools


class CountingBackend(httpcore2.AnyIOBackend):
    """httpcore2's anyio backend, counting the connections opened through it."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, int]] = []

    async def connect_tcp(self, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        self.opened.append((host, port))
        return await super().connect_tcp(host, port, *args, **kwargs)


def test_the_pools_are_the_clients_own_and_each_proxys() -> None:
    client = httpx2.AsyncClient(
        mounts={
            "http://proxied.example": httpx2.AsyncHTTPTransport(proxy="http://127.0.0.1:9"),
            "http://nowhere.example": None,
        }
    )
    pools = connection_pools(client)
    assert len(pools) == 2
    assert all(isinstance(pool, httpcore2.AsyncConnectionPool) for pool in pools)
    assert type(pools[1]) is httpcore2.AsyncHTTPProxy


def test_a_client_on_a_transport_of_its_own_has_no_pool() -> None:
    mock = httpx2.MockTransport(lambda request: httpx2.Response(200))
    assert connection_pools(httpx2.AsyncClient(transport=mock)) == []


async def test_a_request_connects_through_the_backend_set_on_its_pool() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend = CountingBackend()
    async with httpx2.AsyncClient() as client:
        (pool,) = connection_pools(client)
        set_network_backend(pool, backend)
        response = await client.get(f"http://127.0.0.1:{port}/")
    server.close()
    assert (response.status_code, response.text) == (200, "ok")
    assert backend.opened == [("127.0.0.1", port)]
