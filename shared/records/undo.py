"""What "undo" puts back: the entity a Home Assistant call changed, as it was just before.

The tool that changes the house reads the entity's state before it sends the call, and its
result carries the service calls that would put it back (`Restore`); the turn's recording
keeps them with the call's record in the conversation's call log (`tool_completed`'s
`undo`), so they live as long as the conversation and count in its bytes. The call that
undid one says which (`Undone`, the record's `undid`). `find_undo` reads the log's latest
entries (`LOOKBACK`, so the read stays small however long the conversation): the last call
not undone yet, if it ended within the window (`BERNARD_UNDO_WINDOW_S`). The API asks it
for `POST /v1/conversations/{id}/undo` (404, 409) before a turn starts, and the `undo` tool
again as it runs (worker/tools/home_assistant/undo.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LOOKBACK", "MAX_RESTORE_CALLS", "Restore", "TooLate", "Undoable", "Undone", "find_undo"]

# Call-log entries read from the end (a call is two: started, completed).
LOOKBACK = 200
MAX_RESTORE_CALLS = 4


@dataclass(frozen=True, slots=True)
class Restore:
    """The service calls ({domain, service, entity_id, data}) that put an entity back as it
    was, and what they do in words ("light.kitchen back on at 40 % brightness")."""

    calls: tuple[dict[str, Any], ...]
    said: str

    def encoded(self) -> dict[str, Any]:
        return {"calls": list(self.calls), "said": self.said}

    @classmethod
    def decoded(cls, data: Any) -> Restore | None:
        """The restore a call record holds; None for anything that is not one."""
        if not isinstance(data, Mapping):
            return None
        calls, said = data.get("calls"), data.get("said")
        if not isinstance(calls, list) or not isinstance(said, str):
            return None
        if not calls or len(calls) > MAX_RESTORE_CALLS:
            return None
        if not all(
            isinstance(c, Mapping)
            and all(isinstance(c.get(k), str) for k in ("domain", "service", "entity_id"))
            and isinstance(c.get("data", {}), Mapping)
            for c in calls
        ):
            return None
        return cls(tuple(dict(c) for c in calls), said)


@dataclass(frozen=True, slots=True)
class Undone:
    """An undo's result: the call record (its `call_id`) it put back."""

    call_id: str


@dataclass(frozen=True, slots=True)
class Undoable:
    """The call to undo: its record's id, what puts it back, and when it ended."""

    call_id: str
    restore: Restore
    at: float


@dataclass(frozen=True, slots=True)
class TooLate:
    """The last call that could be undone ended more than the window ago."""

    at: float
    window_s: float


def find_undo(
    records: Sequence[Mapping[str, Any]], *, now: float, window_s: float
) -> Undoable | TooLate | None:
    """The last call of `records` (call records, in the order they started) that can be
    undone and was not; `TooLate` when it ended before `now - window_s`; None when none."""
    undone: set[str] = set()
    for record in reversed(records):
        undid = record.get("undid")
        if isinstance(undid, str):
            undone.add(undid)
        call_id, at = record.get("call_id"), record.get("completed_at")
        if record.get("status") != "completed" or call_id in undone:
            continue
        restore = Restore.decoded(record.get("undo"))
        if restore is None or not isinstance(call_id, str) or not isinstance(at, int | float):
            continue
        if at < now - window_s:
            return TooLate(float(at), window_s)
        return Undoable(call_id, restore, float(at))
    return None
