"""Real OpenAI clients pointed at Bernard: the `openai` SDK and LangChain's `ChatOpenAI`."""

from __future__ import annotations

import openai
import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage

from tests.support.stack import Stack
from tests.support.upstream import Reply, ScriptedUpstream

MESSAGES = [{"role": "user", "content": "hello"}]


async def test_openai_sdk_streams_the_answer_and_usage(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(["Bonjour", " à", " tous"], usage=(4, 3)))
    stream = await stack.openai().chat.completions.create(
        model="bernard-v1",
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert text == "Bonjour à tous"
    assert finish == "stop"
    assert usage is not None and usage.total_tokens == 7


async def test_openai_sdk_stream_helper_accumulates_the_final_message(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(["one", " two"], usage=(2, 2)))
    async with stack.openai().chat.completions.stream(
        model="bernard-v1",
        messages=MESSAGES,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    ) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    assert final.choices[0].message.content == "one two"
    assert final.choices[0].message.role == "assistant"
    assert final.usage is not None and final.usage.total_tokens == 4


async def test_openai_sdk_non_stream_answer(stack: Stack, upstream: ScriptedUpstream) -> None:
    upstream.script(Reply.text("Plain answer.", usage=(3, 2)))
    completion = await stack.openai().chat.completions.create(
        model="bernard-v1",
        messages=MESSAGES,  # type: ignore[arg-type]
    )
    assert completion.choices[0].message.content == "Plain answer."
    assert completion.usage is not None and completion.usage.total_tokens == 5
    assert completion.model_extra and completion.model_extra["bernard"]["turn_id"]


async def test_openai_sdk_raises_typed_errors_from_the_envelope(stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await stack.openai().chat.completions.create(
            model="gpt-unknown",
            messages=MESSAGES,  # type: ignore[arg-type]
        )
    assert caught.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        await stack.openai().chat.completions.create(model="bernard-v1", messages=[])
    assert bad.value.param == "messages"


async def test_openai_sdk_raises_on_a_mid_stream_error_frame(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.error(500, "boom"))
    stream = await stack.openai().chat.completions.create(
        model="bernard-v1",
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
    )
    with pytest.raises(openai.APIError, match="HTTP 500"):
        async for _ in stream:
            pass


async def test_openai_sdk_lists_the_model(stack: Stack) -> None:
    models = await stack.openai().models.list()
    assert [m.id for m in models.data] == ["bernard-v1"]


async def test_langchain_chat_openai_streams_from_bernard(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(["Lang", "Chain"], usage=(5, 2)))
    total: AIMessageChunk | None = None
    async for chunk in stack.langchain(stream_usage=True).astream([HumanMessage("hello")]):
        assert isinstance(chunk, AIMessageChunk)
        total = chunk if total is None else total + chunk
    assert total is not None
    assert total.content == "LangChain"
    assert total.usage_metadata is not None and total.usage_metadata["total_tokens"] == 7
    assert not total.tool_calls


async def test_langchain_chat_openai_invokes_bernard(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text("Invoked.", usage=(1, 1)))
    message = await stack.langchain(stream_usage=True).ainvoke([HumanMessage("hello")])
    assert message.content == "Invoked."
