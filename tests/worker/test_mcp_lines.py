"""A stdio MCP server's stdout read a line at a time, each line bounded
(worker/tools/mcp/lines.py)."""

from __future__ import annotations

import json
import logging
import time

import anyio
import pytest

from worker.tools.mcp.lines import BoundedLines

MAX = 1_000
TOO_LONG = (
    "the answer is longer than 1000 bytes, the most Bernard reads of one "
    "(BERNARD_MCP_RESPONSE_MAX_BYTES)"
)


def lines(*chunks: bytes, max_bytes: int = MAX) -> list[bytes]:
    reader = BoundedLines(None, max_bytes, server="files")  # type: ignore[arg-type]
    return [line for chunk in chunks for line in reader.feed(chunk)]


def chunked(data: bytes, size: int = 64) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def error_to(ident: object) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": ident, "error": {"code": -32700, "message": TOO_LONG}},
        separators=(",", ":"),
    ).encode()


def test_lines_are_handed_whole_however_the_chunks_fall() -> None:
    data = b'{"id":1}\n{"id":2,"result":"' + b"x" * 300 + b'"}\n\n{"id":3}\n{"id":4'
    want = [b'{"id":1}', b'{"id":2,"result":"' + b"x" * 300 + b'"}', b"", b'{"id":3}']
    assert lines(data) == want
    assert lines(*chunked(data, 7)) == want
    assert lines(*chunked(data, 1)) == want


def test_a_line_of_exactly_the_bound_is_kept_and_one_byte_more_is_not() -> None:
    line = b'{"id":1,"result":"' + b"x" * (MAX - 20) + b'"}'
    assert len(line) == MAX
    assert lines(*chunked(line + b"\n")) == [line]
    longer = line.replace(b"x", b"xx", 1)
    assert lines(*chunked(longer + b"\n")) == [error_to(1)]


@pytest.mark.parametrize(
    ("line", "ident"),
    [
        # The Python SDK's order: the id first.
        (b'{"jsonrpc":"2.0","id":5,"result":{"content":[{"type":"text","text":"X"}]}}', 5),
        (b'{"jsonrpc": "2.0", "id": "call-9", "error": {"code": 1, "message": "X"}}', "call-9"),
        # The TypeScript SDK's: the result first, the id at the end.
        (b'{"result":{"content":[{"type":"text","text":"X"}]},"jsonrpc":"2.0","id":12}', 12),
        # An id in the result is not the answer's.
        (b'{"result":{"content":[{"id":3,"text":"X"}]},"jsonrpc":"2.0","id":4}', 4),
    ],
)
def test_an_answer_over_the_bound_is_an_error_answer_to_its_call(
    line: bytes, ident: object, caplog: pytest.LogCaptureFixture
) -> None:
    long_line = line.replace(b"X", b"y" * 5_000)
    with caplog.at_level(logging.WARNING, "bernard.worker.mcp"):
        got = lines(*chunked(long_line + b'\n{"id":99}\n'))
    assert got == [error_to(ident), b'{"id":99}']
    assert caplog.messages == [
        f"MCP server files sent a line of {len(long_line)} bytes, over "
        f"BERNARD_MCP_RESPONSE_MAX_BYTES (1000): the call {json.dumps(ident)} fails"
    ]


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"X"}}',
        b'{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{"m":"X"}}',
        b'{"result":{"content":[{"id":3,"text":"X"}]}}',  # no id of its own
        b"X",
    ],
)
def test_any_other_line_over_the_bound_is_dropped(
    line: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    long_line = line.replace(b"X", b"y" * 5_000)
    with caplog.at_level(logging.WARNING, "bernard.worker.mcp"):
        assert lines(*chunked(long_line + b'\n{"id":99}\n')) == [b'{"id":99}']
    assert caplog.messages[0].endswith(": dropped")


async def test_the_client_reads_text_of_whole_lines_until_the_pipe_ends() -> None:
    send, receive = anyio.create_memory_object_stream[bytes](10)
    reader = BoundedLines(receive, MAX, server="files")  # type: ignore[arg-type]
    async with send:
        for chunk in (b'{"a":"\xc3', b'\xa9"}\n{"b":', b"1}\n", b'{"c":1'):
            await send.send(chunk)
    assert [text async for text in reader] == ['{"a":"é"}\n', '{"b":1}\n']


def test_a_long_line_costs_its_length_not_its_square() -> None:
    """32 MB in 64 KiB chunks, as a pipe hands them: each chunk is looked at once, in well
    under a second (the SDK's own reading copied the line so far for each one, 8 GB in all:
    29 s)."""
    chunk = b"y" * 65_536
    reader = BoundedLines(None, 8 * 2**20, server="files")  # type: ignore[arg-type]
    started = time.process_time()
    for _ in range(512):
        assert reader.feed(chunk) == []
    assert reader.feed(b"\n") == []  # dropped: not an answer
    assert time.process_time() - started < 2.0
