"""The first word as soon as the model allows, through the real pipeline.

When the roles share a model (`Settings.roles_share_model`), the router's step streams and
its text is the answer: a turn that needs no tool makes one model call, a one-tool turn two,
and text written before a tool call reaches the client while the tool runs. With two models,
the router may call `respond` beside its last tool calls, and the turn goes straight to the
response model. Every model call of a conversation sends the same prompt up to what is new.

Real API, real worker, real Redis, the scripted upstream. With one model the upstream sees
no `respond` and no router prompt, so its calls are all in `upstream.exchanges`, scripted
with `script`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.sse import Frame, collect, frames, text_of
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream, tool_names
from worker.harness.router import ROUTER_PROMPT
from worker.tools import default_tools

CHAT = "/v1/chat/completions"
SYSTEM = "You are Bernard, a helpful assistant."
TOOLS = [tool.name for tool in default_tools()]


@pytest.fixture
async def one(upstream: ScriptedUpstream) -> AsyncIterator[Stack]:
    """A stack whose roles share one model."""
    settings = make_settings(upstream, router_model="one-model", response_model="one-model")
    assert settings.roles_share_model
    async with run_stack(settings) as stack:
        yield stack


def body(content: str = "Hello?", *, stream: bool = True, **extra: Any) -> dict[str, Any]:
    options = {"include_usage": True, "tool_events": "bernard", "trace": True}
    return {
        "model": "bernard-v1",
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        **({"stream_options": options} if stream else {}),
        **extra,
    }


def bernard_types(collected: list[Frame]) -> list[str]:
    return [f.bernard["type"] for f in collected if f.bernard and f.bernard["type"] != "keepalive"]


async def test_a_chat_turn_is_one_streamed_call_whose_text_is_the_answer(
    one: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(["Hello", " there", "!"], usage=(9, 3)))
    got = await collect(one.client, "POST", CHAT, json=body())
    assert text_of(got) == "Hello there!"
    (request,) = upstream.requests
    assert upstream.router_requests == []
    assert request["stream"] is True
    assert tool_names(request) == TOOLS  # Bernard's tools, and no `respond`
    assert request["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hello?"},
    ]
    # One `llm_prompt` and one `llm_call_complete`: one call.
    assert [t for t in bernard_types(got) if t.startswith("llm")] == [
        "llm_prompt",
        "llm_call_complete",
    ]
    usage = next(f.json["usage"] for f in got if not f.done and f.json.get("usage"))
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (9, 3)
    chunks = [f.json for f in got if not f.done]
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert [reason for reason in finish if reason] == ["stop"]


async def test_the_first_word_reaches_the_client_while_the_model_still_writes(
    one: Stack, upstream: ScriptedUpstream
) -> None:
    gate = upstream.script(Reply.text(["Hello", " there"], block_after=1))
    async with one.client.stream("POST", CHAT, json=body()) as response:
        seen: list[str] = []
        async for frame in frames(response):
            if frame.content:
                if not seen:
                    # The upstream holds the rest of its answer: the first word came from
                    # the one call still streaming, not after it.
                    assert gate.blocked and upstream.exchanges[0].completed_at is None
                    gate.release()
                seen.append(frame.content)
        assert seen[0] == "Hello" and "".join(seen) == "Hello there"
    assert len(upstream.requests) == 1


async def test_the_cut_answers_finish_reason_is_the_turns(
    one: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(["one", " two", " three"]))
    answer = await one.client.post(CHAT, json=body(stream=False, max_tokens=2))
    assert answer.status_code == 200, answer.text
    (choice,) = answer.json()["choices"]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("one two", "length")
    assert upstream.requests[0]["max_completion_tokens"] == 2


async def test_a_one_tool_turn_is_two_calls_and_text_before_the_call_comes_at_once(
    one: Stack, upstream: ScriptedUpstream
) -> None:
    # "Let me check." (3 pieces), then the upstream holds before the tool call's pieces.
    gate = upstream.script(
        Reply.tool_calls(
            [("calculator", {"expression": "6 * 7"})],
            content="Let me check.",
            block_after=3,
            usage=(10, 5),
        )
    )
    upstream.script(Reply.text("It is 42.", usage=(20, 4)))
    async with one.client.stream("POST", CHAT, json=body("What is 6 * 7?")) as response:
        got: list[Frame] = []
        released = False
        async for frame in frames(response):
            got.append(frame)
            if frame.content and not released:
                # Spoken before the model has even named its tool.
                assert gate.blocked and "tool_call" not in bernard_types(got)
                if text_of(got) == "Let me check.":
                    gate.release()
                    released = True
    assert text_of(got) == "Let me check.It is 42."
    order = [t for t in bernard_types(got) if t in {"tool_call", "tool_result"}]
    assert order == ["tool_call", "tool_result"]
    first, second = upstream.requests
    assert upstream.router_requests == []
    assert tool_names(first) == tool_names(second) == TOOLS
    assistant, result = second["messages"][-2:]
    assert assistant["content"] == "Let me check."
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["calculator"]
    assert result["content"] == "42"
    usage = next(f.json["usage"] for f in got if not f.done and f.json.get("usage"))
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (30, 9)


async def test_the_conversation_stores_the_text_before_a_call_once(
    one: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(
        Reply.tool_calls([("calculator", {"expression": "6 * 7"})], content="Let me check.")
    )
    upstream.script(Reply.text("It is 42."))
    created = await one.client.post("/v1/conversations", json={})
    assert created.status_code == 201, created.text
    url = f"/v1/conversations/{created.json()['id']}/messages"
    answered = await one.client.post(url, json={"content": "6*7?"})
    assert answered.status_code == 200, answered.text
    rows = (await one.client.get(url)).json()["data"]
    shape = [
        (row["role"], row["content"], [c["function"]["name"] for c in row.get("tool_calls") or []])
        for row in rows
    ]
    assert shape == [
        ("user", "6*7?", []),
        ("assistant", "Let me check.", ["calculator"]),
        ("tool", "42", []),
        ("assistant", "It is 42.", []),
    ]


async def test_the_non_stream_answer_holds_all_the_text_the_stream_showed(
    one: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(
        Reply.tool_calls([("calculator", {"expression": "6 * 7"})], content="Let me check. ")
    )
    upstream.script(Reply.text("It is 42."))
    answer = await one.client.post(CHAT, json=body("6*7?", stream=False))
    assert answer.status_code == 200, answer.text
    (choice,) = answer.json()["choices"]
    assert choice["message"]["content"] == "Let me check. It is 42."


@pytest.mark.parametrize("written", [[], ["\n", "  "]], ids=["nothing", "whitespace"])
async def test_a_step_that_writes_no_words_leaves_the_answer_to_the_response_call(
    one: Stack, upstream: ScriptedUpstream, written: list[str]
) -> None:
    upstream.script(Reply.text(written))
    upstream.script(Reply.text("Here it is."))
    got = await collect(one.client, "POST", CHAT, json=body())
    assert text_of(got) == "Here it is."  # no whitespace before it
    step, answer = upstream.requests
    assert tool_names(step) == TOOLS and tool_names(answer) == []
    assert step["messages"] == answer["messages"]  # the same prompt, without the tools


async def test_the_responses_api_streams_the_routers_text(
    one: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(["Bonjour", " !"]))
    stream = await one.openai().responses.create(model="bernard-v1", input="hi", stream=True)
    deltas = [event.delta async for event in stream if event.type == "response.output_text.delta"]
    assert deltas == ["Bonjour", " !"]
    assert len(upstream.requests) == 1


async def test_a_client_tool_call_after_text_ends_the_turn_with_both(
    one: Stack, upstream: ScriptedUpstream
) -> None:
    weather = {
        "type": "function",
        "function": {
            "name": "lookup_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    upstream.script(
        Reply.tool_calls([("lookup_weather", {"city": "Paris"})], content="One moment.")
    )
    answer = await one.client.post(CHAT, json=body("Weather?", stream=False, tools=[weather]))
    assert answer.status_code == 200, answer.text
    (choice,) = answer.json()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "One moment."
    (call,) = choice["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "lookup_weather",
        {"city": "Paris"},
    )
    assert tool_names(upstream.requests[0]) == [*TOOLS, "lookup_weather"]
    assert len(upstream.requests) == 1


async def test_cancelling_the_turn_aborts_the_streaming_router_call(
    one: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.slow(interval=0.01))
    started = await one.client.post(CHAT, json=body(stream=False, background=True))
    assert started.status_code == 202, started.text
    turn_id = started.json()["id"]
    await upstream.wait_requests(1)
    cancelled = await one.client.post(f"/v1/turns/{turn_id}/cancel")
    assert cancelled.status_code in (200, 202), cancelled.text
    exchange = await upstream.wait_disconnect(0, timeout_s=5)
    assert exchange.completed_at is None


# -- two models ------------------------------------------------------------------------------


async def test_with_two_models_respond_beside_the_calls_goes_straight_to_the_answer(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(
        Reply.tool_calls([("calculator", {"expression": "6 * 7"}), ("respond", {})])
    )
    upstream.script(Reply.text("It is 42."))
    got = await collect(stack.client, "POST", CHAT, json=body("6*7?"))
    assert text_of(got) == "It is 42."
    (router,) = upstream.router_requests  # no second router call to hear `respond`
    (response,) = upstream.requests
    assert router["messages"][0] == {"role": "system", "content": ROUTER_PROMPT}
    assert "beside them, in the same step" in ROUTER_PROMPT
    assert response["messages"][0] == {"role": "system", "content": SYSTEM}


# -- the prompt's prefix -------------------------------------------------------------------


def common_prefix(a: list[Any], b: list[Any]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


async def two_turns(stack: Stack, upstream: ScriptedUpstream) -> None:
    created = await stack.client.post("/v1/conversations", json={})
    assert created.status_code == 201, created.text
    url = f"/v1/conversations/{created.json()['id']}/messages"
    for content in ("What is 6 * 7?", "And 6 * 8?"):
        sent = await stack.client.post(url, json={"content": content})
        assert sent.status_code == 200, sent.text


def continues(earlier: dict[str, Any], later: dict[str, Any], new: list[dict[str, Any]]) -> None:
    """`later`'s prompt is `earlier`'s, unchanged from its first byte, then `new`."""
    assert later["tools"] == earlier["tools"] if "tools" in earlier else "tools" not in later
    kept = common_prefix(earlier["messages"], later["messages"])
    assert kept == len(earlier["messages"])
    assert later["messages"][kept:] == new


async def test_every_call_of_a_conversation_sends_the_same_prompt_up_to_what_is_new(
    one: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(
        Reply.tool_calls([("calculator", {"expression": "6 * 7"})], content="Let me check.")
    )
    upstream.script(Reply.text("It is 42."))
    upstream.script(Reply.text("It is 48."))
    await two_turns(one, upstream)
    first, second, third = upstream.requests
    assert first["messages"][0] == {"role": "system", "content": SYSTEM}
    continues(first, second, second["messages"][2:])
    continues(
        second,
        third,
        [{"role": "assistant", "content": "It is 42."}, {"role": "user", "content": "And 6 * 8?"}],
    )


async def test_with_two_models_each_roles_calls_keep_their_prefix(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    upstream.script(Reply.text("It is 42."))
    upstream.script(Reply.text("It is 48."))
    await two_turns(stack, upstream)
    new = [{"role": "assistant", "content": "It is 42."}, {"role": "user", "content": "And 6 * 8?"}]
    routed, responded = upstream.router_requests, upstream.requests
    assert len(routed) == 3 and len(responded) == 2
    continues(routed[1], routed[2], new)
    continues(responded[0], responded[1], new)


async def test_a_step_waiting_for_a_slow_tool_has_already_spoken(
    upstream: ScriptedUpstream,
) -> None:
    """A voice satellite speaks the text before the call while the tool runs."""
    from langchain_core.tools import tool

    release = asyncio.Event()

    @tool
    async def slow_lookup(query: str) -> str:
        """Look something up, slowly."""
        await release.wait()
        return "found"

    settings = make_settings(upstream, router_model="one-model", response_model="one-model")
    upstream.script(Reply.tool_calls([("slow_lookup", {"query": "x"})], content="Looking."))
    upstream.script(Reply.text("Found it."))
    async with (
        run_stack(settings, tools=[slow_lookup]) as stack,
        stack.client.stream("POST", CHAT, json=body("Find x")) as response,
    ):
        got: list[Frame] = []
        async for frame in frames(response):
            got.append(frame)
            if "tool_call" in bernard_types(got) and not release.is_set():
                assert text_of(got) == "Looking."
                release.set()
    assert text_of(got) == "Looking.Found it."


async def test_a_background_turn_answers_with_the_routers_text(
    one: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text("Later."))
    started = await one.client.post(CHAT, json=body(stream=False, background=True))
    assert started.status_code == 202, started.text
    turn_id = started.json()["id"]
    async with asyncio.timeout(5):
        while True:
            turn = (await one.client.get(f"/v1/turns/{turn_id}")).json()
            if turn["status"] == "completed":
                break
            await asyncio.sleep(0.02)
    assert text_of(await one.replay(turn_id)) == "Later."


@pytest.mark.parametrize(
    ("question", "calls", "says"),
    [("hello", 1, 'You said: "hello".'), ("What is 6 * 7?", 2, "The result of 6 * 7 is 42.")],
    ids=["chat", "calculator"],
)
async def test_the_demo_model_serves_both_roles_in_one_loop(
    question: str, calls: int, says: str
) -> None:
    settings = make_settings()
    assert settings.demo_mode and settings.roles_share_model
    async with run_stack(settings) as stack:
        got = await collect(stack.client, "POST", CHAT, json=body(question))
    prompts = [f.bernard for f in got if f.bernard and f.bernard["type"] == "llm_prompt"]
    assert [p["stage"] for p in prompts] == ["router"] * calls
    assert says in text_of(got)


async def test_a_write_waits_for_the_user_and_the_decision_is_answered_in_one_call(
    upstream: ScriptedUpstream,
) -> None:
    """A confirmation in the one-model loop: the words before the write reach the user, the
    turn pauses, and the approved call's turn answers with one more call (no router call
    to hear `respond`)."""
    settings = make_settings(
        upstream,
        router_model="one-model",
        response_model="one-model",
        api_keys="key-fw:first-word-notes",
    )
    alice = {"Authorization": "Bearer key-fw"}
    note = ("save_note", {"text": "the door code is 1234"})
    upstream.script(Reply.tool_calls([note], content="I will note it."))
    upstream.script(Reply.text("Saved it."))
    async with run_stack(settings) as stack:
        created = await stack.client.post("/v1/conversations", json={}, headers=alice)
        assert created.status_code == 201, created.text
        url = f"/v1/conversations/{created.json()['id']}"
        paused = await stack.client.post(
            f"{url}/messages", json={"content": "remember the door code"}, headers=alice
        )
        assert paused.status_code == 200, paused.text
        proposal = paused.json()["pending_confirmation"]
        assert proposal["tool_call"]["name"] == "save_note"
        approved = await stack.client.post(
            f"{url}/resume",
            json={"confirmation_id": proposal["confirmation_id"], "decision": "approve"},
            headers=alice,
        )
        assert approved.status_code == 200, approved.text
        rows = (await stack.client.get(f"{url}/messages", headers=alice)).json()["data"]
    assert [(row["role"], row["content"]) for row in rows] == [
        ("user", "remember the door code"),
        ("assistant", "I will note it.\n\nShall I remember “the door code is 1234”?"),
        ("tool", "Saved: the door code is 1234"),
        ("assistant", "Saved it."),
    ]
    paused_call, answering = upstream.requests
    assert tool_names(paused_call) == TOOLS
    assert answering["messages"][-1] == {
        "role": "tool",
        "tool_call_id": proposal["tool_call"]["id"],
        "content": "Saved: the door code is 1234",
    }
    assert upstream.router_requests == []


async def test_the_responses_api_orders_the_text_before_a_call_alike_streamed_and_polled(
    one: Stack, upstream: ScriptedUpstream
) -> None:
    """Text before a tool call opens the response's message item before the call's: the
    Response the stream completes with and the one read back later list the same items in
    the same order."""
    upstream.script(
        Reply.tool_calls([("calculator", {"expression": "6 * 7"})], content="Let me check.")
    )
    upstream.script(Reply.text(" It is 42."))
    client = one.openai()
    stream = await client.responses.create(model="bernard-v1", input="6*7?", stream=True)
    events = [event async for event in stream]
    final = events[-1].response
    polled = await client.responses.retrieve(final.id)
    shapes = [
        [(item.type, getattr(item, "content", None) and item.content[0].text) for item in out]
        for out in (final.output, polled.output)
    ]
    assert shapes[0] == [("message", "Let me check. It is 42."), ("mcp_call", None)]
    assert shapes[1] == shapes[0]
