"""What a worker publishes of what it runs (shared/deployment.py): its models and the service
each of its tools reaches, passwords hidden."""

from __future__ import annotations

from typing import Any

import pytest

from shared.deployment import models_of, services_of
from shared.settings import Settings

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
NO_LLM: dict[str, Any] = dict.fromkeys(
    ("openai_base_url", "openai_api_key", "anthropic_base_url", "anthropic_api_key")
)


def settings(**values: Any) -> Settings:
    return Settings(_env_file=None, **{**NO_LLM, **NO_SERVICES, **values})


@pytest.mark.parametrize(
    ("values", "models"),
    [
        (
            {},
            [
                ("router", "demo", "bernard-demo", None, True),
                ("response", "demo", "bernard-demo", None, True),
            ],
        ),
        (
            {"openai_api_key": "sk-x", "router_model": "small", "response_model": "big"},
            [
                ("router", "openai", "small", "https://api.openai.com/v1", False),
                ("response", "openai", "big", "https://api.openai.com/v1", False),
            ],
        ),
        (
            {
                "openai_base_url": "http://me:pw@ollama:11434/v1",
                "anthropic_api_key": "sk-ant",
                "response_provider": "anthropic",
                "router_model": "qwen",
                "response_model": "claude",
            },
            [
                ("router", "openai", "qwen", "http://me:***@ollama:11434/v1", False),
                ("response", "anthropic", "claude", "https://api.anthropic.com", False),
            ],
        ),
    ],
    ids=["demo", "openai", "two providers, a password"],
)
def test_the_models_a_worker_runs(values: dict[str, Any], models: list[tuple[Any, ...]]) -> None:
    assert [
        (m.role, m.provider, m.model, m.base_url, m.demo) for m in models_of(settings(**values))
    ] == models


@pytest.mark.parametrize(
    ("values", "services"),
    [
        ({}, []),
        (
            {"searxng_url": "http://searx:8080", "wikipedia_url": "https://en.wikipedia.org"},
            [
                ("web_search", "BERNARD_SEARXNG_URL", "http://searx:8080"),
                ("wikipedia", "BERNARD_WIKIPEDIA_URL", "https://en.wikipedia.org"),
            ],
        ),
        (
            {"open_meteo_url": "https://api.open-meteo.com"},
            [],  # the weather tool needs its geocoding service too
        ),
        (
            {"ha_url": "http://user:pw@ha:8123"},
            [],  # Home Assistant's tools need the token too
        ),
        (
            {"ha_url": "http://user:pw@ha:8123", "ha_token": "t"},
            [("ha_*", "BERNARD_HA_URL", "http://user:***@ha:8123")],
        ),
        ({"plex_url": "http://plex:32400"}, []),  # and the token
        (
            {"plex_url": "http://plex:32400", "plex_token": "t"},
            [("plex_*", "BERNARD_PLEX_URL", "http://plex:32400")],
        ),
    ],
)
def test_the_services_the_tools_reach(
    values: dict[str, Any], services: list[tuple[str, str, str]]
) -> None:
    assert [(s.tool, s.variable, s.url) for s in services_of(settings(**values))] == services
