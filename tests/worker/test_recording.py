"""Record writes run in the background, in order, and a failed one is never lost."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from redis.asyncio import Redis

from shared.events import LlmCallComplete, LlmPrompt, ToolCall, ToolResult
from shared.records.call_log import CallEvent
from shared.records.keeper import RecordKeeper
from shared.records.messages import Message
from shared.requests import AgentRequest
from tests.support.stack import make_settings
from worker.calls import ModelCallEnded, ModelCallStarted, ToolCallEnded, ToolOutcome
from worker.context import TurnContext
from worker.llm import LlmResult, build_models
from worker.recording import OrderedWrites, TurnRecording, openai_messages


async def test_writes_run_in_order_without_holding_up_the_caller() -> None:
    done: list[int] = []
    gate = asyncio.Event()

    async def write(n: int) -> None:
        if n == 0:
            await gate.wait()
        done.append(n)

    writes = OrderedWrites()
    for n in range(3):
        writes.add(write(n))  # returns at once although the first write is still blocked
    await asyncio.sleep(0.01)
    assert done == []
    gate.set()
    await writes.drain()
    assert done == [0, 1, 2]


async def test_a_failed_write_surfaces_at_drain_and_stops_the_writes_behind_it() -> None:
    ran: list[str] = []

    async def fail() -> None:
        raise ConnectionError("redis went away")

    async def write(name: str) -> None:
        ran.append(name)

    writes = OrderedWrites()
    writes.add(fail())
    writes.add(write("behind"))
    with pytest.raises(ConnectionError):
        await writes.drain()
    assert ran == []


async def test_a_failed_write_surfaces_at_the_next_add() -> None:
    async def fail() -> None:
        raise ConnectionError("redis went away")

    async def write() -> None:
        raise AssertionError("must not run after a failed write")

    writes = OrderedWrites()
    writes.add(fail())
    await asyncio.sleep(0.01)
    with pytest.raises(ConnectionError):
        writes.add(write())


# -- the call log --------------------------------------------------------------------------


@pytest.fixture
async def keeper(redis: Redis) -> AsyncIterator[RecordKeeper]:
    owner = f"test-owner-{uuid.uuid4().hex}"
    yield RecordKeeper(redis, owner)
    written = [key async for key in redis.scan_iter(match=f"bernard:{{c:{owner}/*")]
    if written:
        await redis.delete(*written)


Writes = list[tuple[list[str], list[str]]]


async def _recording(keeper: RecordKeeper) -> tuple[TurnRecording, Writes, str]:
    """A turn's recording, and each write it makes as it makes it: the call records it
    carries, and the roles of the messages it appends."""
    conversation_id = await keeper.create_conversation(active_turn="turn-1")
    settings = make_settings()
    models = build_models(settings)
    request = AgentRequest(messages=[{"role": "user", "content": "hi"}])
    ctx = TurnContext.for_request(
        "turn-1",
        request,
        settings,
        models.router,
        models.responder,
        conversation_id=conversation_id,
    )
    ctx.content.append("hello")
    recorder = keeper.as_recorder()
    writes: Writes = []
    record_calls = recorder.record_calls
    append_messages = recorder.append_messages

    async def counted(
        conversation: str, events: Sequence[CallEvent], *, turn_id: str | None = None
    ) -> None:
        writes.append(([f"{e.entry['kind']} {e.event}" for e in events], []))
        await record_calls(conversation, events, turn_id=turn_id)

    async def counted_messages(
        conversation: str,
        messages: Sequence[Any],
        *,
        turn_id: str | None = None,
        length: int | None = None,
        calls: Sequence[CallEvent] = (),
    ) -> list[Message]:
        rows = await append_messages(
            conversation, messages, turn_id=turn_id, length=length, calls=calls
        )
        writes.append(([f"{e.entry['kind']} {e.event}" for e in calls], [r["role"] for r in rows]))
        return rows

    recorder.record_calls = counted  # type: ignore[method-assign]
    recorder.append_messages = counted_messages  # type: ignore[method-assign]
    return TurnRecording(recorder, ctx), writes, conversation_id


async def test_calls_observed_while_a_write_is_in_flight_go_out_together(
    keeper: RecordKeeper,
) -> None:
    """A router call's end and the response call's start are observed back to back, while
    the router's start is still being written: they take one write, not two. The response
    call's end goes out with the turn's answer, in its append. The log keeps every entry
    in order."""
    recording, writes, conversation_id = await _recording(keeper)
    recording.observe(started("router", "r"))
    await asyncio.sleep(0)  # the router's start goes out
    recording.observe(ended("router", "r", 1.0))
    recording.observe(started("response", "a"))
    await asyncio.sleep(0.05)
    recording.observe(ended("response", "a", 2.0))
    await asyncio.sleep(0.05)
    await recording.finish()

    assert writes == [
        (["llm started"], []),
        (["llm completed", "llm started"], []),
        (["llm completed"], ["assistant"]),
    ]
    calls = await keeper.calls(conversation_id)
    assert [(c["stage"], c["status"]) for c in calls] == [
        ("router", "completed"),
        ("response", "completed"),
    ]
    assert await keeper.messages(conversation_id) == [{"role": "assistant", "content": "hello"}]


async def test_the_last_running_tool_calls_end_goes_out_with_the_next_write(
    keeper: RecordKeeper,
) -> None:
    """Of two tool calls run at once, the one that ends first while the other still runs is
    written at once (the other may run for long); the last one's end goes out with the
    next model call's start, which follows it at once. Every call's record is complete."""
    recording, writes, conversation_id = await _recording(keeper)
    first, second = tool_call("t1", 0), tool_call("t2", 1)
    recording.observe(first)
    recording.observe(second)
    await asyncio.sleep(0.05)
    recording.observe(tool_ended(first, "4"))
    await asyncio.sleep(0.05)
    recording.observe(tool_ended(second, "5"))
    await asyncio.sleep(0.05)
    recording.observe(started("router", "r"))
    await asyncio.sleep(0.05)
    recording.observe(ended("router", "r", 1.0))
    await recording.finish()

    assert writes == [
        (["tool started", "tool started"], []),  # observed together
        (["tool completed"], []),
        (["tool completed", "llm started"], []),
        (["llm completed"], ["assistant"]),
    ]
    calls = await keeper.calls(conversation_id)
    assert [(c.get("tool_call_id"), c["status"], c.get("content")) for c in calls] == [
        ("t1", "completed", "4"),
        ("t2", "completed", "5"),
        (None, "completed", None),
    ]


def tool_call(call_id: str, index: int) -> ToolCall:
    return ToolCall(id=call_id, name="calculator", arguments='{"expression": "2+2"}', index=index)


def tool_ended(call: ToolCall, content: str) -> ToolCallEnded:
    message = ToolMessage(content=content, tool_call_id=call.id, name=call.name)
    result = ToolResult(tool_call_id=call.id, name=call.name, content=content, index=call.index)
    return ToolCallEnded(call, result, ToolOutcome(message))


def started(stage: str, model: str) -> ModelCallStarted:
    return ModelCallStarted(LlmPrompt(stage=stage, model=model, messages=[]), [])  # type: ignore[arg-type]


def ended(stage: str, model: str, latency_ms: float) -> ModelCallEnded:
    complete = LlmCallComplete(stage=stage, model=model, latency_ms=latency_ms)  # type: ignore[arg-type]
    return ModelCallEnded(complete, LlmResult(AIMessage(content=""), None, latency_ms))


async def test_langchain_messages_are_stored_in_openai_shape(keeper: RecordKeeper) -> None:
    conversation_id = await keeper.create_conversation()
    messages = [
        HumanMessage("from langchain"),
        AIMessage("", tool_calls=[{"name": "get_time", "args": {}, "id": "t1"}]),
        ToolMessage("12:00", tool_call_id="t1", name="get_time"),
    ]
    await keeper.append_messages(conversation_id, openai_messages(messages))

    assert await keeper.messages(conversation_id) == [
        {"role": "user", "content": "from langchain"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "id": "t1",
                    "function": {"name": "get_time", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "content": "12:00", "tool_call_id": "t1", "name": "get_time"},
    ]
