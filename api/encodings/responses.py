"""The `responses` encoding: OpenAI's Responses API (`POST /v1/responses`,
api/routes/responses.py). A turn is a response: its id is `resp_<turn id>`.

The stream is OpenAI's event sequence, each a named SSE event whose data carries `type` and
a dense `sequence_number`: `response.created`, `response.in_progress`, then for each output
item `response.output_item.added` ... `response.output_item.done`, and last
`response.completed` (or `.incomplete` for a length cut, `.failed`, `.cancelled`), which
carries the whole Response. The answer's text is one `message` item (`output_text` part,
`response.output_text.delta` events). Bernard's own tool calls are what OpenAI shows for
tools it runs on the server: an `mcp_call` item of the server "bernard" with its
`response.mcp_call_arguments.*` and `response.mcp_call.*` events; a tool's progress is the
extra event `response.mcp_call.progress`; a call waiting on the user's decision is an
`mcp_approval_request` item (its id is the proposal's confirmation id). The client's own
tools the router called are `function_call` items.

The numbering is the encoder's count of the events it produced (api/encoding.py: an
encoder instance serves one stream from where the client resumes): a client resuming
`starting_after=N` gets an encoder that re-encodes the turn's stream from its start
(api/replays.py) and drops every event up to N, so the numbers are the same on any API
process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from api.encoding import Frame, final_event, named, terminal_error
from shared.events import (
    AwaitingConfirmation,
    ClientToolCall,
    Delta,
    Done,
    Event,
    Start,
    ToolCall,
    ToolProgress,
    ToolResult,
    TurnStatus,
)
from shared.results import TurnResult
from shared.turn_record import TurnRecord

RESPONSE_PREFIX = "resp_"
SERVER_LABEL = "bernard"
# The `type` of a tool's progress event: not one of OpenAI's, passed through by its SDKs.
PROGRESS_EVENT = "response.mcp_call.progress"


def response_id(turn_id: str) -> str:
    return f"{RESPONSE_PREFIX}{turn_id}"


def turn_id_of(response_id: str) -> str | None:
    """The turn a response id names (None: not a response id)."""
    if not response_id.startswith(RESPONSE_PREFIX):
        return None
    return response_id[len(RESPONSE_PREFIX) :] or None


def response_status(status: TurnStatus, finish_reason: str | None) -> str:
    """A turn's status as a Response's: a paused turn completed (its last item is the
    approval request), a turn cut by the token limit is incomplete."""
    if status == TurnStatus.RUNNING:
        return "in_progress"
    if status in (TurnStatus.COMPLETED, TurnStatus.AWAITING_CONFIRMATION):
        return "incomplete" if finish_reason == "length" else "completed"
    return str(status)  # queued, failed, cancelled


def response_usage(usage: dict[str, int] | None) -> dict[str, Any]:
    usage = usage or {}
    return {
        "input_tokens": usage.get("prompt_tokens", 0),
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.get("completion_tokens", 0),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.get("total_tokens", 0),
    }


def message_item(turn_id: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    return {
        "id": f"msg_{turn_id}",
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [part] if status != "in_progress" else [],
    }


def mcp_call_item(
    call_id: str,
    name: str,
    arguments: str,
    output: str | None,
    is_error: bool,
    status: str,
    approval: str | None = None,
) -> dict[str, Any]:
    error = None
    if is_error and output is not None:
        error = {
            "type": "mcp_tool_execution_error",
            "content": [{"type": "text", "text": output}],
        }
    return {
        "id": f"mcp_{call_id}",
        "type": "mcp_call",
        "server_label": SERVER_LABEL,
        "name": name,
        "arguments": arguments,
        "output": None if is_error else output,
        "error": error,
        "status": status,
        # The approval request the user approved it by (a call that needed one).
        "approval_request_id": approval,
    }


def approval_item(pending: dict[str, Any]) -> dict[str, Any]:
    call = pending["tool_call"]
    return {
        "id": pending["confirmation_id"],
        "type": "mcp_approval_request",
        "server_label": SERVER_LABEL,
        "name": call["name"],
        "arguments": call["arguments"],
    }


def function_call_item(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"fc_{call_id}",
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def response_object(
    record: TurnRecord,
    status: str,
    output: list[dict[str, Any]],
    *,
    usage: dict[str, int] | None = None,
    error: dict[str, Any] | None = None,
    finished_at: float | None = None,
) -> dict[str, Any]:
    """The Response resource of `record`'s turn as it stands."""
    agent, echo = record.request.agent, record.request.delivery.echo
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": response_id(record.id),
        "object": "response",
        "created_at": int(record.created_at),
        "status": status,
        # As the client asked: a background response that is also streamed is delivered
        # as a stream (api/routes/responses.py), yet is a background response.
        "background": bool(echo.get("background")),
        "completed_at": int(finished_at) if finished_at and status == "completed" else None,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": echo.get("instructions"),
        "max_output_tokens": agent.max_tokens,
        "metadata": echo.get("metadata") or {},
        "model": record.model,
        "output": output,
        "parallel_tool_calls": agent.parallel_tool_calls,
        "previous_response_id": echo.get("previous_response_id"),
        "conversation": {"id": record.conversation_id} if record.conversation_id else None,
        "store": record.request.agent.kept,
        "temperature": agent.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": echo.get("tool_choice") or "auto",
        "tools": echo.get("tools") or [],
        "top_p": agent.top_p,
        "truncation": echo.get("truncation") or "disabled",
        "usage": response_usage(usage) if usage is not None else None,
        "user": agent.user,
    }


def response_error(done: Done) -> dict[str, Any] | None:
    """A failed response's `error` (OpenAI's shape: code and message)."""
    error = terminal_error(done)
    if error is None or done.status != TurnStatus.FAILED:
        return None
    return {"code": error["code"], "message": error["message"]}


def approvals_of(record: TurnRecord) -> dict[str, str]:
    """The calls a response runs because the user approved them: tool call id → the
    approval request's id (api/responses_domain.py sets them when it decides)."""
    return dict(record.request.delivery.echo.get("approvals") or {})


def result_output(record: TurnRecord, result: TurnResult) -> list[dict[str, Any]]:
    """A finished turn's output items, from its stored result, as its stream ended them."""
    turn_id, approvals = record.id, approvals_of(record)
    output: list[dict[str, Any]] = []
    outputs = {one.get("id"): one.get("content") for one in result.tool_outputs}
    for call in result.tool_calls:
        # As the router records them: {id, name, arguments} (worker/harness/router.py).
        function = call.get("function") or call
        output.append(
            mcp_call_item(
                call["id"],
                function.get("name", ""),
                function.get("arguments", ""),
                outputs.get(call.get("id")),
                False,
                "completed",
                approvals.get(call["id"]),
            )
        )
    output += [approval_item(pending) for pending in result.pending]
    for call in result.client_calls:
        function = call.get("function") or {}
        output.append(
            function_call_item(call["id"], function.get("name", ""), function.get("arguments", ""))
        )
    if result.content:
        status = "incomplete" if result.finish_reason == "length" else "completed"
        # Where the stream opened it: before the calls that started after the first text.
        at = len(output) if result.calls_before_text is None else result.calls_before_text
        output.insert(at, message_item(turn_id, result.content, status))
    return output


@dataclass(slots=True)
class _Open:
    """An output item the stream has added and not yet closed."""

    index: int
    item: dict[str, Any]
    text: list[str] = field(default_factory=list)


class ResponsesEncoder:
    """OpenAI's Responses events for one turn, numbered (api/encoding.py `Encoder`)."""

    # The terminal event says the stream is over.
    END: ClassVar[Frame | None] = None
    keep: ClassVar[tuple[type[Event], ...]] = ()
    reads_result: ClassVar[bool] = True
    shows_rows: ClassVar[bool] = False
    subject_prefix: ClassVar[str] = RESPONSE_PREFIX

    def __init__(self, record: TurnRecord, starting_after: int = -1) -> None:
        self.record = record
        # Events numbered up to this one are counted but not sent (a resumed stream).
        self.starting_after = starting_after
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self.message: _Open | None = None
        self.calls: dict[str, _Open] = {}
        self.approvals = approvals_of(record)

    def _event(self, kind: str, body: dict[str, Any]) -> list[Frame]:
        number = self.sequence
        self.sequence += 1
        if number <= self.starting_after:
            return []
        return [named(kind, {"type": kind, **body, "sequence_number": number})]

    def _snapshot(self, status: str, **extra: Any) -> dict[str, Any]:
        return response_object(self.record, status, list(self.output), **extra)

    def _add(self, item: dict[str, Any]) -> tuple[_Open, list[Frame]]:
        opened = _Open(len(self.output), item)
        self.output.append(item)
        added = {"output_index": opened.index, "item": dict(item)}
        return opened, self._event("response.output_item.added", added)

    def _done(self, opened: _Open, item: dict[str, Any]) -> list[Frame]:
        self.output[opened.index] = item
        return self._event(
            "response.output_item.done", {"output_index": opened.index, "item": item}
        )

    def keepalive(self) -> None:
        """No keepalive event (it would take a sequence number): a `: ping` comment."""
        return None

    def frames(self, event: Event) -> list[Frame]:
        match event:
            case Start():
                queued = (
                    "queued"
                    if self.record.request.delivery.echo.get("background")
                    else "in_progress"
                )
                created = self._event("response.created", {"response": self._snapshot(queued)})
                running = {"response": self._snapshot("in_progress")}
                return created + self._event("response.in_progress", running)
            case Delta(text=text):
                return self._text(text)
            case ToolCall():
                return self._tool_call(event)
            case ToolProgress():
                return self._progress(event)
            case ToolResult():
                return self._tool_result(event)
            case AwaitingConfirmation():
                pending = {"confirmation_id": event.confirmation_id, "tool_call": event.tool_call}
                opened, frames = self._add(approval_item(pending))
                return frames + self._done(opened, opened.item)
            case ClientToolCall():
                item = function_call_item(event.id, event.name, event.arguments)
                opened, frames = self._add({**item, "arguments": "", "status": "in_progress"})
                where = {"item_id": item["id"], "output_index": opened.index}
                frames += self._event(
                    "response.function_call_arguments.delta", {**where, "delta": event.arguments}
                )
                frames += self._event(
                    "response.function_call_arguments.done",
                    {**where, "name": event.name, "arguments": event.arguments},
                )
                return frames + self._done(opened, item)
            case Done():
                return self._ending(event)
        return []

    def _text(self, text: str) -> list[Frame]:
        frames: list[Frame] = []
        if self.message is None:
            item = message_item(self.record.id, "", "in_progress")
            self.message, frames = self._add(item)
            frames += self._event(
                "response.content_part.added",
                {
                    "item_id": item["id"],
                    "output_index": self.message.index,
                    "content_index": 0,
                    "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""},
                },
            )
        self.message.text.append(text)
        return frames + self._event(
            "response.output_text.delta",
            {
                "item_id": self.message.item["id"],
                "output_index": self.message.index,
                "content_index": 0,
                "delta": text,
                "logprobs": [],
            },
        )

    def _close_message(self, status: str) -> list[Frame]:
        opened = self.message
        if opened is None:
            return []
        self.message = None
        text = "".join(opened.text)
        where = {"item_id": opened.item["id"], "output_index": opened.index, "content_index": 0}
        item = message_item(self.record.id, text, status)
        frames = self._event("response.output_text.done", {**where, "text": text, "logprobs": []})
        frames += self._event("response.content_part.done", {**where, "part": item["content"][0]})
        return frames + self._done(opened, item)

    def _tool_call(self, event: ToolCall) -> list[Frame]:
        approval = self.approvals.get(event.id)
        item = mcp_call_item(event.id, event.name, "", None, False, "in_progress", approval)
        opened, frames = self._add(item)
        opened.item = {**item, "arguments": event.arguments}
        self.calls[event.id] = opened
        where = {"item_id": item["id"], "output_index": opened.index}
        frames += self._event("response.mcp_call.in_progress", where)
        frames += self._event(
            "response.mcp_call_arguments.delta", {**where, "delta": event.arguments}
        )
        return frames + self._event(
            "response.mcp_call_arguments.done", {**where, "arguments": event.arguments}
        )

    def _progress(self, event: ToolProgress) -> list[Frame]:
        opened = self.calls.get(event.tool_call_id)
        if opened is None:
            return []
        body: dict[str, Any] = {
            "item_id": opened.item["id"],
            "output_index": opened.index,
            "phase": event.phase,
            "message": event.message,
            **event.counts(),
        }
        return self._event(PROGRESS_EVENT, body)

    def _tool_result(self, event: ToolResult) -> list[Frame]:
        opened = self.calls.pop(event.tool_call_id, None)
        if opened is None:
            return []
        status = "failed" if event.is_error else "completed"
        item = mcp_call_item(
            event.tool_call_id,
            event.name,
            opened.item["arguments"],
            event.content,
            event.is_error,
            status,
            opened.item["approval_request_id"],
        )
        where = {"item_id": item["id"], "output_index": opened.index}
        frames = self._event(f"response.mcp_call.{status}", where)
        return frames + self._done(opened, item)

    def _ending(self, done: Done) -> list[Frame]:
        status = response_status(done.status, done.finish_reason)
        item_status = "incomplete" if status != "completed" else "completed"
        frames = self._close_message(item_status)
        for opened in list(self.calls.values()):  # calls the turn ended before their result
            frames += self._done(opened, {**opened.item, "status": "incomplete"})
        self.calls.clear()
        # No `completed_at`: the stream's `done` carries no time, and every re-encoding of
        # the stream must give the same bytes (the polled Response has it).
        response = self._snapshot(status, usage=done.usage or {}, error=response_error(done))
        return frames + self._event(f"response.{status}", {"response": response})

    def compacted(self, record: TurnRecord) -> list[Frame]:
        """After the stream's retention: the response's start, its output items from the
        stored result (each added and done), and its ending."""
        frames = self.frames(Start())
        result = record.result if record.status != TurnStatus.FAILED else None
        for item in result_output(record, result) if result is not None else []:
            opened, added = self._add(item)
            frames += added + self._done(opened, item)
        return frames + self._ending(final_event(record))

    def body(self, result: TurnResult) -> dict[str, Any]:
        """The finished turn's Response, from its stored result."""
        record = self.record
        done = final_event(record)
        status = response_status(record.status, result.finish_reason)
        return response_object(
            record,
            status,
            result_output(record, result),
            usage=result.usage,
            error=response_error(done),
            finished_at=record.finished_at,
        )

    def answer(self, done: Done, kept: list[Event], result: TurnResult) -> dict[str, Any]:
        """The non-stream Response, once the turn ended with `done`."""
        status = response_status(done.status, done.finish_reason or result.finish_reason)
        return response_object(
            self.record,
            status,
            result_output(self.record, result),
            usage=done.usage or result.usage,
            error=response_error(done),
            finished_at=time.time(),
        )
