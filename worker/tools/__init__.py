"""The tools the router may call, each a LangChain tool that may report live progress.

A tool that reports progress takes `config: RunnableConfig` and calls
`get_reporter(config)`; see `worker.tools.progress` for how the router passes the reporter.
A tool that reaches another service is offered only when that service is configured
(`enabled_tools`, from worker/tools/sources.py `SOURCES`).
"""

from __future__ import annotations

from langchain_core.tools import BaseTool

from worker.tools.calculator import calculator
from worker.tools.home_assistant import home_assistant_tools
from worker.tools.notes import delete_note, list_notes, save_note
from worker.tools.progress import ProgressReporter, get_reporter, progress_config
from worker.tools.search import web_search
from worker.tools.settings import ToolSettings
from worker.tools.sources import enabled_sources
from worker.tools.time import get_time
from worker.tools.timers import cancel_timer, list_timers, set_timer
from worker.tools.weather import weather
from worker.tools.wikipedia import wikipedia

__all__ = [
    "ProgressReporter",
    "calculator",
    "cancel_timer",
    "default_tools",
    "delete_note",
    "enabled_tools",
    "get_reporter",
    "get_time",
    "home_assistant_tools",
    "list_notes",
    "list_timers",
    "progress_config",
    "save_note",
    "set_timer",
    "weather",
    "web_search",
    "wikipedia",
]


def default_tools() -> list[BaseTool]:
    """The tools that need no other service; a new list each call."""
    return [
        calculator,
        get_time,
        save_note,
        list_notes,
        delete_note,
        set_timer,
        list_timers,
        cancel_timer,
    ]


def enabled_tools(tool_settings: ToolSettings) -> list[BaseTool]:
    """The tools a turn gets: the default ones and those of each source whose service is
    configured (worker/tools/sources.py `SOURCES`)."""
    tools = default_tools()
    for source in enabled_sources(tool_settings):
        tools += source.offered(tool_settings)
    return tools
