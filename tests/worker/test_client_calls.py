"""The router with the client's own tools, driven directly (worker/harness/router.py,
worker/harness/client_calls.py): a `TurnContext`, real `ChatOpenAI`, the scripted upstream.

What the clients' tests (tests/test_client_tools.py) cannot see from outside: which calls
the router hands over and which it keeps, what it leaves on the context for the record
keeper, and what it does with calls it cannot hand over.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool, tool

from shared.events import ClientToolCall, Event, Memory, ToolCall, ToolResult
from shared.requests import AgentRequest
from tests.support.stack import make_settings
from tests.support.upstream import Reply, ScriptedUpstream, tool_names
from worker.calls import stream_events
from worker.context import TurnContext
from worker.harness.memory import memory_harness
from worker.harness.router import router_harness
from worker.llm import build_models
from worker.tokens import counter_for
from worker.tools import default_tools


def function(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": {}}},
    }


def make_ctx(
    upstream: ScriptedUpstream,
    client_tools: list[dict[str, Any]],
    *,
    tools: list[BaseTool] | None = None,
    settings: dict[str, Any] | None = None,
    **options: Any,
) -> TurnContext:
    configured = make_settings(upstream, **(settings or {}))
    models = build_models(configured)
    request = AgentRequest(
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        client_tools=client_tools,
        **options,
    )
    return TurnContext.for_request(
        "turn-client-calls",
        request,
        configured,
        models.router,
        models.responder,
        tools=default_tools() if tools is None else tools,
    )


async def run(ctx: TurnContext) -> list[Event]:
    return [event async for item in router_harness(ctx) for event in stream_events(item)]


async def test_the_client_calls_end_the_router_and_are_left_for_the_result_and_the_records(
    upstream: ScriptedUpstream,
) -> None:
    upstream.script_router(
        Reply.tool_calls(
            [("calculator", {"expression": "2+2"}), ("get_weather", {"city": "Oslo"})],
            ids=["own1", "cli1"],
        )
    )
    ctx = make_ctx(upstream, [function("get_weather")])
    events = await run(ctx)
    # Bernard's call of the same step ran first; then the client's was handed over, and no
    # second router call was made.
    assert [e.type for e in events] == [
        "llm_prompt",
        "llm_call_complete",
        "tool_call",
        "tool_progress",
        "tool_progress",
        "tool_result",
        "client_tool_call",
    ]
    assert [e for e in events if isinstance(e, ClientToolCall)] == [
        ClientToolCall(id="cli1", name="get_weather", arguments='{"city": "Oslo"}', index=0)
    ]
    assert len(upstream.router_requests) == 1
    assert ctx.finish_reason == "tool_calls" and ctx.handed_over
    assert ctx.result().client_calls == [
        {
            "id": "cli1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
    ]
    assert [c["id"] for c in ctx.result().tool_calls] == ["own1"]
    # What the records store of the turn: the step's message, both calls in it, and the
    # result of Bernard's; the client's result comes with its follow-up.
    step, result = ctx.tool_messages
    assert isinstance(step, AIMessage) and [c["id"] for c in step.tool_calls] == ["own1", "cli1"]
    assert isinstance(result, ToolMessage) and result.tool_call_id == "own1"


async def test_a_client_tool_named_like_one_of_bernards_is_not_offered_and_bernards_runs(
    upstream: ScriptedUpstream,
) -> None:
    """The API refuses such a name (tests/test_client_tool_refusals.py) against the tools
    the workers published; a worker whose tools differ keeps its own."""
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6*7"})]))
    ctx = make_ctx(upstream, [function("calculator"), function("get_weather")])
    events = await run(ctx)
    assert tool_names(upstream.router_requests[0]).count("calculator") == 1
    assert "get_weather" in tool_names(upstream.router_requests[0])
    assert [e.content for e in events if isinstance(e, ToolResult)] == ["42"]
    assert not ctx.handed_over


async def test_a_client_call_whose_arguments_are_not_an_object_goes_back_to_the_model(
    upstream: ScriptedUpstream,
) -> None:
    upstream.script_router(Reply.tool_calls([("get_weather", "{not json")], ids=["bad"]))
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["good"]))
    ctx = make_ctx(upstream, [function("get_weather")])
    events = await run(ctx)
    (answered,) = [e for e in events if isinstance(e, ToolResult)]
    assert answered.tool_call_id == "bad" and answered.is_error
    assert answered.content.startswith("Error: invalid arguments for tool 'get_weather'")
    assert [(e.id, e.index) for e in events if isinstance(e, ClientToolCall)] == [("good", 0)]


async def test_a_call_that_would_wait_for_the_user_is_not_proposed_beside_client_calls(
    upstream: ScriptedUpstream,
) -> None:
    ran: list[str] = []

    @tool
    async def paint(color: str) -> str:
        """Paints the wall."""
        ran.append(color)
        return f"painted {color}"

    paint.metadata = {"requires_confirmation": True}
    upstream.script_router(
        Reply.tool_calls(
            [("paint", {"color": "teal"}), ("get_weather", {"city": "Oslo"})], ids=["p", "w"]
        )
    )
    ctx = make_ctx(upstream, [function("get_weather")], tools=[paint])
    events = await run(ctx)
    assert not ctx.paused and ran == []
    (refused,) = [e for e in events if isinstance(e, ToolResult)]
    assert refused.tool_call_id == "p" and "the turn ended on the client's tool calls" in (
        refused.content
    )
    assert [e.id for e in events if isinstance(e, ClientToolCall)] == ["w"]
    assert [e.id for e in events if isinstance(e, ToolCall)] == ["p"]


async def test_the_same_call_under_tool_choice_none_is_an_unknown_tool(
    upstream: ScriptedUpstream,
) -> None:
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["n"]))
    ctx = make_ctx(upstream, [function("get_weather")], tool_choice="none")
    events = await run(ctx)
    assert not [e for e in events if isinstance(e, ClientToolCall)]
    (result,) = [e for e in events if isinstance(e, ToolResult)]
    assert result.is_error and "unknown tool 'get_weather'" in result.content
    first = upstream.router_requests[0]
    assert "get_weather" not in tool_names(first) and "tool_choice" not in first


async def test_parallel_calls_off_keeps_the_first_client_call_alone(
    upstream: ScriptedUpstream,
) -> None:
    upstream.script_router(
        Reply.tool_calls(
            [("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Bergen"})],
            ids=["a", "b"],
        )
    )
    ctx = make_ctx(upstream, [function("get_weather")], parallel_tool_calls=False)
    events = await run(ctx)
    handed = [e for e in events if isinstance(e, ClientToolCall)]
    assert [(e.id, json.loads(e.arguments)) for e in handed] == [("a", {"city": "Oslo"})]
    # The message the records keep holds only the call handed over: no call stays open.
    (step,) = ctx.tool_messages
    assert isinstance(step, AIMessage) and [c["id"] for c in step.tool_calls] == ["a"]
    assert upstream.router_requests[0]["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("tool_choice", "sent"),
    [
        ("required", {"type": "any", "disable_parallel_tool_use": True}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        ),
    ],
)
async def test_an_anthropic_router_gets_the_choice_in_its_words_and_hands_the_call_over(
    upstream: ScriptedUpstream, tool_choice: Any, sent: dict[str, Any]
) -> None:
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["a1"]))
    anthropic = {
        "router_provider": "anthropic",
        "anthropic_base_url": upstream.anthropic_base_url,
        "anthropic_api_key": "test-key",
    }
    ctx = make_ctx(
        upstream,
        [function("get_weather")],
        settings=anthropic,
        tool_choice=tool_choice,
        parallel_tool_calls=False,
    )
    events = await run(ctx)
    assert [(e.id, e.name) for e in events if isinstance(e, ClientToolCall)] == [
        ("a1", "get_weather")
    ]
    (request,) = upstream.router_requests
    assert request["tool_choice"] == sent
    assert "get_weather" in tool_names(request)


async def test_the_client_tools_schemas_are_counted_in_the_prompt_budget(
    upstream: ScriptedUpstream,
) -> None:
    """The router's prompt carries them: the history's share is smaller by their size."""
    big = function("get_weather")
    big["function"]["description"] = "weather " * 500

    async def memory_of(client_tools: list[dict[str, Any]]) -> Memory:
        ctx = make_ctx(upstream, client_tools)
        (event,) = [e async for e in memory_harness(ctx) if isinstance(e, Memory)]
        return event

    without, beside = await memory_of([]), await memory_of([big])
    count = counter_for(make_settings(upstream).response_model)
    size = count(orjson.dumps(big).decode())
    assert size > 500
    assert without.budget - beside.budget == size
    assert beside.tokens - without.tokens == size
