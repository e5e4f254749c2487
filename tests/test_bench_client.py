"""The bench's load generator (bench/client.py) times the first content frame of a stream it
parses by hand: a chat stream's first unnamed frame with `delta.content`, a Responses
stream's first `response.output_text.delta` event with a non-empty `delta`. A scripted
server sends the frames over real TCP, the text one a pause after the empty one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from bench.client import Endpoint, request

PAUSE_S = 0.2


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[Endpoint, list[Sequence[bytes]]]]:
    """A server answering each connection with the next script: an SSE head, then each
    piece as a chunk, `PAUSE_S` apart, then the last chunk."""
    scripts: list[Sequence[bytes]] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for piece in scripts.pop(0):
            writer.write(chunk(piece))
            await writer.drain()
            await asyncio.sleep(PAUSE_S)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield ("127.0.0.1", port), scripts
    server.close()
    await server.wait_closed()


async def test_a_responses_stream_is_timed_to_its_first_non_empty_text_delta_event(
    scripted: tuple[Endpoint, list[Sequence[bytes]]],
) -> None:
    endpoint, scripts = scripted
    scripts.append(
        [
            b"id: 1-0\r\nevent: response.created\r\n"
            b'data: {"type":"response.created","sequence_number":0}\r\n\r\n'
            b"id: 2-0\r\nevent: response.output_text.delta\r\n"
            b'data: {"type":"response.output_text.delta","sequence_number":1,"delta":""}\r\n\r\n',
            b"id: 3-0\r\nevent: response.output_text.delta\r\n"
            b'data: {"type":"response.output_text.delta","sequence_number":2,"delta":"Hi"}\r\n\r\n',
        ]
    )

    call = await request(endpoint, "POST", "/v1/responses", {"input": "hello", "stream": True})

    assert [(f.id, f.event) for f in call.frames] == [
        ("1-0", b"response.created"),
        ("2-0", b"response.output_text.delta"),
        ("3-0", b"response.output_text.delta"),
    ]
    assert call.first_content_at == call.frames[2].mono
    assert call.first_content_at - call.sent_at >= PAUSE_S


async def test_a_chat_stream_is_timed_to_its_first_frame_with_content(
    scripted: tuple[Endpoint, list[Sequence[bytes]]],
) -> None:
    endpoint, scripts = scripted
    scripts.append(
        [
            b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
            b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\ndata: [DONE]\n\n',
        ]
    )

    call = await request(endpoint, "POST", "/v1/chat/completions", {"stream": True})

    assert [(f.event, f.data[:12]) for f in call.frames] == [
        (b"", b'{"choices":['),
        (b"", b'{"choices":['),
        (b"", b"[DONE]"),
    ]
    assert call.first_content_at == call.frames[1].mono
    assert call.first_content_at - call.sent_at >= PAUSE_S
