"""Recording one turn in the record keeper, as its events pass through the runner.

The runner is the only writer (seed 002): it hands each event to `TurnRecording.observe`
before passing it on, so a record is written before the client sees the event it stands
for. Harnesses never write; they put what the records need on the context (the whole tool
output lives on the context's tool messages; the stream only carries a cut version).

Each message is written exactly once: the request's new messages at the start (the
client resends the whole history; `append_new_messages` keeps only what is new), and this
turn's tool-call messages, tool results and final answer once the turn has completed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_messages
from redis.exceptions import RedisError

from shared.events import Event, LlmCallComplete, LlmPrompt, ToolCall, ToolResult
from shared.records import Archivist, Recorder
from worker.context import TurnContext

__all__ = ["TurnRecording", "stored_history"]

logger = logging.getLogger("bernard.worker")


class TurnRecording:
    """Writes the records of one turn of `ctx.conversation_id` through `recorder`."""

    def __init__(self, recorder: Recorder, ctx: TurnContext) -> None:
        if ctx.conversation_id is None or ctx.archivist is None:
            raise ValueError("a recorded turn needs a conversation id and an archivist")
        self.recorder = recorder
        self.ctx = ctx
        self.conversation_id = ctx.conversation_id
        self.archivist: Archivist = ctx.archivist
        # The model call in flight (calls are sequential): our call id and when it started.
        self._llm_call: tuple[str, float] | None = None
        # Tool calls started and not yet completed, by the model's tool call id.
        self._tool_calls: dict[str, tuple[str, float]] = {}

    async def begin(self) -> None:
        """Store the request's new messages; the stored conversation becomes the history."""
        await self.recorder.append_new_messages(self.conversation_id, self.ctx.request.messages)
        self.ctx.history = await stored_history(self.archivist, self.conversation_id)

    async def observe(self, event: Event) -> None:
        """Record what `event` stands for (events without a record are ignored)."""
        ctx = self.ctx
        match event:
            case LlmPrompt():
                call_id = await self.recorder.llm_call_started(
                    self.conversation_id,
                    ctx.turn_id,
                    event.stage,
                    event.model,
                    # The prompt repeats the history on every call: kept only when the
                    # client asked to trace this turn.
                    messages=event.messages if ctx.request.trace else None,
                )
                self._llm_call = (call_id, time.perf_counter())
            case LlmCallComplete() if self._llm_call is not None:
                call_id, _ = self._llm_call
                self._llm_call = None
                await self.recorder.llm_call_completed(
                    self.conversation_id, call_id, latency_ms=event.latency_ms, usage=event.usage
                )
            case ToolCall():
                call_id = await self.recorder.tool_call_started(
                    self.conversation_id,
                    ctx.turn_id,
                    tool_call_id=event.id,
                    name=event.name,
                    arguments=event.arguments,
                )
                self._tool_calls[event.id] = (call_id, time.perf_counter())
            case ToolResult() if event.tool_call_id in self._tool_calls:
                call_id, started = self._tool_calls.pop(event.tool_call_id)
                # The event's content may be cut for the stream; the record is the whole output.
                message = _tool_message(ctx.tool_messages, event.tool_call_id)
                await self.recorder.tool_call_completed(
                    self.conversation_id,
                    call_id,
                    latency_ms=(time.perf_counter() - started) * 1000,
                    content=str(message.content) if message else event.content,
                    status="error" if message and message.status == "error" else "success",
                )

    async def finish(self) -> None:
        """The turn completed: store its tool-call messages, tool results and answer."""
        answer = AIMessage(content="".join(self.ctx.content))
        await self.recorder.append_messages(self.conversation_id, [*self.ctx.tool_messages, answer])

    async def fail(self, error: BaseException) -> None:
        """The turn failed or was stopped: close the calls still open as failed.

        Never raises a Redis error: the turn's own error is the one that must surface.
        """
        if isinstance(error, asyncio.CancelledError | GeneratorExit):
            message = "the turn was stopped before the call ended"
        else:
            message = getattr(error, "message", None) or str(error) or type(error).__name__
        try:
            if self._llm_call is not None:
                call_id, started = self._llm_call
                self._llm_call = None
                await self.recorder.llm_call_completed(
                    self.conversation_id,
                    call_id,
                    latency_ms=(time.perf_counter() - started) * 1000,
                    error=message,
                )
            for call_id, started in self._tool_calls.values():
                await self.recorder.tool_call_completed(
                    self.conversation_id,
                    call_id,
                    latency_ms=(time.perf_counter() - started) * 1000,
                    content=f"Error: {message}",
                    status="error",
                )
            self._tool_calls.clear()
        except (RedisError, OSError) as exc:
            # The turn's own error is what matters; a lost record must not replace it.
            logger.warning("could not record the failure of turn %s: %s", self.ctx.turn_id, exc)


async def stored_history(archivist: Archivist, conversation_id: str) -> list[BaseMessage]:
    """The stored conversation as LangChain messages, oldest first."""
    stored = await archivist.messages(conversation_id)
    # A stored assistant message may have `content: null` (tool calls only); LangChain
    # wants text.
    cleaned: list[dict[str, Any]] = [{**m, "content": m.get("content") or ""} for m in stored]
    return list(convert_to_messages(cleaned))


def _tool_message(messages: list[BaseMessage], tool_call_id: str) -> ToolMessage | None:
    # The latest one: a provider may reuse a tool call id in a later router step.
    for message in reversed(messages):
        if isinstance(message, ToolMessage) and message.tool_call_id == tool_call_id:
            return message
    return None
