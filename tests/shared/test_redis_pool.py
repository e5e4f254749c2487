"""A pooled connection's handshake (shared/redis_pool.py `HandshakeRetry`): a server that
accepts a connection and drops it before answering, as a restarting Redis may, costs the
command that asked for the connection another connect, not an error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.exceptions import ConnectionError

from shared.connection import connect_data

# What a RESP2 server answers to the handshake (CLIENT SETNAME) and to a PING.
OK, PONG = b"+OK\r\n", b"+PONG\r\n"


class DroppingServer:
    """A loopback server speaking just enough RESP: it drops the first `drops` connections
    at their first command past a PING (redis-py's health check, which it retries itself,
    goes first: the handshake's CLIENT SETNAME is dropped), and answers every command of
    the others."""

    def __init__(self, drops: int) -> None:
        self.drops = drops
        self.connections = 0
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        dropped = self.connections <= self.drops
        try:
            while command := await _command(reader):
                ping = command[0].upper() == b"PING"
                if dropped and not ping:
                    return
                writer.write(PONG if ping else OK)
                await writer.drain()
        finally:
            writer.close()


async def _command(reader: asyncio.StreamReader) -> list[bytes]:
    """One RESP array of bulk strings, as redis-py sends commands; [] at EOF."""
    header = await reader.readline()
    if not header:
        return []
    words = []
    for _ in range(int(header[1:])):
        size = int((await reader.readline())[1:])
        words.append((await reader.readexactly(size + 2))[:-2])
    return words


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[DroppingServer]:
    fake = DroppingServer(request.param)
    listening = await asyncio.start_server(fake.serve, "127.0.0.1", 0)
    fake.port = listening.sockets[0].getsockname()[1]
    async with listening:
        yield fake


@pytest.mark.parametrize("server", [1, 2], indirect=True, ids=["dropped once", "twice"])
async def test_a_handshake_the_server_dropped_is_tried_again(server: DroppingServer) -> None:
    client = connect_data(f"redis://127.0.0.1:{server.port}/0?client_name=bernard-test")
    try:
        assert await client.ping() is True
    finally:
        await client.aclose()
    assert server.connections == server.drops + 1


@pytest.mark.parametrize("server", [3], indirect=True)
async def test_a_server_that_drops_every_handshake_fails_the_command(
    server: DroppingServer,
) -> None:
    client = connect_data(f"redis://127.0.0.1:{server.port}/0?client_name=bernard-test")
    try:
        with pytest.raises(ConnectionError):
            await client.ping()
    finally:
        await client.aclose()
    assert server.connections == 3, "three handshakes, then the error"
