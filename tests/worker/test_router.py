"""The router harness driven directly: a `TurnContext`, real `ChatOpenAI`, the scripted upstream.

No Redis and no API here: these tests read the harness's events straight off the async
generator, so they can stop between two events and look at what the tool is doing.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException, tool
from redis.asyncio import Redis

from shared.events import (
    Delta,
    Error,
    Event,
    LlmCallComplete,
    LlmPrompt,
    ToolCall,
    ToolProgress,
    ToolResult,
)
from shared.requests import AgentRequest
from tests.support.stack import make_settings
from tests.support.upstream import Reply, ScriptedUpstream, tool_names
from worker.calls import stream_events
from worker.context import TurnContext
from worker.harness.router import RESPOND_TOOL_NAME, ROUTER_PROMPT, router_harness
from worker.harness.tool_call import cut_for_stream
from worker.llm import LlmError, build_models
from worker.tools import default_tools, get_reporter
from worker.tools.runtime import ToolRuntime, get_runtime


def make_ctx(
    upstream: ScriptedUpstream,
    tools: Sequence[BaseTool] | None = None,
    question: str = "What is 6 * 7?",
    trace: bool = True,
    **overrides: Any,
) -> TurnContext:
    settings = make_settings(upstream, **overrides)
    models = build_models(settings)
    request = AgentRequest(messages=[{"role": "user", "content": question}], trace=trace)
    return TurnContext.for_request(
        "turn-router-test",
        request,
        settings,
        models.router,
        models.responder,
        tools=default_tools() if tools is None else tools,
    )


async def run(ctx: TurnContext) -> list[Event]:
    """What the router's stream shows (worker/calls.py `stream_events`), in order."""
    return [event async for item in router_harness(ctx) for event in stream_events(item)]


def kinds(events: Sequence[Event]) -> list[str]:
    return [event.type for event in events]


def only(events: Sequence[Event], kind: type[Event]) -> list[Any]:
    return [event for event in events if isinstance(event, kind)]


async def test_prompts_are_traced_only_when_the_client_asked(upstream: ScriptedUpstream) -> None:
    untraced = await run(make_ctx(upstream, trace=False))
    traced = await run(make_ctx(upstream, trace=True))
    assert [p.messages for p in only(untraced, LlmPrompt)] == [[]]
    assert [len(p.messages) for p in only(traced, LlmPrompt)] == [2]


async def test_a_tool_call_runs_and_its_result_goes_back_to_the_router(
    upstream: ScriptedUpstream,
) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    ctx = make_ctx(upstream)
    events = await run(ctx)

    assert kinds(events) == [
        "llm_prompt",
        "llm_call_complete",
        "tool_call",
        "tool_progress",
        "tool_progress",
        "tool_result",
        "llm_prompt",
        "llm_call_complete",
    ]
    (call,) = only(events, ToolCall)
    (result,) = only(events, ToolResult)
    progress = only(events, ToolProgress)
    assert (call.name, json.loads(call.arguments), call.index) == (
        "calculator",
        {"expression": "6 * 7"},
        0,
    )
    assert [p.phase for p in progress] == ["step", "complete"]
    assert {p.tool_call_id for p in progress} == {call.id} == {result.tool_call_id}
    assert (result.content, result.truncated) == ("42", False)

    prompts = only(events, LlmPrompt)
    assert [p.stage for p in prompts] == ["router", "router"]
    assert prompts[0].messages[0] == {"role": "system", "content": ROUTER_PROMPT}
    assert prompts[0].messages[1:] == [{"role": "user", "content": "What is 6 * 7?"}]
    assert all(c.stage == "router" and c.usage for c in only(events, LlmCallComplete))

    first, second = upstream.router_requests
    assert tool_names(first) == [*(t.name for t in default_tools()), RESPOND_TOOL_NAME]
    respond = next(t for t in first["tools"] if t["function"]["name"] == RESPOND_TOOL_NAME)
    assert "ready for the final answer" in respond["function"]["description"]
    # The second call sees the first's tool call and its result.
    assistant, tool_message = second["messages"][-2:]
    assert assistant["tool_calls"][0]["id"] == call.id
    assert tool_message == {"role": "tool", "tool_call_id": call.id, "content": "42"}

    assert ctx.tool_calls == [{"id": call.id, "name": "calculator", "arguments": call.arguments}]
    assert ctx.tool_outputs == [{"id": call.id, "name": "calculator", "content": "42"}]
    ai, tool_msg = ctx.tool_messages
    assert isinstance(ai, AIMessage) and [c["name"] for c in ai.tool_calls] == ["calculator"]
    assert isinstance(tool_msg, ToolMessage) and tool_msg.content == "42"
    assert ctx.usage["total_tokens"] > 0


async def test_respond_is_never_an_event(upstream: ScriptedUpstream) -> None:
    ctx = make_ctx(upstream)
    events = await run(ctx)
    assert kinds(events) == ["llm_prompt", "llm_call_complete"]
    assert ctx.tool_messages == [] and ctx.tool_calls == []
    assert not only(events, ToolCall) and not only(events, ToolResult)


async def test_a_text_answer_without_tools_ends_the_loop(upstream: ScriptedUpstream) -> None:
    upstream.script_router(Reply.text("I would just answer."))
    ctx = make_ctx(upstream)
    events = await run(ctx)
    assert kinds(events) == ["llm_prompt", "llm_call_complete"]
    assert len(upstream.router_requests) == 1


async def test_respond_next_to_a_tool_call_runs_the_tool_and_stops(
    upstream: ScriptedUpstream,
) -> None:
    upstream.script_router(
        Reply.tool_calls([("get_time", {"timezone": "UTC"}), (RESPOND_TOOL_NAME, {})])
    )
    ctx = make_ctx(upstream)
    events = await run(ctx)
    assert [e.name for e in only(events, ToolCall)] == ["get_time"]
    assert len(upstream.router_requests) == 1
    ai = ctx.tool_messages[0]
    assert isinstance(ai, AIMessage) and [c["name"] for c in ai.tool_calls] == ["get_time"]


async def test_tool_call_indexes_count_across_router_steps(upstream: ScriptedUpstream) -> None:
    upstream.script_router(
        Reply.tool_calls(
            [("calculator", {"expression": "1 + 1"}), ("calculator", {"expression": "2 + 2"})]
        )
    )
    upstream.script_router(Reply.tool_calls([("get_time", {"timezone": "Europe/Paris"})]))
    events = await run(make_ctx(upstream))
    calls = only(events, ToolCall)
    assert [c.index for c in calls] == [0, 1, 2]
    assert len({c.id for c in calls}) == 3
    assert [r.content for r in only(events, ToolResult)][:2] == ["2", "4"]


async def test_an_unknown_tool_answers_an_error_and_the_loop_goes_on(
    upstream: ScriptedUpstream,
) -> None:
    upstream.script_router(Reply.tool_calls([("teleport", {"to": "Mars"})]))
    ctx = make_ctx(upstream)
    events = await run(ctx)
    (result,) = only(events, ToolResult)
    assert result.content.startswith("Error: unknown tool 'teleport'")
    known = ", ".join(sorted(t.name for t in default_tools()))
    assert f"Available tools: {known}." in result.content
    assert not only(events, Error)  # the model's mistake, not a failure of Bernard's
    fed_back = upstream.router_requests[1]["messages"][-1]
    assert fed_back["role"] == "tool" and fed_back["content"] == result.content
    assert len(upstream.router_requests) == 2


async def test_arguments_failing_the_schema_answer_an_error(upstream: ScriptedUpstream) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", {"expr": "1 + 1"})]))
    events = await run(make_ctx(upstream))
    (call,) = only(events, ToolCall)
    (result,) = only(events, ToolResult)
    assert json.loads(call.arguments) == {"expr": "1 + 1"}
    assert result.content == (
        "Error: invalid arguments for tool 'calculator': expression: Field required"
    )
    assert len(upstream.router_requests) == 2


async def test_arguments_that_are_not_json_answer_an_error(upstream: ScriptedUpstream) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", '{"expression": "1 +')]))
    ctx = make_ctx(upstream)
    events = await run(ctx)
    (call,) = only(events, ToolCall)
    (result,) = only(events, ToolResult)
    assert call.arguments == '{"expression": "1 +'
    assert result.content.startswith("Error: invalid arguments for tool 'calculator'")
    assert "not a JSON object" in result.content
    # The prompt stays valid: the call and its error answer share the id.
    second = upstream.router_requests[1]["messages"]
    assert second[-2]["tool_calls"][0]["id"] == second[-1]["tool_call_id"] == call.id


async def test_a_tool_that_raises_answers_an_error_and_reports_it(
    upstream: ScriptedUpstream,
) -> None:
    @tool
    def explode(reason: str) -> str:
        """Always fails."""
        raise RuntimeError(f"kaput: {reason}")

    upstream.script_router(Reply.tool_calls([("explode", {"reason": "test"})]))
    ctx = make_ctx(upstream, tools=[explode])
    events = await run(ctx)
    assert kinds(events)[2:5] == ["tool_call", "tool_result", "error"]
    (result,) = only(events, ToolResult)
    (error,) = only(events, Error)
    assert result.content == "Error: the tool 'explode' failed: kaput: test"
    assert error.code == "tool_error" and "kaput" in error.message
    assert ctx.tool_messages[-1].status == "error"  # type: ignore[attr-defined]
    assert len(upstream.router_requests) == 2


async def test_a_tool_over_its_time_is_stopped_and_answers_an_error(
    upstream: ScriptedUpstream,
) -> None:
    stopped = asyncio.Event()

    @tool
    async def hang() -> str:
        """Never finishes on its own."""
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        return "unreachable"

    upstream.script_router(Reply.tool_calls([("hang", {})]))
    ctx = make_ctx(upstream, tools=[hang], tool_timeout_s=0.2)
    events = await run(ctx)
    (result,) = only(events, ToolResult)
    (error,) = only(events, Error)
    assert result.content == "Error: the tool 'hang' did not finish within 0.2s and was stopped"
    assert error.code == "tool_timeout"
    assert stopped.is_set(), "the tool's task must be cancelled, not left running"
    assert len(upstream.router_requests) == 2


async def test_progress_is_yielded_while_the_tool_is_still_running(
    upstream: ScriptedUpstream,
) -> None:
    release = asyncio.Event()
    finished = asyncio.Event()

    @tool
    async def fetch(url: str, config: RunnableConfig) -> str:
        """Fetch a page, slowly."""
        reporter = get_reporter(config)
        reporter.step(f"Connecting to {url}")
        reporter.progress(1, 2)
        await release.wait()
        reporter.complete("Fetched")
        finished.set()
        return "<html>"

    upstream.script_router(Reply.tool_calls([("fetch", {"url": "https://example.com"})]))
    ctx = make_ctx(upstream, tools=[fetch])
    async with aclosing(router_harness(ctx)) as events:
        seen: list[Event] = []
        while len(only(seen, ToolProgress)) < 2:
            seen.append(await anext(events))
        # Both progress events are out and the tool is still waiting: nothing was held back.
        assert not finished.is_set() and not only(seen, ToolResult)
        step, progress = only(seen, ToolProgress)
        assert (step.phase, step.message) == ("step", "Connecting to https://example.com")
        assert (progress.phase, progress.current, progress.total) == ("progress", 1, 2)
        release.set()
        rest = [event async for item in events for event in stream_events(item)]
    assert kinds(rest)[:2] == ["tool_progress", "tool_result"]
    assert only(rest, ToolResult)[0].content == "<html>"


async def test_closing_the_harness_mid_tool_cancels_the_tool(upstream: ScriptedUpstream) -> None:
    cancelled = asyncio.Event()

    @tool
    async def slow(config: RunnableConfig) -> str:
        """Takes its time."""
        get_reporter(config).step("working")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    upstream.script_router(Reply.tool_calls([("slow", {})]))
    async with aclosing(router_harness(make_ctx(upstream, tools=[slow]))) as events:
        while not isinstance(await anext(events), ToolProgress):
            pass
    assert cancelled.is_set()


async def test_the_step_limit_yields_an_error_and_ends_the_loop(
    upstream: ScriptedUpstream,
) -> None:
    for _ in range(3):
        upstream.script_router(Reply.tool_calls([("calculator", {"expression": "1 + 1"})]))
    ctx = make_ctx(upstream, max_router_steps=2)
    events = await run(ctx)
    assert len(upstream.router_requests) == 2
    assert isinstance(events[-1], Error) and events[-1].code == "router_step_limit"
    assert [c.index for c in only(events, ToolCall)] == [0, 1]
    assert len(ctx.tool_messages) == 4  # both steps' results reach the response model


async def test_long_output_is_cut_for_the_stream_and_kept_whole(
    upstream: ScriptedUpstream,
) -> None:
    @tool
    def dump() -> str:
        """A large output."""
        return "x" * 50

    upstream.script_router(Reply.tool_calls([("dump", {})]))
    ctx = make_ctx(upstream, tools=[dump], stream_tool_output_max_chars=10)
    events = await run(ctx)
    (result,) = only(events, ToolResult)
    assert result.content == "x" * 10 + "…[truncated 40 chars]"
    assert result.truncated
    assert ctx.tool_outputs[0]["content"] == "x" * 50
    assert ctx.tool_messages[-1].content == "x" * 50
    assert upstream.router_requests[1]["messages"][-1]["content"] == "x" * 50


@pytest.mark.parametrize(
    ("content", "limit", "expected"),
    [
        ("abc", 3, ("abc", False)),
        ("abcd", 3, ("abc…[truncated 1 chars]", True)),
        ("", 0, ("", False)),
    ],
)
def test_cut_for_stream(content: str, limit: int, expected: tuple[str, bool]) -> None:
    assert cut_for_stream(content, limit) == expected


async def test_an_upstream_error_raises_out_of_the_harness(upstream: ScriptedUpstream) -> None:
    upstream.script_router(Reply.error(500, "router exploded"))
    ctx = make_ctx(upstream)
    with pytest.raises(LlmError) as caught:
        await run(ctx)
    assert caught.value.code == "upstream_error" and "500" in caught.value.message


# -- calls that wait for the user: checked before the user is asked -------------------------


def write_tool(check: Any, ran: list[str]) -> BaseTool:
    """A tool that waits for confirmation, with `check` as its `confirmation_check`."""

    @tool
    async def paint(color: str) -> str:
        """Paints the wall."""
        ran.append(color)
        return f"painted {color}"

    paint.metadata = {
        "requires_confirmation": True,
        "confirmation_summary": lambda args: f"Paint the wall {args['color']}",
        "confirmation_check": check,
    }
    paint.handle_tool_error = True
    return paint


async def test_a_checked_call_is_proposed_with_the_summary_its_check_gives(
    upstream: ScriptedUpstream, redis: Redis
) -> None:
    seen: list[tuple[dict[str, Any], str]] = []

    async def check(args: dict[str, Any], config: RunnableConfig) -> str:
        seen.append((args, get_runtime(config).owner))  # it reads through the turn's runtime
        return f"Paint the north wall {args['color']} (two coats)"

    ran: list[str] = []
    upstream.script_router(Reply.tool_calls([("paint", {"color": "teal"})]))
    ctx = make_ctx(upstream, tools=[write_tool(check, ran)])
    # A Redis: a call that would wait reads its user's budget (shared/budgets.py).
    ctx.runtime = ToolRuntime(owner=f"alice-{uuid.uuid4().hex}", redis=redis, settings=ctx.settings)
    events = await run(ctx)
    assert kinds(events)[2:] == ["delta", "awaiting_confirmation"]
    assert only(events, Delta)[0].text == "Shall I paint the north wall teal (two coats)?"
    assert events[-1].summary == "Paint the north wall teal (two coats)"  # type: ignore[attr-defined]
    assert [p.summary for p in ctx.pending] == ["Paint the north wall teal (two coats)"]
    assert seen == [({"color": "teal"}, ctx.runtime.owner)] and ran == []


@pytest.mark.parametrize(
    ("fails", "problem"),
    [
        ("refuses", "Error: the wall is wet"),
        ("raises", "Error: the tool 'paint' failed: no brush"),
        ("hangs", "Error: checking the call took longer than 0.2s; try again"),
    ],
)
async def test_a_call_its_check_refuses_is_never_proposed_and_the_model_hears_why(
    fails: str, problem: str, upstream: ScriptedUpstream
) -> None:
    async def check(args: dict[str, Any], config: RunnableConfig) -> str:
        if fails == "refuses":
            raise ToolException("Error: the wall is wet")
        if fails == "raises":
            raise RuntimeError("no brush")
        await asyncio.Event().wait()
        return "unreachable"

    ran: list[str] = []
    upstream.script_router(Reply.tool_calls([("paint", {"color": "teal"})]))
    ctx = make_ctx(upstream, tools=[write_tool(check, ran)], tool_timeout_s=0.2)
    events = await run(ctx)
    assert "awaiting_confirmation" not in kinds(events) and ctx.pending == []
    (call,) = only(events, ToolCall)
    (result,) = only(events, ToolResult)
    assert (call.name, result.tool_call_id, result.is_error) == ("paint", call.id, True)
    assert result.content == problem
    assert ran == [], "a refused call never runs"
    # The router goes on: its next request holds the refusal as the call's result.
    assert len(upstream.router_requests) == 2
    tool_messages = [m for m in upstream.router_requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [problem]


async def test_a_refused_call_beside_a_good_one_is_answered_and_the_good_one_proposed(
    upstream: ScriptedUpstream,
) -> None:
    async def check(args: dict[str, Any], config: RunnableConfig) -> str:
        if args["color"] == "plaid":
            raise ToolException("Error: plaid is not a paint")
        return f"Paint the wall {args['color']}"

    ran: list[str] = []
    upstream.script_router(
        Reply.tool_calls([("paint", {"color": "plaid"}), ("paint", {"color": "teal"})])
    )
    ctx = make_ctx(upstream, tools=[write_tool(check, ran)])
    events = await run(ctx)
    assert kinds(events)[2:] == ["tool_call", "tool_result", "delta", "awaiting_confirmation"]
    assert only(events, ToolResult)[0].content == "Error: plaid is not a paint"
    assert only(events, Delta)[0].text == "Shall I paint the wall teal?"
    assert [p.summary for p in ctx.pending] == ["Paint the wall teal"]
    assert ran == [] and len(upstream.router_requests) == 1
