"""Every MCP server a worker connects to, and the tools they offer together.

Each server's session runs in a task of its own (worker/tools/mcp/connection.py), started
in the background as the worker starts: a server that is slow, down or broken delays no
other server's tools and never the worker's start. `tools()` is what the servers list now,
each under its namespaced name (worker/tools/mcp/names.py); the list is built again only
when a server's tools or state change, and a tool whose definition and name did not change
stays the same object (the model binding is cached by the tools' identities:
worker/llm.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection

from shared.mcp_health import McpServerHealth
from shared.schema_checks import SchemaChecks
from worker.tools.mcp.bounds import Bounds
from worker.tools.mcp.config import McpConfig
from worker.tools.mcp.connection import Connection
from worker.tools.mcp.names import tool_name
from worker.tools.mcp.tool import McpTool

__all__ = ["McpServers"]

logger = logging.getLogger("bernard.worker.mcp")
# How long stopping waits for the sessions to close (a stdio server is given 2 s by the SDK
# to exit before it is killed).
_STOP_S = 10.0
_BOUNDS = Bounds()


class McpServers:
    """The servers of `config`, each call within `timeout_s` and bringing in at most
    `result_max_chars` and `response_max_bytes` (worker/tools/mcp/connection.py), each
    publishing tools within `bounds` (worker/tools/mcp/bounds.py); `reserved` are names
    their tools may not take (the built-in tools'), and `limit` the most tools they may
    offer together."""

    def __init__(
        self,
        config: McpConfig,
        *,
        timeout_s: float,
        result_max_chars: int,
        response_max_bytes: int,
        bounds: Bounds = _BOUNDS,
        reserved: Collection[str] = (),
        limit: int = 100,
    ) -> None:
        self.reserved = frozenset(reserved)
        self.limit = limit
        # The servers' tool schemas and their calls' arguments are checked off the loop.
        self.checks = SchemaChecks()
        self.connections = [
            Connection(
                name,
                server,
                checks=self.checks,
                timeout_s=timeout_s,
                result_max_chars=result_max_chars,
                response_max_bytes=response_max_bytes,
                bounds=bounds,
                changed=self._changed,
            )
            for name, server in config.servers.items()
        ]
        self._tools: list[McpTool] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._listeners: list[Callable[[], None]] = []

    def start(self) -> None:
        """Open every server's session in the background; returns at once."""
        self._tasks = [
            asyncio.create_task(self.checks.start(), name="mcp:schema-checks"),
            *(
                asyncio.create_task(connection.run(), name=f"mcp:{connection.name}")
                for connection in self.connections
            ),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_STOP_S):
                    await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self.checks.close()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` whenever a server's state or tools change."""
        self._listeners.append(listener)

    def tools(self) -> list[McpTool]:
        return self._tools

    def health(self) -> list[McpServerHealth]:
        return [
            McpServerHealth(
                name=c.name,
                transport=c.transport,
                state=c.state.value,
                tools=len(c.tools),
                error=c.error,
                since=c.since,
                warnings=list(c.warnings),
            )
            for c in self.connections
        ]

    def _changed(self) -> None:
        self._tools = self._build()
        for listener in self._listeners:
            listener()

    def _build(self) -> list[McpTool]:
        kept = {(t.server, t.remote.name): t for t in self._tools}
        taken = set(self.reserved)
        built: list[McpTool] = []
        for connection in self.connections:
            for remote in connection.tools:
                if len(built) >= self.limit:
                    logger.warning(
                        "MCP servers offer more than %d tools; the rest are left out", self.limit
                    )
                    return built
                name = tool_name(connection.name, remote.name, taken)
                taken.add(name)
                same = kept.get((connection.name, remote.name))
                if same is None or same.name != name or same.remote != remote:
                    same = McpTool.of(connection, remote, name)
                built.append(same)
        return built
