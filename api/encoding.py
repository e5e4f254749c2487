"""Turn events into the OpenAI wire format: SSE frames for streams, one body otherwise.

Encoding is a pure function of (turn, event): no state carries from one event to the
next, so a resumed stream, on any API process, encodes every entry exactly as the first
one did. One event may become several frames (`done` → finish, usage, `[DONE]`).

Bernard's own events (tool calls, results, progress, traces, non-fatal errors) travel as
`choices: []` chunks with a top-level `bernard` object: every client tested ignores
those and reads the answer from `content` alone (../shared/notes/client-compatibility.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from shared.endings import error_of
from shared.events import (
    AwaitingConfirmation,
    Delta,
    Done,
    Error,
    Event,
    LlmCallComplete,
    LlmPrompt,
    Memory,
    MessageStored,
    Start,
    ToolCall,
    ToolProgress,
    ToolResult,
)
from shared.results import TurnResult
from shared.turns import TurnRecord

DONE = "[DONE]"


@dataclass(frozen=True, slots=True)
class Named:
    """A frame with an SSE `event:` name (the conversation endpoints' encoding)."""

    event: str
    data: str


# One SSE frame: its `data:` payload, or a named event's name and payload.
Frame = str | Named
# Marks the frames of a replay built from the turn record once its stream has expired.
COMPACTED = {"type": "replay", "compacted": True}


def completion_id(record: TurnRecord) -> str:
    prefix = "chatcmpl" if record.request.kind == "chat" else "cmpl"
    return f"{prefix}-{record.id}"


def terminal_error(done: Done) -> dict[str, Any] | None:
    """The error a terminal event reports, or None for a completed turn (shared/endings.py)."""
    return error_of(done.status, done.error)


def final_event(record: TurnRecord) -> Done:
    """The `done` a finished turn's record stands for, as its stream ended with it."""
    result = record.result
    return Done(
        status=record.status,
        finish_reason=result.finish_reason if result is not None else None,
        usage=result.usage if result is not None else None,
        error=record.error,
    )


def _json(body: dict[str, Any]) -> Frame:
    return orjson.dumps(body).decode()


class _ChunkEncoder(ABC):
    """What the chat and text-completion encodings share: the chunks' envelope (`head`),
    the ending and the compacted replay. Each says only how its one choice reads
    (`_answer`, `_finish`)."""

    # The frame that tells a client resuming after the last one that the stream is over.
    END: Frame | None = DONE

    def __init__(self, record: TurnRecord, chunk_object: str) -> None:
        self.record = record
        self.request = record.request
        self.head = {
            "id": completion_id(record),
            "object": chunk_object,
            "created": int(record.created_at),
            "model": record.model,
        }

    @abstractmethod
    def _answer(self, content: str, extra: dict[str, Any]) -> Frame:
        """The whole answer in one chunk (a compacted replay)."""

    @abstractmethod
    def _finish(self, finish_reason: str, extra: dict[str, Any] | None) -> Frame:
        """The chunk that carries the finish reason."""

    def _ending(self, done: Done, extra: dict[str, Any] | None = None) -> list[Frame]:
        error = terminal_error(done)
        if error is not None:
            return [_json({"error": {**error, "param": None}}), DONE]
        frames = [self._finish(done.finish_reason or "stop", extra)]
        if self.request.include_usage:
            usage = {**self.head, "choices": [], "usage": usage_body(done.usage), **(extra or {})}
            frames.append(_json(usage))
        return [*frames, DONE]

    def compacted(self, record: TurnRecord) -> list[Frame]:
        """The replay of a finished turn whose stream expired: its answer in one chunk,
        then its ending, every chunk marked `bernard: COMPACTED`."""
        marked = {"bernard": COMPACTED}
        frames = []
        if record.status == "completed":
            content = record.result.content if record.result is not None else ""
            frames.append(self._answer(content, marked))
        return [*frames, *self._ending(final_event(record), marked)]


class ChatEncoder(_ChunkEncoder):
    """Frames of `chat.completion.chunk` for one turn."""

    def __init__(self, record: TurnRecord) -> None:
        super().__init__(record, "chat.completion.chunk")

    def _chunk(
        self,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Frame:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return _json({**self.head, "choices": [choice], **(extra or {})})

    def _answer(self, content: str, extra: dict[str, Any]) -> Frame:
        return self._chunk({"role": "assistant", "content": content}, None, extra)

    def _finish(self, finish_reason: str, extra: dict[str, Any] | None) -> Frame:
        return self._chunk({}, finish_reason, extra)

    def _extension(self, kind: str, body: dict[str, Any]) -> Frame:
        return _json({**self.head, "choices": [], "bernard": {"type": kind, **body}})

    def keepalive(self) -> Frame:
        return self._extension("keepalive", {})

    def frames(self, event: Event) -> list[Frame]:
        mode = self.request.tool_events
        match event:
            case Start():
                return [self._chunk({"role": "assistant", "content": ""})]
            case Delta(text=text):
                return [self._chunk({"content": text})]
            case ToolCall() if mode == "delta":
                call = {
                    "index": event.index,
                    "id": event.id,
                    "type": "function",
                    "function": {"name": event.name, "arguments": event.arguments},
                }
                return [self._chunk({"tool_calls": [call]})]
            case ToolResult() if mode == "delta":
                output: dict[str, Any] = {"id": event.tool_call_id, "content": event.content}
                if event.index is not None:
                    # The openai SDK's stream helper merges list entries by `index`.
                    output = {"index": event.index, **output}
                return [self._chunk({"tool_outputs": [output]})]
            case ToolCall() | ToolResult() | ToolProgress() if mode != "none":
                return [self._extension(event.type, asdict(event))]
            case LlmPrompt() | LlmCallComplete() | Memory() if self.request.trace:
                return [self._extension(event.type, asdict(event))]
            case AwaitingConfirmation():
                # Whatever the tool-event mode: the client must be able to decide on it.
                return [self._extension(event.type, asdict(event))]
            case Error():
                return [self._extension("error", asdict(event))]
            case Done():
                return self._ending(event)
        return []

    def body(self, result: TurnResult, conversation_id: str | None) -> dict[str, Any]:
        """The non-stream `chat.completion` for a completed turn."""
        message = {"role": "assistant", "content": result.content, "refusal": None}
        return {
            **self.head,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": result.finish_reason,
                }
            ],
            "usage": usage_body(result.usage),
            "bernard": {
                "turn_id": self.record.id,
                "conversation_id": conversation_id,
                "tool_calls": result.tool_calls,
                "tool_outputs": result.tool_outputs,
                # Tool calls waiting for the user's decision (turn `awaiting_confirmation`).
                "pending_confirmations": result.pending,
            },
        }


class CompletionEncoder(_ChunkEncoder):
    """Frames of legacy `text_completion` objects for one turn."""

    def __init__(self, record: TurnRecord) -> None:
        super().__init__(record, "text_completion")

    def _choice(
        self, text: str, finish_reason: str | None = None, extra: dict[str, Any] | None = None
    ) -> Frame:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
        return _json({**self.head, "choices": [choice], **(extra or {})})

    def _answer(self, content: str, extra: dict[str, Any]) -> Frame:
        return self._choice(content, None, extra)

    def _finish(self, finish_reason: str, extra: dict[str, Any] | None) -> Frame:
        return self._choice("", finish_reason, extra)

    def keepalive(self) -> None:
        """No keepalive chunk in this envelope: the relay sends a `: ping` comment."""
        return None

    def frames(self, event: Event) -> list[Frame]:
        match event:
            case Delta(text=text):
                return [self._choice(text)]
            case Done():
                return self._ending(event)
        return []

    def body(self, result: TurnResult, conversation_id: str | None) -> dict[str, Any]:
        choice = {
            "text": result.content,
            "index": 0,
            "logprobs": None,
            "finish_reason": result.finish_reason,
        }
        return {**self.head, "choices": [choice], "usage": usage_body(result.usage)}


class ConversationEncoder:
    """Named SSE events for the conversation endpoints: `text_delta`, `tool_call`,
    `tool_progress`, `tool_result`, `awaiting_confirmation`, `message` (a row was stored),
    `error`, `trace` (when asked for) and, last, `done`."""

    # A client that has the `done` event has heard the end; `[DONE]` is not of this encoding.
    END: Frame | None = None

    def __init__(self, record: TurnRecord) -> None:
        self.record = record

    def keepalive(self) -> None:
        """No keepalive event: the relay sends a `: ping` comment."""
        return None

    def frames(self, event: Event) -> list[Frame]:
        match event:
            case Delta(text=text):
                return [_named("text_delta", {"text": text})]
            case ToolCall():
                body = {"id": event.id, "name": event.name, "arguments": event.arguments}
                return [_named("tool_call", body)]
            case ToolProgress():
                progress: dict[str, Any] = {
                    "tool_call_id": event.tool_call_id,
                    "phase": event.phase,
                    "message": event.message,
                }
                if event.current is not None:
                    progress["current"] = event.current
                if event.total is not None:
                    progress["total"] = event.total
                return [_named("tool_progress", progress)]
            case ToolResult():
                result = {
                    "tool_call_id": event.tool_call_id,
                    "name": event.name,
                    "output": event.content,
                    "is_error": event.is_error,
                }
                return [_named("tool_result", result)]
            case AwaitingConfirmation():
                body = {k: v for k, v in asdict(event).items()}
                return [_named("awaiting_confirmation", body)]
            case MessageStored(row=row):
                return [_named("message", row)]
            case Error():
                return [_named("error", {"code": event.code, "message": event.message})]
            case LlmPrompt() | LlmCallComplete() | Memory() if self.record.request.trace:
                return [_named("trace", {"type": event.type, **asdict(event)})]
            case Done():
                return [self._done(event)]
        return []

    def _done(self, done: Done) -> Named:
        body: dict[str, Any] = {
            "turn_id": self.record.id,
            "status": done.status,
            "usage": usage_body(done.usage),
        }
        error = terminal_error(done)
        if error is not None:
            body["error"] = {"code": error["code"], "message": error["message"]}
        return _named("done", body)

    def compacted(self, record: TurnRecord) -> list[Frame]:
        """After the stream's retention: only how the turn ended (its rows are the
        conversation's: `GET /v1/conversations/{id}/messages`)."""
        return [self._done(final_event(record))]

    def body(self, result: TurnResult, conversation_id: str | None) -> dict[str, Any]:
        """The turn's outcome, as a polled turn object shows it."""
        return {
            "conversation_id": conversation_id,
            "content": result.content,
            "finish_reason": result.finish_reason,
            "usage": usage_body(result.usage),
            "tool_calls": result.tool_calls,
            "tool_outputs": result.tool_outputs,
            "pending_confirmations": result.pending,
        }


Encoder = ChatEncoder | CompletionEncoder | ConversationEncoder


def encoder_for(record: TurnRecord) -> Encoder:
    kind = record.request.kind
    if kind == "conversation":
        return ConversationEncoder(record)
    return ChatEncoder(record) if kind == "chat" else CompletionEncoder(record)


def _named(event: str, body: dict[str, Any]) -> Named:
    return Named(event, orjson.dumps(body).decode())


def usage_body(usage: dict[str, int] | None) -> dict[str, int]:
    usage = usage or {}
    return {
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
        "total_tokens": usage.get("total_tokens", 0),
    }
