"""Timers: `set_timer`, `list_timers` and `cancel_timer`, per user (shared/timers.py).

A timer fires from the queue the workers run, whichever worker is up when it is due, into
the conversation it was set from and onto the user's event stream (`GET /v1/events`).
Cancelling changes the world only a little: by default it does not wait for confirmation
(`BERNARD_CONFIRM_TOOLS=cancel_timer` makes it).
"""

from __future__ import annotations

import time

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import ToolException, tool

from shared.timers import TimerError, TimerStore, parse_duration
from worker.tools.progress import get_reporter
from worker.tools.runtime import ToolRuntime, get_runtime

__all__ = ["cancel_timer", "list_timers", "set_timer"]


def _store(runtime: ToolRuntime) -> TimerStore:
    settings = runtime.settings
    return TimerStore(
        runtime.redis,
        runtime.owner,
        retention_s=settings.conversation_retention_s,
        queue_name=settings.queue_name,
        queue=runtime.queue,  # type: ignore[arg-type]  # the worker's queue client is arq's
    )


def _in(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours} h"] * bool(hours) + [f"{minutes} min"] * bool(minutes)
    return " ".join(parts + [f"{secs} s"] * (bool(secs) or not parts))


@tool
async def set_timer(duration: str, label: str, config: RunnableConfig) -> str:
    """Set a timer that rings after `duration` ("5 minutes", "1h 30m", "90s").

    `label` names it ("pasta", "laundry"); the user hears it by name when it rings.
    """
    runtime = get_runtime(config)
    try:
        seconds = parse_duration(duration)
        timer = await _store(runtime).set(seconds, label, runtime.conversation_id)
    except TimerError as exc:
        raise ToolException(f"Error: {exc}") from exc
    get_reporter(config).complete(f"Timer “{timer.label}” set")
    return f"Timer “{timer.label}” set for {_in(seconds)} (id {timer.id})."


@tool
async def list_timers(config: RunnableConfig) -> str:
    """List the user's timers that have not rung yet, with the time left."""
    now = time.time()
    timers = [t for t in await _store(get_runtime(config)).all() if t.state == "pending"]
    if not timers:
        return "No timers are running."
    return "\n".join(f"- “{t.label}” ({t.id}): {_in(t.due_at - now)} left" for t in timers)


@tool
async def cancel_timer(timer_id: str, config: RunnableConfig) -> str:
    """Cancel a running timer by its id (from `list_timers` or `set_timer`)."""
    timer = await _store(get_runtime(config)).cancel(timer_id)
    if timer is None:
        raise ToolException(f"Error: there is no timer {timer_id!r}; list the timers first.")
    if timer.state != "cancelled":
        return f"Timer “{timer.label}” had already {timer.state}."
    return f"Timer “{timer.label}” cancelled."


for _tool in (set_timer, list_timers, cancel_timer):
    _tool.handle_tool_error = True
cancel_timer.metadata = {
    "requires_confirmation": False,
    "confirmation_summary": lambda args: f"Cancel the timer {args.get('timer_id', '')}",
}
