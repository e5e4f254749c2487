"""How the MCP servers the workers connect to are doing, as `/readyz`, `GET /v1/status` and
`bernard doctor` read it.

Each worker holds its own session with each server (worker/tools/mcp/), so each publishes
its own view: one field of the hash `keys.MCP_SERVERS` per worker (worker/tools/catalog.py
writes it as a server's state changes). `mcp_servers(queue)` reads the views of the workers
alive now (`keys.WORKERS`) and gives one entry per server: its worst state across them and
how many have it ready (`/readyz` and `GET /v1/status` list them; `bernard doctor` warns
about one not ready). This module imports nothing of the MCP SDK: the API reads it.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field, ValidationError
from redis.asyncio import Redis

from shared import keys
from shared.connection import reply_text

__all__ = ["McpServerHealth", "McpServerStatus", "WorkerMcpHealth", "mcp_servers"]

McpState = Literal["connecting", "ready", "down"]
_WORST: dict[str, int] = {"ready": 0, "connecting": 1, "down": 2}


class McpServerHealth(BaseModel):
    """One server as one worker sees it."""

    name: str
    transport: Literal["http", "stdio"]
    state: McpState
    tools: int
    error: str | None = None
    since: float  # when it entered `state` (epoch seconds)
    # The tools it lists that are not offered, and why (worker/tools/mcp/bounds.py).
    warnings: list[str] = Field(default_factory=list)


class WorkerMcpHealth(BaseModel):
    """One worker's field of `keys.MCP_SERVERS`."""

    published_at: float
    servers: list[McpServerHealth]


class McpServerStatus(BaseModel):
    """One server across the workers alive: the worst state any of them has it in (and
    that worker's error), and how many have it ready."""

    name: str
    transport: Literal["http", "stdio"]
    state: McpState
    tools: int
    ready_workers: int
    workers: int
    error: str | None = None
    warnings: list[str] = Field(default_factory=list)  # every worker's, once each


async def mcp_servers(queue: Redis, fresh_s: float = keys.WORKER_FRESH_S) -> list[McpServerStatus]:
    """The servers the workers alive (that reported within `fresh_s`) connect to, by name."""
    async with queue.pipeline(transaction=False) as pipe:
        pipe.zrangebyscore(keys.WORKERS, time.time() - fresh_s, "+inf")
        pipe.hgetall(keys.MCP_SERVERS)
        alive_ids, fields = await pipe.execute()
    alive = {reply_text(worker) for worker in alive_ids}
    found: dict[str, list[McpServerHealth]] = {}
    for worker, raw in fields.items():
        if reply_text(worker) not in alive:
            continue
        try:
            view = WorkerMcpHealth.model_validate_json(raw)
        except ValidationError:  # written by a worker of another version
            continue
        for server in view.servers:
            found.setdefault(server.name, []).append(server)
    return [_merged(name, views) for name, views in sorted(found.items())]


def _merged(name: str, views: list[McpServerHealth]) -> McpServerStatus:
    worst = max(views, key=lambda view: _WORST[view.state])
    return McpServerStatus(
        name=name,
        transport=worst.transport,
        state=worst.state,
        tools=max(view.tools for view in views),
        ready_workers=sum(view.state == "ready" for view in views),
        workers=len(views),
        error=worst.error,
        warnings=list(dict.fromkeys(warning for view in views for warning in view.warnings)),
    )
