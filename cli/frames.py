"""What a frame of any of Bernard's stream encodings (api/encoding.py) says, as the named
events of the conversation endpoints: `text_delta`, `tool_call`, `tool_progress`,
`tool_result`, `awaiting_confirmation`, `error`, `done` (and `message`, `trace`).

`bernard chat` reads named events already; `bernard turns tail` may follow a chat
completion (`chat.completion.chunk` frames with `bernard` extension chunks, ending in
`[DONE]`) or a legacy text completion, and shows them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from cli.sse import ServerEvent

# The payload's keys of a `bernard` chunk that the named event of the same type carries
# under another name.
_RENAMED: dict[str, dict[str, str]] = {"tool_result": {"content": "output"}}
_NAMED = frozenset(
    {"tool_call", "tool_progress", "tool_result", "awaiting_confirmation", "error", "trace"}
)


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """One thing that happened in a turn: a named event and its JSON body."""

    kind: str
    data: dict[str, Any]


def events_of(frame: ServerEvent) -> list[TurnEvent]:
    """The turn events one SSE frame holds (none for a keepalive or a finish chunk)."""
    if frame.event:
        return [TurnEvent(frame.event, _json(frame.data))]
    if frame.data == "[DONE]":
        return [TurnEvent("done", {})]
    body = _json(frame.data)
    if "error" in body and isinstance(body["error"], dict):
        error = body["error"]
        return [TurnEvent("error", {"code": error.get("code"), "message": error.get("message")})]
    if isinstance(body.get("bernard"), dict) and not body.get("choices"):
        extension = dict(body["bernard"])
        kind = str(extension.pop("type", ""))
        if kind not in _NAMED:
            return []
        renamed = _RENAMED.get(kind, {})
        return [TurnEvent(kind, {renamed.get(k) or k: v for k, v in extension.items()})]
    found: list[TurnEvent] = []
    for choice in body.get("choices") or []:
        delta = choice.get("delta") or {}
        text = delta.get("content") or choice.get("text") or ""
        if text:
            found.append(TurnEvent("text_delta", {"text": text}))
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            found.append(
                TurnEvent(
                    "tool_call",
                    {
                        "id": call.get("id"),
                        "name": function.get("name"),
                        "arguments": function.get("arguments"),
                    },
                )
            )
        for output in delta.get("tool_outputs") or []:
            found.append(
                TurnEvent(
                    "tool_result",
                    {"tool_call_id": output.get("id"), "output": output.get("content")},
                )
            )
    return found


def _json(data: str) -> dict[str, Any]:
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {"text": data}
    return body if isinstance(body, dict) else {"value": body}
