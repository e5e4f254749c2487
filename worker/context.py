"""What one turn's harnesses share: the request, the models, the tools and what they produced."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage, convert_to_messages
from langchain_core.tools import BaseTool

from shared.settings import Settings
from shared.turns import TurnRequest
from worker.llm import Llm


@dataclass
class TurnContext:
    """State of one running turn. Harnesses read it and add to it; only the runner records."""

    turn_id: str
    request: TurnRequest
    settings: Settings
    router: Llm
    responder: Llm
    tools: list[BaseTool] = field(default_factory=list)
    # The conversation as the model sees it, without the system prompt.
    history: list[BaseMessage] = field(default_factory=list)
    # This turn's router messages: assistant tool-call messages and tool results.
    tool_messages: list[BaseMessage] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_outputs: list[dict[str, Any]] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    )
    finish_reason: str = "stop"

    @classmethod
    def for_request(
        cls, turn_id: str, request: TurnRequest, settings: Settings, router: Llm, responder: Llm
    ) -> TurnContext:
        return cls(
            turn_id=turn_id,
            request=request,
            settings=settings,
            router=router,
            responder=responder,
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
