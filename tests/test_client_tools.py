"""The client's own function tools on `/v1/chat/completions` (issue 22), as real clients use
them: the official `openai` SDK and LangChain's `ChatOpenAI.bind_tools`, against the running
stack with the scripted upstream (tests/support/upstream.py) playing the router and the answer.

A call of a client tool ends the turn with finish_reason "tool_calls" and the call in
`tool_calls` (the response model never runs); the client's follow-up, an assistant message
with those calls and a `tool` message per call, reaches the router, which goes on.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage

from tests.support.client_tools import CHAT_WEATHER as WEATHER
from tests.support.sse import collect, wire
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream, tool_names

CLOCK = {
    "type": "function",
    "function": {
        "name": "world_clock",
        "description": "The time in a city now.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Oslo?"}]


def roles(messages: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """Each message as (role, the tool call id it carries or answers)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") or []
        out.append((m["role"], m.get("tool_call_id") or (calls[0]["id"] if calls else None)))
    return out


async def test_openai_sdk_gets_the_client_tool_call_and_its_follow_up_gets_the_answer(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    client = stack.openai()
    upstream.script_router(
        Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["call_w1"], usage=(5, 4))
    )
    first = await client.chat.completions.create(
        model="bernard-v1",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id == "call_w1"
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Oslo"},
    )
    assert first.usage is not None and first.usage.total_tokens == 9
    # The router was offered the client's tool beside Bernard's and `respond`; the response
    # model never ran.
    offered = tool_names(upstream.router_requests[0])
    assert {"get_weather", "calculator", "respond"} <= set(offered)
    assert upstream.requests == []

    upstream.script(Reply.text("It is 12 °C and sunny in Oslo."))
    # The message object itself, as OpenAI's own function-calling guide passes it back.
    follow_up = [
        *QUESTION,
        choice.message,
        {"role": "tool", "tool_call_id": "call_w1", "content": "12 °C, sunny"},
    ]
    second = await client.chat.completions.create(
        model="bernard-v1",
        messages=follow_up,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "It is 12 °C and sunny in Oslo."
    assert second.choices[0].message.tool_calls is None
    # The router read the call and its result, ids matching, and went on to `respond`.
    seen = upstream.router_requests[1]["messages"]
    assert roles(seen)[-3:] == [("user", None), ("assistant", "call_w1"), ("tool", "call_w1")]
    assert seen[-1]["content"] == "12 °C, sunny"
    assert roles(upstream.requests[0]["messages"])[-2:] == [
        ("assistant", "call_w1"),
        ("tool", "call_w1"),
    ]


async def test_openai_sdk_streams_the_client_tool_call_in_deltas(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["call_s1"]))
    stream = await stack.openai().chat.completions.create(
        model="bernard-v1",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        stream=True,
    )
    pieces: list[dict[str, Any]] = []
    finish, text = None, ""
    async for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        pieces += [c.model_dump(exclude_none=True) for c in delta.tool_calls or ()]
        finish = chunk.choices[0].finish_reason or finish
    assert pieces == [
        {
            "index": 0,
            "id": "call_s1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        },
        {"index": 0, "function": {"arguments": '{"city": "Oslo"}'}},
    ]
    assert finish == "tool_calls"
    assert text == ""


async def test_openai_sdk_stream_helper_accumulates_the_call_and_the_loop_completes(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    client = stack.openai()
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["call_h1"]))
    async with client.chat.completions.stream(
        model="bernard-v1",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
    ) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls is not None
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("call_h1", "get_weather", '{"city": "Oslo"}')
    ]

    upstream.script(Reply.text(["Sunny", " in", " Oslo."]))
    follow_up = [
        *QUESTION,
        message.model_dump(exclude_none=True, exclude={"parsed"}),
        {"role": "tool", "tool_call_id": "call_h1", "content": "sunny"},
    ]
    async with client.chat.completions.stream(
        model="bernard-v1",
        messages=follow_up,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
    ) as stream:
        async for _ in stream:
            pass
        answer = await stream.get_final_completion()
    assert answer.choices[0].message.content == "Sunny in Oslo."
    assert answer.choices[0].finish_reason == "stop"


async def test_parallel_client_calls_come_with_their_indexes_and_are_answered_together(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    client = stack.openai()
    upstream.script_router(
        Reply.tool_calls(
            [("get_weather", {"city": "Oslo"}), ("world_clock", {"city": "Oslo"})],
            ids=["call_p1", "call_p2"],
        )
    )
    stream = await client.chat.completions.create(
        model="bernard-v1",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER, CLOCK],  # type: ignore[list-item]
        stream=True,
    )
    heads = []
    async for chunk in stream:
        for call in (chunk.choices[0].delta.tool_calls or ()) if chunk.choices else ():
            if call.id is not None:
                heads.append((call.index, call.id, call.function and call.function.name))
    assert heads == [(0, "call_p1", "get_weather"), (1, "call_p2", "world_clock")]

    upstream.script(Reply.text("Sunny, and it is noon."))
    follow_up = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_p1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                },
                {
                    "id": "call_p2",
                    "type": "function",
                    "function": {"name": "world_clock", "arguments": '{"city": "Oslo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_p1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_p2", "content": "12:00"},
    ]
    answer = await client.chat.completions.create(
        model="bernard-v1",
        messages=follow_up,  # type: ignore[arg-type]
        tools=[WEATHER, CLOCK],  # type: ignore[list-item]
    )
    assert answer.choices[0].message.content == "Sunny, and it is noon."
    assert roles(upstream.router_requests[1]["messages"])[-3:] == [
        ("assistant", "call_p1"),
        ("tool", "call_p1"),
        ("tool", "call_p2"),
    ]


async def test_without_parallel_tool_calls_one_client_call_is_handed_over(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(
        Reply.tool_calls(
            [("get_weather", {"city": "Oslo"}), ("world_clock", {"city": "Oslo"})],
            ids=["call_o1", "call_o2"],
        )
    )
    completion = await stack.openai().chat.completions.create(
        model="bernard-v1",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER, CLOCK],  # type: ignore[list-item]
        parallel_tool_calls=False,
    )
    calls = completion.choices[0].message.tool_calls or []
    assert [c.id for c in calls] == ["call_o1"]
    assert upstream.router_requests[0]["parallel_tool_calls"] is False


async def test_bernards_own_calls_earlier_in_the_turn_stay_server_side(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6*7"})], ids=["own"]))
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["mine"]))
    response = await stack.chat(
        "Weather in Oslo, and 6*7?", tools=[WEATHER], stream_options={"tool_events": "none"}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    message = body["choices"][0]["message"]
    assert [c["id"] for c in message["tool_calls"]] == ["mine"]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    # Bernard ran its own call and says so beside the answer, where clients look for nothing.
    assert [c["id"] for c in body["bernard"]["tool_calls"]] == ["own"]
    assert body["bernard"]["tool_outputs"][0]["content"] == "42"
    # The second router call read the calculator's result.
    assert roles(upstream.router_requests[1]["messages"])[-2:] == [
        ("assistant", "own"),
        ("tool", "own"),
    ]


async def test_tool_choice_none_offers_no_client_tool(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text("No tools for you."))
    completion = await stack.openai().chat.completions.create(
        model="bernard-v1",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="none",
    )
    assert completion.choices[0].message.content == "No tools for you."
    assert completion.choices[0].finish_reason == "stop"
    offered = tool_names(upstream.router_requests[0])
    assert "get_weather" not in offered and "respond" in offered


async def test_tool_choice_none_runs_no_client_call_the_model_makes_anyway(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["x1"]))
    upstream.script(Reply.text("I cannot check the weather."))
    completion = await stack.openai().chat.completions.create(
        model="bernard-v1",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="none",
    )
    assert completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].message.tool_calls is None
    assert completion.choices[0].message.content == "I cannot check the weather."


async def test_tool_choice_required_makes_the_router_call_a_tool_and_hand_over_a_client_one(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "1+1"})], ids=["c"]))
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["r1"]))
    completion = await stack.openai().chat.completions.create(
        model="bernard-v1",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
    )
    assert [c.id for c in completion.choices[0].message.tool_calls or ()] == ["r1"]
    for request in upstream.router_requests:
        assert request["tool_choice"] == "required"
        # Without `respond` the router cannot end the turn before a client tool is called.
        assert "respond" not in tool_names(request)
        assert {"get_weather", "calculator"} <= set(tool_names(request))


async def test_tool_choice_required_offers_only_the_client_tools_on_the_last_step(
    upstream: ScriptedUpstream,
) -> None:
    async with run_stack(make_settings(upstream, max_router_steps=2)) as stack:
        upstream.script_router(Reply.tool_calls([("calculator", {"expression": "2"})]))
        upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["l"]))
        completion = await stack.openai().chat.completions.create(
            model="bernard-v1",
            messages=QUESTION,  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice="required",
        )
    assert [c.id for c in completion.choices[0].message.tool_calls or ()] == ["l"]
    assert "calculator" in tool_names(upstream.router_requests[0])
    assert tool_names(upstream.router_requests[1]) == ["get_weather"]


async def test_a_named_tool_choice_is_passed_to_the_router(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("world_clock", {"city": "Oslo"})], ids=["n1"]))
    completion = await stack.openai().chat.completions.create(
        model="bernard-v1",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER, CLOCK],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "world_clock"}},
    )
    assert [c.function.name for c in completion.choices[0].message.tool_calls or ()] == [
        "world_clock"
    ]
    assert upstream.router_requests[0]["tool_choice"] == {
        "type": "function",
        "function": {"name": "world_clock"},
    }


async def test_langchain_bind_tools_gets_tool_calls_and_completes_the_loop(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        return "sunny"

    model = stack.langchain().bind_tools([get_weather])
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["lc1"]))
    question = HumanMessage("What is the weather in Oslo?")
    asked = await model.ainvoke([question])
    assert isinstance(asked, AIMessage)
    assert asked.tool_calls == [
        {"name": "get_weather", "args": {"city": "Oslo"}, "id": "lc1", "type": "tool_call"}
    ]
    assert asked.response_metadata["finish_reason"] == "tool_calls"
    # The router was offered the function as LangChain described it.
    offered = next(
        t for t in upstream.router_requests[0]["tools"] if t["function"]["name"] == "get_weather"
    )
    assert offered["function"]["parameters"]["properties"] == {"city": {"type": "string"}}

    upstream.script(Reply.text(["It", " is", " sunny."]))
    result = ToolMessage(get_weather("Oslo"), tool_call_id="lc1")
    total: AIMessageChunk | None = None
    async for chunk in model.astream([question, asked, result]):
        assert isinstance(chunk, AIMessageChunk)
        total = chunk if total is None else total + chunk
    assert total is not None
    assert total.content == "It is sunny."
    assert not total.tool_calls
    assert roles(upstream.router_requests[1]["messages"])[-2:] == [
        ("assistant", "lc1"),
        ("tool", "lc1"),
    ]


async def test_langchain_streams_the_tool_call_whole(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        return "sunny"

    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["ls1"]))
    total: AIMessageChunk | None = None
    async for chunk in stack.langchain().bind_tools([get_weather]).astream(["Weather in Oslo?"]):
        assert isinstance(chunk, AIMessageChunk)
        total = chunk if total is None else total + chunk
    assert total is not None
    assert total.tool_calls == [
        {"name": "get_weather", "args": {"city": "Oslo"}, "id": "ls1", "type": "tool_call"}
    ]


async def test_a_stored_conversation_keeps_the_client_call_and_result_once_each(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    client = stack.openai()
    conversation = {"conversation_id": "conv_client_tools"}
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "2+2"})], ids=["own"]))
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["call_c1"]))
    first = await client.chat.completions.create(
        model="bernard-v1",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        extra_body=conversation,
    )
    # Handed over, the client's call is in the conversation, waiting for its result.
    url = "/v1/conversations/conv_client_tools/messages"
    waiting = (await stack.client.get(url)).json()["data"]
    assert [(r["role"], [c["id"] for c in r.get("tool_calls") or ()]) for r in waiting] == [
        ("user", []),
        ("assistant", ["own"]),
        ("tool", []),
        ("assistant", ["call_c1"]),
    ]
    upstream.script(Reply.text("Sunny in Oslo."))
    follow_up = [
        *QUESTION,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": "call_c1", "content": "sunny"},
    ]
    second = await client.chat.completions.create(
        model="bernard-v1",
        messages=follow_up,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        extra_body=conversation,
    )
    assert second.choices[0].message.content == "Sunny in Oslo."
    # The follow-up's router read the whole turn: Bernard's own call, its result, the
    # client's call and its result, each once.
    assert roles(upstream.router_requests[2]["messages"])[1:] == [
        ("user", None),
        ("assistant", "own"),
        ("tool", "own"),
        ("assistant", "call_c1"),
        ("tool", "call_c1"),
    ]
    listed = await stack.client.get(url)
    assert listed.status_code == 200, listed.text
    rows = listed.json()["data"]
    assert [(r["role"], r.get("tool_call_id"), r["content"]) for r in rows] == [
        ("user", None, "What is the weather in Oslo?"),
        ("assistant", None, ""),  # Bernard's own call
        ("tool", "own", "4"),
        ("assistant", None, ""),  # the client's, stored once though sent back
        ("tool", "call_c1", "sunny"),
        ("assistant", None, "Sunny in Oslo."),
    ]
    assert [[c["id"] for c in r.get("tool_calls") or ()] for r in rows] == [
        [],
        ["own"],
        [],
        ["call_c1"],
        [],
        [],
    ]


async def test_resuming_after_every_frame_of_a_handed_over_turn_gives_exactly_the_rest(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    """Each client call is one stream entry and two frames (its name, then its arguments):
    a resume between them, or anywhere else, repeats and loses nothing."""
    upstream.script_router(
        Reply.tool_calls(
            [("get_weather", {"city": "Oslo"}), ("world_clock", {"city": "Oslo"})],
            ids=["call_r1", "call_r2"],
        )
    )
    started = await stack.chat(
        "Weather and time in Oslo?",
        tools=[WEATHER, CLOCK],
        stream=True,
        stream_options={"include_usage": True},
    )
    turn_id = started.headers["x-bernard-turn-id"]
    events = f"/v1/turns/{turn_id}/events"
    full = await collect(stack.client, "GET", events)
    deltas = [f.json["choices"][0]["delta"] for f in full if not f.done and f.json["choices"]]
    assert [d.get("tool_calls") for d in deltas if d.get("tool_calls")] == [
        [
            {
                "index": 0,
                "id": "call_r1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ],
        [{"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}],
        [
            {
                "index": 1,
                "id": "call_r2",
                "type": "function",
                "function": {"name": "world_clock", "arguments": ""},
            }
        ],
        [{"index": 1, "function": {"arguments": '{"city": "Oslo"}'}}],
    ]
    assert len({f.id for f in full}) == len(full), "every frame has its own id"
    for k, frame in enumerate(full[:-1]):
        rest = await collect(stack.client, "GET", events, headers={"Last-Event-ID": frame.id})
        assert wire(full[: k + 1] + rest) == wire(full), f"resume after frame {k}"


async def test_a_background_turn_polled_holds_the_client_calls(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["bg1"]))
    admitted = await stack.chat("Weather in Oslo?", tools=[WEATHER], background=True)
    assert admitted.status_code == 202, admitted.text
    turn_id = admitted.headers["x-bernard-turn-id"]
    async with asyncio.timeout(10):
        while True:
            turn = (await stack.client.get(f"/v1/turns/{turn_id}")).json()
            if turn["status"] not in ("queued", "running"):
                break
            await asyncio.sleep(0.02)
    assert turn["status"] == "completed"
    choice = turn["result"]["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {
            "id": "bg1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
    ]


async def test_a_client_call_never_answered_is_closed_before_the_next_question(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    """The client dropped the call and asks something else: the stored call gets a result
    saying it did not run, so no prompt holds a call without one."""
    client = stack.openai()
    conversation = {"conversation_id": "conv_dropped_call"}
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["call_d"]))
    await client.chat.completions.create(
        model="bernard-v1",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        extra_body=conversation,
    )
    upstream.script(Reply.text("Hello."))
    answer = await client.chat.completions.create(
        model="bernard-v1",
        messages=[*QUESTION, {"role": "user", "content": "Never mind, hello."}],
        tools=[WEATHER],  # type: ignore[list-item]
        extra_body=conversation,
    )
    assert answer.choices[0].message.content == "Hello."
    assert roles(upstream.router_requests[1]["messages"])[1:] == [
        ("user", None),
        ("assistant", "call_d"),
        ("tool", "call_d"),
        ("user", None),
    ]
    closed = upstream.router_requests[1]["messages"][3]
    # The words a paused turn's lapsed proposal gets (worker/recording.py EXPIRED_CALL):
    # the records do not yet tell a client's call from a proposal nobody decided on.
    assert closed["content"] == "Not run: the user did not confirm this in time."
