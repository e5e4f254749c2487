"""compat/mcp_stdio.py: the MCP SDK's stdio client reading a server's stdout through the
reader Bernard chooses, held to mcp 2.3.

The first test fails when `stdio_client` changes (check that it still reads the pipe once,
through the module's `TextReceiveStream`, and hands the read stream lines split on "\\n");
the second runs a real server process and shows the chosen reader reading it, and anyio's
reading it for any other caller.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from collections.abc import AsyncIterator

import mcp.client.stdio as sdk_stdio
from anyio.abc import ByteReceiveStream
from anyio.streams.text import TextReceiveStream
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.message import SessionMessage

from compat.mcp_stdio import stdio_client_reading

# sha256 of mcp 2.3.0's `stdio_client` source, first 16 hex digits.
_CLIENT_READ = "ee669cfe97d99a46"
_SERVER = (
    "import sys; "
    'sys.stdout.write(\'{"jsonrpc":"2.0","id":1,"result":{}}\\n\'); sys.stdout.flush(); '
    "sys.stdin.read()"
)


def test_the_stdio_client_it_reads_for_is_the_sdks_as_read() -> None:
    source = inspect.getsource(sdk_stdio.stdio_client)
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == _CLIENT_READ, (
        "mcp's stdio_client changed: check compat/mcp_stdio.py against how it reads stdout "
        "now (and whether it bounds a line itself)"
    )
    assert "TextReceiveStream(process.stdout, encoding=" in source


async def _first_id(client: object) -> object:
    async with client as (read, _):  # type: ignore[attr-defined]
        message = await read.receive()
    assert isinstance(message, SessionMessage)
    return message.message.id  # type: ignore[union-attr]


async def test_the_chosen_reader_reads_the_servers_stdout_and_anyios_reads_for_others() -> None:
    params = StdioServerParameters(command=sys.executable, args=["-c", _SERVER])
    made: list[tuple[str, str]] = []

    def reader(pipe: ByteReceiveStream, encoding: str, errors: str) -> AsyncIterator[str]:
        made.append((encoding, errors))

        async def lines() -> AsyncIterator[str]:
            async for text in TextReceiveStream(pipe, encoding=encoding, errors=errors):
                yield text.replace('"id":1', '"id":7')

        return lines()

    assert await _first_id(stdio_client_reading(params, reader)) == 7
    assert made == [("utf-8", "strict")]
    assert await _first_id(stdio_client(params)) == 1, "another caller reads as the SDK does"
    assert made == [("utf-8", "strict")]
