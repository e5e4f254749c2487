"""The response harness: streams the response model's answer, token by token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from shared.events import Delta, Event, LlmCallComplete, LlmPrompt
from worker.context import TurnContext


async def response_harness(ctx: TurnContext) -> AsyncIterator[Event]:
    """Yield the prompt trace, then each text delta the moment it arrives.

    The client's sampling options (`max_tokens`, `stop`, `temperature`, ...) apply to this
    call, and the model's finish reason (`length` when `max_tokens` cut the answer) becomes
    the turn's.
    """
    if ctx.paused:
        return  # waiting for the user's decision: the answer comes when the turn resumes
    messages = [*ctx.system(), *ctx.memory, *ctx.history, *ctx.tool_messages]
    model = ctx.responder.name
    yield LlmPrompt(stage="response", model=model, messages=ctx.traced(messages))
    # Logged once the call ends (worker/telemetry.py), never per token.
    call_log = ctx.telemetry.model_call("response", model, messages)
    answer = ctx.responder.stream(messages, ctx.request.sampling())
    try:
        async with aclosing(answer):
            async for text in answer:
                if isinstance(text, str):  # no tools are bound: no tool call comes
                    ctx.content.append(text)
                    yield Delta(text=text)
    except BaseException as exc:  # a failed call, or the turn stopped mid-answer
        call_log.failed(exc)
        raise
    result = answer.result
    ctx.add_usage(result.usage)
    if result.finish_reason:
        ctx.finish_reason = result.finish_reason
    call_log.done(result)
    yield LlmCallComplete(
        stage="response", model=model, latency_ms=result.latency_ms, usage=result.usage
    )
