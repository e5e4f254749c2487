"""The scripted upstream against the real `ChatOpenAI` client over real HTTP."""

from __future__ import annotations

import asyncio
import operator
import time
from functools import reduce
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessageChunk
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from tests.support.upstream import Reply, ScriptedUpstream, echo_responder, echo_tokens, tool_names


@tool
def get_time(timezone: str) -> str:
    """The current time in a timezone."""
    return "12:00"


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return "42"


def chat(upstream: ScriptedUpstream, **kwargs: Any) -> ChatOpenAI:
    # max_retries=0: a retry would silently consume the next scripted reply.
    # stream_chunk_timeout=None: its per-chunk asyncio.wait_for swallows a cancel on Python 3.11
    # whenever the next chunk is already buffered (see the buffered-cancel test below).
    return ChatOpenAI(
        model="gpt-4o-mini",
        base_url=upstream.base_url,
        api_key="test",
        stream_usage=True,
        max_retries=0,
        stream_chunk_timeout=None,
        **kwargs,
    )


async def collect(llm: ChatOpenAI, prompt: str = "hi") -> list[AIMessageChunk]:
    return [chunk async for chunk in llm.astream(prompt)]


async def test_streams_text_token_by_token_with_usage() -> None:
    async with ScriptedUpstream() as upstream:
        upstream.script(Reply.text("Hello brave new world"))
        chunks = await collect(chat(upstream), "Say hello")

        assert [c.content for c in chunks if c.content] == ["Hello", " brave", " new", " world"]
        total = reduce(operator.add, chunks)
        assert total.content == "Hello brave new world"
        assert total.usage_metadata is not None
        assert total.usage_metadata["output_tokens"] == 4
        assert total.usage_metadata["total_tokens"] == (total.usage_metadata["input_tokens"] + 4)
        assert total.response_metadata["finish_reason"] == "stop"

        (body,) = upstream.requests
        assert body["model"] == "gpt-4o-mini"
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert body["messages"] == [{"role": "user", "content": "Say hello"}]
        ex = upstream.exchanges[0]
        assert ex.completed_at is not None and ex.disconnected_at is None
        assert ex.started_at <= ex.completed_at


async def test_non_stream_completion_with_usage() -> None:
    async with ScriptedUpstream() as upstream:
        upstream.script(Reply.text("Plain answer"))
        message = await chat(upstream).ainvoke("hi")

        assert message.content == "Plain answer"
        assert message.usage_metadata is not None
        assert message.usage_metadata["output_tokens"] == 2
        assert upstream.requests[0].get("stream") is not True


@pytest.mark.parametrize("streaming", [True, False])
async def test_tool_calls_are_accumulated(streaming: bool) -> None:
    async with ScriptedUpstream() as upstream:
        upstream.script(
            Reply.tool_calls(
                [("get_time", {"timezone": "Europe/Paris"}), ("calculator", {"expression": "6*7"})],
                arg_chunks=4,
            )
        )
        llm = chat(upstream, streaming=streaming).bind_tools([get_time, calculator])
        message = await llm.ainvoke("time in Paris, and 6*7?")

        assert [(c["name"], c["args"], c["id"]) for c in message.tool_calls] == [
            ("get_time", {"timezone": "Europe/Paris"}, "call_1"),
            ("calculator", {"expression": "6*7"}, "call_2"),
        ]
        assert message.response_metadata["finish_reason"] == "tool_calls"
        assert tool_names(upstream.requests[0]) == ["get_time", "calculator"]
        # Role chunk, then per call a head fragment and 4 argument fragments.
        assert upstream.exchanges[0].chunks_sent == (10 if streaming else 0)


async def test_tool_call_fragments_on_the_wire() -> None:
    async with ScriptedUpstream() as upstream:
        upstream.script(Reply.tool_calls([("get_time", {"timezone": "UTC"})], arg_chunks=3))
        client = openai.AsyncOpenAI(base_url=upstream.base_url, api_key="test", max_retries=0)
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "t"}], stream=True
        )
        deltas = [c.choices[0] async for c in stream if c.choices]

        calls = [d.delta.tool_calls[0] for d in deltas if d.delta.tool_calls]
        assert calls[0].id == "call_1" and calls[0].type == "function"
        assert calls[0].function is not None and calls[0].function.name == "get_time"
        assert calls[0].function.arguments == ""
        assert all(c.id is None and c.index == 0 for c in calls[1:])
        args = "".join(c.function.arguments or "" for c in calls[1:] if c.function)
        assert len(calls) == 4 and args == '{"timezone": "UTC"}'
        assert deltas[-1].finish_reason == "tool_calls"


@pytest.mark.parametrize("streaming", [True, False])
async def test_http_error_raises(streaming: bool) -> None:
    async with ScriptedUpstream() as upstream:
        upstream.script(Reply.error(500, "boom"))
        llm = chat(upstream, streaming=streaming)
        with pytest.raises(openai.InternalServerError, match="boom"):
            await llm.ainvoke("hi")
        assert len(upstream.requests) == 1


async def test_mid_stream_failure_drops_the_connection() -> None:
    async with ScriptedUpstream() as upstream:
        upstream.script(Reply.text("one two three four", fail_after=2))
        received: list[str] = []
        # openai wraps the dropped connection (it speaks httpx2, not httpx).
        with pytest.raises(openai.APIConnectionError):
            async for chunk in chat(upstream).astream("hi"):
                received.append(str(chunk.content))
        assert "".join(received) == "one two"
        ex = await upstream.wait_ended()
        assert ex.failed_at is not None and ex.completed_at is None


async def test_block_holds_the_stream_until_released() -> None:
    async with ScriptedUpstream() as upstream:
        gate = upstream.script(Reply.text("first second third", block_after_first=True))
        tokens: asyncio.Queue[str] = asyncio.Queue()

        async def consume() -> None:
            async for chunk in chat(upstream).astream("hi"):
                if chunk.content:
                    await tokens.put(str(chunk.content))

        task = asyncio.create_task(consume())
        # The client already holds the first token while the server is blocked.
        async with asyncio.timeout(5):
            assert await tokens.get() == "first"
        await gate.wait_blocked()
        await asyncio.sleep(0.05)
        assert tokens.empty() and not task.done()

        gate.release()
        await asyncio.wait_for(task, 5)
        assert [tokens.get_nowait() for _ in range(tokens.qsize())] == [" second", " third"]
        assert upstream.exchanges[0].completed_at is not None


@pytest.mark.parametrize("reply", [Reply.slow(interval=0.01), Reply.text("a b", block_after=1)])
async def test_cancelling_astream_is_seen_as_a_disconnect(reply: Reply) -> None:
    async with ScriptedUpstream() as upstream:
        upstream.script(reply)
        first = asyncio.Event()

        async def consume() -> None:
            async for chunk in chat(upstream).astream("hi"):
                if chunk.content:
                    first.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(first.wait(), 5)
        cancelled_at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)

        ex = await upstream.wait_disconnect(timeout_s=2)
        assert ex.disconnected_at is not None and ex.completed_at is None
        assert ex.disconnected_at - cancelled_at < 0.5


async def test_cancel_propagates_while_chunks_are_buffered() -> None:
    async with ScriptedUpstream() as upstream:
        upstream.script(Reply.text(["x"] * 300))
        first = asyncio.Event()

        async def consume() -> None:
            async for chunk in chat(upstream).astream("hi"):
                if chunk.content:
                    first.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(first.wait(), 5)
        task.cancel()
        # With langchain-openai's default stream_chunk_timeout this runs to completion instead.
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)


async def test_default_reply_and_models_endpoint() -> None:
    async with ScriptedUpstream(models=["m1", "m2"]) as upstream:
        assert (await chat(upstream).ainvoke("hi")).content == "Hello from the scripted upstream."
        async with httpx.AsyncClient() as http:
            listing = (await http.get(f"{upstream.base_url}/models")).json()
        assert listing["object"] == "list"
        assert [m["id"] for m in listing["data"]] == ["m1", "m2"]


async def test_responder_answers_concurrent_streams_deterministically() -> None:
    async with ScriptedUpstream(responder=echo_responder(count=50)) as upstream:
        llm = chat(upstream)
        prompts = [f"request {i}" for i in range(20)]
        results = await asyncio.gather(*(collect(llm, p) for p in prompts))

        for prompt, chunks in zip(prompts, results, strict=True):
            assert "".join(str(c.content) for c in chunks) == "".join(echo_tokens(prompt, 50))
        assert len(upstream.exchanges) == 20
        assert all(ex.completed_at is not None for ex in upstream.exchanges)


async def test_script_queue_is_fifo_before_the_responder() -> None:
    def responder(body: dict[str, Any]) -> Reply:
        if tool_names(body):
            return Reply.tool_calls([("respond", {})])
        return Reply.text("from responder")

    async with ScriptedUpstream(responder=responder) as upstream:
        upstream.script(Reply.text("scripted one"))
        upstream.script(Reply.text("scripted two"))
        llm = chat(upstream)
        assert (await llm.ainvoke("a")).content == "scripted one"
        assert (await llm.ainvoke("b")).content == "scripted two"
        assert (await llm.ainvoke("c")).content == "from responder"
        routed = await llm.bind_tools([get_time]).ainvoke("d")
        assert [c["name"] for c in routed.tool_calls] == ["respond"]
        assert upstream.pending == 0
