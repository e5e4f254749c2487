"""What tools this deployment offers, published for `GET /v1/tools`.

The API does not import the worker's tools; each worker, as it starts, writes the tools it
offers (name, description, argument schema, whether a call waits for confirmation) to
`keys.TOOLS`, and the API serves what is there. Workers of one deployment share one
configuration, so the last one to start speaks for all; the entry expires a day after the
last start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from langchain_core.tools import BaseTool
from redis.asyncio import Redis

from shared import keys
from shared.settings import Settings
from worker.tools.confirmation import parameters, requires_confirmation

_TTL_S = 86_400


def catalog(tools: Sequence[BaseTool], settings: Settings) -> list[dict[str, Any]]:
    """Each tool as `GET /v1/tools` lists it."""
    return [
        {
            "name": tool.name,
            "description": tool.description,
            "parameters": parameters(tool),
            "requires_confirmation": requires_confirmation(tool, settings),
        }
        for tool in tools
    ]


async def publish_tools(redis: Redis, tools: Sequence[BaseTool], settings: Settings) -> None:
    await redis.set(keys.TOOLS, orjson.dumps(catalog(tools, settings)), ex=_TTL_S)
