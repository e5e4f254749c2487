"""Anthropic's Messages API as a model provider: the real client (langchain-anthropic over the
anthropic SDK) against the scripted server's Anthropic wire format, alone and through the
whole pipeline."""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from shared.settings import Settings
from tests.support.sse import collect, text_of
from tests.support.sse import frames as frames_of
from tests.support.stack import make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream
from worker.harness.router import RESPOND_TOOL
from worker.llm import LlmResult, build_models
from worker.tools import calculator, default_tools


def anthropic_settings(upstream: ScriptedUpstream, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "anthropic_base_url": upstream.anthropic_base_url,
        "anthropic_api_key": "test-key",
        "router_provider": "anthropic",
        "response_provider": "anthropic",
        "router_model": "claude-router",
        "response_model": "claude-answer",
    }
    return make_settings(upstream, **{**values, **overrides})


async def stream_all(settings: Settings, **kwargs: Any) -> tuple[list[Any], LlmResult]:
    """The streamed items of one response call, and the result beside them."""
    models = build_models(settings)
    try:
        async with aclosing(models.responder.stream([HumanMessage("hi")], **kwargs)) as stream:
            items = [item async for item in stream]
        return items, stream.result
    finally:
        await models.aclose()


async def test_text_streams_delta_by_delta_with_usage_and_stop_reason(
    upstream: ScriptedUpstream,
) -> None:
    upstream.script(Reply.text(["Hel", "lo", " there"], usage=(11, 3)))
    items, result = await stream_all(anthropic_settings(upstream))
    assert items == ["Hel", "lo", " there"]
    assert result.message.content == "Hello there"
    assert result.usage == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    assert result.finish_reason == "stop"
    sent = upstream.requests[0]
    assert sent["model"] == "claude-answer" and sent["stream"] is True
    assert sent["messages"] == [{"role": "user", "content": "hi"}]


async def test_max_tokens_cuts_the_answer_and_reports_length(upstream: ScriptedUpstream) -> None:
    upstream.script(Reply.text(["one", " two", " three"]))
    options = {"max_tokens": 2, "temperature": 0.3, "stop": ["END"], "seed": 7, "user": "u-1"}
    items, result = await stream_all(anthropic_settings(upstream), params=options)
    assert items == ["one", " two"]
    assert result.finish_reason == "length"
    sent = upstream.requests[0]
    assert (sent["max_tokens"], sent["temperature"], sent["stop_sequences"]) == (2, 0.3, ["END"])
    assert sent["metadata"] == {"user_id": "u-1"}
    assert "seed" not in sent, "an option Anthropic does not take is not sent"


async def test_a_tool_call_split_over_many_deltas_arrives_whole(upstream: ScriptedUpstream) -> None:
    arguments = {"expression": "(12 + 30) * 1000 / 7", "note": "a long enough input"}
    upstream.script(Reply.tool_calls([("calculator", arguments)], arg_chunks=12))
    items, result = await stream_all(anthropic_settings(upstream), tools=[calculator])
    calls = [item for item in items if isinstance(item, dict)]
    assert [(c["name"], c["args"]) for c in calls] == [("calculator", arguments)]
    assert result.finish_reason == "tool_calls"
    assert result.message.tool_calls == calls
    deltas = upstream.exchanges[0].chunks_sent
    assert deltas == 12, "the server really sent the input in pieces"
    assert upstream.requests[0]["tools"][0]["name"] == "calculator"


async def test_cancelling_the_stream_closes_the_upstream_connection(
    upstream: ScriptedUpstream,
) -> None:
    upstream.script(Reply.slow(interval=0.01))
    settings = anthropic_settings(upstream)
    models = build_models(settings)

    async def consume() -> None:
        async with aclosing(models.responder.stream([HumanMessage("go")])) as items:
            async for _ in items:
                pass

    task = asyncio.create_task(consume())
    try:
        await upstream.wait_requests(1)
        await asyncio.sleep(0.1)
        task.cancel()
        exchange = await upstream.wait_disconnect(timeout_s=5)
        assert exchange.disconnected_at is not None and exchange.completed_at is None
    finally:
        await models.aclose()


async def test_a_turn_runs_on_anthropic_models_through_the_whole_pipeline(
    upstream: ScriptedUpstream,
) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    upstream.script(Reply.text(["It", " is", " 42."]))
    async with run_stack(anthropic_settings(upstream)) as stack:
        frames = await collect(
            stack.client,
            "POST",
            "/v1/chat/completions",
            json={
                "model": "bernard-v1",
                "stream": True,
                "messages": [{"role": "user", "content": "What is 6 * 7?"}],
            },
        )
    assert text_of(frames) == "It is 42."
    results = [f.bernard for f in frames if f.bernard and f.bernard["type"] == "tool_result"]
    assert [r["content"] for r in results] == ["42"]
    first_router, second_router = upstream.router_requests
    assert [t["name"] for t in first_router["tools"]] == [
        *(tool.name for tool in default_tools()),
        RESPOND_TOOL["function"]["name"],
    ]
    # The router's second call carries its tool call and the result, in Anthropic's shape.
    tool_use = second_router["messages"][-2]["content"][-1]
    tool_result = second_router["messages"][-1]["content"][0]
    assert (tool_use["type"], tool_use["name"]) == ("tool_use", "calculator")
    assert (tool_result["type"], tool_result["tool_use_id"]) == ("tool_result", tool_use["id"])
    assert json.dumps(tool_result).count("42") >= 1
    assert upstream.requests[-1]["model"] == "claude-answer"


@pytest.mark.parametrize("arguments", ["[1, 2]", '"six times seven"', "42", "true"])
async def test_a_tool_input_that_is_not_an_object_goes_back_to_the_model(
    upstream: ScriptedUpstream, arguments: str
) -> None:
    """As on the OpenAI path (tests/test_agent_turn.py): a `tool_use` whose `input` is JSON
    but not an object is a call the model reads an error for, and the turn goes on,
    rather than failing with pydantic's text."""
    upstream.script_router(Reply.tool_calls([("calculator", arguments)]))
    upstream.script(Reply.text(["I could not do that."]))
    async with run_stack(anthropic_settings(upstream)) as stack:
        frames = await collect(
            stack.client,
            "POST",
            "/v1/chat/completions",
            json={
                "model": "bernard-v1",
                "stream": True,
                "messages": [{"role": "user", "content": "What is 6 * 7?"}],
            },
        )
    (call,) = [f.bernard for f in frames if f.bernard and f.bernard["type"] == "tool_call"]
    (result,) = [f.bernard for f in frames if f.bernard and f.bernard["type"] == "tool_result"]
    assert call["arguments"] == arguments
    assert result["content"] == (
        "Error: invalid arguments for tool 'calculator': the arguments are not a JSON "
        f"object: {arguments!r}"
    )
    assert text_of(frames) == "I could not do that."
    # The model read why, as the result of its own call.
    tool_result = upstream.router_requests[1]["messages"][-1]["content"][0]
    assert (tool_result["type"], tool_result["content"]) == ("tool_result", result["content"])
    assert tool_result["is_error"] is True


async def test_with_one_anthropic_model_the_routers_step_streams_the_answer(
    upstream: ScriptedUpstream,
) -> None:
    """One model for both roles: the router's own streamed text is the answer, text before
    a tool call included, and a one-tool turn makes two calls."""
    settings = anthropic_settings(upstream, response_model="claude-router")
    assert settings.roles_share_model
    gate = upstream.script(
        Reply.tool_calls(
            [("calculator", {"expression": "6 * 7"})], content="Let me see.", block_after=3
        )
    )
    upstream.script(Reply.text(["It", " is", " 42."]))
    async with (
        run_stack(settings) as stack,
        stack.client.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": "bernard-v1",
                "stream": True,
                "messages": [{"role": "user", "content": "What is 6 * 7?"}],
            },
        ) as response,
    ):
        got = []
        released = False
        async for frame in frames_of(response):
            got.append(frame)
            if text_of(got) == "Let me see." and not released:
                assert gate.blocked  # spoken while the model still writes its call
                gate.release()
                released = True
    assert text_of(got) == "Let me see.It is 42."
    first, second = upstream.requests
    assert upstream.router_requests == []
    assert first["stream"] is True and second["stream"] is True
    assert "respond" not in [t["name"] for t in first["tools"]]
    assert first["system"] == "You are Bernard, a helpful assistant."
    tool_use = second["messages"][-2]["content"]
    assert [block["type"] for block in tool_use] == ["text", "tool_use"]
