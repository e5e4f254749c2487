"""Bernard's tool calls as Home Assistant's chat log content, so the Assist pipeline's debug
view shows them as it shows any agent's: an assistant message with its tool calls, then one
tool result each.

Home Assistant 2025.4's chat log runs the tool calls it is given through its LLM API
(`ChatLog.async_add_delta_content_stream` hands each to `llm_api.async_call_tool`). Bernard
has run them already, so the relay is an LLM API whose tools run nothing: a call waits for
the result Bernard streams (`resolve`), and a call Bernard never answers in this turn (the
turn ended, or paused for a confirmation) gets `close`'s note instead. `close` must come
before the chat log is asked to start another message, which awaits every call's result.
"""

from __future__ import annotations

import asyncio
from typing import Any

from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import llm
from homeassistant.util.json import JsonObjectType

from .const import DOMAIN


class _RelayApi(llm.API):
    async def async_get_api_instance(self, llm_context: llm.LLMContext) -> llm.APIInstance:
        raise NotImplementedError  # built once per turn by ToolRelay, never looked up


class _RelayedTool(llm.Tool):
    """A tool of Bernard's: its calls wait for the results Bernard streams."""

    def __init__(self, name: str, results: dict[str, asyncio.Future[JsonObjectType]]) -> None:
        self.name = name
        self.description = f"Bernard's {name} tool (run by Bernard)"
        self._results = results

    async def async_call(
        self, hass: HomeAssistant, tool_input: llm.ToolInput, llm_context: llm.LLMContext
    ) -> JsonObjectType:
        return await self._results[tool_input.id]


class ToolRelay:
    """The LLM API of one turn's chat log: `instance` goes to `chat_log.llm_api`."""

    def __init__(
        self,
        hass: HomeAssistant,
        context: Context,
        language: str,
        device_id: str | None,
        utterance: str,
    ) -> None:
        self._loop = hass.loop
        self._results: dict[str, asyncio.Future[JsonObjectType]] = {}
        self.instance = llm.APIInstance(
            api=_RelayApi(hass=hass, id=f"{DOMAIN}_tools", name="Bernard's tools"),
            api_prompt="",
            llm_context=llm.LLMContext(
                platform=DOMAIN,
                context=context,
                user_prompt=utterance,
                language=language,
                assistant="conversation",
                device_id=device_id,
            ),
            tools=[],
        )

    def call(self, call_id: str, name: str, arguments: dict[str, Any]) -> llm.ToolInput:
        """A call Bernard started: the chat log's tool input for it."""
        if all(tool.name != name for tool in self.instance.tools):
            self.instance.tools.append(_RelayedTool(name, self._results))
        self._results[call_id] = self._loop.create_future()
        return llm.ToolInput(tool_name=name, tool_args=arguments, id=call_id)

    def resolve(self, call_id: str, result: JsonObjectType) -> None:
        """Bernard's result for a call."""
        future = self._results.get(call_id)
        if future is not None and not future.done():
            future.set_result(result)

    def close(self, note: JsonObjectType) -> None:
        """`note` as the result of every call still without one."""
        for future in self._results.values():
            if not future.done():
                future.set_result(note)
