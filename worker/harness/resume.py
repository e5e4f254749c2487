"""The resume harness: carries out the user's decisions on the tools a paused turn proposed.

A turn that paused (worker/harness/router.py) left its tool-call message in the
conversation, its write calls without results. The turn that continues it starts here:
each approved call runs (its `tool_call`, progress and `tool_result` stream as any call's),
with the arguments the user may have edited (the stored tool-call message then holds them
too: worker/recording.py), once the policy has ruled on it again (worker/tools/policy.py:
an approval, from whatever route, never runs a call the user's rules refuse, nor an edited
one they would); each rejected one gets a result telling the model the user
declined, so it can answer accordingly. Then the router goes on as usual.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import orjson
from langchain_core.messages import ToolMessage

from shared.events import ToolResult
from worker.calls import Item
from worker.context import TurnContext
from worker.harness.router import rule, run_call
from worker.harness.tool_call import PlannedCall, arguments_text


async def resume_harness(ctx: TurnContext) -> AsyncGenerator[Item, None]:
    """Run what the user approved and tell the model what they declined (nothing to do for
    a turn that resumes nothing)."""
    tools = {tool.name: tool for tool in ctx.tools}
    for decision in (ctx.request.resume or {}).get("decisions", []):
        call = _call(decision)
        if decision["decision"] == "approve":
            ruling = await rule(ctx, call, tools)
            refused = ruling.refusal if ruling is not None else None
            async with aclosing(run_call(ctx, call, tools, refused, ruling)) as events:
                async for event in events:
                    yield event
            continue
        declined = f"The user declined: {call.name} was not run."
        ctx.tool_messages.append(
            ToolMessage(content=declined, tool_call_id=call.id, name=call.name)
        )
        ctx.tool_outputs.append({"id": call.id, "name": call.name, "content": declined})
        yield ToolResult(tool_call_id=call.id, name=call.name, content=declined)


def edited_arguments(decisions: list[dict[str, Any]]) -> dict[str, str]:
    """The arguments each approved call runs with that the user edited (tool call id → JSON
    text, as `_call` gives them), for the stored history to hold them in place of those
    proposed (worker/recording.py); calls approved as proposed are left out."""
    out: dict[str, str] = {}
    for decision in decisions:
        edited = decision.get("arguments")
        if decision["decision"] != "approve" or edited is None:
            continue
        proposed = decision["tool_call"]
        if edited != orjson.loads(proposed["arguments"] or "{}"):
            out[proposed["id"]] = _call(decision).arguments
    return out


def _call(decision: dict[str, Any]) -> PlannedCall:
    proposed = decision["tool_call"]
    edited = decision.get("arguments")
    args = edited if edited is not None else orjson.loads(proposed["arguments"] or "{}")
    return PlannedCall(
        id=proposed["id"], name=proposed["name"], args=args, arguments=arguments_text(args)
    )
