"""The response harness: streams the response model's answer, token by token.

When the roles share a model, the router's own step usually wrote the answer already
(worker/harness/router.py): then nothing is called here. It still answers a turn whose last
router step wrote nothing but whitespace, or that reached the router's step limit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from shared.events import Delta, LlmCallComplete, LlmPrompt
from worker.calls import Item, ModelCallEnded, ModelCallStarted
from worker.context import TurnContext


async def response_harness(ctx: TurnContext) -> AsyncIterator[Item]:
    """Yield the call's start (with its prompt trace), then each text delta the moment it
    arrives, then the call's end (worker/calls.py).

    The client's sampling options (`max_tokens`, `stop`, `temperature`, ...) apply to this
    call, and the model's finish reason (`length` when `max_tokens` cut the answer) becomes
    the turn's.
    """
    if ctx.paused:
        return  # waiting for the user's decision: the answer comes when the turn resumes
    if ctx.handed_over:
        return  # the client runs its tools: the answer comes after its follow-up
    if ctx.answered:
        return  # the router's model wrote it (the roles share a model)
    messages = [*ctx.system(), *ctx.memory, *ctx.history, *ctx.tool_messages]
    model = ctx.responder.name
    prompt = LlmPrompt(stage="response", model=model, messages=ctx.traced(messages))
    yield ModelCallStarted(prompt, messages)
    answer = ctx.responder.stream(messages, ctx.request.sampling())
    async with aclosing(answer):
        async for text in answer:
            if isinstance(text, str):  # no tools are bound: no tool call comes
                ctx.content.append(text)
                yield Delta(text=text)
    result = answer.result
    ctx.add_usage(result.usage)
    if result.finish_reason:
        ctx.finish_reason = result.finish_reason
    complete = LlmCallComplete(
        stage="response", model=model, latency_ms=result.latency_ms, usage=result.usage
    )
    yield ModelCallEnded(complete, result)
