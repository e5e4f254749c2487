"""Server-sent events decoded from the chunks Bernard's streams arrive in."""

from __future__ import annotations

import pytest

from custom_components.bernard.sse import ServerEvent, SseDecoder


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
        # A long line is one line, whatever its length.
        ([b"data: " + b"x" * 200_000 + b"\n\n"], [ServerEvent("", "x" * 200_000)]),
    ],
)
def test_events_are_decoded_whatever_the_chunks(
    chunks: list[bytes], events: list[ServerEvent]
) -> None:
    assert _decode(chunks) == events
