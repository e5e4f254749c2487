"""The direct calls (worker/openai_fast.py) give what `ChatOpenAI` gives, against the same
scripted upstream: text, tool calls, usage, finish reasons, errors, aborts."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from tests.support.stack import make_settings
from tests.support.upstream import Reply, ScriptedUpstream
from worker.llm import Llm, LlmError, LlmResult, build_models
from worker.tools import calculator


async def run(llm: Llm, **kwargs: Any) -> tuple[list[Any], LlmResult]:
    """The streamed items of one call, and the result beside them."""
    async with aclosing(llm.stream([HumanMessage("hi")], **kwargs)) as stream:
        items = [item async for item in stream]
    return items, stream.result


def both(upstream: ScriptedUpstream, **settings: Any) -> tuple[Llm, Llm, Any]:
    models = build_models(make_settings(upstream, **settings))
    fast = models.responder
    assert fast.direct
    slow = Llm(fast.model, fast.name, fast.options, direct=False)
    return fast, slow, models


def outcome(
    streamed: tuple[list[Any], LlmResult],
) -> tuple[list[str], str, dict[str, int] | None, str | None]:
    texts, result = streamed
    assert isinstance(result, LlmResult)
    return texts, str(result.message.content), result.usage, result.finish_reason


@pytest.mark.parametrize(
    ("reply", "params"),
    [
        (lambda: Reply.text(["Hel", "lo", " world"], usage=(7, 3)), {}),
        (lambda: Reply.text(["é", "😀", " ünïcode"]), {}),
        (lambda: Reply.text([]), {}),
        (lambda: Reply.text(["one", " two", " three", " four"]), {"max_tokens": 2}),
        (lambda: Reply.text(["a", "b"], chunk_delay=0.01), {"temperature": 0.5, "stop": ["x"]}),
        # The body ends cleanly without `[DONE]` (nor a finish or usage): the SDK takes what
        # came as the answer, with no finish reason, and so does the fast path.
        (lambda: Reply.text(["Hel", "lo", " world"], end_after=2), {}),
    ],
    ids=["text", "unicode", "empty", "cut by max_tokens", "options", "ended without [DONE]"],
)
async def test_both_paths_give_the_same_answer(
    upstream: ScriptedUpstream, reply: Any, params: dict[str, Any]
) -> None:
    fast, slow, models = both(upstream)
    try:
        upstream.script(reply())
        fast_items = await run(fast, params=params)
        upstream.script(reply())
        slow_items = await run(slow, params=params)
    finally:
        await models.aclose()
    assert outcome(fast_items) == outcome(slow_items)
    first, second = upstream.requests[-2:]
    assert first == second, "the same request goes upstream"


@pytest.mark.parametrize(
    "reply",
    [
        lambda: Reply.error(500, "boom"),
        lambda: Reply.error(400, "bad request", error_type="invalid_request_error"),
        lambda: Reply.text(["a", "b", "c"], fail_after=1),
    ],
    ids=["500", "400", "dropped mid-stream"],
)
async def test_both_paths_fail_the_same_way(upstream: ScriptedUpstream, reply: Any) -> None:
    fast, slow, models = both(upstream)
    errors = []
    try:
        for llm in (fast, slow):
            upstream.script(reply())
            with pytest.raises(LlmError) as caught:
                await run(llm)
            errors.append((caught.value.code, caught.value.message.split(":")[0]))
    finally:
        await models.aclose()
    assert errors[0] == errors[1]


@pytest.mark.parametrize("direct", [True, False], ids=["fast path", "ChatOpenAI"])
async def test_a_finished_stream_hands_its_connection_back(
    upstream: ScriptedUpstream, direct: bool
) -> None:
    """A turn's calls (router, streamed answer, the next turn's router...) go over one
    kept-alive connection: a stream closed before its body ended would drop it, and each
    call would pay a new TCP connection, in the worker and in the upstream."""
    fast, slow, models = both(upstream, worker_concurrency=64)  # one connection pool
    llm = fast if direct else slow
    respond = {"type": "function", "function": {"name": "respond", "parameters": {}}}
    try:
        for _ in range(3):
            await llm.complete([HumanMessage("hi")], [respond])
            upstream.script(Reply.text(["a", "b"], usage=(1, 2)))
            await run(llm)
    finally:
        await models.aclose()
    peers = {e.peer for e in [*upstream.router_exchanges, *upstream.exchanges]}
    assert len(upstream.exchanges) == 3
    assert len(peers) == 1, peers


async def test_cancelling_the_fast_path_closes_the_upstream(upstream: ScriptedUpstream) -> None:
    fast, _, models = both(upstream)
    upstream.script(Reply.slow(interval=0.01))
    task = asyncio.create_task(run(fast))
    try:
        await upstream.wait_requests(1)
        await asyncio.sleep(0.1)
        task.cancel()
        exchange = await upstream.wait_disconnect(timeout_s=5)
        assert exchange.completed_at is None
    finally:
        await models.aclose()


def streamed(items: list[Any], result: LlmResult) -> tuple[Any, ...]:
    """What a streamed call with tools gives: its text deltas, the calls it yields once
    whole, and the whole message's text, calls, invalid calls, usage and finish reason."""
    message = result.message
    texts = [item for item in items if isinstance(item, str)]
    yielded = [(c["name"], c["args"], c["id"]) for c in items if isinstance(c, dict)]
    calls = [(c["name"], c["args"], c["id"]) for c in message.tool_calls]
    invalid = [(c["name"], c["args"], c["id"]) for c in message.invalid_tool_calls]
    return texts, yielded, str(message.content), calls, invalid, result.usage, result.finish_reason


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            lambda: Reply.tool_calls(
                [("calculator", {"expression": "1+1"})], ids=["call_1"], arg_chunks=5
            ),
            ([], [("calculator", {"expression": "1+1"}, "call_1")], "", 1),
        ),
        (
            lambda: Reply.tool_calls(
                [("calculator", {"expression": "2*21"}), ("get_time", {"timezone": "UTC"})],
                content="Let me check.",
                ids=["call_a", "call_b"],
            ),
            (
                ["Let", " me", " check."],
                [
                    ("calculator", {"expression": "2*21"}, "call_a"),
                    ("get_time", {"timezone": "UTC"}, "call_b"),
                ],
                "Let me check.",
                0,
            ),
        ),
        (lambda: Reply.text(["An", " answer"]), (["An", " answer"], [], "An answer", 0)),
    ],
    ids=["one call", "text, then two calls", "text alone"],
)
async def test_with_tools_bound_both_paths_stream_the_same(
    upstream: ScriptedUpstream, reply: Any, expected: tuple[Any, ...]
) -> None:
    """The fast path streams a call with tools as `ChatOpenAI` does: text as it comes, each
    call once whole, the same message at the end (the text before the calls on it)."""
    fast, slow, models = both(upstream)
    try:
        upstream.script(reply())
        fast_items = streamed(*await run(fast, tools=[calculator]))
        upstream.script(reply())
        slow_items = streamed(*await run(slow, tools=[calculator]))
    finally:
        await models.aclose()
    texts, calls, content, _ = expected
    assert fast_items[:4] == (texts, calls, content, calls)
    assert fast_items == slow_items
    first, second = upstream.requests[-2:]
    assert first == second, "the same request goes upstream"
    assert first["stream"] is True
    assert [t["function"]["name"] for t in first["tools"]] == ["calculator"]


@pytest.mark.parametrize(
    "arguments",
    ['{"expression": "1+', "[1, 2]"],
    ids=["not JSON", "JSON, not an object"],
)
async def test_a_streamed_call_with_bad_arguments_is_an_invalid_call(
    upstream: ScriptedUpstream, arguments: str
) -> None:
    """Arguments that are not a JSON object make an invalid call, streamed as in a whole
    answer, whose arguments are the model's own text (the router answers it with the
    problem). LangChain's chunks would complete the cut JSON into a call instead."""
    fast, _, models = both(upstream)
    try:
        upstream.script(Reply.tool_calls([("calculator", arguments)], ids=["call_x"]))
        _, result = await run(fast, tools=[calculator])
        upstream.script_router(Reply.tool_calls([("calculator", arguments)], ids=["call_x"]))
        respond = {"type": "function", "function": {"name": "respond", "parameters": {}}}
        whole = await fast.complete([HumanMessage("hi")], [calculator, respond])
    finally:
        await models.aclose()
    for message in (result.message, whole.message):
        assert message.tool_calls == []
        assert [(c["name"], c["args"], c["id"]) for c in message.invalid_tool_calls] == [
            ("calculator", arguments, "call_x")
        ]


async def test_a_streamed_call_with_tools_keeps_its_bind_options(
    upstream: ScriptedUpstream,
) -> None:
    fast, _, models = both(upstream)
    upstream.script(Reply.text(["ok"]))
    try:
        await run(fast, tools=[calculator], options={"tool_choice": "required"})
    finally:
        await models.aclose()
    (request,) = upstream.requests
    assert request["tool_choice"] == "required"


def answer(result: LlmResult) -> tuple[Any, ...]:
    """What the router reads of an answer (the upstream numbers the ids it makes up)."""
    message = result.message
    calls = [(c["name"], c["args"], c["id"].startswith("call_")) for c in message.tool_calls]
    return str(message.content), calls, result.usage, result.finish_reason


@pytest.mark.parametrize(
    "reply",
    [
        lambda: Reply.text(["A whole", " answer"], usage=(11, 2)),
        lambda: Reply.tool_calls(
            [("calculator", {"expression": "2*21"}), ("get_time", {"zone": "Europe/Zürich"})],
            content="Let me check.",
            ids=["call_a", "call_b"],
        ),
        lambda: Reply.tool_calls([("respond", {})], ids=["call_r"]),
        lambda: Reply.text(["one", " two", " three"]),
    ],
    ids=["text", "two tool calls and text", "respond", "plain"],
)
async def test_both_paths_complete_the_same(upstream: ScriptedUpstream, reply: Any) -> None:
    fast, slow, models = both(upstream)
    respond = {"type": "function", "function": {"name": "respond", "parameters": {}}}
    tools = [calculator, respond]  # a router call: the upstream answers it from its own script
    try:
        upstream.script_router(reply())
        fast_result = await fast.complete([HumanMessage("hi")], tools)
        upstream.script_router(reply())
        slow_result = await slow.complete([HumanMessage("hi")], tools)
    finally:
        await models.aclose()
    assert answer(fast_result) == answer(slow_result)
    assert fast_result.finish_reason is not None
    first, second = upstream.router_requests[-2:]
    assert first == second, "the same request goes upstream"
    assert [t["function"]["name"] for t in first["tools"]] == ["calculator", "respond"]


@pytest.mark.parametrize(
    "reply",
    [
        lambda: Reply.error(500, "boom"),
        lambda: Reply.error(400, "bad request", error_type="invalid_request_error"),
        lambda: Reply.error(401, "no key", error_type="authentication_error"),
    ],
    ids=["500", "400", "401"],
)
async def test_both_paths_fail_a_whole_answer_the_same_way(
    upstream: ScriptedUpstream, reply: Any
) -> None:
    fast, slow, models = both(upstream)
    errors = []
    try:
        for llm in (fast, slow):
            upstream.script(reply())
            with pytest.raises(LlmError) as caught:
                await llm.complete([HumanMessage("hi")], [calculator])
            errors.append((caught.value.code, caught.value.message))
    finally:
        await models.aclose()
    assert errors[0] == errors[1]
