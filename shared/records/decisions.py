"""The logic of tool calls the user decided on, as the history records it: which calls a
history leaves open, what each is answered when no turn carried out its decision, and a
call's arguments as the user approved them edited.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from shared.records.messages import Message

__all__ = [
    "ANSWERED_NOT_CARRIED_OUT",
    "APPROVED_STEP_LAPSED",
    "DECIDED_NOT_CARRIED_OUT",
    "answer_as_decided",
    "open_call_answers",
    "open_calls",
    "with_arguments",
]

# What a call the user approved is answered when the turn that was to run it left no result.
DECIDED_NOT_CARRIED_OUT = (
    "Unknown: the user approved this call, but the turn that was to run it ended before "
    "its result was recorded; it may not have run."
)
# ... and when the user answered in words, and the turn that read them left no result.
ANSWERED_NOT_CARRIED_OUT = (
    "Unknown: the user answered about this call in words, but the turn that read the answer "
    "ended before its result was recorded; it may have run."
)
# ... and when another call proposed with it lapsed undecided (the step never went on).
APPROVED_STEP_LAPSED = (
    "Not run: the user approved this call, but not every call proposed with it was decided in time."
)


def open_calls(history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tool calls of the last assistant message with tool calls that no tool message
    answers, when the history ends on that message and its results (a paused turn's, or one
    cut short). `[]` when anything else came after it."""
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if message.get("role") == "tool":
            continue
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            return []
        answered = {m.get("tool_call_id") for m in history[index + 1 :]}
        return [call for call in message["tool_calls"] if call.get("id") not in answered]
    return []


def open_call_answers(
    history: Sequence[Mapping[str, Any]], content: str, except_calls: Collection[str] = ()
) -> list[Message]:
    """A tool message saying `content` for each of the history's `open_calls` but those in
    `except_calls`."""
    return [
        {
            "role": "tool",
            "content": content,
            "tool_call_id": call["id"],
            "name": call.get("function", {}).get("name"),
        }
        for call in open_calls(history)
        if call.get("id") not in except_calls
    ]


def with_arguments(row: Message, arguments: Mapping[str, str]) -> Message | None:
    """`row` with its tool calls named in `arguments` given those arguments; None when it
    holds none of them, or holds them with these arguments already."""
    calls = row.get("tool_calls") if row.get("role") == "assistant" else None
    if not isinstance(calls, list):
        return None
    changed = False
    amended = []
    for call in calls:
        function = call.get("function") or {}
        new = arguments.get(call.get("id"))
        if new is not None and function.get("arguments") != new:
            call = {**call, "function": {**function, "arguments": new}}
            changed = True
        amended.append(call)
    return {**row, "tool_calls": amended} if changed else None


def answer_as_decided(answers: list[Message], proposals: Sequence[Mapping[str, Any]]) -> None:
    """Answer each call of `answers` the user decided on (in `proposals`, the step's) as
    decided: its step's last decision claimed the conversation for a turn that never
    carried it out (the API stopped between the claim and the turn's creation; a worker
    died in the call), or another call of its step lapsed undecided, so the step never went
    on. The answer for a call nobody decided on does not hold for it: the user did confirm."""
    decided = {p["tool_call"]["id"]: p for p in proposals if p.get("tool_call")}
    for answer in answers:
        proposal = decided.get(answer["tool_call_id"]) or {}
        state = proposal.get("state")
        if state == "approved" and proposal.get("resumed_by"):
            answer["content"] = DECIDED_NOT_CARRIED_OUT
        elif state == "answering":
            answer["content"] = ANSWERED_NOT_CARRIED_OUT
        elif state == "approved":
            answer["content"] = APPROVED_STEP_LAPSED
        elif state == "rejected":
            answer["content"] = f"The user declined: {answer['name']} was not run."
