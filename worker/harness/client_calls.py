"""What the router offers of the client's own function tools, and how it tells their calls
from Bernard's (shared/client_tools.py says what a client tool is).

Each router step binds Bernard's tools, the client's and `respond` (none when the roles
share a model), as the request's `tool_choice` asks (`ClientOffer.binding`):

- `none`: the client's tools are not offered; a call naming one is an unknown tool's.
- `auto` (or nothing said): all offered; the model chooses.
- `required`: a client tool must be called before the turn ends. `respond` is withheld and
  the model must call a tool each step (Bernard's own may run first); on the last step the
  router may take, only the client's tools are offered.
- a named function: the model is made to call it (as OpenAI does: the same choice sent
  again on the follow-up makes it call it again).

`parallel_tool_calls: false` is passed on to the model, and only the first client call of
a step is kept should it call more.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.tools import BaseTool

from shared.client_tools import ChoiceMode, ToolChoice, tool_names
from shared.requests import AgentRequest
from worker.harness.tool_call import PlannedCall


@dataclass(frozen=True, slots=True)
class ClientOffer:
    """The client's tools as this turn's router offers them."""

    tools: list[dict[str, Any]]
    names: frozenset[str]
    choice: ToolChoice
    parallel: bool

    @classmethod
    def of(cls, request: AgentRequest, own: Collection[str]) -> ClientOffer:
        """The request's offer. A client tool named like one of Bernard's `own` (the API
        refuses those, against the tools the workers published: a worker whose tools
        differ, an MCP server's that came since) is left out: Bernard's keeps its name."""
        choice = ToolChoice.of(request.tool_choice)
        tools = [] if choice.mode is ChoiceMode.NONE else request.client_tools
        named = zip(tools, tool_names(tools), strict=True)
        tools = [tool for tool, name in named if name not in own]
        names = frozenset(tool_names(tools))
        if choice.name is not None and choice.name not in names:
            choice = ToolChoice(ChoiceMode.AUTO)
        if not names:
            choice = ToolChoice(ChoiceMode.NONE)
        return cls(tools, names, choice, request.parallel_tool_calls)

    def binding(
        self, own: Sequence[BaseTool], respond: dict[str, Any] | None, *, last_step: bool
    ) -> tuple[list[BaseTool | dict[str, Any]], dict[str, Any] | None]:
        """The tools to bind for one router step and the options to bind them with (None:
        Bernard's usual binding, which the model caches); `respond` is None when the
        router's own text is the answer (the roles share a model)."""
        ending = [] if respond is None else [respond]
        mode = self.choice.mode
        if mode is ChoiceMode.NONE:
            return [*own, *ending], None
        options: dict[str, Any] = {}
        if not self.parallel:
            options["parallel_tool_calls"] = False
        if mode is ChoiceMode.REQUIRED:
            # "any": the word both LangChain models translate for their provider (OpenAI's
            # "required", Anthropic's {"type": "any"}), where ChatAnthropic would read
            # "required" as a tool's name. ChatOpenAI reads "any" as one when a tool has
            # that name, so then "required", which it passes on as is.
            options["tool_choice"] = "required" if "any" in self.names else "any"
            if last_step:
                return list(self.tools), options
            return [*own, *self.tools], options
        if mode is ChoiceMode.NAMED:
            options["tool_choice"] = self.choice.name
        return [*own, *self.tools, *ending], options

    def split(self, planned: Sequence[PlannedCall]) -> tuple[list[PlannedCall], list[PlannedCall]]:
        """A step's calls as (Bernard's to run, the client's to hand over). A client call
        whose arguments are not a JSON object stays with Bernard's, to be answered with the
        problem so the model tries again; past the first client call, without parallel
        calls, the client's are dropped."""
        own: list[PlannedCall] = []
        client: list[PlannedCall] = []
        for call in planned:
            if call.name in self.names and call.parse_error is None:
                if self.parallel or not client:
                    client.append(call)
            else:
                own.append(call)
        return own, client
