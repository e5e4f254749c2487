"""Every built-in tool source that reaches another service, each declared once: the settings
it needs, the tools it adds and the services those reach.

`enabled_tools` (worker/tools/__init__.py) offers a source's tools, and the worker publishes
its services for `GET /v1/status` (worker/tools/catalog.py `deployment`, read by
api/status.py), both from `SOURCES`: what a turn is offered and what the status probes
cannot disagree. A new service-backed tool is one row here, naming the settings its module
declares (worker/tools/settings.py `SourceSettings`). MCP servers are not a row:
their tools come and go while the worker runs (worker/tools/toolbox.py `Toolbox`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from langchain_core.tools import BaseTool

from shared.deployment import ServiceFacts
from shared.redaction import redact_url
from worker.tools.home_assistant import HomeAssistantSettings, home_assistant_tools
from worker.tools.plex_settings import PlexSettings
from worker.tools.search import WebSearchSettings, web_search
from worker.tools.settings import SourceSettings, ToolSettings
from worker.tools.weather import WeatherSettings, weather
from worker.tools.wikipedia import WikipediaSettings, wikipedia

__all__ = [
    "SOURCES",
    "Service",
    "ToolSource",
    "enabled_sources",
    "read_tool_settings",
    "services",
]

S = TypeVar("S", bound=SourceSettings)


@dataclass(frozen=True)
class Service:
    """A service a source's tools reach: `tool` names them as `GET /v1/status` lists them
    (`ha_*`: every tool whose name starts `ha_`), `setting` is the field of the source's
    settings holding its URL."""

    tool: str
    setting: str


@dataclass(frozen=True)
class ToolSource(Generic[S]):
    """A source offered when every field of `needs` (fields of its `settings`, declared in
    its module) is set (an empty URL turns off a tool that has a default)."""

    name: str
    settings: type[S]
    needs: tuple[str, ...]
    tools: Callable[[S], list[BaseTool]]
    services: tuple[Service, ...]

    def enabled(self, tool_settings: ToolSettings) -> bool:
        own = tool_settings.get(self.settings)
        return own is not None and all(getattr(own, field) for field in self.needs)

    def offered(self, tool_settings: ToolSettings) -> list[BaseTool]:
        return self.tools(tool_settings.of(self.settings))


def _plex_tools(settings: PlexSettings) -> list[BaseTool]:
    # Imported only when used: plexapi adds 60-200 ms to a worker's start.
    from worker.tools.plex import plex_tools

    return plex_tools(settings)


SOURCES: tuple[ToolSource[Any], ...] = (
    ToolSource(
        "web search",
        WebSearchSettings,
        needs=("searxng_url",),
        tools=lambda _: [web_search],
        services=(Service("web_search", "searxng_url"),),
    ),
    ToolSource(
        "wikipedia",
        WikipediaSettings,
        needs=("wikipedia_url",),
        tools=lambda _: [wikipedia],
        services=(Service("wikipedia", "wikipedia_url"),),
    ),
    ToolSource(
        "weather",
        WeatherSettings,
        needs=("open_meteo_url", "open_meteo_geocoding_url"),
        tools=lambda _: [weather],
        services=(
            Service("weather", "open_meteo_url"),
            Service("weather", "open_meteo_geocoding_url"),
        ),
    ),
    ToolSource(
        "Home Assistant",
        HomeAssistantSettings,
        needs=("ha_url", "ha_token"),
        tools=home_assistant_tools,
        services=(Service("ha_*", "ha_url"), Service("undo", "ha_url")),
    ),
    ToolSource(
        "Plex",
        PlexSettings,
        needs=("plex_url", "plex_token"),
        tools=_plex_tools,
        services=(Service("plex_*", "plex_url"),),
    ),
)


def read_tool_settings(**values: Any) -> ToolSettings:
    """Every source's settings, read from the environment and `.env` as `Settings` is; each
    of `values` (a field by name, as tests set one) replaces what its source would read. A
    name no source declares is refused rather than ignored."""
    unknown = set(values) - {name for source in SOURCES for name in source.settings.model_fields}
    if unknown:
        raise TypeError(f"no tool source has the settings {sorted(unknown)}")
    return ToolSettings(
        source.settings(
            **{
                name: value
                for name, value in values.items()
                if name in source.settings.model_fields
            }
        )
        for source in SOURCES
    )


def enabled_sources(tool_settings: ToolSettings) -> list[ToolSource[Any]]:
    return [source for source in SOURCES if source.enabled(tool_settings)]


def services(tool_settings: ToolSettings) -> list[ServiceFacts]:
    """The service each enabled source's tools reach, named by the variable that sets it,
    its password hidden."""
    return [
        ServiceFacts(
            tool=service.tool,
            variable=_variable(source.settings, service.setting),
            url=redact_url(getattr(tool_settings.of(source.settings), service.setting)),
        )
        for source in enabled_sources(tool_settings)
        for service in source.services
    ]


def _variable(settings: type[SourceSettings], setting: str) -> str:
    """The environment variable of a source's settings field (its alias, as the source's
    module declares it)."""
    alias = settings.model_fields[setting].alias
    assert alias is not None, f"{settings.__name__}.{setting} has no variable"
    return alias
