"""Settings read from the environment, shared by the API and the worker.

One `Settings` object, returned by the cached `get_settings()`; tests build their own
`Settings(...)` and pass it in explicitly.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

MODEL_ID = "bernard-v1"


class Settings(BaseSettings):
    """Every knob Bernard reads. Names are the environment variables, case-insensitive."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    redis_url: str = "redis://127.0.0.1:6379/0"

    # Upstream LLM. With neither set, the worker runs the offline demo model.
    openai_base_url: str | None = None
    openai_api_key: str | None = None
    router_model: str = Field("gpt-4o-mini", alias="BERNARD_ROUTER_MODEL")
    response_model: str = Field("gpt-4o-mini", alias="BERNARD_RESPONSE_MODEL")
    llm_timeout_s: float = Field(120.0, alias="BERNARD_LLM_TIMEOUT_S")
    llm_max_retries: int = Field(2, alias="BERNARD_LLM_MAX_RETRIES")
    system_prompt: str = Field(
        "You are Bernard, a helpful assistant.", alias="BERNARD_SYSTEM_PROMPT"
    )

    # "key:user,key2:user2". Unset: open, single local user.
    api_keys: str | None = Field(None, alias="BERNARD_API_KEYS")

    worker_concurrency: int = Field(500, alias="BERNARD_WORKER_CONCURRENCY")
    queue_name: str = Field("bernard:queue", alias="BERNARD_QUEUE_NAME")
    turn_timeout_s: float = Field(900.0, alias="BERNARD_TURN_TIMEOUT_S")
    turn_retention_s: int = Field(86_400, alias="BERNARD_TURN_RETENTION_S")
    stream_maxlen: int = Field(10_000, alias="BERNARD_STREAM_MAXLEN")
    keepalive_s: float = Field(15.0, alias="BERNARD_KEEPALIVE_S")
    max_body_bytes: int = Field(4 * 1024 * 1024, alias="BERNARD_MAX_BODY_BYTES")

    max_router_steps: int = Field(5, alias="BERNARD_MAX_ROUTER_STEPS")
    tool_timeout_s: float = Field(30.0, alias="BERNARD_TOOL_TIMEOUT_S")
    stream_tool_output_max_chars: int = Field(4000, alias="BERNARD_STREAM_TOOL_OUTPUT_MAX_CHARS")

    disconnect_grace_s: float = Field(5.0, alias="BERNARD_DISCONNECT_GRACE_S")
    lease_ttl_s: float = Field(5.0, alias="BERNARD_LEASE_TTL_S")
    lease_renew_s: float = Field(1.0, alias="BERNARD_LEASE_RENEW_S")

    @property
    def demo_mode(self) -> bool:
        """True when no upstream LLM is configured: the worker uses the offline demo model."""
        return not (self.openai_base_url or self.openai_api_key)

    def api_key_users(self) -> dict[str, str]:
        """Parse `BERNARD_API_KEYS` into {key: user}; empty when the server runs open."""
        pairs: dict[str, str] = {}
        for item in (self.api_keys or "").split(","):
            key, sep, user = item.strip().partition(":")
            if key and sep and user:
                pairs[key] = user
        return pairs


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read from the environment once."""
    return Settings()
