"""What one turn's harnesses share: the request, the models, the tools and what they produced."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, convert_to_messages
from langchain_core.tools import BaseTool

from shared.records import Archivist
from shared.settings import Settings
from shared.turns import TurnRequest
from worker.llm import Llm


@dataclass
class TurnContext:
    """State of one running turn. Harnesses read it and add to it; only the runner records.

    `archivist` is the read-only half of the record keeper: a harness may look up the
    conversation but never write to it (the runner holds the `Recorder`).
    """

    turn_id: str
    request: TurnRequest
    settings: Settings
    router: Llm
    responder: Llm
    tools: list[BaseTool] = field(default_factory=list)
    # The conversation this turn belongs to; None runs the turn without records.
    conversation_id: str | None = None
    archivist: Archivist | None = None
    # The conversation as the model sees it, without the system prompt. The runner replaces
    # it with the stored history when the turn has a conversation.
    history: list[BaseMessage] = field(default_factory=list)
    # This turn's router messages as the response model sees them: assistant tool-call
    # messages (without `respond`) and the tool results, whole.
    tool_messages: list[BaseMessage] = field(default_factory=list)
    # Every router model answer as it came, `respond` calls included (never streamed).
    router_messages: list[AIMessage] = field(default_factory=list)
    # True once the router called `respond`: it has what the answer needs.
    responded: bool = False
    # What ran, as the non-stream body lists it; `len(tool_calls)` is the next call's index.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_outputs: list[dict[str, Any]] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    )
    finish_reason: str = "stop"

    @classmethod
    def for_request(
        cls,
        turn_id: str,
        request: TurnRequest,
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

    def add_usage(self, usage: dict[str, int] | None) -> None:
        for name, value in (usage or {}).items():
            if name in self.usage:
                self.usage[name] += value

    def result(self) -> dict[str, Any]:
        """The turn's outcome as stored on the turn record (the API renders the envelope)."""
        return {
            "content": "".join(self.content),
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "tool_calls": self.tool_calls,
            "tool_outputs": self.tool_outputs,
        }
