"""Which tools wait for the user's confirmation before they run, and how they say what
they would do.

A tool that changes the world declares it in its LangChain metadata:
`metadata={"requires_confirmation": True, "confirmation_summary": fn}`, `fn(args)` giving
one plain sentence ("Turn on light.kitchen at 40 % brightness"). Operators override per tool:
`BERNARD_CONFIRM_TOOLS` (always ask) and `BERNARD_AUTO_APPROVE_TOOLS` (never ask), comma-
separated tool names.
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import BaseTool

from shared.settings import Settings


def requires_confirmation(tool: BaseTool, settings: Settings) -> bool:
    """Whether a call of `tool` waits for the user's decision."""
    if tool.name in settings.auto_approve_tool_names():
        return False
    if tool.name in settings.confirm_tool_names():
        return True
    return bool((tool.metadata or {}).get("requires_confirmation"))


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


def parameters(tool: BaseTool) -> dict[str, Any]:
    """The JSON schema of the arguments the model may pass (to check edited ones against)."""
    schema: Any = tool.tool_call_schema
    if isinstance(schema, dict):
        return schema
    return dict(schema.model_json_schema())
