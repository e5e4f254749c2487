"""What a tool may need from the turn it runs in: whose it is, the worker's Redis, and the
worker's HTTP client for the services tools reach (one per worker: pooled connections with
limits and timeouts; its transport can be replaced, as httpx allows, by tests).

The router passes it in the tool's `RunnableConfig` beside the progress reporter
(worker/tools/progress.py), and a tool asks for it with `get_runtime(config)`:

    @tool
    async def list_notes(config: RunnableConfig) -> str:
        runtime = get_runtime(config)
        notes = await NoteStore(runtime.redis, runtime.owner, ...).all()
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import ToolException
from redis.asyncio import Redis

from shared.settings import Settings
from worker.tools.settings import ToolSettings

RUNTIME_KEY = "bernard"


@dataclass(frozen=True, slots=True)
class ToolRuntime:
    owner: str
    redis: Redis
    settings: Settings
    http: httpx.AsyncClient | None = None
    # The conversation the turn belongs to (a timer set in it reports back there).
    conversation_id: str | None = None
    # The queue role (shared/keys.py), where timers' jobs go; None: the same as `redis`.
    queue: Redis | None = None
    # Each tool source's own settings (worker/tools/settings.py); none: its tools say so.
    tool_settings: ToolSettings = field(default_factory=ToolSettings)

    def client(self) -> httpx.AsyncClient:
        """The worker's HTTP client; a tool error when the turn runs without one."""
        if self.http is None:
            raise ToolException("this tool needs the worker's HTTP client")
        return self.http


def http_client(
    settings: Settings, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """The HTTP client a worker's tools share: bounded pool, every step time-limited. It
    follows no redirect and offers only the encodings a tool reads: worker/tools/http.py
    follows redirects within a service's origin, decompresses, and bounds the whole
    request."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(settings.tool_http_timeout_s),
        limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
        transport=transport,
        headers={
            "User-Agent": "Bernard/0.1 (a self-hosted household assistant)",
            "Accept-Encoding": "gzip, deflate",
        },
        follow_redirects=False,
    )


def runtime_config(runtime: ToolRuntime | None, config: RunnableConfig) -> RunnableConfig:
    """`config` with `runtime` under `configurable["bernard"]` (unchanged for None)."""
    if runtime is None:
        return config
    merged: RunnableConfig = dict(config)  # type: ignore[assignment]
    merged["configurable"] = {**(merged.get("configurable") or {}), RUNTIME_KEY: runtime}
    return merged


def get_runtime(config: RunnableConfig | Mapping[str, Any] | None) -> ToolRuntime:
    """The runtime the router passed; a tool error when there is none (run outside a turn)."""
    runtime = ((config or {}).get("configurable") or {}).get(RUNTIME_KEY)
    if not isinstance(runtime, ToolRuntime):
        raise ToolException("this tool runs only inside a Bernard turn")
    return runtime
