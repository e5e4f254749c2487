"""The offline demo chat model: streaming, usage, and its keyword tool routing."""

from __future__ import annotations

import operator
import time
from functools import reduce
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.tools import tool

from worker.demo_model import DEMO_NOTICE, DemoChatModel


@tool
def get_time(timezone: str = "UTC") -> str:
    """The current time in an IANA time zone."""
    return "12:00"


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return "42"


@tool
def respond() -> str:
    """Stop calling tools and answer the user."""
    return ""


ALL_TOOLS = [get_time, calculator, respond]


def calls(message: BaseMessage) -> list[tuple[str, dict[str, Any], str | None]]:
    assert isinstance(message, AIMessage)
    return [(c["name"], c["args"], c["id"]) for c in message.tool_calls]


async def test_streams_several_chunks_then_usage() -> None:
    model = DemoChatModel(token_delay_s=0)
    chunks = [c async for c in model.astream("What's up?")]

    texts = [c.content for c in chunks if c.content]
    assert len(texts) > 5
    total = reduce(operator.add, chunks)
    assert isinstance(total, AIMessageChunk)
    assert total.content == "".join(str(t) for t in texts)
    assert str(total.content).startswith('You said: "What\'s up?" ')
    assert str(total.content).endswith(DEMO_NOTICE)
    usage = total.usage_metadata
    assert usage is not None
    assert usage["output_tokens"] == len(texts)
    assert usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert total.response_metadata["finish_reason"] == "stop"


async def test_streaming_is_paced_by_token_delay() -> None:
    assert DemoChatModel().token_delay_s == pytest.approx(0.02)
    model = DemoChatModel(token_delay_s=0.01)
    stamps = [time.monotonic() async for _ in model.astream("hello")]
    assert stamps[-1] - stamps[0] >= 0.01 * (len(stamps) - 2)


def test_sync_stream_and_invoke_agree() -> None:
    model = DemoChatModel(token_delay_s=0)
    streamed = reduce(operator.add, model.stream("Tell me a joke"))
    invoked = model.invoke("Tell me a joke")
    assert invoked.content == streamed.content
    assert invoked.usage_metadata == streamed.usage_metadata
    assert model._llm_type == "bernard-demo"


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("What time is it?", [("get_time", {"timezone": "UTC"})]),
        ("What time is it in Europe/Paris?", [("get_time", {"timezone": "Europe/Paris"})]),
        ("what's the time in utc", [("get_time", {"timezone": "UTC"})]),
        ("What is (2 + 3) * 4?", [("calculator", {"expression": "(2 + 3) * 4"})]),
        ("compute 7*6 please", [("calculator", {"expression": "7*6"})]),
        (
            "What's the time in Asia/Tokyo, and 10 / 4?",
            [("get_time", {"timezone": "Asia/Tokyo"}), ("calculator", {"expression": "10 / 4"})],
        ),
        ("Tell me about otters", [("respond", {})]),
        ("What happened on 2024-01-05?", [("respond", {})]),
    ],
)
async def test_routes_the_question_to_a_tool(
    question: str, expected: list[tuple[str, dict[str, Any]]]
) -> None:
    message = await DemoChatModel().bind_tools(ALL_TOOLS).ainvoke(question)
    ids = [f"call_demo_{i + 1}" for i in range(len(expected))]
    assert calls(message) == [(n, a, i) for (n, a), i in zip(expected, ids, strict=True)]
    assert message.content == ""
    assert message.response_metadata["finish_reason"] == "tool_calls"


async def test_routes_to_respond_once_tools_have_answered() -> None:
    history: list[BaseMessage] = [
        HumanMessage("What time is it?"),
        AIMessage("", tool_calls=[{"name": "get_time", "args": {}, "id": "call_demo_1"}]),
        ToolMessage("12:00", tool_call_id="call_demo_1", name="get_time"),
    ]
    message = await DemoChatModel().bind_tools(ALL_TOOLS).ainvoke(history)
    assert calls(message) == [("respond", {}, "call_demo_2")]


async def test_without_respond_tool_answers_in_text() -> None:
    model = DemoChatModel(token_delay_s=0).bind_tools([get_time, calculator])
    message = await model.ainvoke("Tell me about otters")
    assert message.tool_calls == []
    assert DEMO_NOTICE in str(message.content)


async def test_tool_choice_forces_a_tool_or_none() -> None:
    model = DemoChatModel()
    forced = await model.bind_tools(ALL_TOOLS, tool_choice="respond").ainvoke("What time is it?")
    assert calls(forced) == [("respond", {}, "call_demo_1")]
    none = await model.bind_tools(ALL_TOOLS, tool_choice="none").ainvoke("What time is it?")
    assert calls(none) == []


async def test_streamed_tool_calls_match_invoke() -> None:
    model = DemoChatModel(token_delay_s=0).bind_tools(ALL_TOOLS)
    question = "time in America/New_York and 2 ** 8?"
    total = reduce(operator.add, [c async for c in model.astream(question)])
    invoked = await model.ainvoke(question)
    assert calls(total) == calls(invoked)
    assert total.usage_metadata is not None and total.usage_metadata["output_tokens"] > 0


async def test_answer_reports_tool_results() -> None:
    history: list[BaseMessage] = [
        HumanMessage("old question"),
        AIMessage("old answer"),
        HumanMessage("What time is it in Europe/Paris, and what is 6*7?"),
        AIMessage(
            "",
            tool_calls=[
                {"name": "get_time", "args": {"timezone": "Europe/Paris"}, "id": "call_demo_1"},
                {"name": "calculator", "args": {"expression": "6*7"}, "id": "call_demo_2"},
            ],
        ),
        ToolMessage("2026-01-01T12:00:00+01:00", tool_call_id="call_demo_1"),
        ToolMessage("42", tool_call_id="call_demo_2"),
    ]
    chunks = [c async for c in DemoChatModel(token_delay_s=0).astream(history)]
    text = "".join(str(c.content) for c in chunks)
    assert "The time in Europe/Paris is 2026-01-01T12:00:00+01:00." in text
    assert "The result of 6*7 is 42." in text
    assert text.endswith(DEMO_NOTICE)


def test_tool_errors_are_reported() -> None:
    history: list[BaseMessage] = [
        HumanMessage("What is 1/0?"),
        AIMessage(
            "", tool_calls=[{"name": "calculator", "args": {"expression": "1/0"}, "id": "c"}]
        ),
        ToolMessage("Error: division by zero", tool_call_id="c", status="error"),
    ]
    text = str(DemoChatModel().invoke(history).content)
    assert "The calculator tool reported a problem: Error: division by zero." in text
