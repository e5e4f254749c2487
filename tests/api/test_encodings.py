"""Every encoding (api/encodings/), event by event: the frames, keepalive, polled body and
compacted replay each encoding gives, against tests/api/frames.json, which holds them
literally as the wire carried them before the encoders moved into one module each (the
bytes a client gets must not change)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from api.encoding import Frame, Named
from api.encodings import ENCODINGS, encoder_for, subject_of
from shared.endings import completed, ended
from shared.errors import ErrorCode
from shared.events import (
    AwaitingConfirmation,
    ClientToolCall,
    Delta,
    Done,
    Error,
    Event,
    LlmCallComplete,
    LlmPrompt,
    Memory,
    MessageStored,
    Start,
    ToolCall,
    ToolProgress,
    ToolResult,
)
from shared.requests import AgentRequest, Delivery, TurnRequest
from shared.results import TurnResult
from shared.turn_record import TurnRecord

EXPECTED = json.loads((Path(__file__).parent / "frames.json").read_text())
USAGE = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
EVENTS: dict[str, Event] = {
    "start": Start(),
    "delta": Delta(text="hé\n"),
    "tool_call": ToolCall(id="c1", name="add", arguments='{"a": 1}', index=0),
    # The policy's ruling: shown where Bernard's own events are, never in OpenAI's shapes.
    "tool_call_ruled": ToolCall(
        id="c1",
        name="add",
        arguments='{"a": 1}',
        index=0,
        policy={"rule": "lights", "decision": "allow"},
    ),
    "tool_progress": ToolProgress(
        tool_call_id="c1", tool="add", phase="running", message="half", current=1.0, total=2.0
    ),
    "tool_result": ToolResult(tool_call_id="c1", name="add", content="2", index=0),
    "tool_result_no_index": ToolResult(
        tool_call_id="c1", name="add", content="oops", is_error=True
    ),
    "awaiting": AwaitingConfirmation(
        confirmation_id="k1",
        tool_call={"id": "c2", "name": "lights", "arguments": "{}"},
        summary="Turn on the lights",
        expires_at=1700000100.5,
    ),
    "message": MessageStored(row={"id": "msg_1", "role": "user", "content": "hi"}),
    "llm_prompt": LlmPrompt(
        stage="router", model="m", messages=[{"role": "user", "content": "hi"}]
    ),
    "llm_call_complete": LlmCallComplete(stage="response", model="m", latency_ms=12.5, usage=USAGE),
    "memory": Memory(kept=1, stored=2, summary_covers=None, notes=0, tokens=10, budget=100),
    "error": Error(message="the tool failed", code="tool_error"),
    "done": completed("length", USAGE),
    "done_failed": ended(ErrorCode.UPSTREAM_ERROR),
    "done_paused": Done(status="awaiting_confirmation", finish_reason="stop", usage=USAGE),
    "client_tool_call": ClientToolCall(
        id="call_9", name="get_weather", arguments='{"city": "Oslo"}', index=1
    ),
    "done_tool_calls": completed("tool_calls", USAGE),
}
# The turn's delivery options, by the names frames.json uses.
CONFIGS: dict[str, dict[str, Any]] = {
    "chat": {"kind": "chat"},
    "chat_usage": {"kind": "chat", "include_usage": True},
    "chat_delta": {"kind": "chat", "tool_events": "delta"},
    "chat_none": {"kind": "chat", "tool_events": "none"},
    "completion": {"kind": "completion", "include_usage": True},
    "conversation": {"kind": "conversation"},
}
RESULT = TurnResult(
    content="hi",
    finish_reason="stop",
    usage=USAGE,
    tool_calls=[{"id": "c1"}],
    tool_outputs=[{"id": "c1", "content": "2"}],
)

# A turn that ended on calls of the client's own tools (issue 22).
HANDED_OVER = TurnResult(
    finish_reason="tool_calls",
    usage=USAGE,
    client_calls=[
        {
            "id": "call_9",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
    ],
)


def record(config: str) -> TurnRecord:
    # Traced: the stream holds model-call traces only when the client asked for them.
    options = dict(CONFIGS[config])
    request = TurnRequest(AgentRequest([], trace=True), Delivery(options.pop("kind"), **options))
    return TurnRecord(
        id="t1",
        owner="o",
        request=request,
        model="bernard-v1",
        created_at=1700000000.0,
        conversation_id="conv_1",
    )


def as_recorded(frames: list[Frame]) -> list[Any]:
    """Frames as frames.json holds them: a named event as its name and data."""
    return [{"event": f.event, "data": f.data} if isinstance(f, Named) else f for f in frames]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("event", EVENTS)
def test_each_event_encodes_as_it_always_has(config: str, event: str) -> None:
    frames = encoder_for(record(config)).frames(EVENTS[event])
    assert as_recorded(frames) == EXPECTED["frames"][f"{config} {event}"]


@pytest.mark.parametrize("config", CONFIGS)
def test_keepalive_body_and_compacted_replay_are_as_they_always_were(config: str) -> None:
    encoder = encoder_for(record(config))
    keepalive = encoder.keepalive()
    assert (as_recorded([keepalive])[0] if keepalive is not None else None) == EXPECTED[
        "keepalive"
    ][config]
    assert encoder.body(RESULT) == EXPECTED["bodies"][config]
    finished = record(config)
    finished.status, finished.result = "completed", RESULT
    assert as_recorded(encoder_for(finished).compacted(finished)) == EXPECTED["compacted"][config]


@pytest.mark.parametrize("config", CONFIGS)
def test_a_turn_ended_on_client_calls_is_polled_and_replayed_with_them(config: str) -> None:
    assert encoder_for(record(config)).body(HANDED_OVER) == EXPECTED["bodies_client_calls"][config]
    finished = record(config)
    finished.status, finished.result = "completed", HANDED_OVER
    compacted = as_recorded(encoder_for(finished).compacted(finished))
    assert compacted == EXPECTED["compacted_client_calls"][config]


@pytest.mark.parametrize(
    ("encoding", "subject"),
    [("chat", "abc"), ("completion", "abc"), ("conversation", "abc"), ("responses", "resp_abc")],
)
def test_a_webhook_names_the_turn_as_its_client_knows_it(encoding: str, subject: str) -> None:
    assert subject_of(encoding, "abc") == subject


def test_every_encoding_is_tested_for_its_subject() -> None:
    assert sorted(ENCODINGS) == ["chat", "completion", "conversation", "responses"]
