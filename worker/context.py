"""What one turn's harnesses share: the request, the models, the tools and what they produced."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import (
    BaseMessage,
    SystemMessage,
    convert_to_messages,
    convert_to_openai_messages,
)
from langchain_core.tools import BaseTool

from shared.lifecycle import Cause
from shared.records.reads import Archivist
from shared.requests import AgentRequest
from shared.results import TurnResult
from shared.settings import Settings
from worker.llm import Llm
from worker.tools.runtime import ToolRuntime


class ConversationGoneError(Exception):
    """The turn's conversation is gone (deleted, perhaps created again) or no longer held by
    the turn, before the turn began: it must not run."""


@dataclass
class TurnContext:
    """State of one running turn. Harnesses read it and add to it; only the runner records.

    `archivist` is the read-only half of the record keeper: a harness may look up the
    conversation but never write to it (the runner holds the `Recorder`).
    """

    turn_id: str
    request: AgentRequest
    settings: Settings
    router: Llm
    responder: Llm
    tools: list[BaseTool] = field(default_factory=list)
    # The conversation this turn belongs to; None runs the turn without records.
    conversation_id: str | None = None
    archivist: Archivist | None = None
    # The conversation as the model sees it, without the system prompt: the memory stage
    # (worker/harness/memory.py) fills it, from `stored` when the turn has a conversation.
    history: list[BaseMessage] = field(default_factory=list)
    # The latest stored rows, as the runner read them when it recorded the request (None
    # without records); what the prompts hold beyond the history (notes, the summary); and,
    # when the messages before it are due to be folded into the summary, where the prompts'
    # messages start (a position, 1-based).
    stored: list[dict[str, Any]] | None = None
    memory: list[BaseMessage] = field(default_factory=list)
    summary_until: int | None = None
    # This turn's router messages as the response model sees them: assistant tool-call
    # messages (without `respond`) and the tool results, whole.
    tool_messages: list[BaseMessage] = field(default_factory=list)
    # True once a router step wrote the answer (the roles share a model, and the step
    # called no tool): the response harness has nothing to add.
    answered: bool = False
    # Where in `content` the answer begins: text a router step wrote before its tool calls
    # reached the client at once and is kept on that step's message, not in the answer's.
    answer_start: int = 0
    # How many tool calls had started when a router step wrote the turn's first text (None:
    # no router step wrote any): `TurnResult.calls_before_text`.
    calls_before_text: int | None = None
    # What ran, as the non-stream body lists it; `len(tool_calls)` is the next call's index.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_outputs: list[dict[str, Any]] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    )
    finish_reason: str = "stop"
    # What the tools may need of the turn (whose it is, the worker's Redis); None in tests
    # that run only tools needing nothing.
    runtime: ToolRuntime | None = None
    # Calls of tools that change the world, proposed by the router and waiting for the
    # user's decision: the turn ends `awaiting_confirmation` instead of answering.
    pending: list[Proposal] = field(default_factory=list)
    # Calls of the client's own tools ({id, type, function: {name, arguments}}): the turn
    # ends on them (finish_reason "tool_calls") without an answer, and the client runs them.
    client_calls: list[dict[str, Any]] = field(default_factory=list)
    # Why the turn was told to stop, once it has stopped (None: it was not told to); the
    # runner's supervisor answers it (worker/supervisor.py), the recording asks it.
    stop_cause: Callable[[], Awaitable[Cause | None]] | None = None

    @classmethod
    def for_request(
        cls,
        turn_id: str,
        request: AgentRequest,
        settings: Settings,
        router: Llm,
        responder: Llm,
        *,
        tools: Sequence[BaseTool] = (),
        conversation_id: str | None = None,
        archivist: Archivist | None = None,
    ) -> TurnContext:
        """A fresh context whose history is the request's messages."""
        return cls(
            turn_id=turn_id,
            request=request,
            settings=settings,
            router=router,
            responder=responder,
            tools=list(tools),
            conversation_id=conversation_id,
            archivist=archivist,
            history=list(convert_to_messages(request.messages)),
        )

    def system(self) -> list[BaseMessage]:
        """The system prompt, unless the client sent its own."""
        if any(isinstance(m, SystemMessage) for m in self.history):
            return []
        return [SystemMessage(self.settings.system_prompt)]

    @property
    def paused(self) -> bool:
        """Whether the turn stops here to wait for the user's decision on `pending`."""
        return bool(self.pending)

    @property
    def handed_over(self) -> bool:
        """Whether the turn ends on calls of the client's own tools, for the client to run:
        no answer is written (worker/harness/response.py) nor stored (worker/recording.py)."""
        return bool(self.client_calls)

    def answer(self) -> str:
        """The answer's text as the conversation stores it (`answer_start`)."""
        return "".join(self.content[self.answer_start :])

    def traced(self, messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
        """A prompt as its `llm_prompt` trace carries it: the whole prompt when the client
        asked to trace the turn, else nothing (converting it costs time per message)."""
        return convert_to_openai_messages(list(messages)) if self.request.trace else []

    def add_usage(self, usage: dict[str, int] | None) -> None:
        for name, value in (usage or {}).items():
            if name in self.usage:
                self.usage[name] += value

    def result(self) -> TurnResult:
        """The turn's outcome as stored on the turn record (the API renders the envelope)."""
        return TurnResult(
            content="".join(self.content),
            finish_reason=self.finish_reason,
            usage=self.usage,
            tool_calls=self.tool_calls,
            tool_outputs=self.tool_outputs,
            pending=[proposal.public() for proposal in self.pending],
            client_calls=self.client_calls,
            calls_before_text=self.calls_before_text,
        )


@dataclass(slots=True)
class Proposal:
    """A tool call waiting for the user's decision, as it is stored and shown.

    `parameters` is the tool's argument schema, kept so the API can check arguments the user
    edits without knowing the tools.
    """

    confirmation_id: str
    turn_id: str
    tool_call: dict[str, str]  # {id, name, arguments (JSON text)}
    summary: str
    expires_at: float
    parameters: dict[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        """What a client sees of it."""
        return {
            "confirmation_id": self.confirmation_id,
            "tool_call": self.tool_call,
            "summary": self.summary,
            "expires_at": self.expires_at,
        }
