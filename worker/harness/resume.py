"""The resume harness: carries out the user's decisions on the tools a paused turn proposed.

A turn that paused (worker/harness/router.py) left its tool-call message in the
conversation, its write calls without results. The turn that continues it starts here:
each approved call runs (its `tool_call`, progress and `tool_result` stream as any call's),
with the arguments the user may have edited (the stored tool-call message then holds them
too: worker/recording.py), once the policy has ruled on it again (worker/tools/policy.py:
an approval, from whatever route, never runs a call the user's rules refuse, nor an edited
one they would); each rejected one gets a result telling the model the user declined, so
it can answer accordingly. A turn whose user message answered in words
(worker/harness/answers.py) then has that message follow the results; one whose words are
the router's to read has no decisions yet: the router makes them in its first step. Then the
router goes on as usual.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import orjson

from worker.calls import Item
from worker.context import TurnContext
from worker.harness.answers import answer_messages, decided_call
from worker.harness.router import carry_out


async def resume_harness(ctx: TurnContext) -> AsyncGenerator[Item, None]:
    """Run what the user approved and tell the model what they declined (nothing to do for
    a turn that resumes nothing)."""
    resume = ctx.request.resume or {}
    tools = {tool.name: tool for tool in ctx.tools}
    async with aclosing(carry_out(ctx, resume.get("decisions", []), tools)) as events:
        async for event in events:
            yield event
    if "words" in resume and not resume.get("pending"):
        ctx.tool_messages.extend(answer_messages(ctx.request))


def edited_arguments(decisions: list[dict[str, Any]]) -> dict[str, str]:
    """The arguments each approved call runs with that the user edited (tool call id → JSON
    text, as `decided_call` gives them), for the stored history to hold them in place of
    those proposed (worker/recording.py); calls approved as proposed are left out."""
    out: dict[str, str] = {}
    for decision in decisions:
        edited = decision.get("arguments")
        if decision["decision"] != "approve" or edited is None:
            continue
        proposed = decision["tool_call"]
        if edited != orjson.loads(proposed["arguments"] or "{}"):
            out[proposed["id"]] = decided_call(decision).arguments
    return out
