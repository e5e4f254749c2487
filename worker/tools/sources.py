"""Every built-in tool source that reaches another service, each declared once: the settings
it needs, the tools it adds and the services those reach.

`enabled_tools` (worker/tools/__init__.py) offers a source's tools, and the worker publishes
its services for `GET /v1/status` (worker/tools/catalog.py `deployment`, read by
api/status.py), both from `SOURCES`: what a turn is offered and what the status probes
cannot disagree. A new service-backed tool is one row here. MCP servers are not a row:
their tools come and go while the worker runs (worker/tools/toolbox.py `Toolbox`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from langchain_core.tools import BaseTool

from shared.deployment import ServiceFacts
from shared.redaction import redact_url
from shared.settings import Settings
from worker.tools.home_assistant import home_assistant_tools
from worker.tools.search import web_search
from worker.tools.weather import weather
from worker.tools.wikipedia import wikipedia

__all__ = ["SOURCES", "Service", "ToolSource", "enabled_sources", "services"]


@dataclass(frozen=True)
class Service:
    """A service a source's tools reach: `tool` names them as `GET /v1/status` lists them
    (`ha_*`: every tool whose name starts `ha_`), `setting` is the `Settings` field holding
    its URL."""

    tool: str
    setting: str


@dataclass(frozen=True)
class ToolSource:
    """A source offered when every field of `needs` is set (an empty URL turns off a tool
    that has a default)."""

    name: str
    needs: tuple[str, ...]
    tools: Callable[[Settings], list[BaseTool]]
    services: tuple[Service, ...]

    def enabled(self, settings: Settings) -> bool:
        return all(getattr(settings, field) for field in self.needs)


def _plex_tools(settings: Settings) -> list[BaseTool]:
    # Imported only when used: plexapi adds 60-200 ms to a worker's start.
    from worker.tools.plex import plex_tools

    return plex_tools(settings)


SOURCES: tuple[ToolSource, ...] = (
    ToolSource(
        "web search",
        needs=("searxng_url",),
        tools=lambda _: [web_search],
        services=(Service("web_search", "searxng_url"),),
    ),
    ToolSource(
        "wikipedia",
        needs=("wikipedia_url",),
        tools=lambda _: [wikipedia],
        services=(Service("wikipedia", "wikipedia_url"),),
    ),
    ToolSource(
        "weather",
        needs=("open_meteo_url", "open_meteo_geocoding_url"),
        tools=lambda _: [weather],
        services=(
            Service("weather", "open_meteo_url"),
            Service("weather", "open_meteo_geocoding_url"),
        ),
    ),
    ToolSource(
        "Home Assistant",
        needs=("ha_url", "ha_token"),
        tools=home_assistant_tools,
        services=(Service("ha_*", "ha_url"),),
    ),
    ToolSource(
        "Plex",
        needs=("plex_url", "plex_token"),
        tools=_plex_tools,
        services=(Service("plex_*", "plex_url"),),
    ),
)


def enabled_sources(settings: Settings) -> list[ToolSource]:
    return [source for source in SOURCES if source.enabled(settings)]


def services(settings: Settings) -> list[ServiceFacts]:
    """The service each enabled source's tools reach, named by the variable that sets it,
    its password hidden."""
    return [
        ServiceFacts(
            tool=service.tool,
            variable=_variable(service.setting),
            url=redact_url(getattr(settings, service.setting)),
        )
        for source in enabled_sources(settings)
        for service in source.services
    ]


def _variable(setting: str) -> str:
    """The environment variable of a `Settings` field (its alias, as shared/settings.py
    declares it)."""
    alias = Settings.model_fields[setting].alias
    assert alias is not None, f"Settings.{setting} has no variable"
    return alias
