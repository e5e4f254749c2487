"""A conversation's call log: one entry per LLM or tool call `started`, one per `completed`
(`CallEvent`, built by `llm_started`, `llm_completed`, `tool_started`, `tool_completed`),
merged per call on read (`calls_of`).

shared/records/writes.py appends the entries (`Recorder.record_calls`), shared/records/reads.py
reads them back (`Archivist.calls`); worker/recording.py builds them from a turn's events.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from shared.records.messages import Message

__all__ = [
    "CallEvent",
    "CallKind",
    "calls_of",
    "llm_completed",
    "llm_started",
    "new_call_id",
    "tool_completed",
    "tool_started",
]

CallKind = Literal["llm", "tool"]


def new_call_id() -> str:
    """A fresh id for an LLM or tool call record."""
    return f"call_{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class CallEvent:
    """One entry of a conversation's call log: call `call_id` `started` or `completed`,
    at `at` (epoch seconds), with what `entry` says of it. Built by `llm_started`,
    `llm_completed`, `tool_started` and `tool_completed`; appended by
    `Recorder.record_calls`."""

    call_id: str
    event: Literal["started", "completed"]
    entry: Message
    at: float = field(default_factory=time.time)

    def encoded(self) -> bytes:
        return orjson.dumps(
            {"call_id": self.call_id, "event": self.event, "at": self.at, **self.entry}
        )


def llm_started(turn_id: str, stage: str, model: str) -> CallEvent:
    """A model call began, under a fresh `call_id` (`new_call_id()`) its completion names.
    The prompt is not stored: its messages are the conversation's own, stored once."""
    entry: Message = {"kind": "llm", "turn_id": turn_id, "stage": stage, "model": model}
    return CallEvent(new_call_id(), "started", entry)


def llm_completed(
    call_id: str,
    *,
    latency_ms: float,
    usage: Mapping[str, int] | None = None,
    error: str | None = None,
) -> CallEvent:
    """The model call `call_id` ended, with its token `usage` or its `error`."""
    entry: Message = {
        "kind": "llm",
        "status": "failed" if error else "completed",
        "latency_ms": latency_ms,
        "usage": dict(usage) if usage is not None else None,
        "error": error,
    }
    return CallEvent(call_id, "completed", entry)


def tool_started(
    turn_id: str,
    *,
    tool_call_id: str,
    name: str,
    arguments: str,
    policy: Mapping[str, str] | None = None,
) -> CallEvent:
    """A tool began running. `tool_call_id` is the model's id for the call; the event's
    `call_id` is ours (`new_call_id()`), unique even when a provider reuses tool call ids
    across steps. `policy` is the rule that let it run, or refused it
    (worker/tools/policy.py `Ruling.shown`)."""
    entry: Message = {
        "kind": "tool",
        "turn_id": turn_id,
        "tool_call_id": tool_call_id,
        "name": name,
        "arguments": arguments,
    }
    if policy is not None:
        entry["policy"] = dict(policy)
    return CallEvent(new_call_id(), "started", entry)


def tool_completed(
    call_id: str,
    *,
    latency_ms: float,
    content: str,
    status: Literal["success", "error"] = "success",
    undo: Mapping[str, Any] | None = None,
    undid: str | None = None,
) -> CallEvent:
    """The tool call `call_id` ended; `content` is stored whole, never cut. `undo` is what
    would put back what it changed, `undid` the call it put back (shared/records/undo.py)."""
    entry: Message = {
        "kind": "tool",
        "status": "completed" if status == "success" else "failed",
        "latency_ms": latency_ms,
        "content": content,
    }
    if undo is not None:
        entry["undo"] = dict(undo)
    if undid is not None:
        entry["undid"] = undid
    return CallEvent(call_id, "completed", entry)


def calls_of(entries: Iterable[bytes | str]) -> list[Message]:
    """The log's entries (`CallEvent.encoded`, oldest first) as one dict per call, in the
    order the calls started: each `started` entry merged with its `completed` one."""
    merged: dict[str, Message] = {}
    for item in entries:
        entry = orjson.loads(item)
        event, at = entry.pop("event"), entry.pop("at")
        record = merged.setdefault(entry["call_id"], {"status": "running"})
        record.update(entry)
        record["started_at" if event == "started" else "completed_at"] = at
    return list(merged.values())
