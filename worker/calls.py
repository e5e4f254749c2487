"""A model or tool call as a turn's harnesses describe it, once, for every sink.

A harness yields the stream's events (shared/events.py) and, for the moments of a call, one
of these items: each holds the event its stream shows and what the other sinks need beside
it (the prompt's messages, the model's whole result, the tool's whole outcome), so the call
records (worker/recording.py) and the log lines and spans (worker/telemetry.py) read the
same description the stream does. worker/turn.py hands every item to every sink;
`stream_events` is what of an item the stream shows.

A call that fails or is stopped raises out of its harness instead: every sink then closes
what it has open (`Sink.fail`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from langchain_core.messages import BaseMessage, ToolMessage

from shared.events import Error, Event, LlmCallComplete, LlmPrompt, ToolCall, ToolResult
from shared.streams import TurnOverError
from worker.llm import LlmResult

__all__ = [
    "Item",
    "ModelCallEnded",
    "ModelCallStarted",
    "ToolCallEnded",
    "ToolOutcome",
    "is_stop",
    "stream_events",
]


@dataclass(slots=True)
class ModelCallStarted:
    """A model call starts with the prompt `messages`; its stream shows `prompt` (a trace)."""

    prompt: LlmPrompt
    messages: Sequence[BaseMessage]


@dataclass(slots=True)
class ModelCallEnded:
    """The model call started last answered `result`; its stream shows `complete`."""

    complete: LlmCallComplete
    result: LlmResult


@dataclass(slots=True)
class ToolOutcome:
    """How a call ended: the tool message (content whole) and, for a failure, an error event."""

    message: ToolMessage
    failure: Error | None = None

    @property
    def content(self) -> str:
        return str(self.message.content)

    @property
    def status(self) -> Literal["success", "error"]:
        return self.message.status


@dataclass(slots=True)
class ToolCallEnded:
    """The tool call `call` (its start, as streamed) has its `outcome`; the stream shows
    `result` (the output cut for it), then the failure's `error`, if it failed."""

    call: ToolCall
    result: ToolResult
    outcome: ToolOutcome


# What a turn's harnesses yield. A tool call's start is its stream event (`ToolCall`),
# which holds all there is to say of it then.
Item = Event | ModelCallStarted | ModelCallEnded | ToolCallEnded


def stream_events(item: Item) -> Sequence[Event]:
    """What of `item` the turn's stream shows, in order."""
    if isinstance(item, Event):  # most items: a text delta
        return (item,)
    match item:
        case ModelCallStarted():
            return (item.prompt,)
        case ModelCallEnded():
            return (item.complete,)
        case ToolCallEnded():
            failure = item.outcome.failure
            return (item.result,) if failure is None else (item.result, failure)


def is_stop(error: BaseException) -> bool:
    """Whether `error` stopped the turn's calls rather than failed them: a cancel, a closed
    generator, or a stream that takes no more writes (the turn ended elsewhere)."""
    return isinstance(error, asyncio.CancelledError | GeneratorExit | TurnOverError)
