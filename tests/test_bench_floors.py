"""The floors' measurement (bench/floors.py) runs each server and each upstream reader it
names, at a load small enough for a test: every frame and chunk arrives, and the relay's
latency is read from the time each frame carries."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from bench.floors import Load, paced, reader_floor, serving_floor, stamp_of

TINY = Load(streams=3, rate=100.0, tokens=5)


@pytest.mark.parametrize(
    ("data", "stamp"),
    [
        (
            b'{"id":"chatcmpl-0123456789abcdef01234567","object":"chat.completion.chunk",'
            b'"created":6123.456789,"model":"bernard-v1","choices":[]}',
            6123.456789,
        ),
        (
            b'{"id":"chatcmpl-0123456789abcdef01234567","object":"chat.completion.chunk",'
            b'"created":7.000001,"model":"bernard-v1","choices":[]}',
            7.000001,
        ),
    ],
)
def test_a_frame_names_the_time_it_was_made(data: bytes, stamp: float) -> None:
    assert stamp_of(data) == stamp


async def test_a_paced_frame_is_a_chat_chunk_of_about_150_bytes() -> None:
    frames = [frame async for frame in paced(Load(1, 1000.0, 2))]
    assert len(frames) == 2
    assert all(195 <= len(frame) <= 210 for frame in frames)
    assert frames[0].startswith(b'data: {"id":"chatcmpl-') and frames[0].endswith(b"}\n\n")
    assert stamp_of(frames[0][6:-2]) <= stamp_of(frames[1][6:-2])


@pytest.mark.parametrize(
    ("server", "app"),
    [("uvicorn", "frame"), ("uvicorn-h11", "raw"), ("granian", "frame"), ("granian", "rsgi")],
)
def test_each_server_streams_every_frame(server: str, app: str) -> None:
    # The clients exit non-zero (SystemExit) when a frame is missing.
    result = serving_floor(server, app, TINY)
    assert result.cpu_us >= 0
    assert 0 <= result.p50_ms <= result.p99_ms < 5_000


@pytest.fixture(scope="module")
def upstream_port() -> Iterator[int]:
    from bench.floors import _upstream

    proc, port = _upstream()
    yield port
    proc.terminate()
    proc.wait()


@pytest.mark.parametrize("kind", ["sockets", "sdk", "sdk-aiohttp", "aiohttp"])
def test_each_reader_reads_every_chunk(kind: str, upstream_port: int) -> None:
    try:
        used = reader_floor(kind, upstream_port, 0, TINY)
    except SystemExit as exc:  # the reader exits non-zero when a chunk is missing
        pytest.fail(f"{kind}: {exc}")
    assert used >= 0


@pytest.mark.parametrize("kind", ["sockets-xadd", "sockets-held"])
def test_each_reader_that_writes_its_chunks_reads_every_chunk(
    kind: str, upstream_port: int, redis_url: str
) -> None:
    port = urlsplit(redis_url).port
    assert port is not None  # the session's own server, never the machine's shared one
    try:
        used = reader_floor(kind, upstream_port, port, TINY)
    except SystemExit as exc:  # the reader exits non-zero when a chunk or a write fails
        pytest.fail(f"{kind}: {exc}")
    assert used >= 0
