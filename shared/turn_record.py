"""A turn's record: the turn hash in Redis as one object (`TurnRecord`), and what a list
shows of a turn (`preview_of`).

shared/turns/ (`TurnStore`) stores, reads and moves these records; which status a turn
may move to, and how it ends, is shared/lifecycle.py's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from shared import budgets
from shared.events import TERMINAL_STATUSES, TurnStatus
from shared.requests import TurnRequest
from shared.results import TurnResult

__all__ = ["PREVIEW_CHARS", "TurnRecord", "preview_of"]

# How much of its user message a turn's `preview` keeps.
PREVIEW_CHARS = 80


def preview_of(messages: list[dict[str, Any]]) -> str | None:
    """What a turn is about: the start of the last user message it was given (the one it
    answers), on one line, cut to `PREVIEW_CHARS`; None when it was given none (a resume)."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts: their text
            content = " ".join(
                str(part.get("text", "")) for part in content if isinstance(part, dict)
            )
        # Only its start is read: a message may be 100,000 characters (on the turn's way in).
        text = " ".join(str(content or "")[: PREVIEW_CHARS * 4].split())
        if not text:
            return None
        return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
    return None


@dataclass(slots=True)
class TurnRecord:
    """The turn hash, as one object."""

    id: str
    owner: str
    request: TurnRequest
    model: str
    created_at: float = field(default_factory=time.time)
    status: TurnStatus = TurnStatus.QUEUED
    conversation_id: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    error: dict[str, str] | None = None
    result: TurnResult | None = None
    # The W3C trace context of the request that created the turn (tracing on): the worker
    # continues that trace (shared/traces.py).
    traceparent: str | None = None
    # What the turn is about, for lists (`preview_of`); kept when the prompt is dropped.
    preview: str | None = None

    def __post_init__(self) -> None:
        if self.preview is None:
            self.preview = preview_of(self.request.agent.messages)

    def found_by(self, owner: str) -> bool:
        """Whether `owner` finds this turn by its id or in a list: it is theirs, and kept (a
        turn with `store: false` is found by no route, as OpenAI's unstored responses)."""
        return self.owner == owner and self.request.agent.kept

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def to_redis(self) -> dict[str, bytes | str]:
        fields: dict[str, bytes | str] = {
            "id": self.id,
            "owner": self.owner,
            "model": self.model,
            "status": self.status,
            "created_at": repr(self.created_at),
            # The messages and the client's tools apart: the worker needs them once, and
            # ending the turn drops them (shared/lifecycle.py, FINISH), so a finished turn
            # keeps its options (and what its encoding shows back) but not its whole prompt.
            "request": (request := orjson.dumps(self.request.stored())),
            "messages": orjson.dumps(self.request.agent.messages),
        }
        if self.request.agent.client_tools:
            fields["tools"] = orjson.dumps(self.request.agent.client_tools)
        # What of it its owner's storage budget counts while it is kept (shared/budgets.py);
        # an unkept turn is forgotten once delivered.
        counted = budgets.counted_bytes(len(request)) if self.request.agent.kept else 0
        if counted:
            fields["counted"] = str(counted)
        if self.conversation_id:
            fields["conversation_id"] = self.conversation_id
        if self.traceparent:
            fields["traceparent"] = self.traceparent
        if self.preview:
            fields["preview"] = self.preview
        return fields

    @classmethod
    def from_redis(cls, raw: dict[bytes, bytes]) -> TurnRecord:
        data = {k.decode(): v for k, v in raw.items()}

        def number(name: str) -> float | None:
            value = data.get(name)
            return float(value) if value else None

        def json_field(name: str) -> Any:
            value = data.get(name)
            return orjson.loads(value) if value else None

        result = json_field("result")
        request = orjson.loads(data["request"])
        if "messages" in data:
            request["messages"] = orjson.loads(data["messages"])
        if "tools" in data:
            request["client_tools"] = orjson.loads(data["tools"])
        return cls(
            id=data["id"].decode(),
            owner=data["owner"].decode(),
            model=data["model"].decode(),
            status=TurnStatus(data["status"].decode()),
            request=TurnRequest.restored(request),
            created_at=float(data["created_at"]),
            conversation_id=data["conversation_id"].decode() if "conversation_id" in data else None,
            started_at=number("started_at"),
            finished_at=number("finished_at"),
            error=json_field("error"),
            result=TurnResult.from_json(result) if result is not None else None,
            traceparent=data["traceparent"].decode() if "traceparent" in data else None,
            preview=data["preview"].decode() if "preview" in data else None,
        )
