"""The events a turn is made of, and their encoding as Redis Stream entries.

The worker yields these, writes one stream entry per event, and the API turns each entry
into SSE frames for the wire format the client asked for. Events hold everything their
frames need (a tool call carries its own `index`, `done` carries the usage), so any API
process can encode any entry on its own: that is what makes resume exact.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Literal

import orjson


class TurnStatus(StrEnum):
    """Where a turn stands: its record's `status` and its `done`'s (shared/lifecycle.py moves
    it). A `StrEnum`, so a status is its own wire value and compares equal to its string."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # It ends a turn too: it paused before a tool that changes the world, holds no worker,
    # and a decision continues the conversation as a new turn.
    AWAITING_CONFIRMATION = "awaiting_confirmation"


TERMINAL_STATUSES: frozenset[TurnStatus] = frozenset(
    {
        TurnStatus.COMPLETED,
        TurnStatus.FAILED,
        TurnStatus.CANCELLED,
        TurnStatus.AWAITING_CONFIRMATION,
    }
)
Stage = Literal["router", "response"]
ProgressPhase = Literal["step", "progress", "complete", "error"]


@dataclass(slots=True)
class Event:
    """Base of all events; `type` names the event on the wire and in the stream."""

    type: ClassVar[str] = "event"


@dataclass(slots=True)
class Start(Event):
    """Written by the API when it creates the turn: the stream exists before any worker runs."""

    type: ClassVar[str] = "start"


@dataclass(slots=True)
class Trace(Event):
    """Base of the events that trace a turn (its model calls, its memory): in the stream
    only when the client asked to trace the turn (worker/supervisor.py `_visible`)."""


@dataclass(slots=True)
class LlmPrompt(Trace):
    """Trace: the messages sent to one model call."""

    type: ClassVar[str] = "llm_prompt"
    stage: Stage
    model: str
    messages: list[dict[str, Any]]


@dataclass(slots=True)
class LlmCallComplete(Trace):
    """Trace: one model call ended."""

    type: ClassVar[str] = "llm_call_complete"
    stage: Stage
    model: str
    latency_ms: float
    usage: dict[str, int] | None = None


@dataclass(slots=True)
class Memory(Trace):
    """Trace: what of the conversation this turn's prompts hold, and why.

    `kept` recent messages (of `stored` in all) whole, within `budget` tokens of history;
    the running `summary_covers` the first that many messages (None without a summary);
    `notes` of the user's notes; `tokens` the prompt's estimated size without the answer."""

    type: ClassVar[str] = "memory"
    kept: int
    stored: int
    summary_covers: int | None
    notes: int
    tokens: int
    budget: int


@dataclass(slots=True)
class ToolCall(Event):
    """The router decided to run a tool; emitted before the tool runs, arguments whole.

    `index` counts tool calls across the whole turn (never reset per router step);
    `policy` names the rule that let it run or refused it, `{"rule", "decision"}`
    (worker/tools/policy.py), None for a call no rule was asked about (one that cannot run).
    """

    type: ClassVar[str] = "tool_call"
    id: str
    name: str
    arguments: str
    index: int
    policy: dict[str, str] | None = None


@dataclass(slots=True)
class ClientToolCall(Event):
    """The router called one of the client's own tools (`AgentRequest.client_tools`): the
    client runs it, not Bernard. One per call; the turn then ends `completed` with
    finish_reason "tool_calls", and the client's follow-up carries the results.

    `arguments` is the whole JSON text; `index` is the call's place among this turn's
    client calls (0, 1, ... as Chat Completions' `delta.tool_calls[].index`).
    """

    type: ClassVar[str] = "client_tool_call"
    id: str
    name: str
    arguments: str
    index: int


@dataclass(slots=True)
class ToolProgress(Event):
    """A running tool reported progress."""

    type: ClassVar[str] = "tool_progress"
    tool_call_id: str
    tool: str
    phase: ProgressPhase
    message: str
    current: float | None = None
    total: float | None = None

    def counts(self) -> dict[str, float]:
        """`current` and `total`, those it has: what an encoding adds to its fields."""
        return {
            name: value
            for name, value in (("current", self.current), ("total", self.total))
            if value is not None
        }


@dataclass(slots=True)
class ToolResult(Event):
    """A tool finished; `content` is cut for the stream, the record keeper stores it whole.

    `index` is its call's `ToolCall.index`: `delta.tool_outputs` entries need one, or the
    openai SDK's stream helper fails on the turn's second output.
    """

    type: ClassVar[str] = "tool_result"
    tool_call_id: str
    name: str
    content: str
    truncated: bool = False
    index: int | None = None
    is_error: bool = False


@dataclass(slots=True)
class AwaitingConfirmation(Event):
    """The router called a tool that changes the world: it waits for the user's decision.

    `tool_call` is `{id, name, arguments}` (arguments as JSON text); `summary` says in plain
    words what the tool would do; `expires_at` (epoch seconds) is when the proposal lapses.
    """

    type: ClassVar[str] = "awaiting_confirmation"
    confirmation_id: str
    tool_call: dict[str, str]
    summary: str
    expires_at: float


@dataclass(slots=True)
class MessageStored(Event):
    """A conversation row was stored (`row`: id, role, content, tool_calls, tool_call_id,
    turn_id, created_at); streamed to conversation clients only."""

    type: ClassVar[str] = "message"
    row: dict[str, Any]


@dataclass(slots=True)
class TimerFired(Event):
    """A user's timer is done (on the user's event stream, shared/timers.py)."""

    type: ClassVar[str] = "timer_fired"
    timer_id: str
    label: str
    conversation_id: str | None
    due_at: float


@dataclass(slots=True)
class Delta(Event):
    """Response text as it arrives from the response model."""

    type: ClassVar[str] = "delta"
    text: str


@dataclass(slots=True)
class Error(Event):
    """A non-fatal problem (a tool failed, the step limit was hit); the turn goes on."""

    type: ClassVar[str] = "error"
    message: str
    code: str


@dataclass(slots=True)
class Done(Event):
    """Always the last entry of a turn's stream."""

    type: ClassVar[str] = "done"
    status: TurnStatus
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    error: dict[str, str] | None = None

    def __post_init__(self) -> None:
        self.status = TurnStatus(self.status)  # as decoded from a stream entry: its string


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        Start,
        LlmPrompt,
        LlmCallComplete,
        Memory,
        ToolCall,
        ClientToolCall,
        ToolProgress,
        ToolResult,
        AwaitingConfirmation,
        MessageStored,
        TimerFired,
        Delta,
        Error,
        Done,
    )
}


@dataclass(slots=True)
class Stamped:
    """An event as stored: the event plus the wall-clock time the writer stored it."""

    event: Event
    at: float = field(default_factory=time.time)


# A str holds a lone surrogate only when something decoded one (a whole pair is one character).
_SURROGATE = re.compile("[\ud800-\udfff]")


def encode(event: Event, at: float | None = None) -> bytes:
    """The stream entry's payload: orjson of the event's fields plus `type` and `at`.

    A lone surrogate (`"\\ud800"`, which a model's broken output can carry through a JSON
    parser that allows it) is not UTF-8 and orjson refuses it: it is written as U+FFFD, so
    the event, and its turn, go on.
    """
    body = asdict(event)
    body["type"] = event.type
    body["at"] = time.time() if at is None else at
    try:
        return orjson.dumps(body)
    except TypeError:
        return orjson.dumps(_without_surrogates(body))


def _without_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_surrogates(v) for v in value]
    return value


def decode(payload: bytes | str) -> Stamped:
    """Inverse of `encode`. Raises `ValueError` on an unknown type."""
    body = orjson.loads(payload)
    kind = body.pop("type")
    at = body.pop("at", 0.0)
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise ValueError(f"unknown event type {kind!r}")
    return Stamped(event=cls(**body), at=at)
