"""The Responses API (`/v1/responses`, api/routes/responses.py) through the official `openai`
SDK, unmodified, against a running API and worker and the scripted upstream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage

from shared.notes import NoteStore
from tests.support.client_tools import WEATHER
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream

NOTE = ("save_note", {"text": "the door code is 1234"})


# The approval tests save a note: their user is their own, or the note would be in every
# later prompt of the session's shared user (its notes are part of each prompt).
NOTE_USER = "responses-notes"


@pytest.fixture
async def note_stack(upstream: ScriptedUpstream) -> AsyncIterator[Stack]:
    settings = make_settings(upstream, api_keys=f"key-notes:{NOTE_USER}")
    async with run_stack(settings) as running:
        yield running


async def notes_of(stack: Stack) -> list[str]:
    store = NoteStore(stack.redis, NOTE_USER, retention_s=60)
    return [note.text for note in await store.all()]


def types_of(events: list[Any]) -> list[str]:
    return [event.type for event in events]


async def test_create_answers_one_response(stack: Stack, upstream: ScriptedUpstream) -> None:
    upstream.script(Reply.text("Plain answer.", usage=(3, 2)))
    response = await stack.openai().responses.create(model="bernard-v1", input="hello")
    assert response.object == "response"
    assert response.status == "completed"
    assert response.id.startswith("resp_")
    assert response.output_text == "Plain answer."
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 2)
    assert response.usage.total_tokens == 5
    assert response.error is None and response.incomplete_details is None
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert upstream.requests[-1]["messages"][-1] == {"role": "user", "content": "hello"}


async def test_instructions_and_input_items_reach_the_model(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text("Oui."))
    response = await stack.openai().responses.create(
        model="bernard-v1",
        instructions="Answer in French.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Yes?"}]}],
        metadata={"k": "v"},
        temperature=0.5,
        max_output_tokens=50,
    )
    assert response.output_text == "Oui."
    assert response.instructions == "Answer in French."
    assert response.metadata == {"k": "v"}
    assert response.temperature == 0.5 and response.max_output_tokens == 50
    sent = upstream.requests[-1]
    assert {"role": "user", "content": "Yes?"} in sent["messages"]
    assert any("Answer in French." in str(m.get("content")) for m in sent["messages"])
    assert sent["temperature"] == 0.5


async def test_what_the_agents_sdk_sends_by_default_is_taken(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text("Fine."))
    body = {
        "model": "bernard-v1",
        "input": "hello",
        "include": [],
        "text": {"format": {"type": "text"}},
    }
    response = await stack.client.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["output"][0]["content"][0]["text"] == "Fine."


async def test_a_long_input_is_taken_up_to_the_message_limit(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text("Long."))
    long = "x" * 5000
    response = await stack.openai().responses.create(model="bernard-v1", input=long)
    assert response.output_text == "Long."
    assert upstream.requests[-1]["messages"][-1] == {"role": "user", "content": long}
    limit = stack.settings.max_message_chars
    upstream.script(Reply.text("At the limit."))
    parts = [{"type": "input_text", "text": "x" * limit}]
    at_limit = await stack.openai().responses.create(
        model="bernard-v1",
        input=[{"role": "user", "content": parts}],  # type: ignore[list-item, misc]
    )
    assert at_limit.output_text == "At the limit."
    with pytest.raises(openai.BadRequestError) as over:
        await stack.openai().responses.create(model="bernard-v1", input="x" * (limit + 1))
    assert over.value.param == "input[0]"  # type: ignore[attr-defined]


async def test_a_length_cut_is_incomplete(stack: Stack, upstream: ScriptedUpstream) -> None:
    upstream.script(Reply.text([f"w{i} " for i in range(10)]))
    response = await stack.openai().responses.create(
        model="bernard-v1", input="hello", max_output_tokens=3
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "w0 w1 w2 "


async def test_create_streams_openais_event_sequence(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(["Bonjour", " à", " tous"], usage=(4, 3)))
    stream = await stack.openai().responses.create(model="bernard-v1", input="hello", stream=True)
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = types_of(events)
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1  # the worker may join deltas that piled up
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == (
        "Bonjour à tous"
    )
    final = events[-1].response
    assert final.output_text == "Bonjour à tous"
    assert final.usage is not None and final.usage.total_tokens == 7
    assert final.id == events[0].response.id


async def test_the_stream_helper_gives_the_final_response(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(["one", " two"], usage=(2, 2)))
    async with stack.openai().responses.stream(model="bernard-v1", input="hello") as stream:
        texts = [
            event.delta async for event in stream if event.type == "response.output_text.delta"
        ]
        final = await stream.get_final_response()
    assert "".join(texts) == "one two"
    assert final.output_text == "one two"
    assert final.status == "completed"
    assert final.usage is not None and final.usage.total_tokens == 4


async def test_a_failed_turn_streams_response_failed(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.error(500, "boom"))
    stream = await stack.openai().responses.create(model="bernard-v1", input="hello", stream=True)
    events = [event async for event in stream]
    assert types_of(events) == ["response.created", "response.in_progress", "response.failed"]
    failed = events[-1].response
    assert failed.status == "failed"
    assert failed.error is not None and failed.error.code == "upstream_error"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "respond"}]}, "tools[0].name"),
        ({"tools": [{"type": "function", "name": "calculator"}]}, "tools[0].name"),
        ({"tool_choice": {"type": "function", "name": "nothing"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, None),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"text": {"format": {"type": "json_schema"}}}, "text"),
        ({"temperature": 3}, "temperature"),
    ],
)
async def test_what_bernard_cannot_honour_is_a_400_naming_it(
    stack: Stack, extra: dict[str, Any], param: str | None
) -> None:
    body = {"model": "bernard-v1", "input": "hello", **extra}
    response = await stack.client.post("/v1/responses", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if param is not None:
        assert error["param"] == param
    else:
        assert error["param"] == "input[0].content[0].type"


def _calls(count: int) -> list[dict[str, Any]]:
    """`count` calls of the client's function, each with its output: a history's items."""
    items: list[dict[str, Any]] = []
    for i in range(count):
        call = {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"}
        items += [call, {"type": "function_call_output", "call_id": f"c{i}", "output": "ok"}]
    return [*items, {"role": "user", "content": "and now?"}]


def _call(**fields: Any) -> list[dict[str, Any]]:
    return [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", **fields}]


def _tool(**fields: Any) -> list[dict[str, Any]]:
    return [{"type": "function", "name": "get_weather", **fields}]


# A tool at the limits of its name and description: 16,496 bytes as JSON.
_AT_LIMIT = _tool(name="A-z_0" + "9" * 59, description="d" * 16_384)


@pytest.mark.parametrize(
    ("overrides", "extra", "param"),
    [
        # Instructions are a system message, bounded as one (BERNARD_MAX_MESSAGE_CHARS).
        ({"max_message_chars": 10}, {"instructions": "x" * 11}, "instructions"),
        # As many calls in the history as Chat Completions takes (BERNARD_MAX_TOOL_CALLS).
        ({"max_tool_calls": 2}, {"input": _calls(3)}, "input"),
        ({}, {"input": _calls(129)}, "input"),
        # Ids and names as long as Chat Completions' (256 characters).
        ({}, {"input": _call(call_id="c" * 257)}, "input[0].call_id"),
        ({}, {"input": _call(name="f" * 257)}, "input[0].name"),
        (
            {},
            {"input": [{"type": "function_call_output", "call_id": "c" * 257, "output": "ok"}]},
            "input[0].call_id",
        ),
        # A function tool's name by OpenAI's rule, its description as long as chat's.
        ({}, {"tools": _tool(name="get weather")}, "tools[0].name"),
        ({}, {"tools": _tool(name="météo")}, "tools[0].name"),
        ({}, {"tools": _tool(name="f" * 65)}, "tools[0].name"),
        ({}, {"tools": _tool(description="d" * 16_385)}, "tools[0].description"),
        ({}, {"tools": _tool(parameters=["not", "a", "schema"])}, "tools[0].parameters"),
        # The tools the response keeps to show back (BERNARD_MAX_TOOLS_BYTES).
        ({"max_tools_bytes": 16_495}, {"tools": _AT_LIMIT}, "tools"),
        (
            {},
            {"tools": [_tool(name=f"t{i}", description="d" * 16_000)[0] for i in range(17)]},
            "tools",
        ),
    ],
)
async def test_an_input_over_the_chat_limits_is_a_400_naming_it(
    upstream: ScriptedUpstream, overrides: dict[str, int], extra: dict[str, Any], param: str
) -> None:
    async with run_stack(make_settings(upstream, **overrides), worker=False) as stack:
        # Background: a request let through answers at once, queued, rather than waiting.
        body = {"model": "bernard-v1", "input": "hello", "background": True, **extra}
        response = await stack.client.post("/v1/responses", json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param
        assert await stack.redis.zcard(stack.settings.queue_name) == 0


async def test_an_input_at_the_chat_limits_is_taken(upstream: ScriptedUpstream) -> None:
    settings = make_settings(
        upstream, max_message_chars=10, max_tool_calls=2, max_tools_bytes=16_496
    )
    async with run_stack(settings, worker=False) as stack:
        body = {
            "model": "bernard-v1",
            "background": True,
            "instructions": "x" * 10,
            "input": [*_call(call_id="c" * 256, name="f" * 256)[:1], *_calls(1)],
            "tools": _AT_LIMIT,
        }
        response = await stack.client.post("/v1/responses", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "queued"


async def test_previous_response_id_continues_its_conversation(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    client = stack.openai()
    upstream.script(Reply.text("Hello Ann."))
    first = await client.responses.create(
        model="bernard-v1", input="My name is Ann.", instructions="Be brief."
    )
    upstream.script(Reply.text("You are Ann."))
    second = await client.responses.create(
        model="bernard-v1",
        input="What is my name?",
        previous_response_id=first.id,
        instructions="Be brief.",
    )
    assert second.output_text == "You are Ann."
    # The same instructions again are not stored again.
    assert second.instructions == "Be brief."
    assert [m["content"] for m in upstream.requests[-1]["messages"]].count("Be brief.") == 1
    assert second.previous_response_id == first.id
    assert first.conversation is not None and second.conversation is not None
    assert second.conversation.id == first.conversation.id
    sent = [(m["role"], m["content"]) for m in upstream.requests[-1]["messages"]]
    assert sent[-3:] == [
        ("user", "My name is Ann."),
        ("assistant", "Hello Ann."),
        ("user", "What is my name?"),
    ]
    # Only from the conversation's latest response: Bernard does not fork.
    with pytest.raises(openai.ConflictError) as stale:
        await client.responses.create(
            model="bernard-v1", input="Again?", previous_response_id=first.id
        )
    assert stale.value.param == "previous_response_id"  # type: ignore[attr-defined]
    assert second.id in stale.value.message
    # `conversation` names the same conversation.
    upstream.script(Reply.text("Still Ann."))
    third = await client.responses.create(
        model="bernard-v1", input="And now?", conversation=first.conversation.id
    )
    assert third.conversation is not None and third.conversation.id == first.conversation.id
    assert ("assistant", "You are Ann.") in [
        (m["role"], m["content"]) for m in upstream.requests[-1]["messages"]
    ]
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(
            model="bernard-v1", input="x", previous_response_id="resp_nothing"
        )


async def test_bernards_own_tool_calls_are_mcp_calls(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    upstream.script(Reply.text("It is 42."))
    async with stack.openai().responses.stream(model="bernard-v1", input="6*7?") as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    kinds = [kind for kind in types_of(events) if kind != "response.output_text.delta"]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.progress",  # Bernard's own: the SDK passes it through
        "response.mcp_call.progress",
        "response.mcp_call.completed",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    call, message = final.output
    assert call.type == "mcp_call" and message.type == "message"
    assert (call.server_label, call.name, call.output, call.error) == (
        "bernard",
        "calculator",
        "42",
        None,
    )
    assert json.loads(call.arguments) == {"expression": "6 * 7"}
    assert final.output_text == "It is 42."
    # Polled, the same items.
    polled = await stack.openai().responses.retrieve(final.id)
    assert polled.output[0].model_dump() == call.model_dump()
    assert (polled.output[1].id, polled.output_text) == (message.id, "It is 42.")
    # Its input is the question alone: Bernard's call, its result and the answer are output.
    items = (await stack.openai().responses.input_items.list(final.id)).data
    assert [(item.type, getattr(item, "role", None)) for item in items] == [("message", "user")]


async def test_a_call_needing_approval_ends_the_response_and_an_approval_continues_it(
    note_stack: Stack, upstream: ScriptedUpstream
) -> None:
    stack = note_stack
    client = stack.openai("key-notes")
    before = await notes_of(stack)
    upstream.script_router(Reply.tool_calls([NOTE]))
    paused = await client.responses.create(model="bernard-v1", input="remember the door code")
    assert paused.status == "completed"
    question, request = paused.output
    assert question.type == "message"  # the question in words, for any client to show
    assert paused.output_text == "Shall I remember “the door code is 1234”?"
    assert request.type == "mcp_approval_request"
    assert (request.server_label, request.name) == ("bernard", "save_note")
    assert json.loads(request.arguments) == {"text": "the door code is 1234"}
    assert await notes_of(stack) == before, "nothing ran"

    upstream.script(Reply.text("Saved it."))
    stream = await client.responses.create(
        model="bernard-v1",
        previous_response_id=paused.id,
        input=[
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
        ],
        stream=True,
    )
    events = [event async for event in stream]
    final = events[-1].response
    assert final.status == "completed" and final.previous_response_id == paused.id
    call = final.output[0]
    assert (call.type, call.name) == ("mcp_call", "save_note")
    assert call.approval_request_id == request.id
    polled = await client.responses.retrieve(final.id)
    assert polled.output[0].approval_request_id == request.id
    assert final.output_text == "Saved it."
    assert await notes_of(stack) == [*before, "the door code is 1234"]
    # Decided once: the same approval again is refused.
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(
            model="bernard-v1",
            previous_response_id=paused.id,
            input=[
                {
                    "type": "mcp_approval_response",
                    "approval_request_id": request.id,
                    "approve": False,
                }
            ],
        )


async def test_a_rejected_call_never_runs(note_stack: Stack, upstream: ScriptedUpstream) -> None:
    stack = note_stack
    client = stack.openai("key-notes")
    before = await notes_of(stack)
    upstream.script_router(Reply.tool_calls([NOTE]))
    paused = await client.responses.create(model="bernard-v1", input="remember the door code")
    upstream.script(Reply.text("Not saved."))
    answer = await client.responses.create(
        model="bernard-v1",
        previous_response_id=paused.id,
        input=[
            {
                "type": "mcp_approval_response",
                "approval_request_id": paused.output[-1].id,
                "approve": False,
            }
        ],
    )
    assert answer.output_text == "Not saved."
    assert await notes_of(stack) == before
    declined = upstream.router_requests[-1]["messages"][-1]
    assert declined["role"] == "tool" and "save_note" not in await notes_of(stack)


async def test_langchain_chat_openai_speaks_the_responses_api(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    llm = stack.langchain(use_responses_api=True)
    upstream.script(Reply.text("Invoked.", usage=(5, 2)))
    message = await llm.ainvoke([HumanMessage("hello")])
    assert message.text == "Invoked."
    assert message.response_metadata["id"].startswith("resp_")
    assert message.usage_metadata is not None and message.usage_metadata["total_tokens"] == 7
    upstream.script(Reply.text(["Lang", "Chain"], usage=(5, 2)))
    total: AIMessageChunk | None = None
    async for chunk in llm.astream([HumanMessage("hello")]):
        assert isinstance(chunk, AIMessageChunk)
        total = chunk if total is None else total + chunk
    assert total is not None and total.text == "LangChain"
    assert total.usage_metadata is not None and total.usage_metadata["total_tokens"] == 7


async def test_a_function_tool_round_trip(stack: Stack, upstream: ScriptedUpstream) -> None:
    client = stack.openai()
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["call_w1"]))
    first = await client.responses.create(
        model="bernard-v1",
        input="What is the weather in Oslo?",
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert first.status == "completed"
    (call,) = first.output
    assert call.type == "function_call"
    assert (call.call_id, call.name) == ("call_w1", "get_weather")
    assert json.loads(call.arguments) == {"city": "Oslo"}
    offered = upstream.router_requests[-1]["tools"]
    assert "get_weather" in [tool["function"]["name"] for tool in offered]

    upstream.script(Reply.text("It is 12 °C and sunny in Oslo."))
    second = await client.responses.create(
        model="bernard-v1",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": "call_w1", "output": "12 °C, sunny"}],
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert second.output_text == "It is 12 °C and sunny in Oslo."
    heard = upstream.router_requests[-1]["messages"]
    assert [m["role"] for m in heard[-3:]] == ["user", "assistant", "tool"]
    assert heard[-2]["tool_calls"][0]["id"] == "call_w1"
    assert sum(bool(m.get("tool_calls")) for m in heard) == 1, "the call once, before its result"
    assert heard[-1] == {"role": "tool", "tool_call_id": "call_w1", "content": "12 °C, sunny"}
    # Its input is the output sent; the first's, the question (its call is its output).
    (sent,) = (await client.responses.input_items.list(second.id)).data
    assert sent.type == "function_call_output"
    assert (sent.call_id, sent.output) == ("call_w1", "12 °C, sunny")
    asked = (await client.responses.input_items.list(first.id)).data
    assert [(item.type, getattr(item, "role", None)) for item in asked] == [("message", "user")]


async def test_a_function_call_streams_as_openai_streams_it(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["call_s1"]))
    async with stack.openai().responses.stream(
        model="bernard-v1",
        input="What is the weather in Oslo?",
        tools=[WEATHER],  # type: ignore[list-item]
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    (call,) = final.output
    assert call.type == "function_call" and call.call_id == "call_s1"
    assert json.loads(call.arguments) == {"city": "Oslo"}


async def test_a_function_tool_round_trip_resending_the_whole_input(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    client = stack.openai()
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["call_r1"]))
    question = {"role": "user", "content": "What is the weather in Oslo?"}
    first = await client.responses.create(
        model="bernard-v1",
        input=[question],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
    )
    upstream.script(Reply.text("Sunny."))
    output = {"type": "function_call_output", "call_id": "call_r1", "output": "sunny"}
    second = await client.responses.create(
        model="bernard-v1",
        input=[question, first.output[0].model_dump(), output],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert second.output_text == "Sunny."
    heard = upstream.router_requests[-1]["messages"]
    assert [m["role"] for m in heard[-3:]] == ["user", "assistant", "tool"]
    assert heard[-2]["tool_calls"][0]["function"]["name"] == "get_weather"
    # input_items lists what was sent, the resent call and its output too (not the answer).
    items = (await client.responses.input_items.list(second.id, order="asc")).data
    assert [item.type for item in items] == ["message", "function_call", "function_call_output"]
    assert items[0].content[0].text == "What is the weather in Oslo?"  # type: ignore[union-attr]
    call, output = items[1], items[2]
    assert call.type == "function_call" and output.type == "function_call_output"
    assert (call.call_id, call.name, json.loads(call.arguments)) == (
        "call_r1",
        "get_weather",
        {"city": "Oslo"},
    )
    assert (output.call_id, output.output) == ("call_r1", "sunny")
    assert len({item.id for item in items}) == 3


CLOCK = {
    "type": "function",
    "name": "world_clock",
    "description": "The time in a city now.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
BOTH = "What is the weather and the time in Oslo?"


async def test_parallel_function_calls_are_items_answered_together(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    client = stack.openai()
    upstream.script_router(
        Reply.tool_calls(
            [("get_weather", {"city": "Oslo"}), ("world_clock", {"city": "Oslo"})],
            ids=["call_p1", "call_p2"],
        )
    )
    first = await client.responses.create(
        model="bernard-v1",
        input=BOTH,
        tools=[WEATHER, CLOCK],  # type: ignore[list-item]
    )
    assert [(i.type, i.call_id, i.name) for i in first.output] == [  # type: ignore[union-attr]
        ("function_call", "call_p1", "get_weather"),
        ("function_call", "call_p2", "world_clock"),
    ]
    assert first.parallel_tool_calls is True

    upstream.script(Reply.text("Sunny, and it is noon."))
    second = await client.responses.create(
        model="bernard-v1",
        previous_response_id=first.id,
        input=[
            {"type": "function_call_output", "call_id": "call_p1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_p2", "output": "12:00"},
        ],
        tools=[WEATHER, CLOCK],  # type: ignore[list-item]
    )
    assert second.output_text == "Sunny, and it is noon."
    heard = upstream.router_requests[-1]["messages"]
    # Both calls in one assistant message, as OpenAI's parallel calls are, then both results.
    assert [m["role"] for m in heard[-3:]] == ["assistant", "tool", "tool"]
    assert [call["id"] for call in heard[-3]["tool_calls"]] == ["call_p1", "call_p2"]
    assert [m["tool_call_id"] for m in heard[-2:]] == ["call_p1", "call_p2"]


async def test_without_parallel_tool_calls_one_function_call_is_handed_over(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(
        Reply.tool_calls(
            [("get_weather", {"city": "Oslo"}), ("world_clock", {"city": "Oslo"})],
            ids=["call_o1", "call_o2"],
        )
    )
    response = await stack.openai().responses.create(
        model="bernard-v1",
        input=BOTH,
        tools=[WEATHER, CLOCK],  # type: ignore[list-item]
        parallel_tool_calls=False,
    )
    assert [i.call_id for i in response.output] == ["call_o1"]  # type: ignore[union-attr]
    assert response.parallel_tool_calls is False
    assert upstream.router_requests[-1]["parallel_tool_calls"] is False


async def test_tool_choice_reaches_the_router_in_each_of_its_forms(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    client = stack.openai()
    upstream.script(Reply.text("No tools."))
    none = await client.responses.create(
        model="bernard-v1",
        input=BOTH,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="none",
    )
    assert (none.output_text, none.tool_choice) == ("No tools.", "none")
    offered = [tool["function"]["name"] for tool in upstream.router_requests[-1]["tools"]]
    assert "get_weather" not in offered and "respond" in offered

    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "1+1"})], ids=["c"]))
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["r1"]))
    required = await client.responses.create(
        model="bernard-v1",
        input=BOTH,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
    )
    # Bernard's own call ran on the server; the response ends on the client's.
    assert [(i.type, i.id) for i in required.output] == [
        ("mcp_call", "mcp_c"),
        ("function_call", "fc_r1"),
    ]
    assert upstream.router_requests[-1]["tool_choice"] == "required"

    upstream.script_router(Reply.tool_calls([("world_clock", {"city": "Oslo"})], ids=["n1"]))
    named = await client.responses.create(
        model="bernard-v1",
        input=BOTH,
        tools=[WEATHER, CLOCK],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "world_clock"},
    )
    assert [i.name for i in named.output] == ["world_clock"]  # type: ignore[union-attr]
    assert named.tool_choice.model_dump() == {"type": "function", "name": "world_clock"}  # type: ignore[union-attr]
    assert upstream.router_requests[-1]["tool_choice"] == {
        "type": "function",
        "function": {"name": "world_clock"},
    }
