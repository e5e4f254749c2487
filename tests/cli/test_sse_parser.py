"""The command line's SSE parser (cli/sse.py): the lines of a stream in, events out."""

from __future__ import annotations

import pytest

from cli.sse import ServerEvent, SseParser

CASES = [
    ("a data frame", ["data: hello", ""], [ServerEvent("", "hello")]),
    (
        "a named event with its id",
        ["event: text_delta", 'data: {"text":"Hi"}', "id: 1700-0", ""],
        [ServerEvent("text_delta", '{"text":"Hi"}', "1700-0")],
    ),
    (
        "data lines join with newlines",
        ["data: one", "data: two", ""],
        [ServerEvent("", "one\ntwo")],
    ),
    ("no space after the colon", ["data:tight", ""], [ServerEvent("", "tight")]),
    (
        "only one leading space goes",
        ["data:  two spaces", ""],
        [ServerEvent("", " two spaces")],
    ),
    ("comments and retry are dropped", [": ping", "retry: 100", ""], []),
    ("an event without data is dropped", ["event: done", "id: 1-0", ""], []),
    ("nothing is dispatched before the blank line", ["data: pending"], []),
    (
        "fields do not leak into the next event",
        ["event: a", "id: 1-0", "data: x", "", "data: y", ""],
        [ServerEvent("a", "x", "1-0"), ServerEvent("", "y")],
    ),
    ("an id with a NUL is ignored", ["id: 1\0", "data: x", ""], [ServerEvent("", "x")]),
    ("a field without a colon names an empty value", ["data", ""], [ServerEvent("", "")]),
    ("an unknown field is ignored", ["foo: bar", "data: x", ""], [ServerEvent("", "x")]),
    (
        "a multi-frame entry's numbered ids",
        ["id: 1700-0:2", "data: [DONE]", ""],
        [ServerEvent("", "[DONE]", "1700-0:2")],
    ),
]


@pytest.mark.parametrize(("lines", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_lines_make_events(lines: list[str], expected: list[ServerEvent]) -> None:
    parser = SseParser()
    events = [event for line in lines if (event := parser.feed(line)) is not None]
    assert events == expected
