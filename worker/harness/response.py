"""The response harness: streams the response model's answer, token by token."""

from __future__ import annotations

from collections.abc import AsyncIterator

from langchain_core.messages import convert_to_openai_messages

from shared.events import Delta, Event, LlmCallComplete, LlmPrompt
from worker.context import TurnContext
from worker.llm import LlmResult


async def response_harness(ctx: TurnContext) -> AsyncIterator[Event]:
    """Yield the prompt trace, then each text delta the moment it arrives."""
    messages = [*ctx.system(), *ctx.history, *ctx.tool_messages]
    model = ctx.responder.name
    yield LlmPrompt(stage="response", model=model, messages=convert_to_openai_messages(messages))
    async for item in ctx.responder.stream(messages):
        if isinstance(item, LlmResult):
            ctx.add_usage(item.usage)
            yield LlmCallComplete(
                stage="response", model=model, latency_ms=item.latency_ms, usage=item.usage
            )
        else:
            ctx.content.append(item)
            yield Delta(text=item)
