"""Each tool source's own settings, declared in its module beside its tools.

A source that reaches a service declares what it reads as a `SourceSettings` subclass
(worker/tools/home_assistant/config.py `HomeAssistantSettings`, ...): read from the environment
and `.env` exactly as `shared/settings.py` `Settings` is (the same variable names, the same
file), so neither that module nor the API knows the source exists. A field that holds a
secret is a `SecretStr`: `secrets()` gives its value, and the credentials inside every URL
the settings hold, for the worker to hide from its logs (`shared/logs.py` `hide_in_logs`).

The worker holds every source's settings in one `ToolSettings` (built by
worker/tools/sources.py `read_tool_settings`), and a tool finds its own there:
`get_runtime(config).tool_settings.of(HomeAssistantSettings)`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from langchain_core.tools import ToolException
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.redaction import url_secrets

__all__ = ["SourceSettings", "ToolSettings"]


class SourceSettings(BaseSettings):
    """What one tool source reads. Its fields name their environment variables by alias
    (`Field(None, alias="BERNARD_HA_URL")`), as `Settings`' do."""

    # As `Settings` reads its own: operators' `.env` files set these beside the rest.
    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    def needed(self, field: str, what: str) -> str:
        """The text of `field`, which the source cannot do without; unset, a tool error that
        names its variable ("Error: web search is not configured (BERNARD_SEARXNG_URL)")."""
        value = getattr(self, field)
        if not value:
            variable = type(self).model_fields[field].alias
            raise ToolException(f"Error: {what} is not configured ({variable})")
        return str(value)

    def secrets(self) -> list[str]:
        """Every `SecretStr` field's value, and the credentials inside every URL a field
        holds (shared/redaction.py `url_secrets`: none in a value that is no URL)."""
        found: list[str] = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                found.append(value.get_secret_value())
            elif isinstance(value, str):
                found += url_secrets(value)
        return found


S = TypeVar("S", bound=SourceSettings)


class ToolSettings:
    """The settings of each tool source a worker has, by their class."""

    def __init__(self, settings: Iterable[SourceSettings] = ()) -> None:
        self._by_class = {type(each): each for each in settings}

    def get(self, cls: type[S]) -> S | None:
        """The settings of class `cls`; None when the worker has none (its source is then
        not offered: a worker built with only some sources', as tests build one)."""
        found = self._by_class.get(cls)
        return found if isinstance(found, cls) else None

    def of(self, cls: type[S]) -> S:
        """The settings of class `cls`, for a tool; a tool error when the worker has none."""
        found = self.get(cls)
        if found is None:
            raise ToolException(f"this tool needs its settings ({cls.__name__})")
        return found

    def secrets(self) -> list[str]:
        """What every source's settings must keep out of the logs (`SourceSettings.secrets`)."""
        return [secret for each in self._by_class.values() for secret in each.secrets()]
