"""Running one tool call for the router: validated, time-limited, its progress streamed live.

`execute` streams each `ToolProgress` the tool reports *while the tool is still running* (the
tool runs in its own task; its reporter feeds a queue that the stream drains), with the call's
one `ToolOutcome` beside it once the tool is done (worker/streamed.py). Every way a call can
go wrong (an unknown tool, arguments that fail the tool's schema, a tool that raises, a tool
that overruns its time) ends in an outcome whose message is a clear error the model can read
and act on; nothing here raises into the turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, ToolException
from pydantic import BaseModel, ValidationError

from shared.errors import ErrorCode
from shared.events import Error, ToolProgress
from worker.calls import ToolOutcome
from worker.streamed import Streamed
from worker.tools.confirmation import checked_summary
from worker.tools.progress import ProgressReporter, progress_config
from worker.tools.runtime import ToolRuntime, runtime_config

__all__ = [
    "Checked",
    "PlannedCall",
    "check",
    "cut_for_stream",
    "execute",
    "problem_with",
]

logger = logging.getLogger("bernard.worker.tools")


@dataclass(slots=True)
class PlannedCall:
    """One tool call the router decided on, with a guaranteed id.

    `arguments` is the JSON text as streamed to the client; `parse_error` is set when the
    model's arguments were not a JSON object (then `args` is empty).
    """

    id: str
    name: str
    args: dict[str, Any]
    arguments: str
    parse_error: str | None = None


def cut_for_stream(content: str, limit: int) -> tuple[str, bool]:
    """`content` cut to `limit` characters plus an explicit marker, and whether it was cut."""
    if len(content) <= limit:
        return content, False
    return f"{content[:limit]}…[truncated {len(content) - limit} chars]", True


def problem_with(call: PlannedCall, tools: Mapping[str, BaseTool]) -> str | None:
    """Why `call` cannot run as the model asked (unknown tool, arguments that are not JSON
    or fail the tool's schema), or None when it can."""
    tool = tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return f"unknown tool '{call.name}'. Available tools: {known}."
    if call.parse_error is not None:
        return f"invalid arguments for tool '{call.name}': {call.parse_error}"
    problem = _schema_problem(tool, call.args)
    if problem is not None:
        return f"invalid arguments for tool '{call.name}': {problem}"
    return None


@dataclass(frozen=True, slots=True)
class Checked:
    """What checking a call before the user is asked found: the `summary` to ask with, or
    the `problem` (the model reads it as the call's result) that keeps it from running."""

    summary: str | None = None
    problem: str | None = None


async def check(
    call: PlannedCall, tool: BaseTool, *, timeout_s: float, runtime: ToolRuntime | None
) -> Checked:
    """Run the tool's checks of a call that waits for the user (worker/tools/confirmation.py
    `checked_summary`), time-limited; nothing here raises into the turn."""
    config = runtime_config(runtime, {})
    try:
        async with asyncio.timeout(timeout_s):
            return Checked(summary=await checked_summary(tool, call.args, config))
    except ToolException as exc:
        return Checked(problem=str(exc).removeprefix("Error: "))
    except TimeoutError:
        return Checked(problem=f"checking the call took longer than {timeout_s:g}s; try again")
    except Exception as exc:
        logger.warning(
            "tool %s check failed: %s",
            call.name,
            type(exc).__name__,
            extra={"tool": call.name, "tool_call_id": call.id, "exception": type(exc).__name__},
        )
        return Checked(problem=f"the tool '{call.name}' failed: {exc}")


def execute(
    call: PlannedCall,
    tools: Mapping[str, BaseTool],
    *,
    timeout_s: float,
    runtime: ToolRuntime | None = None,
    refused: str | None = None,
) -> Streamed[ToolProgress, ToolOutcome]:
    """Run `call`: its progress as it happens, and beside it, once the progress is out, its
    one `ToolOutcome` (worker/streamed.py).

    `runtime` reaches the tool through its config (worker/tools/runtime.py). `refused` ends
    the call at once with that error, the tool never run (a check before the user was asked
    found it cannot run: `check`)."""
    return Streamed(lambda ended: _run(call, tools, timeout_s, runtime, refused, ended))


async def _run(
    call: PlannedCall,
    tools: Mapping[str, BaseTool],
    timeout_s: float,
    runtime: ToolRuntime | None,
    refused: str | None,
    ended: Callable[[ToolOutcome], None],
) -> AsyncGenerator[ToolProgress, None]:
    problem = refused or problem_with(call, tools)
    if problem is not None:
        ended(_error(call, problem))
        return
    tool = tools[call.name]

    queue: asyncio.Queue[ToolProgress | None] = asyncio.Queue()
    reporter = ProgressReporter(queue.put_nowait, tool_call_id=call.id, tool=call.name)
    tool_input = {"name": call.name, "args": call.args, "id": call.id, "type": "tool_call"}
    config = runtime_config(runtime, progress_config(reporter))
    task = asyncio.create_task(tool.ainvoke(tool_input, config=config))
    # The end of the task goes through the same queue as `None`, behind every progress event
    # the tool reported before returning, so nothing it reported is lost or reordered.
    task.add_done_callback(lambda _: queue.put_nowait(None))
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        # No cancel scope spans a `yield`: an `asyncio.timeout` block here would cancel the
        # consumer's task, wherever it is, while this generator sits suspended.
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                item = await asyncio.wait_for(queue.get(), timeout=max(remaining, 0))
            except TimeoutError:
                break
            if item is None:
                break
            yield item
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    if task.cancelled():
        message = f"the tool '{call.name}' did not finish within {timeout_s:g}s and was stopped"
        ended(_error(call, message, failure=Error(message=message, code=ErrorCode.TOOL_TIMEOUT)))
        return
    exc = task.exception()
    if exc is not None:
        # The type only: the exception's message may quote the arguments (the `tool call`
        # line holds it with BERNARD_LOG_PROMPTS=1, worker/telemetry.py).
        logger.warning(
            "tool %s failed: %s",
            call.name,
            type(exc).__name__,
            extra={"tool": call.name, "tool_call_id": call.id, "exception": type(exc).__name__},
        )
        message = f"the tool '{call.name}' failed: {exc}"
        ended(_error(call, message, failure=Error(message=message, code=ErrorCode.TOOL_ERROR)))
        return
    result = task.result()
    if isinstance(result, ToolMessage):
        result.content = as_text(result.content)
        result.name = result.name or call.name
        ended(ToolOutcome(message=result))
    else:
        # A tool with `response_format="content_and_artifact"` or a custom runnable.
        content = as_text(result)
        ended(ToolOutcome(ToolMessage(content=content, tool_call_id=call.id, name=call.name)))


def as_text(content: Any) -> str:
    """A tool's output as the text the model and the client read."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and all(
        isinstance(p, Mapping) and p.get("type") == "text" for p in content
    ):
        return "".join(str(p.get("text", "")) for p in content)
    try:
        return orjson.dumps(content, default=str).decode()
    except TypeError:
        return str(content)


def _schema_problem(tool: BaseTool, args: dict[str, Any]) -> str | None:
    """Why `args` fail the tool's argument schema, or None when they fit (or it has none)."""
    # Checked here rather than left to `ainvoke`, so a ValidationError raised *inside* a
    # tool is reported as the tool failing, not as the model's arguments being wrong.
    schema = tool.tool_call_schema
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        return None
    try:
        schema.model_validate(args)
    except ValidationError as exc:
        return "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
            for err in exc.errors()
        )
    return None


def _error(call: PlannedCall, message: str, *, failure: Error | None = None) -> ToolOutcome:
    tool_message = ToolMessage(
        content=f"Error: {message}", tool_call_id=call.id, name=call.name, status="error"
    )
    return ToolOutcome(message=tool_message, failure=failure)


def arguments_text(args: Mapping[str, Any]) -> str:
    """The arguments as the JSON text a client sees in `function.arguments`."""
    return json.dumps(args, ensure_ascii=False)
