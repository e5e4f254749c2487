"""The `conversation` encoding: named SSE events for the conversation endpoints
(api/routes/conversations.py): `text_delta`, `tool_call`, `tool_progress`, `tool_result`,
`awaiting_confirmation`, `message` (a row was stored), `error`, `trace` (when asked for)
and, last, `done`. Waiting without a stream, the client gets the rows the turn stored and
the tool call it now waits on."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, ClassVar

from api.encoding import Frame, Named, final_event, named, terminal_error, usage_body
from shared.events import (
    AwaitingConfirmation,
    Delta,
    Done,
    Error,
    Event,
    MessageStored,
    ToolCall,
    ToolProgress,
    ToolResult,
    Trace,
)
from shared.results import TurnResult
from shared.turn_record import TurnRecord


class ConversationEncoder:
    """Named SSE events of one conversation turn (api/encoding.py `Encoder`)."""

    # A client that has the `done` event has heard the end; `[DONE]` is not of this encoding.
    END: ClassVar[Frame | None] = None
    keep: ClassVar[tuple[type[Event], ...]] = (AwaitingConfirmation, MessageStored)
    reads_result: ClassVar[bool] = False
    shows_rows: ClassVar[bool] = True
    subject_prefix: ClassVar[str] = ""

    def __init__(self, record: TurnRecord) -> None:
        self.record = record

    def keepalive(self) -> None:
        """No keepalive event: the session sends a `: ping` comment."""
        return None

    def frames(self, event: Event) -> list[Frame]:
        match event:
            case Delta(text=text):
                return [named("text_delta", {"text": text})]
            case ToolCall():
                body: dict[str, Any] = {
                    "id": event.id,
                    "name": event.name,
                    "arguments": event.arguments,
                }
                if event.policy is not None:  # the rule that let it run, or refused it
                    body["policy"] = event.policy
                return [named("tool_call", body)]
            case ToolProgress():
                progress: dict[str, Any] = {
                    "tool_call_id": event.tool_call_id,
                    "phase": event.phase,
                    "message": event.message,
                    **event.counts(),
                }
                return [named("tool_progress", progress)]
            case ToolResult():
                result = {
                    "tool_call_id": event.tool_call_id,
                    "name": event.name,
                    "output": event.content,
                    "is_error": event.is_error,
                }
                return [named("tool_result", result)]
            case AwaitingConfirmation():
                return [awaiting_frame(asdict(event))]
            case MessageStored(row=row):
                return [named("message", row)]
            case Error():
                return [named("error", {"code": event.code, "message": event.message})]
            case Trace():
                # In the stream only when the client asked to trace the turn.
                return [named("trace", {"type": event.type, **asdict(event)})]
            case Done():
                return [done_frame(self.record.id, event)]
        return []

    def compacted(self, record: TurnRecord) -> list[Frame]:
        """After the stream's retention: only how the turn ended (its rows are the
        conversation's: `GET /v1/conversations/{id}/messages`)."""
        return [done_frame(record.id, final_event(record))]

    def body(self, result: TurnResult) -> dict[str, Any]:
        """The turn's outcome, as a polled turn object shows it."""
        return {
            "conversation_id": self.record.conversation_id,
            "content": result.content,
            "finish_reason": result.finish_reason,
            "usage": usage_body(result.usage),
            "tool_calls": result.tool_calls,
            "tool_outputs": result.tool_outputs,
            "pending_confirmations": result.pending,
        }

    def answer(self, done: Done, kept: list[Event], result: TurnResult) -> dict[str, Any]:
        """The rows the turn stored and the tool call it now waits on, if any."""
        pending = [asdict(e) for e in kept if isinstance(e, AwaitingConfirmation)]
        messages = [e.row for e in kept if isinstance(e, MessageStored)]
        return rows_answer(self.record.id, done, messages, pending[0] if pending else None)


def done_frame(turn_id: str | None, done: Done) -> Named:
    """The last event of a conversation stream: how the turn ended (None: no turn ran)."""
    body: dict[str, Any] = {
        "turn_id": turn_id,
        "status": done.status,
        "usage": usage_body(done.usage),
    }
    error = terminal_error(done)
    if error is not None:
        body["error"] = {"code": error["code"], "message": error["message"]}
    return named("done", body)


def awaiting_frame(pending: dict[str, Any] | None) -> Named:
    """A tool call that waits on the user's decision (`awaiting_confirmation`)."""
    return named("awaiting_confirmation", pending)


def rows_answer(
    turn_id: str | None,
    done: Done,
    messages: list[dict[str, Any]],
    pending: dict[str, Any] | None,
) -> dict[str, Any]:
    """A conversation turn's JSON answer (None: a decision that started no turn)."""
    return {
        "turn_id": turn_id,
        "status": done.status,
        "messages": messages,
        "pending_confirmation": pending,
        "usage": usage_body(done.usage),
    }
