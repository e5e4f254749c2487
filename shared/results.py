"""What a completed (or paused) turn produced, as the worker stores it on the turn record
and the API renders it (api/encodings/): one typed object instead of a dict read by key.

The worker builds it (worker/context.py `TurnContext.result`); `TurnStore.finish` stores it
as JSON, field for field (shared/turns/moves.py), and `TurnRecord.from_redis`
(shared/turn_record.py) reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class TurnResult:
    """A finished turn's outcome: its answer, why it stopped, what it cost, what ran."""

    content: str = ""
    finish_reason: str = "stop"
    # prompt_tokens, completion_tokens, total_tokens (shared/events.py `Done.usage`).
    usage: dict[str, int] = field(default_factory=dict)
    # Each tool call the router made ({id, type, function}) and its output ({id, content}).
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_outputs: list[dict[str, Any]] = field(default_factory=list)
    # Tool calls waiting for the user's decision (turn `awaiting_confirmation`), as a
    # client sees them (worker/context.py `Proposal.public`).
    pending: list[dict[str, Any]] = field(default_factory=list)
    # The client's own tools the router called ({id, type: "function", function: {name,
    # arguments}}): the turn ended on them (finish_reason "tool_calls") for the client to run.
    client_calls: list[dict[str, Any]] = field(default_factory=list)
    # How many of `tool_calls` had started when the first text was written (the router's
    # model wrote words before its calls); None: after them all. The Responses encoding
    # places the message among the calls there, as its stream did.
    calls_before_text: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TurnResult:
        """The result a record holds, as `TurnStore.finish` stored it."""
        return cls(**{name: value for name, value in data.items() if name in _FIELDS})


_FIELDS = frozenset(f.name for f in fields(TurnResult))
