"""A turn's request, in two halves: what the worker runs (`AgentRequest`) and how the API
delivers what it produces (`Delivery`). The worker reads only the first: it never learns
the wire encoding, which the API alone owns (api/encodings/).

The record stores both as one flat JSON object (shared/turn_record.py `TurnRecord.to_redis`),
the encoding's name under `kind`; the messages and the client's tools apart, as only the
worker needs them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any, Literal

ToolEventsMode = Literal["bernard", "delta", "none"]
DisconnectPolicy = Literal["cancel", "continue"]
# What a request's message does while a turn runs on its conversation, as a request names
# it (shared/conversation_state.py `Strategy`).
MultitaskStrategy = Literal["interrupt", "enqueue", "reject"]


class RunMode(StrEnum):
    """What the worker runs for a turn (worker/turn.py `harnesses`)."""

    # Memory, the router with its tools (after a paused turn's decisions, if it carries
    # them), then the response model.
    AGENT = "agent"
    # The response model alone, on the messages given (a legacy text completion).
    MODEL = "model"


@dataclass(slots=True)
class AgentRequest:
    """What the worker needs to run a turn, as validated by the API."""

    messages: list[dict[str, Any]]
    mode: RunMode = RunMode.AGENT
    # Publish the model calls' traces (prompts, latency, usage, memory) in the stream.
    trace: bool = False
    # Publish each conversation row the turn stores (`message` events) in the stream.
    rows: bool = False
    # Whether the messages are the client's whole history, sent again with each turn (the
    # chat API), or only the new message (the conversation endpoints): worker/recording.py
    # stores only what is new.
    resends_history: bool = True
    # Sampling and cost options, passed to the response model as the client sent them.
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None
    # Continuing a paused turn: {"turn_id", "decisions": [{confirmation_id, tool_call,
    # decision, arguments?}]} (worker/harness/resume.py). A turn whose user message answers
    # the paused turn's question in words also has "words" (that message's text: the message
    # is stored after the decided calls' results) and, when the words are for the model to
    # read, "pending" (the calls it decides on: worker/harness/answers.py).
    resume: dict[str, Any] | None = None
    # A turn without a conversation of its own that runs on one's history (the Responses
    # API's `store: false` with `previous_response_id`): {"conversation_id", "through": the
    # position of its last message}. The worker reads what of it the prompt holds
    # (worker/harness/memory.py) and writes nothing to it; `messages` are only the new ones.
    history_of: dict[str, Any] | None = None
    # The turn undoes the conversation's last change to the house, as its `undo` tool does
    # (POST /v1/conversations/{id}/undo: worker/harness/undo.py).
    undo: bool = False
    # The user's language, a primary subtag of shared/confirmation_words.py `LANGUAGES`
    # (from `Accept-Language`), for the words Bernard itself says; None: English.
    language: str | None = None
    # The client's own function tools, offered to the router beside Bernard's:
    # each in Chat Completions' shape, {"type": "function", "function": {"name",
    # "description", "parameters", "strict"?}}. The router never runs one: calling it ends
    # the turn with the call (`ClientToolCall`), and the client's follow-up carries the result.
    client_tools: list[dict[str, Any]] = field(default_factory=list)
    # Chat Completions' shape: "none" | "auto" | "required" | {"type": "function",
    # "function": {"name": ...}}; None is the client's silence (OpenAI's default, "auto").
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    # Set when the turn joined its conversation's line (a message that came while a turn
    # ran): the turn it waited behind ("" for none). It runs once it holds the
    # conversation (shared/turns/line.py `TurnStore.take_turn`).
    follows: str | None = None
    # False: the turn is kept no longer than its delivery needs (the Responses API's
    # `store: false`): it has no conversation, so no tool call may wait for the user's
    # decision (worker/harness/router.py); the API forgets it once its answer or its
    # stream's `done` went out (api/turn_service.py), and no route finds it by id.
    kept: bool = True

    def sampling(self) -> dict[str, Any]:
        """The sampling options the client set, as model call keyword arguments."""
        return {
            name: value for name in SAMPLING_OPTIONS if (value := getattr(self, name)) is not None
        }


SAMPLING_OPTIONS = (
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "user",
)


@dataclass(slots=True)
class Delivery:
    """How the API delivers a turn: its wire encoding (a name in api/encodings/'s
    registry) and the client's options for it. The worker never reads it."""

    encoding: str = "chat"
    stream: bool = True
    include_usage: bool = False
    tool_events: ToolEventsMode = "bernard"
    on_disconnect: DisconnectPolicy = "cancel"
    # The client asked for a background turn: it runs on without a client, and its end is
    # POSTed to the webhook; unless streamed, it is answered at once (api/turn_service.py).
    background: bool = False
    # What the encoding shows back of the request and nothing runs on (the Responses API's
    # `instructions`, `metadata`, `tools`, `previous_response_id`...: api/encodings/responses.py).
    echo: dict[str, Any] = field(default_factory=dict)
    # Where a background turn's end is POSTed, signed (shared/webhooks.py): the request's
    # own `webhook_url`, else the deployment's; None: nowhere. The API sets it as it
    # creates the turn (api/turn_service.py), which also writes it where the turn's ending
    # reads it: the record's `webhook` field (shared/turns/creation.py `TurnStore.create`).
    webhook_url: str | None = None


_AGENT_FIELDS = frozenset(f.name for f in fields(AgentRequest))
_DELIVERY_FIELDS = frozenset(f.name for f in fields(Delivery)) - {"encoding"}


@dataclass(slots=True)
class TurnRequest:
    """A turn's request: what to run, and how to deliver it."""

    agent: AgentRequest
    delivery: Delivery = field(default_factory=Delivery)

    def stored(self) -> dict[str, Any]:
        """Both halves as one flat object, without the messages and the client's tools
        (stored apart: shared/turn_record.py)."""
        agent = {**asdict(self.agent), "messages": [], "client_tools": []}
        delivery = asdict(self.delivery)
        return {**agent, "kind": delivery.pop("encoding"), **delivery}

    @classmethod
    def restored(cls, data: dict[str, Any]) -> TurnRequest:
        """The request `stored` wrote (with its messages and tools put back)."""
        agent = {k: v for k, v in data.items() if k in _AGENT_FIELDS}
        agent["mode"] = RunMode(agent["mode"])
        delivery = {k: v for k, v in data.items() if k in _DELIVERY_FIELDS}
        return cls(AgentRequest(**agent), Delivery(encoding=data["kind"], **delivery))
