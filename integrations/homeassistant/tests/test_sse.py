"""Server-sent events decoded from the chunks Bernard's streams arrive in."""

from __future__ import annotations

import time

import pytest

from custom_components.bernard.sse import MAX_LINE_CHARS, LineTooLong, ServerEvent, SseDecoder


def _decode(chunks: list[bytes]) -> list[ServerEvent]:
    decoder = SseDecoder()
    return [event for chunk in chunks for event in decoder.feed(chunk)]


DELTA = ServerEvent("text_delta", '{"text":"Hi"}', "1-0:0")


@pytest.mark.parametrize(
    ("chunks", "events"),
    [
        ([b'event: text_delta\ndata: {"text":"Hi"}\nid: 1-0:0\n\n'], [DELTA]),
        # Any split, even inside a line or a field name.
        ([b"event: text_de", b'lta\ndata: {"text":"Hi"}\nid: 1-0:0\n', b"\n"], [DELTA]),
        ([b'event: text_delta\r\ndata: {"text":"Hi"}\r\nid: 1-0:0\r\n\r\n'], [DELTA]),
        # CRLF split between its two halves is one line break, not two.
        ([b'event: text_delta\r\ndata: {"text":"Hi"}\r\nid: 1-0:0\r', b"\n\r\n"], [DELTA]),
        ([b'event: text_delta\rdata: {"text":"Hi"}\rid: 1-0:0\r\r\n'], [DELTA]),
        # A character split over two chunks.
        ([b"data: caf\xc3", b"\xa9\n\n"], [ServerEvent("", "café")]),
        # Keepalive comments, retry and an event with no data are dropped.
        ([b": ping\n\nretry: 10\n\nevent: x\n\n"], []),
        ([b"data: a\ndata: b\n\n"], [ServerEvent("", "a\nb")]),
        ([b"data:no space\n\n"], [ServerEvent("", "no space")]),
        # Only CR and LF end lines: U+2028 is data.
        ([b"data: a\xe2\x80\xa8b\n\n"], [ServerEvent("", "a\u2028b")]),
        # An event not yet ended by a blank line waits.
        ([b"event: done\ndata: {}\n"], []),
        # A long line is one line, however many chunks it came in.
        ([b"data: " + b"x" * 200_000 + b"\n\n"], [ServerEvent("", "x" * 200_000)]),
        ([b"data: ", *[b"x" * 1000] * 200, b"\n\n"], [ServerEvent("", "x" * 200_000)]),
    ],
)
def test_events_are_decoded_whatever_the_chunks(
    chunks: list[bytes], events: list[ServerEvent]
) -> None:
    assert _decode(chunks) == events


# Every way a line can end, comments, several fields, an id, a character of two bytes and
# one of four, and an event that no blank line ends yet.
STREAM = (
    b": ping\r\n\r\n"
    b'event: text_delta\r\ndata: {"text":"caf\xc3\xa9"}\r\nid: 1-0:0\r\n\r\n'
    b"event: x\rdata: a\rdata: \xf0\x9f\x8d\xb5\r\r"
    b"data: b\n\n"
    b"data: c\r\n\n"
    b"event: done\ndata: {}\n"
)
STREAM_EVENTS = [
    ServerEvent("text_delta", '{"text":"café"}', "1-0:0"),
    ServerEvent("x", "a\n\U0001f375"),
    ServerEvent("", "b"),
    ServerEvent("", "c"),
]


def test_a_stream_split_at_every_byte_boundary_decodes_the_same() -> None:
    assert _decode([STREAM]) == STREAM_EVENTS
    for cut in range(len(STREAM) + 1):
        assert _decode([STREAM[:cut], STREAM[cut:]]) == STREAM_EVENTS, cut
    assert _decode([STREAM[i : i + 1] for i in range(len(STREAM))]) == STREAM_EVENTS


TEN = ServerEvent("", "1234")


@pytest.mark.parametrize(
    ("chunks", "events"),
    [
        ([b"data: 1234\n\n"], [TEN]),  # ten characters: the bound
        ([b"data: 12345\n\n"], None),
        ([b"data: ", b"1234", b"\n\n"], [TEN]),
        ([b"data: ", b"12", b"345"], None),  # refused before its line ends
        ([b"data: 1234\r", b"\ndata: 1234\n\n"], [ServerEvent("", "1234\n1234")]),
        ([b"data: 1234\ndata: 1234\n\n"], [ServerEvent("", "1234\n1234")]),
    ],
)
def test_a_line_past_the_bound_is_refused(
    chunks: list[bytes], events: list[ServerEvent] | None
) -> None:
    decoder = SseDecoder(max_line_chars=10)
    if events is None:
        with pytest.raises(LineTooLong):
            for chunk in chunks:
                decoder.feed(chunk)
    else:
        assert [event for chunk in chunks for event in decoder.feed(chunk)] == events


def test_an_8_mib_line_is_refused_at_once_and_one_under_the_bound_read_in_linear_time() -> None:
    chunk = b"x" * 2**16  # as aiohttp hands them over
    decoder = SseDecoder()
    started = time.perf_counter()
    with pytest.raises(LineTooLong):
        decoder.feed(b"data: ")
        for _ in range(8 * 2**20 // len(chunk)):
            decoder.feed(chunk)
    refused_s = time.perf_counter() - started

    decoder = SseDecoder()
    size = MAX_LINE_CHARS - len("data: ")
    started = time.perf_counter()
    events = [decoder.feed(b"data: ")]
    for _ in range(size // len(chunk)):
        events.append(decoder.feed(chunk))
    events.append(decoder.feed(b"x" * (size % len(chunk)) + b"\n\n"))
    read_s = time.perf_counter() - started
    print(f"\n8 MiB refused in {refused_s * 1000:.0f} ms; 4 MiB read in {read_s * 1000:.0f} ms")
    assert [len(e.data) for batch in events for e in batch] == [size]
    # Was 5.8 s for the 8 MiB line on Home Assistant's loop (each chunk joined to all before).
    assert refused_s < 0.5
    assert read_s < 0.5
