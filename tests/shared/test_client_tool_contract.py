"""The contract for the client's own function tools (issue 22), as both processes store and
read it: the request's tools and choice on the turn record (shared/requests.py,
shared/turn_record.py), the
`client_tool_call` event in the stream (shared/events.py), the calls on the result
(shared/results.py)."""

from __future__ import annotations

import orjson

from shared.events import ClientToolCall, decode, encode
from shared.requests import AgentRequest, Delivery, TurnRequest
from shared.results import TurnResult
from shared.turn_record import TurnRecord

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}


def test_a_requests_client_tools_and_choice_are_stored_and_read_back() -> None:
    request = TurnRequest(
        AgentRequest(
            [{"role": "user", "content": "weather?"}],
            client_tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False,
        ),
        Delivery("chat"),
    )
    fields = TurnRecord(id="t1", owner="u", request=request, model="m").to_redis()
    stored = orjson.loads(fields["request"])
    # The tools apart from the options: ending the turn drops them (shared/lifecycle.py).
    assert stored["client_tools"] == []
    assert orjson.loads(fields["tools"]) == [WEATHER]
    assert stored["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert stored["parallel_tool_calls"] is False
    raw = {k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in fields.items()}
    assert TurnRecord.from_redis(raw).request == request


def test_a_client_tool_call_comes_back_from_its_stream_entry() -> None:
    event = ClientToolCall(id="call_1", name="get_weather", arguments='{"city": "Oslo"}', index=1)
    payload = encode(event, at=3.0)
    assert orjson.loads(payload) == {
        "type": "client_tool_call",
        "id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Oslo"}',
        "index": 1,
        "at": 3.0,
    }
    assert decode(payload).event == event


def test_a_results_client_calls_are_stored_and_read_back() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    result = TurnResult(content="", finish_reason="tool_calls", client_calls=[call])
    assert TurnResult.from_json(orjson.loads(orjson.dumps(result))) == result
