"""The response harness: streams the response model's answer, token by token."""

from __future__ import annotations

from collections.abc import AsyncIterator

from shared.events import Delta, Event, LlmCallComplete, LlmPrompt
from worker.context import TurnContext
from worker.llm import LlmResult


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
    try:
        async for item in ctx.responder.stream(messages, ctx.request.sampling()):
            if isinstance(item, LlmResult):
                ctx.add_usage(item.usage)
                if item.finish_reason:
                    ctx.finish_reason = item.finish_reason
                call_log.done(item)
                yield LlmCallComplete(
                    stage="response", model=model, latency_ms=item.latency_ms, usage=item.usage
                )
            elif isinstance(item, str):  # no tools are bound: no tool calls come
                ctx.content.append(item)
                yield Delta(text=item)
    except BaseException as exc:  # a failed call, or the turn stopped mid-answer
        call_log.failed(exc)
        raise
