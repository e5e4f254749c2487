"""An MCP server's tool as the router calls it: a LangChain tool with the server's JSON
schema and description, under its namespaced name (worker/tools/mcp/names.py).

A call is checked against the tool's input schema before it is sent (off the loop, within a
time bound: shared/schema_checks.py; a call that fails it never reaches the server, and the
model reads why), runs on the worker's session with the
server (worker/tools/mcp/connection.py), turns each `notifications/progress` into a
`tool_progress` event as it arrives (`MAX_PROGRESS` at most, each message cut at
`PROGRESS_CHARS`), and its result into text within the connection's `result_max_chars`
(worker/tools/mcp/output.py);
an `isError` result or any failure is an error the model reads. Stopping the call (the
turn is cancelled, or the tool's time is up) cancels the request: the SDK sends MCP's
`notifications/cancelled` for it.

Whether a call waits for the user's decision (worker/tools/confirmation.py) comes from the
server's `confirm` and `trust_hints`, and the tool's annotations (`waits`): a tool that is
not read-only, or is destructive, waits, exactly like Bernard's own write tools, and so does
every tool of a server whose hints are not trusted (the server's own word is all that says a
tool only reads). Its `confirmation_check` refuses before anyone is asked a call that cannot
run (arguments the schema refuses, the server not connected, the tool gone) and says what
will run, in Bernard's words first: the tool as Bernard names it, its server and the
arguments; the server's title for it follows, said to be the server's (`summary`).
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException
from mcp.types import Tool, ToolAnnotations
from pydantic import ConfigDict

from shared.schema_checks import Invalid
from worker.tools.http import trim
from worker.tools.mcp.bounds import arguments_schema, description
from worker.tools.mcp.config import Confirm
from worker.tools.mcp.connection import Connection, ConnectionState
from worker.tools.mcp.output import Output, render_result
from worker.tools.progress import get_reporter

__all__ = ["McpTool", "waits"]

SUMMARY_CHARS = 300
# The most progress events one call streams: a server may notify as often as it likes,
# each event is a stream entry (and a frame for every client).
MAX_PROGRESS = 200
# A progress message's length at most: a server's message may be as long as it likes, and
# each one is streamed to every client of the turn.
PROGRESS_CHARS = 200


def waits(annotations: ToolAnnotations | None, confirm: Confirm, trusted: bool) -> bool:
    """Whether a call waits for the user: per the server's `confirm`, or, by its
    annotations, when the tool is not read-only (`readOnlyHint` false or absent) or is
    destructive (`destructiveHint`); a server's hints not `trusted` spare no question."""
    if confirm is Confirm.ALWAYS:
        return True
    if confirm is Confirm.NEVER:
        return False
    if not trusted:
        return True
    hints = annotations or ToolAnnotations()
    return hints.read_only_hint is not True or hints.destructive_hint is True


class McpTool(BaseTool):
    """One tool of one MCP server (see the module docstring)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    connection: Connection
    remote: Tool

    @classmethod
    def of(cls, connection: Connection, remote: Tool, name: str) -> McpTool:
        made = cls(
            name=name,
            description=description(remote, connection.name),
            args_schema=arguments_schema(remote),
            connection=connection,
            remote=remote,
        )
        made.metadata = {
            "requires_confirmation": waits(
                remote.annotations, connection.config.confirm, connection.config.trust_hints
            ),
            "confirmation_summary": made.summary,
            "confirmation_check": made.check,
            "mcp_server": connection.name,
        }
        return made

    @property
    def server(self) -> str:
        return self.connection.name

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """Run a tool call (`{"type": "tool_call", "args": ..., "id": ...}`, as the router
        sends it) into a `ToolMessage`, or plain arguments into the text.

        Overridden rather than `_arun`, so that an argument named like one of LangChain's
        own (`config`, `run_manager`) still reaches the server."""
        call = input if isinstance(input, dict) else {}
        is_call = call.get("type") == "tool_call"
        args = call.get("args", {}) if is_call else call
        try:
            output = await self.run_call(args, config)
        except ToolException as exc:
            text = str(exc) if str(exc).startswith("Error: ") else f"Error: {exc}"
            if not is_call:
                return text
            return ToolMessage(text, tool_call_id=call["id"], name=self.name, status="error")
        if not is_call:
            return output.text
        return ToolMessage(
            output.text, artifact=output.artifact, tool_call_id=call["id"], name=self.name
        )

    async def run_call(self, args: Any, config: RunnableConfig | None) -> Output:
        reporter = get_reporter(config)
        with reporter.reporting_errors():
            await self._check_arguments(args)

            reported = 0

            async def report(progress: float, total: float | None, message: str | None) -> None:
                nonlocal reported
                reported += 1
                if reported > MAX_PROGRESS:
                    return
                said = trim(message, PROGRESS_CHARS) if message else None
                if total:
                    reporter.progress(progress, total, said)
                else:
                    reporter.step(said or f"{progress:g} done")

            result = await self.connection.call(self.remote.name, args, report)
            output = render_result(result, max_chars=self.connection.result_max_chars)
            if result.is_error:
                said = output.text or "the tool failed without saying why"
                raise ToolException(f"Error: {said}")
        return output

    async def check(self, args: dict[str, Any], config: RunnableConfig) -> str:
        """The `confirmation_check`: what will run, or why it cannot."""
        await self._check_arguments(args)
        connection = self.connection
        if connection.state is not ConnectionState.READY:
            why = f" ({connection.error})" if connection.error else ""
            raise ToolException(
                f"Error: the MCP server “{self.server}” is not connected{why}; try again later"
            )
        if not any(tool.name == self.remote.name for tool in connection.tools):
            raise ToolException(
                f"Error: the MCP server “{self.server}” no longer offers {self.remote.name}"
            )
        return self.summary(args)

    def summary(self, args: dict[str, Any]) -> str:
        """What the user approves: 'Run home__set_light on the MCP server “home” with
        entity="light.kitchen", brightness=40 (the server calls it “Set a light”)'. Bernard's
        words come first, whole within `SUMMARY_CHARS`; the server's title, only when it is
        one of its own, in what room is left."""
        shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
        said = f"Run {self.name} on the MCP server “{self.server}”"
        said = trim(f"{said} with {shown}" if shown else said, SUMMARY_CHARS)
        title = self.remote.title or (self.remote.annotations or ToolAnnotations()).title
        room = SUMMARY_CHARS - len(said) - len(" (the server calls it “”)")
        if not title or room < 8:
            return said
        return f"{said} (the server calls it “{trim(title, room)}”)"

    async def _check_arguments(self, args: Any) -> None:
        problem = await self.connection.checks.arguments(arguments_schema(self.remote), args)
        if isinstance(problem, Invalid):
            raise ToolException(
                f"Error: invalid arguments for tool '{self.name}': {problem.where}: "
                f"{problem.message}"
            )
        if problem is not None:
            raise ToolException(
                f"Error: the arguments for tool '{self.name}' could not be checked against its "
                f"input schema ({problem.reason}); it was not run"
            )

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("MCP tools run only asynchronously (ainvoke)")
