"""What the workers run, as they publish it for `GET /v1/status` (api/routes/status.py).

The API does not call the models or the tools' services on a turn's behalf, and its own
environment may not be the workers'; so each worker, as it publishes its tools
(worker/tools/catalog.py), also writes `keys.DEPLOYMENT`: the version it runs, its two
models (provider, model, base URL, whether it is the offline demo model) and the service
each of its tools reaches (worker/tools/sources.py `services`: the tool sources declare
them, and the API learns them only from here). URLs are written with their passwords
hidden; no key is.
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
    """A service a tool reaches, and the setting that names it (worker/tools/sources.py)."""

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
