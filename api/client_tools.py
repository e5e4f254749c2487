"""A request's own function tools against the deployment's: a client tool may not take the
name of one of Bernard's tools, or the router could not tell which one the model called;
and each one's `parameters` must be a schema Bernard can use (`check_schemas`: a `$ref`
that names nothing, or names another document, would fail the turn mid-way at the model).

Bernard's tool names are what the workers published for `GET /v1/tools` (`keys.TOOLS`,
worker/tools/catalog.py, served by api/routes/tools.py); the API never imports the worker's
tools. The other checks on client tools, which need no Redis, are the body's
(api/schemas.py `ChatCompletionRequest._tools_make_sense`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from redis.asyncio import Redis

from api.errors import invalid
from shared import keys
from shared.schema_checks import SchemaChecks


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


async def check_schemas(
    checks: SchemaChecks,
    tools: Sequence[Mapping[str, Any]],
    param: str = "tools[{i}].function.parameters",
) -> None:
    """Refuse with a 400 the first of `tools` (in Chat Completions' shape) whose parameters
    are not a schema Bernard can use (shared/schema_checks.py); `param` as `check_no_clash`'s."""
    for i, tool in enumerate(tools):
        function = tool.get("function") or {}
        if function.get("parameters") is None:
            continue
        problem = await checks.schema(function["parameters"])
        if problem is not None:
            raise invalid(f"function {function.get('name')!r}: {problem.reason}", param.format(i=i))
