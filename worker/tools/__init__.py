"""The tools the router may call, each a LangChain tool that may report live progress.

A tool that reports progress takes `config: RunnableConfig` and calls
`get_reporter(config)`; see `worker.tools.progress` for how the router passes the reporter.
A tool that reaches another service is offered only when that service is configured
(`enabled_tools`).
"""

from __future__ import annotations

from langchain_core.tools import BaseTool

from shared.settings import Settings
from worker.tools.calculator import calculator
from worker.tools.home_assistant import home_assistant_tools
from worker.tools.notes import delete_note, list_notes, save_note
from worker.tools.progress import ProgressReporter, get_reporter, progress_config
from worker.tools.search import web_search
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


def enabled_tools(settings: Settings) -> list[BaseTool]:
    """The tools a turn gets: the default ones and those whose service is configured."""
    tools = default_tools()
    if settings.searxng_url:
        tools.append(web_search)
    if settings.wikipedia_url:
        tools.append(wikipedia)
    if settings.open_meteo_url and settings.open_meteo_geocoding_url:
        tools.append(weather)
    if settings.ha_url and settings.ha_token:
        tools += home_assistant_tools(settings)
    if settings.plex_url and settings.plex_token:
        # Imported only when used: plexapi adds 60-200 ms to a worker's start.
        from worker.tools.plex import plex_tools

        tools += plex_tools(settings)
    return tools
