"""worker/calls.py and worker/turn.py: a call described once, and every item of a turn handed
to every sink, in order; a failure closes every sink."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from shared.events import Delta, Error, Event, LlmCallComplete, LlmPrompt, ToolCall, ToolResult
from tests.support.upstream import Reply, ScriptedUpstream
from tests.worker.test_router import make_ctx
from worker.calls import (
    Item,
    ModelCallEnded,
    ModelCallStarted,
    ToolCallEnded,
    ToolOutcome,
    stream_events,
)
from worker.llm import LlmError, LlmResult
from worker.turn import run_to_sinks

PROMPT = LlmPrompt(stage="router", model="m", messages=[])
COMPLETE = LlmCallComplete(stage="router", model="m", latency_ms=3.0)
CALL = ToolCall(id="c1", name="clock", arguments="{}", index=0)
SHOWN = ToolResult(tool_call_id="c1", name="clock", content="noo…[truncated 2 chars]", index=0)
FAILURE = Error(message="the tool 'clock' failed: stopped", code="tool_error")
WHOLE = ToolMessage(content="noon", tool_call_id="c1", name="clock")


@pytest.mark.parametrize(
    ("item", "shown"),
    [
        (Delta(text="hi"), [Delta(text="hi")]),
        (ModelCallStarted(PROMPT, [HumanMessage("hi")]), [PROMPT]),
        (ModelCallEnded(COMPLETE, LlmResult(AIMessage(content=""), None, 3.0)), [COMPLETE]),
        (CALL, [CALL]),
        (ToolCallEnded(CALL, SHOWN, ToolOutcome(WHOLE)), [SHOWN]),
        (ToolCallEnded(CALL, SHOWN, ToolOutcome(WHOLE, FAILURE)), [SHOWN, FAILURE]),
    ],
)
def test_the_stream_shows_of_each_item_its_event_and_a_failed_tools_error(
    item: Item, shown: list[Event]
) -> None:
    assert list(stream_events(item)) == shown


class Collecting:
    """A sink that keeps what it was given."""

    def __init__(self) -> None:
        self.items: list[Item] = []
        self.failed: list[BaseException] = []

    async def take(self, item: Item) -> None:
        self.items.append(item)

    async def fail(self, error: BaseException) -> None:
        self.failed.append(error)


def names(items: list[Item]) -> list[str]:
    return [type(item).__name__ for item in items]


async def test_every_sink_takes_every_item_of_the_turn_in_order(
    upstream: ScriptedUpstream,
) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    upstream.script(Reply.text("42"))
    ctx = make_ctx(upstream)
    first, second = Collecting(), Collecting()
    await run_to_sinks(ctx, [first, second])
    assert first.items == second.items
    assert names(first.items) == [
        "Memory",
        "ModelCallStarted",  # the router
        "ModelCallEnded",
        "ToolCall",
        "ToolProgress",
        "ToolProgress",
        "ToolCallEnded",
        "ModelCallStarted",  # the router again: it responds
        "ModelCallEnded",
        "ModelCallStarted",  # the response
        "Delta",
        "ModelCallEnded",
    ]
    ended: Any = first.items[6]
    assert ended.outcome.content == "42" and ended.result.content == "42"
    assert first.failed == second.failed == []


async def test_a_failed_call_closes_every_sink_with_its_error(upstream: ScriptedUpstream) -> None:
    upstream.script_router(Reply.error(500, "the model is down"))
    ctx = make_ctx(upstream)
    first, second = Collecting(), Collecting()
    with pytest.raises(LlmError) as raised:
        await run_to_sinks(ctx, [first, second])
    assert names(first.items) == ["Memory", "ModelCallStarted"]
    assert first.failed == second.failed == [raised.value]
