"""Live progress from a running tool, as `shared.events.ToolProgress` events.

The router makes one `ProgressReporter` per tool call, pointed at a sink it drains while the
tool runs (a callback: the put of a queue), and passes it through the tool's
`RunnableConfig`:

    reporter = ProgressReporter(queue.put_nowait, tool_call_id=call["id"], tool=call["name"])
    result = await tool.ainvoke(call, config=progress_config(reporter))

The tool asks for its reporter with `get_reporter(config)`, which hands back a reporter that
drops everything when none was passed, so a tool runs the same under a bare `invoke()`:

    @tool
    def lookup(query: str, config: RunnableConfig) -> str:
        get_reporter(config).step(f"Looking up {query!r}")

A tool whose failures are `ToolException`s (the model reads their text as the result) does
its work inside `with reporter.reporting_errors():`, which also reports each one as the
tool's `error`.

LangChain runs a sync tool in a thread pool under `ainvoke()`, so reporting is thread-safe:
from another thread the event is handed to the router's loop with `call_soon_threadsafe`.
Events from one thread keep their order, and all of them reach the loop before the tool's
result does (both travel through the same FIFO of loop callbacks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import ToolException

from shared.events import ProgressPhase, ToolProgress

__all__ = [
    "PROGRESS_KEY",
    "ProgressReporter",
    "ProgressSink",
    "get_reporter",
    "progress_config",
]

PROGRESS_KEY = "progress"

ProgressSink = Callable[[ToolProgress], None]

logger = logging.getLogger(__name__)


class ProgressReporter:
    """Turns a tool's `step`/`progress`/`complete`/`error` calls into `ToolProgress` events.

    `sink` takes each event (it must not block: progress is advisory and must never stall
    the tool); `None` makes a reporter that drops everything. The reporter remembers the event
    loop it was made on, so build it in the router's coroutine.
    """

    def __init__(
        self,
        sink: ProgressSink | None,
        *,
        tool_call_id: str = "",
        tool: str = "",
    ) -> None:
        self.tool_call_id = tool_call_id
        self.tool = tool
        self._sink = sink
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    @classmethod
    def noop(cls) -> ProgressReporter:
        """A reporter that accepts every call and emits nothing."""
        return cls(None)

    @property
    def enabled(self) -> bool:
        """False for the no-op reporter; lets a tool skip building costly messages."""
        return self._sink is not None

    def step(self, message: str) -> None:
        """The tool started a new step, e.g. "Querying the weather service"."""
        self._emit("step", message)

    def progress(self, current: float, total: float, message: str | None = None) -> None:
        """`current` of `total` units are done; the message defaults to "current/total"."""
        text = message if message is not None else f"{current:g}/{total:g}"
        self._emit("progress", text, current=current, total=total)

    def complete(self, message: str) -> None:
        """The tool finished its work (its result follows as the tool message)."""
        self._emit("complete", message)

    def error(self, message: str) -> None:
        """The tool hit a problem; it may still return an error text as its result."""
        self._emit("error", message)

    @contextlib.contextmanager
    def reporting_errors(self) -> Iterator[None]:
        """Report a `ToolException` raised inside as the tool's `error` (its message without
        the "Error: " the model reads it with), then let it go on to become the result."""
        try:
            yield
        except ToolException as exc:
            self.error(str(exc).removeprefix("Error: "))
            raise

    def _emit(
        self,
        phase: ProgressPhase,
        message: str,
        *,
        current: float | None = None,
        total: float | None = None,
    ) -> None:
        sink = self._sink
        if sink is None:
            return
        event = ToolProgress(
            tool_call_id=self.tool_call_id,
            tool=self.tool,
            phase=phase,
            message=message,
            current=current,
            total=total,
        )
        if self._loop is None or _running_loop() is self._loop:
            sink(event)
            return
        try:
            self._loop.call_soon_threadsafe(sink, event)
        except RuntimeError:
            # The router's loop is closed: nobody is left to read the event.
            logger.debug("progress event dropped, loop closed: %s", event)


def progress_config(
    reporter: ProgressReporter, config: RunnableConfig | None = None
) -> RunnableConfig:
    """`config` (or a new one) with `reporter` under `configurable["progress"]`."""
    merged: RunnableConfig = dict(config or {})  # type: ignore[assignment]
    merged["configurable"] = {**(merged.get("configurable") or {}), PROGRESS_KEY: reporter}
    return merged


def get_reporter(config: RunnableConfig | Mapping[str, Any] | None) -> ProgressReporter:
    """The reporter the router passed in `config`, or a no-op one when there is none."""
    configurable = (config or {}).get("configurable") or {}
    reporter = configurable.get(PROGRESS_KEY)
    return reporter if isinstance(reporter, ProgressReporter) else ProgressReporter.noop()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
