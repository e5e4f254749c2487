"""Turn events into the OpenAI wire format: SSE frames for streams, one body otherwise.

Encoding is a pure function of (turn, event): no state carries from one event to the
next, so a resumed stream, on any API process, encodes every entry exactly as the first
one did. One event may become several frames (`done` → finish, usage, `[DONE]`).

Bernard's own events (tool calls, results, progress, traces, non-fatal errors) travel as
`choices: []` chunks with a top-level `bernard` object: every client tested ignores
those and reads the answer from `content` alone (../shared/notes/client-compatibility.md).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import orjson

from shared.events import (
    Delta,
    Done,
    Error,
    Event,
    LlmCallComplete,
    LlmPrompt,
    Start,
    ToolCall,
    ToolProgress,
    ToolResult,
)
from shared.turns import TurnRecord

DONE = "[DONE]"
Frame = str  # the `data:` payload of one SSE frame

# What a failed or cancelled turn looks like in the error frame and in the error envelope.
_CANCELLED = {"message": "the turn was cancelled", "type": "cancelled", "code": "turn_cancelled"}


def completion_id(record: TurnRecord) -> str:
    prefix = "chatcmpl" if record.request.kind == "chat" else "cmpl"
    return f"{prefix}-{record.id}"


def terminal_error(done: Done) -> dict[str, Any] | None:
    """The error a terminal event reports, or None for a completed turn."""
    if done.status == "cancelled":
        return dict(_CANCELLED)
    if done.status == "failed":
        error = done.error or {}
        return {
            "message": error.get("message", "the turn failed"),
            "type": error.get("type", "server_error"),
            "code": error.get("code", "internal_error"),
        }
    return None


def _json(body: dict[str, Any]) -> Frame:
    return orjson.dumps(body).decode()


class ChatEncoder:
    """Frames of `chat.completion.chunk` for one turn."""

    def __init__(self, record: TurnRecord) -> None:
        self.record = record
        self.request = record.request
        self.head = {
            "id": completion_id(record),
            "object": "chat.completion.chunk",
            "created": int(record.created_at),
            "model": record.model,
        }

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> Frame:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return _json({**self.head, "choices": [choice]})

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
            case LlmPrompt() | LlmCallComplete() if self.request.trace:
                return [self._extension(event.type, asdict(event))]
            case Error():
                return [self._extension("error", asdict(event))]
            case Done():
                return self._ending(event)
        return []

    def _ending(self, done: Done) -> list[Frame]:
        error = terminal_error(done)
        if error is not None:
            return [_json({"error": {**error, "param": None}}), DONE]
        frames = [self._chunk({}, done.finish_reason or "stop")]
        if self.request.include_usage:
            frames.append(_json({**self.head, "choices": [], "usage": usage_body(done.usage)}))
        return [*frames, DONE]

    def body(self, result: dict[str, Any], conversation_id: str | None) -> dict[str, Any]:
        """The non-stream `chat.completion` for a completed turn."""
        message = {"role": "assistant", "content": result.get("content", ""), "refusal": None}
        return {
            **self.head,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": result.get("finish_reason") or "stop",
                }
            ],
            "usage": usage_body(result.get("usage")),
            "bernard": {
                "turn_id": self.record.id,
                "conversation_id": conversation_id,
                "tool_calls": result.get("tool_calls", []),
                "tool_outputs": result.get("tool_outputs", []),
            },
        }


class CompletionEncoder:
    """Frames of legacy `text_completion` objects for one turn."""

    def __init__(self, record: TurnRecord) -> None:
        self.record = record
        self.head = {
            "id": completion_id(record),
            "object": "text_completion",
            "created": int(record.created_at),
            "model": record.model,
        }

    def _choice(self, text: str, finish_reason: str | None = None) -> Frame:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
        return _json({**self.head, "choices": [choice]})

    def keepalive(self) -> None:
        """No keepalive chunk in this envelope: the relay sends a `: ping` comment."""
        return None

    def frames(self, event: Event) -> list[Frame]:
        match event:
            case Delta(text=text):
                return [self._choice(text)]
            case Done():
                error = terminal_error(event)
                if error is not None:
                    return [_json({"error": {**error, "param": None}}), DONE]
                frames = [self._choice("", event.finish_reason or "stop")]
                if self.record.request.include_usage:
                    usage = usage_body(event.usage)
                    frames.append(_json({**self.head, "choices": [], "usage": usage}))
                return [*frames, DONE]
        return []

    def body(self, result: dict[str, Any], conversation_id: str | None) -> dict[str, Any]:
        choice = {
            "text": result.get("content", ""),
            "index": 0,
            "logprobs": None,
            "finish_reason": result.get("finish_reason") or "stop",
        }
        return {**self.head, "choices": [choice], "usage": usage_body(result.get("usage"))}


Encoder = ChatEncoder | CompletionEncoder


def encoder_for(record: TurnRecord) -> Encoder:
    return ChatEncoder(record) if record.request.kind == "chat" else CompletionEncoder(record)


def usage_body(usage: dict[str, int] | None) -> dict[str, int]:
    usage = usage or {}
    return {
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
        "total_tokens": usage.get("total_tokens", 0),
    }
