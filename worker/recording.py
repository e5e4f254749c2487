"""Recording one turn in the record keeper, as its events pass through the runner.

The runner is the only writer (seed 002): it hands each event to `TurnRecording.observe`
as it passes. The writes run in order in the background (`OrderedWrites`), so no model
call waits for a record, and all of them are in before the turn ends: a client that got
the turn's `done` finds every record. Harnesses never write; they put what the records
need on the context (the whole tool output lives on the context's tool messages; the
stream only carries a cut version).

Each message is written exactly once: the request's new messages at the start (the
client resends the whole history; `append_new_messages` keeps only what is new), and this
turn's tool-call messages, tool results and final answer once the turn has completed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_messages
from redis.exceptions import RedisError

from shared.events import Event, LlmCallComplete, LlmPrompt, ToolCall, ToolResult
from shared.records import ConversationNotFoundError, Message, Recorder, new_call_id
from worker.context import TurnContext

__all__ = ["TurnRecording", "as_history"]

logger = logging.getLogger("bernard.worker")


class TurnRecording:
    """Writes the records of one turn of `ctx.conversation_id` through `recorder`."""

    def __init__(self, recorder: Recorder, ctx: TurnContext) -> None:
        if ctx.conversation_id is None:
            raise ValueError("a recorded turn needs a conversation id")
        self.recorder = recorder
        self.ctx = ctx
        self.conversation_id = ctx.conversation_id
        # The model call in flight (calls are sequential): our call id and when it started.
        self._llm_call: tuple[str, float] | None = None
        # Tool calls started and not yet completed, by the model's tool call id.
        self._tool_calls: dict[str, tuple[str, float]] = {}
        self._writes = OrderedWrites()

    async def begin(self) -> None:
        """Store the request's new messages; the stored conversation becomes the history."""
        continuation = await self.recorder.append_new_messages(
            self.conversation_id, self.ctx.request.messages
        )
        self.ctx.history = as_history(continuation.history)

    def observe(self, event: Event) -> None:
        """Queue the record of what `event` stands for (events without one are ignored).

        Raises what an earlier record write raised.
        """
        ctx = self.ctx
        match event:
            case LlmPrompt():
                call_id = new_call_id()
                self._llm_call = (call_id, time.perf_counter())
                self._writes.add(
                    self.recorder.llm_call_started(
                        self.conversation_id,
                        ctx.turn_id,
                        event.stage,
                        event.model,
                        # The prompt repeats the history on every call: kept only when the
                        # client asked to trace this turn.
                        messages=event.messages if ctx.request.trace else None,
                        call_id=call_id,
                    )
                )
            case LlmCallComplete() if self._llm_call is not None:
                call_id, _ = self._llm_call
                self._llm_call = None
                self._writes.add(
                    self.recorder.llm_call_completed(
                        self.conversation_id,
                        call_id,
                        latency_ms=event.latency_ms,
                        usage=event.usage,
                    )
                )
            case ToolCall():
                call_id = new_call_id()
                self._tool_calls[event.id] = (call_id, time.perf_counter())
                self._writes.add(
                    self.recorder.tool_call_started(
                        self.conversation_id,
                        ctx.turn_id,
                        tool_call_id=event.id,
                        name=event.name,
                        arguments=event.arguments,
                        call_id=call_id,
                    )
                )
            case ToolResult() if event.tool_call_id in self._tool_calls:
                call_id, started = self._tool_calls.pop(event.tool_call_id)
                # The event's content may be cut for the stream; the record is the whole output.
                message = _tool_message(ctx.tool_messages, event.tool_call_id)
                self._writes.add(
                    self.recorder.tool_call_completed(
                        self.conversation_id,
                        call_id,
                        latency_ms=(time.perf_counter() - started) * 1000,
                        content=str(message.content) if message else event.content,
                        status="error" if message and message.status == "error" else "success",
                    )
                )

    async def finish(self) -> None:
        """The turn completed: wait for its call records, then store its tool-call
        messages, tool results and answer."""
        await self._writes.drain()
        answer = AIMessage(content="".join(self.ctx.content))
        await self.recorder.append_messages(self.conversation_id, [*self.ctx.tool_messages, answer])

    async def fail(self, error: BaseException) -> None:
        """The turn failed or was stopped: close the calls still open as failed.

        Never raises a record error: the turn's own error is the one that must surface.
        """
        if isinstance(error, asyncio.CancelledError | GeneratorExit):
            message = "the turn was stopped before the call ended"
        else:
            message = getattr(error, "message", None) or str(error) or type(error).__name__
        try:
            await self._writes.drain()
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
        except (RedisError, OSError, ConversationNotFoundError) as exc:
            # The turn's own error is what matters; a lost record must not replace it.
            logger.warning("could not record the failure of turn %s: %s", self.ctx.turn_id, exc)


class OrderedWrites:
    """Record writes run one after another in a task of their own, so the turn never waits
    for them (each was a round trip on the way to the next model call); `drain` waits for
    them all and raises what one raised, as does the next `add` after a failed write."""

    def __init__(self) -> None:
        self._queue: deque[Coroutine[Any, Any, Any]] = deque()
        self._task: asyncio.Task[None] | None = None

    def add(self, write: Coroutine[Any, Any, Any]) -> None:
        if self._task is not None and self._task.done():
            task, self._task = self._task, None
            if task.exception() is not None:
                write.close()
                self._close_queued()
                task.result()
        self._queue.append(write)
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def drain(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            try:
                await task
            finally:
                self._close_queued()

    async def _run(self) -> None:
        while self._queue:
            await self._queue.popleft()

    def _close_queued(self) -> None:
        # Writes queued behind a failed one never run; close them so none is left unawaited.
        while self._queue:
            self._queue.popleft().close()


def as_history(stored: list[Message]) -> list[BaseMessage]:
    """Stored conversation messages as LangChain messages, oldest first."""
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
