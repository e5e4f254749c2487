"""What the workers run, as they publish it for `GET /v1/status` (api/routes/status.py).

The API does not call the models or the tools' services on a turn's behalf, and its own
environment may not be the workers'; so each worker, as it publishes its tools
(worker/tools/catalog.py), also writes `keys.DEPLOYMENT`: the version it runs, its two
models (provider, model, base URL, whether it is the offline demo model) and the service
each of its tools reaches. URLs are written with their passwords hidden; no key is.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Literal

from pydantic import BaseModel

from shared.connection import redact
from shared.settings import Settings

DEMO_MODEL = "bernard-demo"
DEFAULT_OPENAI_URL = "https://api.openai.com/v1"
DEFAULT_ANTHROPIC_URL = "https://api.anthropic.com"


def version() -> str:
    """The installed Bernard's version (pyproject.toml)."""
    try:
        return package_version("bernard")
    except PackageNotFoundError:  # pragma: no cover - run from a tree never installed
        return "unknown"


class ModelFacts(BaseModel):
    """One of a worker's two models."""

    role: Literal["router", "response"]
    provider: Literal["openai", "anthropic", "demo"]
    model: str
    base_url: str | None  # its password hidden; None for the demo model
    demo: bool


class ServiceFacts(BaseModel):
    """A service a tool reaches, and the setting that names it."""

    tool: str  # the tool's name, or `ha_*` (`plex_*`) for Home Assistant's (Plex's)
    variable: str
    url: str  # its password hidden


class Deployment(BaseModel):
    version: str
    models: list[ModelFacts]
    services: list[ServiceFacts]
    published_at: float


def models_of(settings: Settings) -> list[ModelFacts]:
    """The models a worker with `settings` runs (worker/llm.py `build_models`)."""
    if settings.demo_mode:
        return [
            ModelFacts(role=role, provider="demo", model=DEMO_MODEL, base_url=None, demo=True)
            for role in ("router", "response")
        ]
    found = []
    for role, provider, model in (
        ("router", settings.router_provider, settings.router_model),
        ("response", settings.response_provider, settings.response_model),
    ):
        base = base_url_of(provider, settings)
        found.append(
            ModelFacts(role=role, provider=provider, model=model, base_url=redact(base), demo=False)
        )
    return found


def services_of(settings: Settings) -> list[ServiceFacts]:
    """The service each configured tool reaches: the tools worker/tools/__init__.py
    `enabled_tools` offers for these settings."""
    named: list[tuple[str, str, str | None]] = [
        ("web_search", "BERNARD_SEARXNG_URL", settings.searxng_url),
        ("wikipedia", "BERNARD_WIKIPEDIA_URL", settings.wikipedia_url),
    ]
    if settings.open_meteo_url and settings.open_meteo_geocoding_url:
        named += [
            ("weather", "BERNARD_OPEN_METEO_URL", settings.open_meteo_url),
            ("weather", "BERNARD_OPEN_METEO_GEOCODING_URL", settings.open_meteo_geocoding_url),
        ]
    if settings.ha_token:
        named.append(("ha_*", "BERNARD_HA_URL", settings.ha_url))
    if settings.plex_token:
        named.append(("plex_*", "BERNARD_PLEX_URL", settings.plex_url))
    return [
        ServiceFacts(tool=tool, variable=variable, url=redact(url))
        for tool, variable, url in named
        if url
    ]


def models_request(
    provider: str, base_url: str, settings: Settings | None = None
) -> tuple[str, dict[str, str]]:
    """The request that lists an upstream's models, a cheap way to see it answers: its URL
    for `base_url`, and the headers carrying `settings`' key for `provider` (none without
    settings)."""
    headers: dict[str, str] = {}
    if provider == "anthropic":
        if settings is not None and settings.anthropic_api_key:
            headers = {"x-api-key": settings.anthropic_api_key, "anthropic-version": "2023-06-01"}
        return f"{base_url.rstrip('/')}/v1/models", headers
    if settings is not None and settings.openai_api_key:
        headers = {"Authorization": f"Bearer {settings.openai_api_key}"}
    return f"{base_url.rstrip('/')}/models", headers


def base_url_of(provider: str, settings: Settings) -> str:
    """The base URL `settings` give `provider`'s models (the provider's own by default)."""
    if provider == "anthropic":
        return settings.anthropic_base_url or DEFAULT_ANTHROPIC_URL
    return settings.openai_base_url or DEFAULT_OPENAI_URL
