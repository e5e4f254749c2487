"""A request's own function tools against the deployment's: a client tool may not take the
name of one of Bernard's tools, or the router could not tell which one the model called.

Bernard's tool names are what the workers published for `GET /v1/tools` (`keys.TOOLS`,
worker/tools/catalog.py, served by api/routes/tools.py); the API never imports the worker's
tools. The other checks on client tools, which need no Redis, are the body's
(api/schemas.py `ChatCompletionRequest._tools_make_sense`).
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from redis.asyncio import Redis

from api.errors import invalid
from shared import keys


async def own_tool_names(queue: Redis) -> set[str]:
    """The names of the tools the workers offer (none before a worker has published)."""
    raw = await queue.get(keys.TOOLS)
    return {str(tool.get("name")) for tool in orjson.loads(raw)} if raw else set()


async def check_no_clash(
    queue: Redis, names: Sequence[str], param: str = "tools[{i}].function.name"
) -> None:
    """Refuse with a 400 naming the first of `names` that is one of Bernard's own tools;
    `param` says where the i-th name is in the body (Chat Completions' shape by default;
    the Responses API's function tools hold it at `tools[{i}].name`)."""
    if not names:
        return
    own = await own_tool_names(queue)
    for i, name in enumerate(names):
        if name in own:
            raise invalid(
                f"tool name {name!r} is taken by one of Bernard's own tools (GET /v1/tools); "
                "rename the tool",
                param.format(i=i),
            )
