"""One turn's log lines and spans, written where its calls start and end (never per token).

The supervisor makes a `TurnTelemetry` when it claims a turn (`claimed`) and ends it with
the turn (`ended`). In between it is one of the turn's sinks (worker/turn.py): it reads the
calls' starts and ends from the items the harnesses yield (worker/calls.py), as the call
records do, and closes the calls still open when the turn fails or stops (`fail`). One
made without a claim (a test's) logs but opens no span.

Lines, on the `bernard.worker` logger, each with `turn_id`, `conversation_id` and `user`:

- `turn started`: `queue_ms` (created → claimed), `kind`, `worker`
- `model call`: `stage`, `model`, `latency_ms`, `prompt_tokens`, `completion_tokens`,
  `finish_reason`, `status` (`ok`, `error`, `cancelled`), `error` (an `ErrorCode`) and
  `upstream_status` when it failed
- `tool call`: `tool`, `tool_call_id`, `duration_ms`, `status` (`success`, `error`,
  `invalid`: the model's call could not run, `cancelled`), `error`
- `turn paused`: `tool`, `confirmation_id` (the call waits for the user's decision)
- `turn ended`: `status`, `error`, `duration_ms` (claimed → ended), `queue_ms`,
  `prompt_tokens`, `completion_tokens`, `total_tokens`

With `BERNARD_LOG_PROMPTS=1`, and only then, they also hold the prompt and the model's
output, a tool call's arguments and output, and error messages; so do the spans.

Spans (tracing on, shared/traces.py), under the trace of the API request that created the
turn, named and attributed after OpenTelemetry's GenAI conventions where one fits:
`bernard.queue_wait` (created → claimed), `invoke_agent bernard` (the turn), and under it
`chat {model}` per model call (`gen_ai.request.model`, `gen_ai.usage.input_tokens`,
`gen_ai.usage.output_tokens`, `gen_ai.response.finish_reasons`, `bernard.stage`) and
`execute_tool {name}` per tool call (`gen_ai.tool.name`, `gen_ai.tool.call.id`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
from langchain_core.messages import BaseMessage, convert_to_openai_messages

from shared import traces
from shared.errors import ErrorCode
from shared.events import AwaitingConfirmation, ToolCall
from shared.settings import Settings
from shared.turn_record import TurnRecord
from worker.calls import (
    Item,
    ModelCallEnded,
    ModelCallStarted,
    ToolCallEnded,
    ToolOutcome,
    is_stop,
)
from worker.llm import LlmError, LlmResult

if TYPE_CHECKING:
    from opentelemetry.trace import Span


__all__ = ["ModelCall", "ToolRun", "TurnTelemetry"]

logger = logging.getLogger("bernard.worker")
# How much of a tool's output a line or span holds (with prompts logged).
_OUTPUT_CHARS = 4000
_AGENT = "bernard"


def _ns(epoch_s: float) -> int:
    return int(epoch_s * 1_000_000_000)


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 1)


def _end_span(span: Span | None, code: str | None, attributes: Mapping[str, Any]) -> None:
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attributes({k: v for k, v in attributes.items() if v is not None})
    if code is not None:
        span.set_attribute("error.type", code)
        span.set_status(Status(StatusCode.ERROR, code))
    span.end()


class TurnTelemetry:
    """The log lines and spans of one turn."""

    def __init__(
        self,
        turn_id: str,
        settings: Settings,
        *,
        conversation_id: str | None = None,
        user: str | None = None,
        span: Span | None = None,
        queue_ms: float | None = None,
    ) -> None:
        self.prompts = settings.log_prompts
        self.fields: dict[str, Any] = {
            "turn_id": turn_id,
            "conversation_id": conversation_id,
            "user": user,
        }
        self.span = span
        self.queue_ms = queue_ms
        self.started = time.perf_counter()
        # The turn's running totals (the context's `usage`, which its calls add to).
        self.usage: Mapping[str, int] | None = None
        self._ended = False
        # The calls open now: the model call (they are sequential) and the tool calls, by
        # the model's tool call id.
        self._model_call: ModelCall | None = None
        self._tool_runs: dict[str, ToolRun] = {}

    @classmethod
    def claimed(cls, record: TurnRecord, settings: Settings, worker_id: str) -> TurnTelemetry:
        """The turn's telemetry from its claim on: logs `turn started`, and with tracing on
        records the queue wait and opens the turn's span, under the API request's trace."""
        started_at = record.started_at or time.time()
        queue_ms = round(max(0.0, started_at - record.created_at) * 1000, 1)
        span = None
        tracer = traces.tracer()
        if tracer is not None:
            parent = traces.parent_context(record.traceparent)
            attributes: dict[str, Any] = {"bernard.turn_id": record.id, "enduser.id": record.owner}
            if record.conversation_id:
                attributes["gen_ai.conversation.id"] = record.conversation_id
            wait = tracer.start_span(
                "bernard.queue_wait",
                context=parent,
                start_time=_ns(record.created_at),
                attributes=attributes,
            )
            wait.end(end_time=_ns(started_at))
            span = tracer.start_span(
                f"invoke_agent {_AGENT}",
                context=parent,
                start_time=_ns(started_at),
                attributes={
                    **attributes,
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": _AGENT,
                    "bernard.turn.mode": record.request.agent.mode.value,
                    "bernard.worker": worker_id,
                },
            )
        telemetry = cls(
            record.id,
            settings,
            conversation_id=record.conversation_id,
            user=record.owner,
            span=span,
            queue_ms=queue_ms,
        )
        logger.info(
            "turn started",
            extra={
                **telemetry.fields,
                "queue_ms": queue_ms,
                "mode": record.request.agent.mode.value,
                "worker": worker_id,
            },
        )
        return telemetry

    def _child(self, name: str, attributes: Mapping[str, Any]) -> Span | None:
        """A span under the turn's (none when tracing is off or the turn has no span)."""
        tracer = traces.tracer()
        if tracer is None or self.span is None:
            return None
        from opentelemetry.trace import SpanKind, set_span_in_context

        return tracer.start_span(
            name,
            context=set_span_in_context(self.span),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )

    async def take(self, item: Item) -> None:
        """Start or end the log line and span of the call `item` stands for, if any; note a
        pause for the user's decision."""
        match item:
            case ModelCallStarted():
                prompt = item.prompt
                self._model_call = ModelCall(self, prompt.stage, prompt.model, item.messages)
            case ModelCallEnded() if self._model_call is not None:
                self._model_call.done(item.result)
                self._model_call = None
            case ToolCall():
                self._tool_runs[item.id] = ToolRun(self, item)
            case ToolCallEnded() if item.call.id in self._tool_runs:
                self._tool_runs.pop(item.call.id).done(item.outcome)
            case AwaitingConfirmation():
                self.paused(item)

    async def fail(self, error: BaseException) -> None:
        """The turn failed or was stopped (`error`): the calls still open end with it."""
        if self._model_call is not None:
            self._model_call.failed(error)
            self._model_call = None
        for run in self._tool_runs.values():
            run.failed(error)
        self._tool_runs.clear()

    def paused(self, proposal: AwaitingConfirmation) -> None:
        """The turn stops to wait for the user's decision on `proposal`."""
        tool = proposal.tool_call["name"]
        fields: dict[str, Any] = {
            **self.fields,
            "tool": tool,
            "tool_call_id": proposal.tool_call["id"],
            "confirmation_id": proposal.confirmation_id,
        }
        if self.prompts:
            fields["arguments"] = proposal.tool_call["arguments"]
        logger.info("turn paused", extra=fields)
        if self.span is not None:
            self.span.add_event(
                "awaiting_confirmation",
                {"gen_ai.tool.name": tool, "bernard.confirmation_id": proposal.confirmation_id},
            )

    def ended(self, status: str, code: str | None = None, message: str | None = None) -> None:
        """Log `turn ended` and end the turn's span (once; later calls do nothing)."""
        if self._ended:
            return
        self._ended = True
        usage = self.usage or {}
        fields: dict[str, Any] = {
            **self.fields,
            "status": status,
            "error": str(code) if code is not None else None,
            "duration_ms": _ms(self.started),
            "queue_ms": self.queue_ms,
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "total_tokens": usage.get("total_tokens"),
        }
        if self.prompts and message:
            fields["error_message"] = message
        level = logging.WARNING if status in ("failed", "lost") else logging.INFO
        logger.log(level, "turn ended", extra=fields)
        failed = code is not None and status not in ("cancelled",)
        _end_span(
            self.span,
            str(code) if failed else None,
            {
                "bernard.turn.status": status,
                "gen_ai.usage.input_tokens": usage.get("prompt_tokens"),
                "gen_ai.usage.output_tokens": usage.get("completion_tokens"),
            },
        )

    def close(self) -> None:
        """End the turn's span if no ending was logged (the job itself was cancelled)."""
        if not self._ended:
            self._ended = True
            _end_span(self.span, None, {})


class ModelCall:
    """One model call of a turn, from its prompt to its result."""

    __slots__ = ("_ended", "model", "prompt", "span", "stage", "started", "turn")

    def __init__(
        self, turn: TurnTelemetry, stage: str, model: str, messages: Sequence[BaseMessage]
    ) -> None:
        self.turn = turn
        self.stage = stage
        self.model = model
        self.started = time.perf_counter()
        self._ended = False
        # Converted only when asked for: it costs time per message.
        self.prompt = convert_to_openai_messages(list(messages)) if turn.prompts else None
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "bernard.stage": stage,
        }
        if self.prompt is not None:
            attributes["gen_ai.input.messages"] = orjson.dumps(self.prompt, default=str).decode()
        self.span = turn._child(f"chat {model}", attributes)

    def done(self, result: LlmResult) -> None:
        """The call answered."""
        if self._ended:
            return
        self._ended = True
        usage = result.usage or {}
        fields: dict[str, Any] = {
            **self.turn.fields,
            "stage": self.stage,
            "model": self.model,
            "status": "ok",
            "latency_ms": round(result.latency_ms, 1),
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "finish_reason": result.finish_reason,
        }
        output = None
        if self.turn.prompts:
            message = result.message
            output = {"content": message.content, "tool_calls": message.tool_calls}
            fields["prompt"] = self.prompt
            fields["output"] = output
        logger.info("model call", extra=fields)
        _end_span(
            self.span,
            None,
            {
                "gen_ai.usage.input_tokens": usage.get("prompt_tokens"),
                "gen_ai.usage.output_tokens": usage.get("completion_tokens"),
                "gen_ai.response.finish_reasons": (
                    [result.finish_reason] if result.finish_reason else None
                ),
                "gen_ai.output.messages": (
                    orjson.dumps(output, default=str).decode() if output is not None else None
                ),
            },
        )

    def failed(self, error: BaseException) -> None:
        """The call raised `error` (an `LlmError`, or a cancel: the turn was stopped)."""
        if self._ended:
            return
        self._ended = True
        fields: dict[str, Any] = {
            **self.turn.fields,
            "stage": self.stage,
            "model": self.model,
            "latency_ms": _ms(self.started),
        }
        code: str | None = None
        if is_stop(error):
            fields["status"] = "cancelled"
        else:
            fields["status"] = "error"
            if isinstance(error, LlmError):
                code = str(error.code)
                fields["upstream_status"] = error.status
            else:
                code = str(ErrorCode.INTERNAL_ERROR)
                fields["exception"] = type(error).__name__
            fields["error"] = code
            if self.turn.prompts:
                fields["prompt"] = self.prompt
                # An upstream's own words (`LlmError.detail`), which no client sees.
                fields["error_message"] = str(error)
        level = logging.INFO if code is None else logging.WARNING
        logger.log(level, "model call", extra=fields)
        _end_span(self.span, code, {"bernard.cancelled": True} if code is None else {})


class ToolRun:
    """One tool call of a turn, from the router's decision to its outcome."""

    __slots__ = ("_ended", "call", "span", "started", "turn")

    def __init__(self, turn: TurnTelemetry, call: ToolCall) -> None:
        self.turn = turn
        self.call = call
        self.started = time.perf_counter()
        self._ended = False
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
        }
        if turn.prompts:
            attributes["gen_ai.tool.call.arguments"] = call.arguments
        self.span = turn._child(f"execute_tool {call.name}", attributes)

    def _fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            **self.turn.fields,
            "tool": self.call.name,
            "tool_call_id": self.call.id,
            "duration_ms": _ms(self.started),
        }
        if self.turn.prompts:
            fields["arguments"] = self.call.arguments
        return fields

    def done(self, outcome: ToolOutcome) -> None:
        """The call has its outcome (which may be an error the model reads)."""
        if self._ended:
            return
        self._ended = True
        fields = self._fields()
        code: str | None = None
        if outcome.status == "success":
            fields["status"] = "success"
        elif outcome.failure is not None:
            code = str(outcome.failure.code or ErrorCode.TOOL_ERROR)
            fields["status"] = "error"
        else:  # it never ran: an unknown tool or arguments that fail its schema
            fields["status"] = "invalid"
        fields["error"] = code
        output = outcome.content[:_OUTPUT_CHARS] if self.turn.prompts else None
        if output is not None:
            fields["output"] = output
            if outcome.failure is not None:
                fields["error_message"] = outcome.failure.message
        level = logging.INFO if fields["status"] == "success" else logging.WARNING
        logger.log(level, "tool call", extra=fields)
        attributes: dict[str, Any] = {"bernard.tool.status": fields["status"]}
        if output is not None:
            attributes["gen_ai.tool.call.result"] = output
        failure = code or ("invalid_call" if fields["status"] == "invalid" else None)
        _end_span(self.span, failure, attributes)

    def failed(self, error: BaseException) -> None:
        """The call was stopped (the turn was cancelled) or failed outside the tool."""
        if self._ended:
            return
        self._ended = True
        fields = self._fields()
        code = None if is_stop(error) else str(ErrorCode.INTERNAL_ERROR)
        fields["status"] = "cancelled" if code is None else "error"
        fields["error"] = code
        if code is not None:
            fields["exception"] = type(error).__name__
        logger.log(logging.INFO if code is None else logging.WARNING, "tool call", extra=fields)
        _end_span(self.span, code, {"bernard.tool.status": fields["status"]})
