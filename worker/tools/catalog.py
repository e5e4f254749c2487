"""What tools this deployment offers, published for `GET /v1/tools`.

The API does not import the worker's tools; each worker, as it starts, writes the tools it
offers (name, description, argument schema, whether a call waits for confirmation) to
`keys.TOOLS`, and again every `REPUBLISH_S` while it runs (worker/supervisor.py), and the
API serves what is there. Beside them goes what the worker runs (its models, the services
its tools reach: shared/deployment.py, worker/tools/sources.py, `keys.DEPLOYMENT`), for
`GET /v1/status`. Workers of one deployment share one configuration, so the last one to
publish speaks for all; the entries expire a day after the last publish, so a day after the
last worker stopped. An MCP server's tool is listed with its `server`; since those come and
go as servers connect and change, a worker publishes again when they do
(worker/supervisor.py), with its view of each server's health beside them
(`publish_mcp_health`, read by shared/mcp_health.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import orjson
from langchain_core.tools import BaseTool
from redis.asyncio import Redis

from shared import keys
from shared.connection import reply_text
from shared.deployment import Deployment, models_of, version
from shared.mcp_health import McpServerHealth, WorkerMcpHealth
from shared.settings import Settings
from worker.tools.confirmation import parameters
from worker.tools.policy import requires_confirmation
from worker.tools.settings import ToolSettings
from worker.tools.sources import services

_TTL_S = 86_400
# How often a running worker publishes its tools again: well within `_TTL_S`, so the entry
# outlives any one worker's uptime and comes back after Redis lost it.
REPUBLISH_S = 3600.0


def catalog(tools: Sequence[BaseTool], settings: Settings) -> list[dict[str, Any]]:
    """Each tool as `GET /v1/tools` lists it."""
    return [
        {
            "name": tool.name,
            "description": tool.description,
            "parameters": parameters(tool),
            "requires_confirmation": requires_confirmation(tool, settings),
            **({"server": server} if (server := _server(tool)) else {}),
        }
        for tool in tools
    ]


def deployment(settings: Settings, tool_settings: ToolSettings) -> Deployment:
    """What a worker with `settings` runs, for `GET /v1/status` (shared/deployment.py): its
    models, and the services its tool sources reach (worker/tools/sources.py)."""
    return Deployment(
        version=version(),
        models=models_of(settings),
        services=services(tool_settings),
        published_at=time.time(),
    )


async def publish_tools(
    redis: Redis, tools: Sequence[BaseTool], settings: Settings, tool_settings: ToolSettings
) -> None:
    """The tools, and what the worker runs beside them (`keys.DEPLOYMENT`)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.set(keys.TOOLS, orjson.dumps(catalog(tools, settings)), ex=_TTL_S)
        deployed = deployment(settings, tool_settings)
        pipe.set(keys.DEPLOYMENT, deployed.model_dump_json(), ex=_TTL_S)
        await pipe.execute()


def _server(tool: BaseTool) -> str | None:
    """The MCP server a tool comes from; None for Bernard's own."""
    return (tool.metadata or {}).get("mcp_server")


async def publish_mcp_health(
    redis: Redis, worker_id: str, servers: Sequence[McpServerHealth]
) -> None:
    """This worker's view of its MCP servers (`keys.MCP_SERVERS`), dropping the views of
    workers no longer alive (`keys.WORKERS`)."""
    view = WorkerMcpHealth(published_at=time.time(), servers=list(servers))
    # A worker enters `WORKERS` at its first liveness renewal, maybe after this: its own field
    # is never stale.
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zrange(keys.WORKERS, 0, -1)
        pipe.hkeys(keys.MCP_SERVERS)
        alive, fields = await pipe.execute()
    workers = {reply_text(w) for w in alive} | {worker_id}
    stale = [f for f in fields if reply_text(f) not in workers]
    async with redis.pipeline(transaction=False) as pipe:
        if stale:
            pipe.hdel(keys.MCP_SERVERS, *stale)
        pipe.hset(keys.MCP_SERVERS, worker_id, view.model_dump_json())
        pipe.expire(keys.MCP_SERVERS, _TTL_S)
        await pipe.execute()


async def withdraw_mcp_health(redis: Redis, worker_id: str) -> None:
    """This worker stopped: its view goes."""
    await redis.hdel(keys.MCP_SERVERS, worker_id)  # type: ignore[misc]
