"""The agent turn end to end: router → tools → response through the real pipeline.

Real API, real arq worker (in this test's event loop), real Redis, the worker's `ChatOpenAI`
talking to the scripted upstream over HTTP. Router calls (requests offering `respond`) are
scripted with `script_router`, the answer with `script`. Test tools are handed to the worker
with `run_stack(settings, tools=...)` (tests/support/stack.py); since the worker runs in this
event loop, a test can gate a tool on an `asyncio.Event` and set it only once the client has
seen the tool's progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool

from api.auth import LOCAL_USER
from shared.records.reads import Archivist
from tests.support.sse import Frame, collect, frames, text_of
from tests.support.stack import Stack, make_settings, run_stack, wait_status
from tests.support.upstream import Reply, ScriptedUpstream
from worker.tools import default_tools, get_reporter

CHAT = "/v1/chat/completions"
ANSWER = "Six times seven is 42."


def agent_stack(
    upstream: ScriptedUpstream | None, tools: Sequence[BaseTool] | None = None, **overrides: Any
) -> contextlib.AbstractAsyncContextManager[Stack]:
    """API and worker like `run_stack`, with the worker's tools replaced by `tools`."""
    return run_stack(make_settings(upstream, **overrides), tools=tools)


def body(
    content: str = "What is 6 * 7?",
    *,
    stream: bool = True,
    tool_events: str = "bernard",
    trace: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    options = {"include_usage": True, "tool_events": tool_events, "trace": trace}
    return {
        "model": "bernard-v1",
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        **({"stream_options": options} if stream else {}),
        **extra,
    }


def kind(frame: Frame) -> str:
    """What a frame is, for order checks: a `bernard` type or the standard chunk's part."""
    if frame.done:
        return "[DONE]"
    data = frame.json
    if "error" in data:
        return "error_frame"
    if data.get("bernard"):
        return str(data["bernard"]["type"])
    if not data["choices"]:
        return "usage" if data.get("usage") else "empty"
    choice = data["choices"][0]
    delta = choice["delta"]
    if choice["finish_reason"]:
        return "finish"
    if "role" in delta:
        return "role"
    if delta.get("tool_calls"):
        return "delta.tool_calls"
    if delta.get("tool_outputs"):
        return "delta.tool_outputs"
    return "content" if delta.get("content") else "other"


def kinds(collected: Sequence[Frame]) -> list[str]:
    """Frame kinds in order, keepalives dropped and runs of content folded into one."""
    out: list[str] = []
    for frame in collected:
        k = kind(frame)
        if k == "keepalive" or (k == "content" and out and out[-1] == "content"):
            continue
        out.append(k)
    return out


def bernard_of(collected: Sequence[Frame], kind_: str) -> list[dict[str, Any]]:
    return [f.bernard for f in collected if f.bernard and f.bernard["type"] == kind_]


def calculator_then_answer(upstream: ScriptedUpstream, answer: str = ANSWER) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    upstream.script(Reply.text(answer))


# -- order and shape of the stream ---------------------------------------------------------


async def test_the_stream_shows_trace_tool_call_progress_result_then_the_answer(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    calculator_then_answer(upstream)
    got = await collect(stack.client, "POST", CHAT, json=body(trace=True))

    assert kinds(got) == [
        "role",
        "memory",
        "llm_prompt",
        "llm_call_complete",
        "tool_call",
        "tool_progress",
        "tool_progress",
        "tool_result",
        "llm_prompt",
        "llm_call_complete",
        "llm_prompt",
        "content",
        "llm_call_complete",
        "finish",
        "usage",
        "[DONE]",
    ]
    assert text_of(got) == ANSWER
    stages = [b["stage"] for b in bernard_of(got, "llm_prompt")]
    assert stages == ["router", "router", "response"]
    (memory,) = bernard_of(got, "memory")
    assert (memory["kept"], memory["summary_covers"]) == (1, None)
    assert 0 < memory["tokens"] < memory["budget"] + memory["tokens"]
    # Every extension frame is a full chunk with the stream's id, created and model.
    heads = {(f.json["id"], f.json["created"], f.json["model"]) for f in got if not f.done}
    assert len(heads) == 1
    assert all(f.json["choices"] == [] for f in got if f.bernard)
    finish = next(f for f in got if kind(f) == "finish")
    assert finish.json["choices"][0]["finish_reason"] == "stop"


async def test_without_trace_no_prompt_frames_are_sent(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    calculator_then_answer(upstream)
    got = await collect(stack.client, "POST", CHAT, json=body())
    assert kinds(got) == [
        "role",
        "tool_call",
        "tool_progress",
        "tool_progress",
        "tool_result",
        "content",
        "finish",
        "usage",
        "[DONE]",
    ]


@pytest.mark.parametrize("mode", ["bernard", "delta"])
async def test_respond_never_reaches_the_client(
    stack: Stack, upstream: ScriptedUpstream, mode: str
) -> None:
    upstream.script_router(
        Reply.tool_calls([("calculator", {"expression": "6 * 7"}), ("respond", {})])
    )
    upstream.script(Reply.text(ANSWER))
    got = await collect(stack.client, "POST", CHAT, json=body(tool_events=mode, trace=True))
    names = [b["name"] for b in bernard_of(got, "tool_call")]
    names += [
        call["function"]["name"]
        for f in got
        if kind(f) == "delta.tool_calls"
        for call in f.json["choices"][0]["delta"]["tool_calls"]
    ]
    assert names == ["calculator"]
    assert len(upstream.router_requests) == 1  # respond ended the loop
    assert not [f for f in got if '"respond"' in f.data]
    assert text_of(got) == ANSWER


async def test_a_tool_call_its_progress_and_its_output_share_one_id(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    calculator_then_answer(upstream)
    got = await collect(stack.client, "POST", CHAT, json=body())
    (call,) = bernard_of(got, "tool_call")
    (result,) = bernard_of(got, "tool_result")
    progress = bernard_of(got, "tool_progress")
    assert call["id"] == result["tool_call_id"]
    assert {p["tool_call_id"] for p in progress} == {call["id"]}
    assert (call["name"], json.loads(call["arguments"]), call["index"]) == (
        "calculator",
        {"expression": "6 * 7"},
        0,
    )
    assert (result["name"], result["content"], result["truncated"]) == ("calculator", "42", False)


async def test_a_slow_tools_progress_reaches_the_client_before_its_result_exists(
    upstream: ScriptedUpstream,
) -> None:
    release = asyncio.Event()
    finished = asyncio.Event()

    @tool
    async def survey(topic: str, config: RunnableConfig) -> str:
        """Survey a topic, slowly."""
        reporter = get_reporter(config)
        reporter.step(f"Surveying {topic}")
        reporter.progress(1, 3)
        await release.wait()
        finished.set()
        return f"{topic}: done"

    upstream.script_router(Reply.tool_calls([("survey", {"topic": "otters"})]))
    upstream.script(Reply.text("Otters are fine."))
    async with (
        agent_stack(upstream, tools=[survey]) as stack,
        stack.client.stream("POST", CHAT, json=body("otters?")) as response,
    ):
        stream = frames(response)
        seen: list[Frame] = []
        while len(bernard_of(seen, "tool_progress")) < 2:
            seen.append(await anext(stream))
        # The client holds both progress frames while the tool is still waiting.
        assert not finished.is_set()
        assert not bernard_of(seen, "tool_result")
        release.set()
        rest = [frame async for frame in stream]
    (result,) = bernard_of(rest, "tool_result")
    assert result["content"] == "otters: done"
    assert [p["phase"] for p in bernard_of(seen, "tool_progress")] == ["step", "progress"]
    assert text_of(rest) == "Otters are fine."


# -- what goes wrong ------------------------------------------------------------------------


async def test_a_client_leaving_mid_tool_cancels_the_tool_and_closes_its_record(
    upstream: ScriptedUpstream,
) -> None:
    cancelled = asyncio.Event()

    @tool
    async def crawl(config: RunnableConfig) -> str:
        """Crawls forever."""
        get_reporter(config).step("crawling")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    upstream.script_router(Reply.tool_calls([("crawl", {})]))
    async with agent_stack(upstream, tools=[crawl]) as stack:
        async with stack.client.stream("POST", CHAT, json=body("crawl")) as response:
            turn_id = response.headers["x-bernard-turn-id"]
            conversation_id = response.headers["x-bernard-conversation-id"]
            stream = frames(response)
            seen: list[Frame] = []
            while not bernard_of(seen, "tool_progress"):
                seen.append(await anext(stream))
        await asyncio.wait_for(cancelled.wait(), 5)
        ended = await wait_status(stack, turn_id, {"cancelled", "completed", "failed"})
        assert ended["status"] == "cancelled"
        archivist = Archivist(stack.redis, LOCAL_USER)
        (record,) = await archivist.calls(conversation_id, kind="tool")
        messages = await archivist.messages(conversation_id)
        rows, _ = await archivist.rows(conversation_id)
    assert (record["name"], record["status"]) == ("crawl", "failed")
    assert record["content"] == "Error: the turn was stopped before the call ended"
    # The call and how it ended stay in the conversation, and the answer it never began,
    # marked stopped: the next turn's model reads that it was stopped, in a prompt where
    # no call lacks its result.
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["tool_calls"][0]["function"]["name"] == "crawl"
    assert messages[2]["tool_call_id"] == messages[1]["tool_calls"][0]["id"]
    assert messages[2]["content"] == "Error: the turn was stopped before the call ended"
    assert (rows[3]["content"], rows[3]["stopped"]) == ("", "turn_cancelled")
    assert upstream.requests == []  # the response model was never called


async def test_unknown_tools_and_bad_arguments_are_answered_and_the_turn_goes_on(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(
        Reply.tool_calls([("teleport", {"to": "Mars"}), ("calculator", {"expr": "1 + 1"})])
    )
    upstream.script(Reply.text("I could not do that."))
    got = await collect(stack.client, "POST", CHAT, json=body())
    first, second = bernard_of(got, "tool_result")
    assert first["content"].startswith("Error: unknown tool 'teleport'")
    assert second["content"] == (
        "Error: invalid arguments for tool 'calculator': expression: Field required"
    )
    assert text_of(got) == "I could not do that."
    assert kind(got[-3]) == "finish"
    # Both errors went back to the router, and the response model saw them too.
    fed_back = [m for m in upstream.router_requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in fed_back] == [first["content"], second["content"]]
    response_prompt = upstream.requests[-1]["messages"]
    assert [m["content"] for m in response_prompt if m["role"] == "tool"] == [
        first["content"],
        second["content"],
    ]


@pytest.mark.parametrize("arguments", ["[1, 2]", '"six times seven"', "42", "true"])
async def test_arguments_that_are_json_but_not_an_object_go_back_to_the_model(
    stack: Stack, upstream: ScriptedUpstream, arguments: str
) -> None:
    """As arguments that are not JSON at all: the model reads why the call did not run, and
    the turn goes on, rather than failing with the parser's text."""
    upstream.script_router(Reply.tool_calls([("calculator", arguments)]))
    upstream.script(Reply.text("I could not do that."))
    got = await collect(stack.client, "POST", CHAT, json=body())
    (call,) = bernard_of(got, "tool_call")
    (result,) = bernard_of(got, "tool_result")
    assert call["arguments"] == arguments
    assert result["content"] == (
        "Error: invalid arguments for tool 'calculator': the arguments are not a JSON "
        f"object: {arguments!r}"
    )
    assert text_of(got) == "I could not do that."
    fed_back = [m for m in upstream.router_requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in fed_back] == [result["content"]]


async def test_a_tool_over_its_time_gets_an_error_result_and_an_error_frame(
    upstream: ScriptedUpstream,
) -> None:
    @tool
    async def hang() -> str:
        """Never finishes."""
        await asyncio.Event().wait()
        return "never"

    upstream.script_router(Reply.tool_calls([("hang", {})]))
    upstream.script(Reply.text("The tool was too slow."))
    async with agent_stack(upstream, tools=[hang], tool_timeout_s=0.3) as stack:
        got = await collect(stack.client, "POST", CHAT, json=body("hang"))
    assert kinds(got)[:4] == ["role", "tool_call", "tool_result", "error"]
    (result,) = bernard_of(got, "tool_result")
    (error,) = bernard_of(got, "error")
    assert result["content"] == "Error: the tool 'hang' did not finish within 0.3s and was stopped"
    assert error["code"] == "tool_timeout"
    assert text_of(got) == "The tool was too slow."
    assert got[-1].done and kind(got[-3]) == "finish"


async def test_a_tool_that_raises_gets_an_error_result_and_the_turn_completes(
    upstream: ScriptedUpstream,
) -> None:
    @tool
    def explode() -> str:
        """Always fails."""
        raise RuntimeError("kaput")

    upstream.script_router(Reply.tool_calls([("explode", {})]))
    upstream.script(Reply.text("Sorry."))
    async with agent_stack(upstream, tools=[explode]) as stack:
        got = await collect(stack.client, "POST", CHAT, json=body("explode"))
    (result,) = bernard_of(got, "tool_result")
    (error,) = bernard_of(got, "error")
    assert result["content"] == "Error: the tool 'explode' failed: kaput"
    assert error["code"] == "tool_error"
    assert text_of(got) == "Sorry." and kind(got[-3]) == "finish"


async def test_the_step_limit_is_an_error_frame_and_the_answer_still_comes(
    upstream: ScriptedUpstream,
) -> None:
    for _ in range(3):
        upstream.script_router(Reply.tool_calls([("calculator", {"expression": "1 + 1"})]))
    upstream.script(Reply.text("Two, twice."))
    async with agent_stack(upstream, max_router_steps=2) as stack:
        got = await collect(stack.client, "POST", CHAT, json=body("1+1 forever"))
    assert len(upstream.router_requests) == 2
    (error,) = bernard_of(got, "error")
    assert error["code"] == "router_step_limit"
    assert [b["index"] for b in bernard_of(got, "tool_call")] == [0, 1]
    assert kinds(got)[-6:] == ["tool_result", "error", "content", "finish", "usage", "[DONE]"]
    assert text_of(got) == "Two, twice."


async def test_an_upstream_500_during_the_router_fails_the_turn(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.error(500, "router exploded"))
    async with stack.client.stream("POST", CHAT, json=body()) as response:
        turn_id = response.headers["x-bernard-turn-id"]
        got = [frame async for frame in frames(response)]
    # The failure as a `bernard` error chunk, then the terminal error frame.
    assert kinds(got) == ["role", "error", "error_frame", "[DONE]"]
    error = got[-2].json["error"]
    assert error["code"] == "upstream_error" and "500" in error["message"]
    assert upstream.requests == []  # the response model was never called
    turn = (await stack.client.get(f"/v1/turns/{turn_id}")).json()
    assert turn["status"] == "failed"


UPSTREAM_SECRET = "db at 10.0.0.5 refused user billing-svc"


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (lambda: Reply.error(500, UPSTREAM_SECRET), "the upstream model failed (HTTP 500)"),
        (
            lambda: Reply.error(400, UPSTREAM_SECRET, error_type="invalid_request_error"),
            "the upstream model failed (HTTP 400)",
        ),
        (lambda: Reply.text(["one", "two"], fail_after=1), "the upstream model failed"),
    ],
    ids=["500", "400", "dropped mid-stream"],
)
async def test_clients_get_the_code_and_a_generic_message_never_the_upstreams_text(
    stack: Stack, upstream: ScriptedUpstream, reply: Any, message: str
) -> None:
    """What an upstream says when it fails may quote its internals or the prompt: it stays
    in the log (with BERNARD_LOG_PROMPTS=1), and every way a client reads the ending says
    the same generic words."""
    upstream.script(reply())
    got = await collect(stack.client, "POST", CHAT, json=body())
    streamed = got[-2].json["error"]
    (event,) = bernard_of(got, "error")
    upstream.script(reply())
    waited = await stack.client.post(CHAT, json=body(stream=False))
    turn = (await stack.client.get(f"/v1/turns/{waited.headers['x-bernard-turn-id']}")).json()
    assert waited.status_code == 502
    for error in (streamed, event, waited.json()["error"], turn["error"]):
        assert error["code"] == "upstream_error"
        assert error["message"] == message
    for text in (str(got), waited.text, str(turn)):
        assert "10.0.0.5" not in text and "billing" not in text


async def test_an_upstream_500_during_the_response_fails_the_turn_after_the_tools(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    upstream.script(Reply.error(500, "response exploded"))
    async with stack.client.stream("POST", CHAT, json=body()) as response:
        turn_id = response.headers["x-bernard-turn-id"]
        got = [frame async for frame in frames(response)]
    assert kinds(got) == [
        "role",
        "tool_call",
        "tool_progress",
        "tool_progress",
        "tool_result",
        "error",
        "error_frame",
        "[DONE]",
    ]
    assert got[-2].json["error"]["code"] == "upstream_error"
    turn = (await stack.client.get(f"/v1/turns/{turn_id}")).json()
    assert turn["status"] == "failed"


async def test_a_non_stream_request_fails_with_502_when_the_router_fails(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.error(500, "router exploded"))
    response = await stack.client.post(CHAT, json=body(stream=False))
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_error"


# -- tool_events modes ------------------------------------------------------------------------


def two_steps(upstream: ScriptedUpstream) -> None:
    """Two calls in the first router step, one in the second, then the answer."""
    upstream.script_router(
        Reply.tool_calls(
            [("calculator", {"expression": "6 * 7"}), ("get_time", {"timezone": "UTC"})]
        )
    )
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "1 + 1"})]))
    upstream.script(Reply.text(ANSWER))


async def test_bernard_mode_sends_tools_only_as_extension_frames(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    two_steps(upstream)
    got = await collect(stack.client, "POST", CHAT, json=body(tool_events="bernard"))
    assert "delta.tool_calls" not in kinds(got) and "delta.tool_outputs" not in kinds(got)
    assert [b["index"] for b in bernard_of(got, "tool_call")] == [0, 1, 2]
    assert len(bernard_of(got, "tool_result")) == 3
    assert bernard_of(got, "tool_progress")
    assert text_of(got) == ANSWER


async def test_delta_mode_sends_calls_in_delta_tool_calls_indexed_across_the_turn(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    two_steps(upstream)
    got = await collect(stack.client, "POST", CHAT, json=body(tool_events="delta"))

    calls = [
        call
        for f in got
        if kind(f) == "delta.tool_calls"
        for call in f.json["choices"][0]["delta"]["tool_calls"]
    ]
    outputs = [
        output
        for f in got
        if kind(f) == "delta.tool_outputs"
        for output in f.json["choices"][0]["delta"]["tool_outputs"]
    ]
    assert [c["index"] for c in calls] == [0, 1, 2]
    assert len({c["id"] for c in calls}) == 3
    assert all(c["type"] == "function" for c in calls)
    assert [c["function"]["name"] for c in calls] == ["calculator", "get_time", "calculator"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "6 * 7"}
    assert [o["id"] for o in outputs] == [c["id"] for c in calls]
    assert [o["index"] for o in outputs] == [0, 1, 2]  # the SDK helper merges by index
    assert [outputs[0]["content"], outputs[2]["content"]] == ["42", "2"]
    # Progress still travels in extension frames; no tool_call/tool_result frames of ours.
    assert bernard_of(got, "tool_progress")
    assert not bernard_of(got, "tool_call") and not bernard_of(got, "tool_result")
    finish = next(f for f in got if kind(f) == "finish")
    assert finish.json["choices"][0]["finish_reason"] == "stop"
    assert text_of(got) == ANSWER


async def test_none_mode_sends_only_content_finish_and_usage(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    two_steps(upstream)
    got = await collect(stack.client, "POST", CHAT, json=body(tool_events="none"))
    assert kinds(got) == ["role", "content", "finish", "usage", "[DONE]"]
    assert text_of(got) == ANSWER


async def test_none_mode_still_reports_non_fatal_errors(upstream: ScriptedUpstream) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "1"})]))
    upstream.script(Reply.text("Done."))
    async with agent_stack(upstream, max_router_steps=1) as stack:
        got = await collect(stack.client, "POST", CHAT, json=body(tool_events="none"))
    assert kinds(got) == ["role", "error", "content", "finish", "usage", "[DONE]"]


# -- long outputs and the record keeper ----------------------------------------------------


async def test_a_long_tool_output_is_cut_in_the_stream_and_stored_whole(
    upstream: ScriptedUpstream,
) -> None:
    whole = "".join(f"line {i}\n" for i in range(100))

    @tool
    def report() -> str:
        """A long report."""
        return whole

    upstream.script_router(Reply.tool_calls([("report", {})]))
    upstream.script(Reply.text("Summarised."))
    async with agent_stack(upstream, tools=[report], stream_tool_output_max_chars=20) as stack:
        async with stack.client.stream("POST", CHAT, json=body("report")) as response:
            conversation_id = response.headers["x-bernard-conversation-id"]
            got = [frame async for frame in frames(response)]
        archivist = Archivist(stack.redis, LOCAL_USER)
        (tool_record,) = await archivist.calls(conversation_id, kind="tool")
        messages = await archivist.messages(conversation_id, roles="tool")

    (result,) = bernard_of(got, "tool_result")
    assert result["content"] == f"{whole[:20]}…[truncated {len(whole) - 20} chars]"
    assert result["truncated"] is True
    assert tool_record["content"] == whole
    assert [m["content"] for m in messages] == [whole]
    # The response model read it whole as well.
    assert [m["content"] for m in upstream.requests[0]["messages"] if m["role"] == "tool"] == [
        whole
    ]


async def test_a_turn_is_recorded_once_and_the_next_turn_continues_it(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    calculator_then_answer(upstream)
    async with stack.client.stream("POST", CHAT, json=body(trace=True)) as response:
        conversation_id = response.headers["x-bernard-conversation-id"]
        first_turn = response.headers["x-bernard-turn-id"]
        await response.aread()

    archivist = Archivist(stack.redis, LOCAL_USER)
    after_first = await archivist.messages(conversation_id)
    assert [(m["role"], bool(m.get("tool_calls"))) for m in after_first] == [
        ("user", False),
        ("assistant", True),
        ("tool", False),
        ("assistant", False),
    ]
    call_id = after_first[1]["tool_calls"][0]["id"]
    assert after_first[2] == {
        "role": "tool",
        "content": "42",
        "name": "calculator",
        "tool_call_id": call_id,
    }
    assert after_first[3] == {"role": "assistant", "content": ANSWER}

    calls = await archivist.calls(conversation_id)
    llm = [c for c in calls if c["kind"] == "llm"]
    tools = [c for c in calls if c["kind"] == "tool"]
    assert [(c["stage"], c["status"]) for c in llm] == [
        ("router", "completed"),
        ("router", "completed"),
        ("response", "completed"),
    ]
    assert all(c["usage"]["total_tokens"] >= 0 and c["latency_ms"] > 0 for c in llm)
    assert all(c["turn_id"] == first_turn for c in calls)
    assert all("messages" not in c for c in llm), "prompts are the conversation's, stored once"
    assert [(t["name"], t["tool_call_id"], t["content"], t["status"]) for t in tools] == [
        ("calculator", call_id, "42", "completed")
    ]

    # The client resends the whole history plus a new question, without the tool messages.
    upstream.script(Reply.text("You are welcome."))
    history = [
        {"role": "user", "content": "What is 6 * 7?"},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": "Thanks!"},
    ]
    second = await stack.client.post(
        CHAT,
        json={"model": "bernard-v1", "messages": history, "conversation_id": conversation_id},
    )
    assert second.status_code == 200
    assert second.json()["bernard"]["conversation_id"] == conversation_id

    after_second = await archivist.messages(conversation_id)
    assert after_second[:4] == after_first
    assert after_second[4:] == [
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You are welcome."},
    ]
    calls = await archivist.calls(conversation_id)
    assert [c["kind"] for c in calls].count("llm") == 5  # router + response for the second
    assert [c["kind"] for c in calls].count("tool") == 1
    second_turn = {c["turn_id"] for c in calls[4:]}
    assert second_turn == {second.headers["x-bernard-turn-id"]}
    assert "messages" not in calls[4]  # untraced: the prompt is not kept
    # The stored conversation, router steps included, was the response model's context.
    prompt = upstream.requests[-1]["messages"]
    assert [m["role"] for m in prompt] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]


async def test_a_failed_turn_records_the_failed_call_and_no_answer(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.error(500, "router exploded"))
    async with stack.client.stream("POST", CHAT, json=body()) as response:
        conversation_id = response.headers["x-bernard-conversation-id"]
        await response.aread()
    archivist = Archivist(stack.redis, LOCAL_USER)
    assert await archivist.messages(conversation_id) == [
        {"role": "user", "content": "What is 6 * 7?"}
    ]
    (call,) = await archivist.calls(conversation_id)
    assert (call["stage"], call["status"]) == ("router", "failed")
    assert "500" in call["error"]


async def test_the_non_stream_body_lists_the_tools_that_ran(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    calculator_then_answer(upstream)
    response = await stack.client.post(CHAT, json=body(stream=False))
    assert response.status_code == 200
    data = response.json()
    message = data["choices"][0]["message"]
    assert message["content"] == ANSWER and "tool_calls" not in message
    (call,) = data["bernard"]["tool_calls"]
    (output,) = data["bernard"]["tool_outputs"]
    assert (call["name"], json.loads(call["arguments"])) == ("calculator", {"expression": "6 * 7"})
    assert output == {"id": call["id"], "name": "calculator", "content": "42"}
    # The turn's usage counts every model call: two router calls and the answer.
    assert data["usage"]["total_tokens"] > 0


async def test_a_legacy_completion_runs_the_response_model_only(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text("a completion"))
    response = await stack.client.post(
        "/v1/completions", json={"model": "bernard-v1", "prompt": "Say something"}
    )
    assert response.status_code == 200
    assert response.json()["choices"][0]["text"] == "a completion"
    assert upstream.router_requests == []
    assert "tools" not in upstream.requests[0]


# -- real clients parse the whole stream in every mode --------------------------------------


MODES = ["bernard", "delta", "none"]


@pytest.mark.parametrize("mode", MODES)
async def test_the_openai_stream_helper_parses_every_mode(
    stack: Stack, upstream: ScriptedUpstream, mode: str
) -> None:
    two_steps(upstream)
    client = stack.openai()
    async with client.chat.completions.stream(
        model="bernard-v1",
        messages=[{"role": "user", "content": "What is 6 * 7?"}],
        stream_options={"include_usage": True},
        extra_body={"stream_options": {"include_usage": True, "tool_events": mode, "trace": True}},
    ) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    choice = final.choices[0]
    assert choice.message.content == ANSWER
    assert choice.finish_reason == "stop"
    assert final.usage is not None and final.usage.total_tokens > 0


@pytest.mark.parametrize("mode", MODES)
async def test_langchain_chat_openai_parses_every_mode(
    stack: Stack, upstream: ScriptedUpstream, mode: str
) -> None:
    two_steps(upstream)
    llm = stack.langchain(
        stream_usage=True,
        extra_body={"stream_options": {"include_usage": True, "tool_events": mode, "trace": True}},
    )
    total: AIMessageChunk | None = None
    async for chunk in llm.astream("What is 6 * 7?"):
        total = chunk if total is None else total + chunk
    assert total is not None
    assert total.content == ANSWER
    assert total.usage_metadata is not None and total.usage_metadata["total_tokens"] > 0
    assert total.response_metadata["finish_reason"] == "stop"


# -- the offline demo model -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "tool_name", "arguments", "in_answer"),
    [
        ("What is (2 + 3) * 4?", "calculator", {"expression": "(2 + 3) * 4"}, "is 20"),
        ("What time is it in Europe/Paris?", "get_time", {"timezone": "Europe/Paris"}, "Paris"),
        ("what time is it", "get_time", {"timezone": "UTC"}, "The time in UTC is"),
    ],
)
async def test_the_demo_model_calls_tools_through_the_router(
    question: str, tool_name: str, arguments: dict[str, str], in_answer: str
) -> None:
    async with agent_stack(
        None, tools=default_tools(), openai_base_url=None, openai_api_key=None
    ) as stack:
        assert stack.settings.demo_mode
        got = await collect(stack.client, "POST", CHAT, json=body(question))
    (call,) = bernard_of(got, "tool_call")
    (result,) = bernard_of(got, "tool_result")
    assert (call["name"], json.loads(call["arguments"])) == (tool_name, arguments)
    assert result["tool_call_id"] == call["id"]
    assert in_answer in text_of(got) and result["content"] in text_of(got)
    assert kinds(got)[-3:] == ["finish", "usage", "[DONE]"]
