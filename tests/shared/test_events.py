"""Events as stream entries (shared/events.py): what goes in comes back out."""

from __future__ import annotations

import pytest

from shared.events import (
    Delta,
    Done,
    Event,
    LlmPrompt,
    ToolCall,
    ToolResult,
    decode,
    encode,
)


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (Delta(text="plain"), Delta(text="plain")),
        (Delta(text="a whole pair 😀 stays"), Delta(text="a whole pair 😀 stays")),
        (Delta(text="lone \ud800 surrogate"), Delta(text="lone \ufffd surrogate")),
        (Delta(text="\udfff\ud800"), Delta(text="\ufffd\ufffd")),
        (
            ToolCall(id="c\udc00", name="t", arguments='{"q": "\ud83d"}', index=0),
            ToolCall(id="c\ufffd", name="t", arguments='{"q": "\ufffd"}', index=0),
        ),
        (
            ToolResult(tool_call_id="c", name="t", content="out \udbff"),
            ToolResult(tool_call_id="c", name="t", content="out \ufffd"),
        ),
        (
            LlmPrompt(stage="router", model="m", messages=[{"content": ["\ud800"], "k\udc00": 1}]),
            LlmPrompt(stage="router", model="m", messages=[{"content": ["\ufffd"], "k\ufffd": 1}]),
        ),
        (
            Done(status="completed", usage={"total_tokens": 3}),
            Done(status="completed", usage={"total_tokens": 3}),
        ),
    ],
    ids=[
        "text",
        "surrogate pair",
        "lone surrogate",
        "two lone surrogates",
        "tool call",
        "tool result",
        "prompt, nested",
        "done",
    ],
)
def test_an_event_comes_back_as_it_was_written_with_lone_surrogates_replaced(
    event: Event, expected: Event
) -> None:
    stamped = decode(encode(event, at=12.5))
    assert stamped.event == expected
    assert stamped.at == 12.5


def test_an_unknown_event_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event type"):
        decode(b'{"type": "nope", "at": 0}')
