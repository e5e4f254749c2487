"""Every tool a worker offers, from every source: the built-in tools its settings enable
(worker/tools/__init__.py `enabled_tools`) and, with `BERNARD_MCP_CONFIG`, the tools of
each MCP server (worker/tools/mcp/), which come and go as servers connect and change.

The worker (worker/supervisor.py) starts the toolbox with itself, gives each turn the tools
of the moment (`tools()`), publishes them again whenever `changed()` says they changed, and
stops the toolbox with itself. A new tool source joins here, and nowhere else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from langchain_core.tools import BaseTool

from shared.client_tools import MAX_TOOLS
from shared.mcp_health import McpServerHealth
from shared.settings import Settings
from worker.tools import enabled_tools
from worker.tools.settings import ToolSettings

if TYPE_CHECKING:
    from worker.tools.mcp.servers import McpServers

__all__ = ["Toolbox"]


class Toolbox:
    """The tools `tool_settings` enable (or `builtin`, when given, for Bernard's own), plus
    the MCP servers'. Reading `BERNARD_MCP_CONFIG` happens here: a file that cannot be used
    raises `McpConfigError` (worker/tools/mcp/config.py), and the worker does not start."""

    def __init__(
        self,
        settings: Settings,
        builtin: Sequence[BaseTool] | None = None,
        tool_settings: ToolSettings | None = None,
    ) -> None:
        self.builtin = (
            list(builtin)
            if builtin is not None
            else enabled_tools(tool_settings if tool_settings is not None else ToolSettings())
        )
        self.mcp: McpServers | None = None
        if settings.mcp_config:
            # Imported only when used: the MCP SDK adds about a second to a worker's start.
            from worker.tools.mcp.bounds import Bounds
            from worker.tools.mcp.config import load_config
            from worker.tools.mcp.servers import McpServers

            self.mcp = McpServers(
                load_config(settings.mcp_config),
                timeout_s=settings.tool_timeout_s,
                result_max_chars=settings.mcp_result_max_chars,
                response_max_bytes=settings.mcp_response_max_bytes,
                bounds=Bounds(
                    tool_max_bytes=settings.mcp_tool_max_bytes,
                    max_tools=settings.mcp_server_max_tools,
                    max_bytes=settings.mcp_server_max_bytes,
                ),
                reserved={tool.name for tool in self.builtin},
                limit=max(MAX_TOOLS - 1 - len(self.builtin), 0),
            )
            self.mcp.on_change(self._changed)
        self._tools = list(self.builtin)
        self._changes: asyncio.Event | None = None

    def start(self) -> None:
        """Connect to the MCP servers in the background; returns at once."""
        self._changes = asyncio.Event()
        if self.mcp is not None:
            self.mcp.start()

    async def stop(self) -> None:
        if self.mcp is not None:
            await self.mcp.stop()

    def tools(self) -> list[BaseTool]:
        """The tools a turn starting now is offered (the same list until they change)."""
        return self._tools

    def mcp_health(self) -> list[McpServerHealth] | None:
        """Each MCP server as this worker sees it; None without `BERNARD_MCP_CONFIG`."""
        return self.mcp.health() if self.mcp is not None else None

    async def changed(self) -> None:
        """Return once the tools, or an MCP server's state, changed since the last return."""
        assert self._changes is not None, "start() first"
        await self._changes.wait()
        self._changes.clear()

    def _changed(self) -> None:
        assert self.mcp is not None
        self._tools = [*self.builtin, *self.mcp.tools()]
        if self._changes is not None:
            self._changes.set()
