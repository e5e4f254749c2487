"""`undo`: the conversation's last change to the house put back, within
`BERNARD_UNDO_WINDOW_S`, through the policy and the checks as any call."""

from __future__ import annotations

import time
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException

from shared.records.reads import Archivist
from shared.records.undo import LOOKBACK, TooLate, Undoable, Undone, find_undo
from worker.tools.home_assistant.calls import checked_call, send, subject
from worker.tools.home_assistant.rendering import changes
from worker.tools.policy import Subject
from worker.tools.progress import get_reporter
from worker.tools.runtime import get_runtime


async def _undoable(config: RunnableConfig) -> Undoable:
    """The last change to the house in this conversation that can be put back; a
    `ToolException` saying why there is none."""
    runtime = get_runtime(config)
    if runtime.conversation_id is None:
        raise ToolException("Error: undo works in a stored conversation; this turn has none")
    archivist = Archivist(
        runtime.redis, runtime.owner, retention_s=runtime.settings.conversation_retention_s
    )
    records = await archivist.latest_calls(runtime.conversation_id, LOOKBACK)
    window = runtime.settings.undo_window_s
    found = find_undo(records, now=time.time(), window_s=window)
    if found is None:
        raise ToolException(
            "Error: there is nothing to undo: Bernard made no change to the house in this "
            "conversation that it can put back"
        )
    if isinstance(found, TooLate):
        raise ToolException(
            f"Error: the last change was made {time.time() - found.at:.0f} s ago, and Bernard "
            f"undoes a change for {window:g} s only (BERNARD_UNDO_WINDOW_S)"
        )
    return found


async def _undo_subjects(
    args: dict[str, Any], config: RunnableConfig, areas: bool
) -> list[Subject]:
    """What undo would call, as the policy reads it: undoing an unlock is a lock call, asked
    or refused as one. None to undo: nothing (the tool then says so)."""
    try:
        found = await _undoable(config)
    except ToolException:
        return []
    return [
        await subject(
            config, c["domain"], c["service"], c["entity_id"], dict(c.get("data") or {}), areas
        )
        for c in found.restore.calls
    ]


async def check_undo(args: dict[str, Any], config: RunnableConfig) -> str:
    """`undo`'s `confirmation_check`: what it would put back, once each call it would make
    can run; a `ToolException` when it cannot."""
    found = await _undoable(config)
    for c in found.restore.calls:
        await checked_call(config, c["domain"], c["service"], c["entity_id"], c.get("data"))
    return f"Undo the last change: put {found.restore.said}"


async def _undo(config: RunnableConfig) -> tuple[str, Undone]:
    """Put back the entity of the last change to the house in this conversation."""
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        found = await _undoable(config)
        reporter.step(f"Putting {found.restore.said}")
        lines = [f"Undone: put {found.restore.said}."]
        for c in found.restore.calls:
            call = await checked_call(
                config, c["domain"], c["service"], c["entity_id"], c.get("data")
            )
            lines += changes(call.entity, await send(config, call))
    reporter.complete("Put back")
    return "\n".join(lines), Undone(found.call_id)


def undo_tool() -> BaseTool:
    """The `undo` tool: offered beside `ha_call_service`."""
    made = StructuredTool.from_function(
        coroutine=_undo,
        name="undo",
        description=(
            "Undo the last change Bernard made to the house in this conversation (when the "
            'user says "undo that", "put it back"): puts the entity back as it was just '
            "before, within a few minutes of the change."
        ),
        response_format="content_and_artifact",
        metadata={
            "confirmation_summary": lambda args: "Undo the last change to the house",
            "confirmation_check": check_undo,
            "policy_subjects": _undo_subjects,
        },
    )
    made.handle_tool_error = True
    return made
