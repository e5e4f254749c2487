"""The MCP SDK (bounded in pyproject.toml), past its interface: the stdio client's reading of
the server's stdout, by a reader Bernard chooses.

`mcp.client.stdio.stdio_client` reads the server's stdout inline, through anyio's
`TextReceiveStream` over the pipe, each chunk appended to what is left of the line
(`(buffer + chunk).split("\\n")`), with no bound on a line: a line of n bytes is copied and
scanned again for each 64 KiB that comes, about n² / 128 KiB bytes, all on the worker's
event loop (a copy of its loop took 0.86 s for an 8 MB line and 29 s for a 32 MB one). No
parameter changes how it reads, and a transport of Bernard's own would re-implement the rest
of `stdio_client`, which is private (the spec's shutdown: stdin closed, a grace period,
the process group terminated then killed, stdout drained meanwhile). So only the reading is
replaced: the module's name `TextReceiveStream`, which `stdio_client` calls once per session
with the pipe, becomes `_text_stream`, which makes the reader the caller of
`stdio_client_reading` chose (a context variable, set while the client starts its tasks, is
how it is told) and anyio's own `TextReceiveStream` for any other caller.

tests/compat/test_mcp_stdio.py holds it: it pins `stdio_client`'s source, and shows a chosen
reader reading a real server's stdout.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from contextvars import ContextVar
from typing import Any

import mcp.client.stdio as sdk_stdio
from anyio.abc import ByteReceiveStream
from anyio.streams.text import TextReceiveStream
from mcp.client.stdio import StdioServerParameters, stdio_client

__all__ = ["StdoutReader", "stdio_client_reading"]

# What reads a server's stdout: given the pipe, the encoding and the error handler, the text
# of the lines that came, each chunk ending with a newline.
StdoutReader = Callable[[ByteReceiveStream, str, str], AsyncIterator[str]]

_READER: ContextVar[StdoutReader | None] = ContextVar("bernard_mcp_stdio_reader", default=None)


def _text_stream(
    transport_stream: ByteReceiveStream, encoding: str = "utf-8", errors: str = "strict"
) -> AsyncIterator[str]:
    """What `stdio_client` reads the pipe through: the chosen reader, else anyio's."""
    reader = _READER.get()
    if reader is None:
        return TextReceiveStream(transport_stream, encoding=encoding, errors=errors)
    return reader(transport_stream, encoding, errors)


@asynccontextmanager
async def stdio_client_reading(
    server: StdioServerParameters, reader: StdoutReader
) -> AsyncIterator[Any]:
    """`stdio_client(server)`, its server's stdout read by `reader` (see the module
    docstring)."""
    if sdk_stdio.TextReceiveStream is not _text_stream:
        sdk_stdio.TextReceiveStream = _text_stream  # type: ignore[misc,assignment]
    async with AsyncExitStack() as stack:
        # Its reading task is started (and takes a copy of this context) as it is entered.
        chosen = _READER.set(reader)
        try:
            streams = await stack.enter_async_context(stdio_client(server))
        finally:
            _READER.reset(chosen)
        yield streams
