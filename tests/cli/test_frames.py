"""Frames of every stream encoding (api/encoding.py) as the terminal's turn events
(cli/frames.py): the conversation endpoints' named events pass through, chat completion
chunks become the same events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cli.frames import TurnEvent, events_of
from cli.sse import ServerEvent


def chunk(**body: Any) -> ServerEvent:
    return ServerEvent("", json.dumps({"id": "chatcmpl-1", **body}))


CASES = [
    (
        "a named event passes through",
        ServerEvent("text_delta", '{"text": "Hi"}'),
        [TurnEvent("text_delta", {"text": "Hi"})],
    ),
    (
        "a named done",
        ServerEvent("done", '{"turn_id": "t", "status": "completed"}'),
        [TurnEvent("done", {"turn_id": "t", "status": "completed"})],
    ),
    (
        "chat content",
        chunk(choices=[{"index": 0, "delta": {"content": "Hi"}}]),
        [TurnEvent("text_delta", {"text": "Hi"})],
    ),
    (
        "the role chunk says nothing",
        chunk(choices=[{"delta": {"role": "assistant", "content": ""}}]),
        [],
    ),
    ("a finish chunk says nothing", chunk(choices=[{"delta": {}, "finish_reason": "stop"}]), []),
    (
        "a legacy completion's text",
        chunk(choices=[{"index": 0, "text": "Hi"}]),
        [TurnEvent("text_delta", {"text": "Hi"})],
    ),
    (
        "a bernard tool call",
        chunk(
            choices=[],
            bernard={
                "type": "tool_call",
                "id": "c1",
                "name": "calculator",
                "arguments": "{}",
                "index": 0,
            },
        ),
        [TurnEvent("tool_call", {"id": "c1", "name": "calculator", "arguments": "{}", "index": 0})],
    ),
    (
        "a bernard tool result names its output as the named event does",
        chunk(
            choices=[],
            bernard={
                "type": "tool_result",
                "tool_call_id": "c1",
                "name": "calculator",
                "content": "42",
                "is_error": False,
            },
        ),
        [
            TurnEvent(
                "tool_result",
                {"tool_call_id": "c1", "name": "calculator", "output": "42", "is_error": False},
            )
        ],
    ),
    ("a keepalive says nothing", chunk(choices=[], bernard={"type": "keepalive"}), []),
    (
        "delta tool calls and outputs",
        chunk(
            choices=[
                {
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "calculator", "arguments": "{}"},
                            }
                        ],
                        "tool_outputs": [{"index": 0, "id": "c1", "content": "42"}],
                    }
                }
            ]
        ),
        [
            TurnEvent("tool_call", {"id": "c1", "name": "calculator", "arguments": "{}"}),
            TurnEvent("tool_result", {"tool_call_id": "c1", "output": "42"}),
        ],
    ),
    (
        "an error frame",
        ServerEvent("", json.dumps({"error": {"message": "stopped", "code": "turn_cancelled"}})),
        [TurnEvent("error", {"code": "turn_cancelled", "message": "stopped"})],
    ),
    (
        "a stored row, named `message`, is not taken for a chat chunk",
        ServerEvent("message", '{"id": "msg_1", "role": "user", "content": "hi"}'),
        [TurnEvent("message", {"id": "msg_1", "role": "user", "content": "hi"})],
    ),
    ("[DONE] ends the turn", ServerEvent("", "[DONE]"), [TurnEvent("done", {})]),
    (
        "data that is not JSON is kept as text",
        ServerEvent("note", "plain"),
        [TurnEvent("note", {"text": "plain"})],
    ),
]


@pytest.mark.parametrize(("frame", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_frame_says(frame: ServerEvent, expected: list[TurnEvent]) -> None:
    assert events_of(frame) == expected
