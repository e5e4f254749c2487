"""What the Plex tools (worker/tools/plex.py) read. A module of its own so that
worker/tools/sources.py can read them without importing plexapi, which adds 60-200 ms to a
worker's start and is imported only when Plex is configured."""

from __future__ import annotations

from pydantic import Field, SecretStr

from worker.tools.settings import SourceSettings

__all__ = ["PlexSettings"]


class PlexSettings(SourceSettings):
    """The Plex Media Server's address with its port (`http://192.168.1.10:32400`) and an
    `X-Plex-Token`; both set: the tools are offered."""

    plex_url: str | None = Field(
        None,
        alias="BERNARD_PLEX_URL",
        description="A Plex Media Server with its port (`http://192.168.1.10:32400`); with "
        "`BERNARD_PLEX_TOKEN` set too, the Plex tools are offered",
    )
    plex_token: SecretStr | None = Field(
        None, alias="BERNARD_PLEX_TOKEN", description="The server's `X-Plex-Token`"
    )
