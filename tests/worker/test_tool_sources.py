"""The built-in tool sources (worker/tools/sources.py `SOURCES`): for each configuration, the
tools a turn is offered (worker/tools/__init__.py `enabled_tools`) and the services the
worker publishes for `GET /v1/status` (worker/tools/catalog.py `deployment`), passwords
hidden. Both come from the one table, so one row of settings checks both."""

from __future__ import annotations

from typing import Any

import pytest

from shared.settings import Settings
from worker.tools import enabled_tools
from worker.tools.catalog import deployment

NO_SERVICES: dict[str, Any] = {
    "searxng_url": None,
    "wikipedia_url": "",
    "open_meteo_url": "",
    "open_meteo_geocoding_url": "",
    "ha_url": None,
    "ha_token": None,
    "plex_url": None,
    "plex_token": None,
}
DEFAULT_TOOLS = [
    "calculator",
    "get_time",
    "save_note",
    "list_notes",
    "delete_note",
    "set_timer",
    "list_timers",
    "cancel_timer",
]
HA_TOOLS = ["ha_list_entities", "ha_get_state", "ha_call_service"]
PLEX_TOOLS = ["plex_search", "plex_browse", "plex_now_playing", "plex_play", "plex_control"]


def settings(**values: Any) -> Settings:
    return Settings(_env_file=None, **{**NO_SERVICES, **values})


CASES: list[tuple[str, dict[str, Any], list[str], list[tuple[str, str, str]]]] = [
    ("none", {}, [], []),
    (
        "web search and wikipedia",
        {"searxng_url": "http://searx:8080", "wikipedia_url": "https://en.wikipedia.org"},
        ["web_search", "wikipedia"],
        [
            ("web_search", "BERNARD_SEARXNG_URL", "http://searx:8080"),
            ("wikipedia", "BERNARD_WIKIPEDIA_URL", "https://en.wikipedia.org"),
        ],
    ),
    (
        "weather without its geocoding service",
        {"open_meteo_url": "https://api.open-meteo.com"},
        [],
        [],
    ),
    (
        "weather",
        {
            "open_meteo_url": "https://api.open-meteo.com",
            "open_meteo_geocoding_url": "https://geocoding-api.open-meteo.com",
        },
        ["weather"],
        [
            ("weather", "BERNARD_OPEN_METEO_URL", "https://api.open-meteo.com"),
            (
                "weather",
                "BERNARD_OPEN_METEO_GEOCODING_URL",
                "https://geocoding-api.open-meteo.com",
            ),
        ],
    ),
    ("Home Assistant without its token", {"ha_url": "http://user:pw@ha:8123"}, [], []),
    (
        "Home Assistant",
        {"ha_url": "http://user:pw@ha:8123", "ha_token": "t"},
        HA_TOOLS,
        [("ha_*", "BERNARD_HA_URL", "http://user:***@ha:8123")],
    ),
    ("Plex without its token", {"plex_url": "http://plex:32400"}, [], []),
    ("Plex token without its URL", {"plex_token": "t"}, [], []),
    (
        "Plex",
        {"plex_url": "http://plex:32400", "plex_token": "t"},
        PLEX_TOOLS,
        [("plex_*", "BERNARD_PLEX_URL", "http://plex:32400")],
    ),
]


@pytest.mark.parametrize(
    ("values", "tools", "services"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_a_source_adds_its_tools_and_publishes_its_services(
    values: dict[str, Any], tools: list[str], services: list[tuple[str, str, str]]
) -> None:
    configured = settings(**values)
    assert [t.name for t in enabled_tools(configured)] == [*DEFAULT_TOOLS, *tools]
    published = deployment(configured).services
    assert [(s.tool, s.variable, s.url) for s in published] == services
