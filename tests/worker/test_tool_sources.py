"""The built-in tool sources (worker/tools/sources.py `SOURCES`): for each configuration, the
tools a turn is offered (worker/tools/__init__.py `enabled_tools`) and the services the
worker publishes for `GET /v1/status` (worker/tools/catalog.py `deployment`), passwords
hidden. Both come from the one table, so one row of settings checks both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import ToolException
from pydantic import SecretStr

from shared.settings import Settings
from worker.tools import enabled_tools
from worker.tools.catalog import deployment
from worker.tools.home_assistant import HomeAssistantSettings
from worker.tools.plex_settings import PlexSettings
from worker.tools.search import WebSearchSettings
from worker.tools.settings import ToolSettings
from worker.tools.sources import SOURCES, read_tool_settings
from worker.tools.weather import WeatherSettings
from worker.tools.wikipedia import WikipediaSettings

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
HA_TOOLS = ["ha_list_entities", "ha_get_state", "ha_call_service", "undo"]
PLEX_TOOLS = ["plex_search", "plex_browse", "plex_now_playing", "plex_play", "plex_control"]


def tool_settings(**values: Any) -> ToolSettings:
    """Every source's settings from `values` alone (no `.env`)."""
    values = {**NO_SERVICES, **values}
    return ToolSettings(
        source.settings(
            _env_file=None,
            **{
                name: value
                for name, value in values.items()
                if name in source.settings.model_fields
            },
        )
        for source in SOURCES
    )


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
        [
            ("ha_*", "BERNARD_HA_URL", "http://user:***@ha:8123"),
            ("undo", "BERNARD_HA_URL", "http://user:***@ha:8123"),
        ],
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
    configured = tool_settings(**values)
    assert [t.name for t in enabled_tools(configured)] == [*DEFAULT_TOOLS, *tools]
    published = deployment(Settings(_env_file=None), configured).services
    assert [(s.tool, s.variable, s.url) for s in published] == services


# Each source's settings, as operators set them: the variable, and the value when it is unset.
VARIABLES: list[tuple[type[Any], str, str, Any]] = [
    (WebSearchSettings, "searxng_url", "BERNARD_SEARXNG_URL", None),
    (WikipediaSettings, "wikipedia_url", "BERNARD_WIKIPEDIA_URL", "https://en.wikipedia.org"),
    (WeatherSettings, "open_meteo_url", "BERNARD_OPEN_METEO_URL", "https://api.open-meteo.com"),
    (
        WeatherSettings,
        "open_meteo_geocoding_url",
        "BERNARD_OPEN_METEO_GEOCODING_URL",
        "https://geocoding-api.open-meteo.com",
    ),
    (HomeAssistantSettings, "ha_url", "BERNARD_HA_URL", None),
    (HomeAssistantSettings, "ha_token", "BERNARD_HA_TOKEN", None),
    (
        HomeAssistantSettings,
        "ha_domains",
        "BERNARD_HA_DOMAINS",
        "light,switch,fan,climate,cover,media_player,scene,script",
    ),
    (PlexSettings, "plex_url", "BERNARD_PLEX_URL", None),
    (PlexSettings, "plex_token", "BERNARD_PLEX_TOKEN", None),
]


@pytest.mark.parametrize(("cls", "field", "variable", "default"), VARIABLES)
def test_each_source_reads_its_variables_from_the_environment_and_dotenv(
    cls: type[Any],
    field: str,
    variable: str,
    default: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The names and defaults `Settings` had before each source declared its own: an
    operator's environment and `.env` keep working. The environment wins over `.env`."""

    def read(**options: Any) -> Any:
        value = getattr(cls(**options), field)
        return value.get_secret_value() if isinstance(value, SecretStr) else value

    monkeypatch.delenv(variable, raising=False)
    assert read(_env_file=None) == default
    dotenv = tmp_path / ".env"
    dotenv.write_text(f"{variable.lower()}=from-dotenv\n")  # names are case-insensitive
    assert read(_env_file=dotenv) == "from-dotenv"
    monkeypatch.setenv(variable, "from-env")
    assert read(_env_file=dotenv) == "from-env"


def test_every_source_setting_is_read_and_a_name_no_source_has_is_refused() -> None:
    read = read_tool_settings(ha_url="http://ha:8123", plex_token="p", wikipedia_url="")
    assert read.of(HomeAssistantSettings).ha_url == "http://ha:8123"
    token = read.of(PlexSettings).plex_token
    assert token is not None and token.get_secret_value() == "p"
    assert read.of(WikipediaSettings).wikipedia_url == ""
    with pytest.raises(TypeError, match=r"no tool source has the settings \['ha_uri'\]"):
        read_tool_settings(ha_uri="http://ha:8123")


def test_the_tokens_are_secret_and_kept_out_of_a_printed_settings() -> None:
    home = HomeAssistantSettings(_env_file=None, ha_url="http://ha", ha_token="ha-token-789")
    plex = PlexSettings(_env_file=None, plex_url="http://plex", plex_token="plex-token-012")
    assert "ha-token-789" not in repr(home) and "plex-token-012" not in repr(plex)
    assert ToolSettings([home, plex]).secrets() == ["ha-token-789", "plex-token-012"]


@pytest.mark.parametrize("source", SOURCES, ids=[source.name for source in SOURCES])
def test_a_source_needs_and_publishes_only_fields_its_settings_declare(source: Any) -> None:
    declared = set(source.settings.model_fields)
    assert set(source.needs) <= declared
    assert {service.setting for service in source.services} <= declared


def test_a_needed_setting_unset_is_a_tool_error_naming_its_variable() -> None:
    unset = WikipediaSettings(_env_file=None, wikipedia_url="")
    with pytest.raises(ToolException) as refused:
        unset.needed("wikipedia_url", "Wikipedia")
    assert str(refused.value) == "Error: Wikipedia is not configured (BERNARD_WIKIPEDIA_URL)"
    searxng = WebSearchSettings(_env_file=None, searxng_url="http://searxng:8080")
    assert searxng.needed("searxng_url", "web search") == "http://searxng:8080"
