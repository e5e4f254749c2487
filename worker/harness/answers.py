"""The user's answer in words to a paused turn's question, for the turn that carries it out.

A message that answers a paused turn's question (api/conversations.py decides that it
does) reaches the worker as a resumed turn (`AgentRequest.resume`) with the message's
words. A plain "yes" or "no" (shared/confirmation_words.py) was decided by the API at once,
as `POST .../resume` decides: the turn carries the decisions out (worker/harness/resume.py).
Anything else ("no, dim it to 30 percent", "only the kitchen one") is the router's to read,
with the waiting calls in front of it (`Waiting`): in its first step each waiting call is
answered, in the prompt only, by a note that it waits, naming its confirmation id, and the
router is offered `approve_pending` and `reject_pending` beside its tools. So one model call
decides and acts: it may approve some calls, reject others, and call other tools in the same
step (a call that changes the world is then proposed as any is, and asked about). A tool
call and not a structured answer, because the router already speaks tool calls, in both
model modes and with every provider that calls tools. A waiting call the router does not
approve in that step is declined: only an approval runs anything.

However they were decided, the decisions are carried out as `resume` carries them out
(worker/harness/router.py `carry_out`: each approved call run with its checks, recorded and
streamed; each rejected one answered that the user declined). In the history the decided
calls' results come right after the paused turn's message, then the user's words
(`answer_messages`): a tool call's results must follow it, and the words are what the model read
them with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_messages

from shared.requests import AgentRequest
from worker.harness.tool_call import PlannedCall, arguments_text

__all__ = [
    "ANSWER_TOOL_NAMES",
    "Waiting",
    "answer_messages",
    "decided_call",
    "declined",
]

APPROVE_PENDING = "approve_pending"
REJECT_PENDING = "reject_pending"
ANSWER_TOOL_NAMES = frozenset({APPROVE_PENDING, REJECT_PENDING})


def _tool(name: str, description: str) -> dict[str, Any]:
    ids = {"type": "array", "items": {"type": "string"}, "description": "confirmation ids"}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"confirmation_ids": ids},
                "required": ["confirmation_ids"],
            },
        },
    }


ANSWER_TOOLS = [
    _tool(
        APPROVE_PENDING,
        "Run the waiting tool calls the user's latest message approves, by confirmation id",
    ),
    _tool(
        REJECT_PENDING,
        "Do not run the waiting tool calls the user's latest message declines or replaces",
    ),
]


def declined(name: str) -> str:
    """What the model reads of a call the user declined."""
    return f"The user declined: {name} was not run."


def decided_call(decision: Mapping[str, Any]) -> PlannedCall:
    """The call a decision runs: as proposed, or with the arguments the user edited."""
    proposed = decision["tool_call"]
    edited = decision.get("arguments")
    args = edited if edited is not None else orjson.loads(proposed["arguments"] or "{}")
    return PlannedCall(
        id=proposed["id"], name=proposed["name"], args=args, arguments=arguments_text(args)
    )


def answer_messages(request: AgentRequest) -> list[BaseMessage]:
    """The messages a turn that answers in words stores after the decided calls' results:
    its last message, the answer, with what came along with it (a Responses request's new
    instructions); a client that resends its history sent the rest before."""
    sent = request.messages if not request.resends_history else request.messages[-1:]
    return list(convert_to_messages(sent))


@dataclass(slots=True)
class Waiting:
    """The calls a paused turn proposed that the router decides on, and the user's words."""

    proposals: list[dict[str, Any]]  # {confirmation_id, tool_call, summary}
    words: list[BaseMessage]

    @classmethod
    def of(cls, request: AgentRequest) -> Waiting | None:
        """The waiting calls of a turn whose words the router reads; None for any other."""
        resume = request.resume or {}
        if not resume.get("pending"):
            return None
        return cls(list(resume["pending"]), answer_messages(request))

    @property
    def tools(self) -> list[dict[str, Any]]:
        return ANSWER_TOOLS

    def prompt(self) -> list[BaseMessage]:
        """What the router's first step reads after the history: each waiting call's note,
        then the user's words."""
        notes: list[BaseMessage] = [
            ToolMessage(
                content=(
                    f"Not run yet: waiting for the user's decision (confirmation id "
                    f"{p['confirmation_id']}: {p['summary']}). The user's next message "
                    f"answers it: call {APPROVE_PENDING} with the ids it approves and "
                    f"{REJECT_PENDING} with those it declines or replaces (a call not "
                    "approved is not run), and call other tools for anything else it asks."
                ),
                tool_call_id=p["tool_call"]["id"],
                name=p["tool_call"]["name"],
            )
            for p in self.proposals
        ]
        return [*notes, *self.words]

    def decide(self, message: AIMessage) -> tuple[list[dict[str, Any]], AIMessage]:
        """The decisions the router's step made (every waiting call, in the order proposed:
        approved if it approved it and did not also reject it, else rejected), and its
        message without the calls that made them."""
        # A model may name a call by its tool call id, which its history shows it.
        named = {p["tool_call"]["id"]: p["confirmation_id"] for p in self.proposals}
        approved: set[str] = set()
        rejected: set[str] = set()
        kept = []
        for call in message.tool_calls:
            if call["name"] not in ANSWER_TOOL_NAMES:
                kept.append(call)
                continue
            chosen = approved if call["name"] == APPROVE_PENDING else rejected
            ids = _ids(call["args"].get("confirmation_ids"))
            chosen.update(named.get(one, one) for one in ids)
        invalid = [c for c in message.invalid_tool_calls if c.get("name") not in ANSWER_TOOL_NAMES]
        decisions = [
            {
                "confirmation_id": p["confirmation_id"],
                "tool_call": p["tool_call"],
                "decision": "approve" if p["confirmation_id"] in approved - rejected else "reject",
                "arguments": None,
            }
            for p in self.proposals
        ]
        rest = message.model_copy(update={"tool_calls": kept, "invalid_tool_calls": invalid})
        return decisions, rest


def _ids(value: Any) -> Iterable[str]:
    """The confirmation ids a decision names (one id alone, too)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, str)]
    return []
