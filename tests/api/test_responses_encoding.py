"""api/encodings/responses.py event by event: what the Responses stream carries for the
events no client test reaches yet (the client's own tool calls), the numbering a resumed
encoder reproduces, and a paused turn's items."""

from __future__ import annotations

import json
from typing import Any

from api.encoding import Named
from api.encodings.responses import ResponsesEncoder
from shared.endings import completed
from shared.events import (
    AwaitingConfirmation,
    ClientToolCall,
    Delta,
    Done,
    Event,
    Start,
    ToolCall,
    ToolProgress,
    ToolResult,
)
from shared.requests import AgentRequest, Delivery, TurnRequest
from shared.results import TurnResult
from shared.turn_record import TurnRecord

USAGE = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}


def record() -> TurnRecord:
    request = TurnRequest(AgentRequest([]), Delivery("responses"))
    return TurnRecord(id="t1", owner="o", request=request, model="bernard-v1", created_at=1700.0)


def encoded(events: list[Event], starting_after: int = -1) -> list[tuple[str, dict[str, Any]]]:
    encoder = ResponsesEncoder(record(), starting_after=starting_after)
    out = []
    for event in events:
        for frame in encoder.frames(event):
            assert isinstance(frame, Named)
            out.append((frame.event, json.loads(frame.data)))
    return out


def test_a_client_tool_call_is_a_function_call_item() -> None:
    frames = encoded(
        [ClientToolCall(id="call_9", name="get_weather", arguments='{"city":"Oslo"}', index=0)]
    )
    item = {
        "id": "fc_call_9",
        "type": "function_call",
        "call_id": "call_9",
        "name": "get_weather",
        "arguments": '{"city":"Oslo"}',
        "status": "completed",
    }
    where = {"item_id": "fc_call_9", "output_index": 0}
    assert frames == [
        (
            "response.output_item.added",
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "arguments": "", "status": "in_progress"},
                "sequence_number": 0,
            },
        ),
        (
            "response.function_call_arguments.delta",
            {
                "type": "response.function_call_arguments.delta",
                **where,
                "delta": '{"city":"Oslo"}',
                "sequence_number": 1,
            },
        ),
        (
            "response.function_call_arguments.done",
            {
                "type": "response.function_call_arguments.done",
                **where,
                "name": "get_weather",
                "arguments": '{"city":"Oslo"}',
                "sequence_number": 2,
            },
        ),
        (
            "response.output_item.done",
            {
                "type": "response.output_item.done",
                "output_index": 0,
                "item": item,
                "sequence_number": 3,
            },
        ),
    ]


def test_a_resumed_encoder_gives_exactly_the_events_after_its_number() -> None:
    events: list[Event] = [
        Start(),
        ToolCall(id="c1", name="add", arguments='{"a": 1}', index=0),
        ToolProgress(tool_call_id="c1", tool="add", phase="progress", message="half"),
        ToolResult(tool_call_id="c1", name="add", content="2", index=0),
        Delta(text="It is "),
        Delta(text="2."),
        completed("stop", USAGE),
    ]
    full = encoded(events)
    assert [body["sequence_number"] for _, body in full] == list(range(len(full)))
    for n in range(len(full)):
        assert encoded(events, starting_after=n) == full[n + 1 :], n
    assert full[-1][1]["response"]["output"][1]["content"][0]["text"] == "It is 2."


def test_a_paused_turn_completes_with_its_approval_request() -> None:
    awaiting = AwaitingConfirmation(
        confirmation_id="conf_1",
        tool_call={"id": "c2", "name": "save_note", "arguments": '{"text": "x"}'},
        summary="Remember x",
        expires_at=1700000100.5,
    )
    paused = Done(status="awaiting_confirmation", finish_reason="stop", usage=USAGE)
    frames = encoded([Start(), awaiting, paused])
    request = {
        "id": "conf_1",
        "type": "mcp_approval_request",
        "server_label": "bernard",
        "name": "save_note",
        "arguments": '{"text": "x"}',
    }
    assert [name for name, _ in frames] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    assert frames[3][1]["item"] == request
    assert frames[-1][1]["response"]["output"] == [request]
    assert frames[-1][1]["response"]["status"] == "completed"
    result = TurnResult(pending=[{"confirmation_id": "conf_1", "tool_call": awaiting.tool_call}])
    assert ResponsesEncoder(record()).answer(paused, [], result)["output"] == [request]
