"""The client's own function tools, as both processes read them.

A request may bring function tools of its own (`AgentRequest.client_tools`, in Chat
Completions' shape) and a `tool_choice`. The router is offered them beside Bernard's own
tools (worker/harness/router.py) and never runs one: a call of a client tool ends the turn
with the call (`ClientToolCall`, finish_reason "tool_calls"), and the client's follow-up
carries its result. Here: the name the router keeps for itself, and what a `tool_choice`
asks (`ToolChoice`), read the same way by the API, which checks it (api/schemas.py,
api/client_tools.py), and by the router, which honours it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# The router's own "I have what I need" tool (worker/harness/router.py): no client tool may
# take its name.
RESPOND_TOOL_NAME = "respond"
# OpenAI's limit on the tools of one request: on the client's (the API checks it), and on all
# the router is offered in one call, `respond` included (worker/tools/toolbox.py).
MAX_TOOLS = 128


class ChoiceMode(StrEnum):
    """What a `tool_choice` asks of the router about the client's tools."""

    # The client's tools are neither offered nor called.
    NONE = "none"
    # Offered; the router calls them or not (OpenAI's default).
    AUTO = "auto"
    # A client tool is called before the turn ends (Bernard's own may run first).
    REQUIRED = "required"
    # This one function is called.
    NAMED = "named"


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """A `tool_choice` as the router honours it; `name` only for `NAMED`."""

    mode: ChoiceMode
    name: str | None = None

    @classmethod
    def of(cls, tool_choice: str | Mapping[str, Any] | None) -> ToolChoice:
        """The choice a request's `tool_choice` makes (None: the client said nothing, auto).

        Raises `ValueError` for a value that is none of Chat Completions' shapes.
        """
        if tool_choice is None:
            return cls(ChoiceMode.AUTO)
        if isinstance(tool_choice, str):
            if tool_choice == ChoiceMode.NAMED or tool_choice not in set(ChoiceMode):
                raise ValueError(f"tool_choice {tool_choice!r} is not none, auto or required")
            return cls(ChoiceMode(tool_choice))
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if tool_choice.get("type") != "function" or not isinstance(name, str) or not name:
            raise ValueError("a named tool_choice is {type: function, function: {name}}")
        return cls(ChoiceMode.NAMED, name)


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """The function names of client tools in Chat Completions' shape."""
    return [str((tool.get("function") or {}).get("name", "")) for tool in tools]
