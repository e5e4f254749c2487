"""Where Home Assistant is and the token that lets Bernard in (`BERNARD_HA_*`), and the base
URL and headers every request carries."""

from __future__ import annotations

from dataclasses import dataclass

from langchain_core.tools import ToolException
from pydantic import Field, SecretStr

from worker.tools.settings import SourceSettings


class HomeAssistantSettings(SourceSettings):
    """Where Home Assistant is, the token that lets Bernard in, and the domains (comma-
    separated) whose services Bernard may call. Both the URL and the token set: the tools
    are offered."""

    ha_url: str | None = Field(None, alias="BERNARD_HA_URL")
    ha_token: SecretStr | None = Field(None, alias="BERNARD_HA_TOKEN")
    ha_domains: str = Field(
        "light,switch,fan,climate,cover,media_player,scene,script", alias="BERNARD_HA_DOMAINS"
    )

    def ha_domain_names(self) -> frozenset[str]:
        return frozenset(name.strip() for name in self.ha_domains.split(",") if name.strip())


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Home Assistant's base URL and the headers that authorize a request to it."""

    base: str
    headers: dict[str, str]


def endpoint(settings: HomeAssistantSettings) -> Endpoint:
    """Where the settings say Home Assistant is, and with which token; a tool error when
    either is unset."""
    if not (settings.ha_url and settings.ha_token):
        raise ToolException(
            "Error: Home Assistant is not configured (BERNARD_HA_URL and BERNARD_HA_TOKEN)"
        )
    token = settings.ha_token.get_secret_value()
    return Endpoint(settings.ha_url.rstrip("/"), {"Authorization": f"Bearer {token}"})
