"""How a tool says what a call would do, and what it checks before anyone is asked.

Whether a call waits for the user's decision is the policy's (worker/tools/policy.py); a
tool that changes the world declares it in its LangChain metadata, which the policy reads
for a call no rule matches: `metadata={"requires_confirmation": True,
"confirmation_summary": fn}`, `fn(args)` giving one plain sentence ("Turn on light.kitchen
at 40 % brightness").

A tool that can tell before it runs whether a call can run at all (the entity exists, the
value is in its range, the client is online) also declares `"confirmation_check": check`,
an async `check(args, config)` that reads (never changes) what it needs through the turn's
runtime and either raises a `ToolException` saying why the call cannot run or returns the
summary of exactly what will run. The router runs it before it asks the user
(`checked_summary`), so nobody is asked to approve a call that is refused afterwards; the
tool checks again when it runs, since the world may change while the user decides.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool


def summary(tool: BaseTool, args: dict[str, Any]) -> str:
    """What calling `tool` with `args` would do, in plain words."""
    summarize = (tool.metadata or {}).get("confirmation_summary")
    if callable(summarize):
        try:
            return str(summarize(args))
        except Exception:  # a summary must never break the pause
            pass
    shown = ", ".join(f"{k}={v!r}" for k, v in args.items())
    return f"Run {tool.name}({shown})"


ConfirmationCheck = Callable[[dict[str, Any], RunnableConfig], Awaitable[str]]


async def checked_summary(tool: BaseTool, args: dict[str, Any], config: RunnableConfig) -> str:
    """What the user is asked to approve: the tool's `confirmation_check` (a `ToolException`
    when the call cannot run), or, for a tool without one, its `summary`."""
    check = (tool.metadata or {}).get("confirmation_check")
    if callable(check):
        return str(await check(args, config))
    return summary(tool, args)


def parameters(tool: BaseTool) -> dict[str, Any]:
    """The JSON schema of the arguments the model may pass (to check edited ones against)."""
    schema: Any = tool.tool_call_schema
    if isinstance(schema, dict):
        return schema
    return dict(schema.model_json_schema())
