"""A turn's OpenAI-compatible calls, made on the SDK's own client without the SDK's
per-call and per-chunk work: whole answers (`openai_complete`) and streams
(`openai_tokens`), text only or with tools bound, whose tool calls are gathered as they come
and read as a whole answer's are once the stream ends.

What this keeps from LangChain and the SDK: the request payload `ChatOpenAI` builds (the
messages, the bound tools, the call options), the answer as `ChatOpenAI` parses it (tool
calls, usage, finish reason), both through compat/langchain_openai.py; and the SDK client
itself with its base URL, key, retries and timeouts (`client.post`, the SDK's documented
way to call a path it has no method for). What it leaves out, measured on this box
(docs/benchmarks.md, cost per token):

- the SDK's request transform, which walks the whole payload against its typed
  parameters and changes nothing in a plain JSON one: 0.9 ms for a short answer's request,
  2.1 ms for a router request with ten tools, and growing with the conversation;
- per streamed chunk, the SDK's pydantic model and LangChain's message chunk, added up as
  they come: about 430 µs of worker CPU per token, against about 40 µs here, where each
  `data:` line is decoded once with orjson.

Every other call, and every other provider, goes through LangChain (worker/llm.py).
tests/worker/test_openai_fast.py runs both paths against the scripted upstream and
requires the same results.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson
from langchain_core.messages import AIMessage, BaseMessage, InvalidToolCall
from langchain_core.messages.tool import invalid_tool_call
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI

from compat.langchain_openai import chat_result, request_payload

# The header with which the SDK hands back a response before reading its body (what its
# `with_streaming_response` sets).
_STREAM_BODY = {"X-Stainless-Raw-Response": "stream"}
# How long a stream's body may linger after `[DONE]` before its connection is dropped.
_DRAIN_S = 1.0


class UpstreamStreamError(Exception):
    """The upstream's answer broke off, or was not what the API sends."""


async def _post(client: AsyncOpenAI, payload: dict[str, Any], *, stream: bool) -> httpx2.Response:
    """POST the payload to `/chat/completions` through the SDK client; errors are the SDK's
    (`openai.APIStatusError`, `openai.APIConnectionError`...)."""
    options: Any = {"headers": _STREAM_BODY} if stream else {}
    response: httpx2.Response = await client.post(
        "/chat/completions", cast_to=httpx2.Response, body=payload, options=options
    )
    return response


async def _drain(lines: AsyncIterator[str]) -> None:
    """Read what follows `[DONE]` (in practice only the body's closing chunk marker): a
    response closed before its body ends takes its connection with it, and every call would
    open a new one (a TCP connect, and the upstream's accept, twice a turn). The openai
    SDK's own stream reads to the end the same way. The answer is whole by now,
    so an upstream that errs or lingers here (`_DRAIN_S`) costs only the connection."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_DRAIN_S):
            async for _ in lines:
                pass


async def openai_complete(
    model: ChatOpenAI,
    messages: Sequence[BaseMessage],
    bound: Mapping[str, Any],
    *,
    client: AsyncOpenAI,
) -> AIMessage:
    """One whole answer; `bound` is what `bind_tools` bound (the tools, the tool choice).
    Sent on `client`, an SDK client configured as the model's."""
    payload = request_payload(model, messages, bound)
    response = await _post(client, payload, stream=False)
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError as exc:
        raise UpstreamStreamError(f"an answer that is not JSON: {response.text[:100]!r}") from exc
    return _whole_message(model, body)


def _whole_message(model: ChatOpenAI, body: Any) -> AIMessage:
    """`model`'s reading of a whole answer's `body`, its calls whose arguments are JSON but
    not an object made invalid calls."""
    not_objects = _calls_without_an_object(body)
    try:
        result = chat_result(model, body)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise UpstreamStreamError(f"an answer that cannot be read: {exc}") from exc
    generation = result.generations[0]
    message = generation.message
    assert isinstance(message, AIMessage)
    message.invalid_tool_calls = [*message.invalid_tool_calls, *not_objects]
    # As `BaseChatModel` does: the finish reason and the rest of the generation's info
    # become the message's metadata.
    message.response_metadata = {
        **(generation.generation_info or {}),
        **message.response_metadata,
    }
    return message


def _calls_without_an_object(body: Any) -> list[InvalidToolCall]:
    """Take the tool calls whose arguments are JSON but not an object (`[1, 2]`, `"on"`)
    out of the answer, as invalid calls: `ChatOpenAI` would put such arguments on the
    message as they are, and the message then fails its own validation (the turn failed
    with pydantic's text). As invalid calls they go back to the model with the reason, as
    arguments that are not JSON do (worker/harness/router.py). `null` stays a call without
    arguments, as LangChain reads it."""
    try:
        message = body["choices"][0]["message"]
        calls = list(message.get("tool_calls") or ())
    except (KeyError, IndexError, TypeError, AttributeError):
        return []  # `chat_result` says what is wrong with it
    kept: list[Any] = []
    found: list[InvalidToolCall] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            try:
                parsed = orjson.loads(arguments) if arguments.strip() else None
            except orjson.JSONDecodeError:
                parsed = None  # not JSON at all: LangChain makes it an invalid call itself
            if parsed is not None and not isinstance(parsed, dict):
                assert isinstance(function, dict)
                name, call_id = function.get("name"), call.get("id")
                found.append(
                    invalid_tool_call(
                        name=name if isinstance(name, str) else None,
                        args=arguments,
                        id=call_id if isinstance(call_id, str) else None,
                        error="the arguments are not a JSON object",
                    )
                )
                continue
        kept.append(call)
    if found:
        message["tool_calls"] = kept
    return found


async def openai_tokens(
    model: ChatOpenAI,
    messages: Sequence[BaseMessage],
    params: Mapping[str, Any],
    *,
    ended: Callable[[AIMessage, str | None, float], None],
    client: AsyncOpenAI,
) -> AsyncGenerator[str, None]:
    """Yield each text delta; once the upstream ends the stream, call `ended(message, finish
    reason, latency ms)` (the message carries the whole text and the usage, and the tool
    calls when `params` bound tools: what `bind_tools` bound, beside the call options). Sent
    on `client`, as `openai_complete`."""
    started = time.perf_counter()
    payload = request_payload(model, messages, params)
    payload["stream"] = True
    payload["stream_options"] = {"include_usage": True}
    parts: list[str] = []
    # Tool calls by their index: id, name and the arguments' fragments as they came.
    calls: dict[int, _Gathered] = {}
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    response = await _post(client, payload, stream=True)
    try:
        lines = response.aiter_lines()
        while True:
            try:
                line = await anext(lines)
            except StopAsyncIteration:
                # A body that ends cleanly without `[DONE]` is taken as the whole answer (no
                # finish reason unless one came): the `openai` SDK's stream does the same
                # (openai/_streaming.py: it stops at the end of the events, and `[DONE]` only
                # stops it early), and this path must end as `ChatOpenAI` does
                # (tests/worker/test_openai_fast.py, "ended without [DONE]").
                break
            except Exception as exc:  # the body broke off or was not what the API sends
                raise UpstreamStreamError(str(exc) or type(exc).__name__) from exc
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                await _drain(lines)
                break
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError as exc:
                raise UpstreamStreamError(f"a chunk that is not JSON: {data[:100]!r}") from exc
            if chunk.get("error"):
                raise UpstreamStreamError(str(chunk["error"].get("message", chunk["error"])))
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                text = delta.get("content")
                if text:
                    parts.append(text)
                    yield text
                if delta.get("tool_calls"):
                    _gather(calls, delta["tool_calls"])
                if choice.get("finish_reason"):
                    finish_reason = choice["finish_reason"]
    finally:
        await response.aclose()
    latency_ms = (time.perf_counter() - started) * 1000
    if calls:
        ended(_with_calls(model, parts, calls, usage, finish_reason), finish_reason, latency_ms)
        return
    message = AIMessage(content="".join(parts))
    if usage is not None:
        message.usage_metadata = {
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
            "total_tokens": usage.get("total_tokens", 0),
        }
    ended(message, finish_reason, latency_ms)


@dataclass(slots=True)
class _Gathered:
    """One streamed tool call so far."""

    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def _gather(calls: dict[int, _Gathered], pieces: Any) -> None:
    """Add one chunk's tool-call fragments to `calls`, as LangChain's chunks add up: the
    first id a call gets is its id, names and arguments are joined."""
    for piece in pieces:
        if not isinstance(piece, dict):
            raise UpstreamStreamError(f"a tool call that is not an object: {piece!r:.100}")
        index = piece.get("index")
        call = calls.setdefault(index if isinstance(index, int) else len(calls), _Gathered())
        if call.id is None and isinstance(piece.get("id"), str):
            call.id = piece["id"]
        function = piece.get("function") or {}
        if isinstance(function.get("name"), str):
            call.name += function["name"]
        if isinstance(function.get("arguments"), str):
            call.arguments.append(function["arguments"])


def _with_calls(
    model: ChatOpenAI,
    parts: list[str],
    calls: dict[int, _Gathered],
    usage: dict[str, Any] | None,
    finish_reason: str | None,
) -> AIMessage:
    """A stream that called tools, read as the whole answer it adds up to would be
    (`openai_complete`): the same parsing of the calls, invalid ones included."""
    tool_calls = [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": "".join(call.arguments)},
        }
        for _, call in sorted(calls.items())
    ]
    text = "".join(parts)
    message = {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
    choice = {"index": 0, "message": message, "finish_reason": finish_reason}
    return _whole_message(model, {"choices": [choice], "usage": usage})
