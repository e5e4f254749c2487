"""The undo harness: a turn started by `POST /v1/conversations/{id}/undo` calls the `undo`
tool (worker/tools/home_assistant/undo.py) without asking the model to, through the policy as
any call goes (worker/tools/policy.py): it runs, is refused, or waits for the user's
decision, asked in words as any pause is (undoing an unlock is a lock call, asked or
refused as one). The response model
then says what happened; a call that waits pauses the turn, and the decision resumes it
(worker/harness/resume.py).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing

from langchain_core.messages import AIMessage
from langchain_core.messages.tool import tool_call

from worker.calls import Item
from worker.context import TurnContext
from worker.harness.router import pause, propose, room_to_wait, rule, run_call
from worker.harness.tool_call import PlannedCall, check
from worker.tools.policy import PolicyVerdict

__all__ = ["UNDO_TOOL", "undo_harness"]

UNDO_TOOL = "undo"


async def undo_harness(ctx: TurnContext) -> AsyncGenerator[Item, None]:
    """Call `undo` as the router would have: its `tool_call` and result, or its proposal."""
    tools = {tool.name: tool for tool in ctx.tools}
    call = PlannedCall(id=f"call_{uuid.uuid4().hex[:24]}", name=UNDO_TOOL, args={}, arguments="{}")
    message = AIMessage(content="", tool_calls=[tool_call(name=call.name, args={}, id=call.id)])
    ctx.tool_messages.append(message)
    ruling = await rule(ctx, call, tools)
    refused = ruling.refusal if ruling is not None else None
    if ruling is not None and ruling.verdict is PolicyVerdict.ASK:
        room, why = await room_to_wait(ctx)
        checked = await check(
            call, tools[call.name], timeout_s=ctx.settings.tool_timeout_s, runtime=ctx.runtime
        )
        if room >= 1 and checked.summary is not None:
            proposal = propose(ctx, call, tools[call.name], checked.summary)
            asking = pause(ctx, [proposal], message, len(ctx.content))
            async with aclosing(asking) as events:
                async for event in events:
                    yield event
            return
        refused = f"not run: {why}" if room < 1 else checked.problem
    async with aclosing(run_call(ctx, call, tools, refused, ruling)) as events:
        async for event in events:
            yield event
