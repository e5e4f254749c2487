"""What `GET /v1/status` says of the deployment (api/routes/status.py): the version, the
models and whether they are the offline demo model, the tools and whether the services
they reach answer, MCP servers, each Redis (its roles, topology and health facts) and the
workers alive.

The models and the services are what the workers published (shared/deployment.py), not
this process's settings: the API may run with another environment. Whether they answer is
found out here, by one cheap request each (a model's `/models`, a service's URL; any HTTP
answer from a service is an answer), within `PROBE_TIMEOUT_S`.

The cost is bounded whatever clients do: each API process builds the status at most once
per `STATUS_CACHE_S`, and requests that arrive while it is being built wait for that one
build (`StatusCache`); no request reaches out on its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import httpx
import orjson
from pydantic import ValidationError
from redis.asyncio import Redis

from shared import keys
from shared.backends import backend_of
from shared.connection import REDIS_ERRORS
from shared.deployment import (
    Deployment,
    ModelFacts,
    base_url_of,
    models_of,
    models_request,
    version,
)
from shared.mcp_health import McpServerStatus, mcp_servers
from shared.redis_checks import server_facts
from shared.settings import Settings
from shared.status import (
    ModelStatus,
    Probe,
    RedisStatus,
    ServiceStatus,
    StatusReport,
    ToolStatus,
    WorkersStatus,
)

STATUS_CACHE_S = 10.0
PROBE_TIMEOUT_S = 3.0
# Redis INFO and the worker count, per server: no status waits on a dead one for long.
REDIS_TIMEOUT_S = 3.0
_REDIS_FAILURES: tuple[type[Exception], ...] = (*REDIS_ERRORS, TimeoutError)


class StatusCache:
    """The latest status for `ttl_s`; one build at a time, shared by whoever waits."""

    def __init__(self, ttl_s: float = STATUS_CACHE_S) -> None:
        self.ttl_s = ttl_s
        self._value: StatusReport | None = None
        self._built_at = 0.0
        self._building: asyncio.Task[StatusReport] | None = None
        self.builds = 0

    async def get(self, build: Callable[[], Awaitable[StatusReport]]) -> StatusReport:
        if self._value is not None and time.monotonic() - self._built_at < self.ttl_s:
            return self._value
        if self._building is None:
            self._building = asyncio.ensure_future(self._build(build))
        # Shielded: a client that leaves does not cancel the build the others wait for.
        return await asyncio.shield(self._building)

    async def _build(self, build: Callable[[], Awaitable[StatusReport]]) -> StatusReport:
        try:
            self.builds += 1
            value = await build()
            self._value, self._built_at = value, time.monotonic()
            return value
        finally:
            self._building = None


async def build_status(settings: Settings, data: Redis, queue: Redis) -> StatusReport:
    """The deployment's status now: `data` and `queue` are the API's clients of the two
    roles (the same client when one Redis holds both)."""
    published, tools = await _published(queue)
    async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, follow_redirects=False) as http:
        models, services, redis, workers, servers = await asyncio.gather(
            _models(http, settings, published),
            _services(http, published),
            _redis(data, queue),
            _workers(queue),
            _mcp_servers(queue),
        )
    return StatusReport(
        version=version(),
        checked_at=time.time(),
        published_at=published.published_at if published else None,
        workers_version=published.version if published else None,
        models=models,
        tools=[
            ToolStatus(
                name=str(tool.get("name")),
                requires_confirmation=bool(tool.get("requires_confirmation")),
                services=[
                    s for tool_name, s in services if reaches(str(tool.get("name")), tool_name)
                ],
            )
            for tool in tools
        ],
        mcp_servers=servers,
        redis=redis,
        workers=workers,
    )


def reaches(name: str, service_tool: str) -> bool:
    """Whether the tool `name` uses a service published for `service_tool` (`ha_*`: every
    Home Assistant tool)."""
    if service_tool.endswith("*"):
        return name.startswith(service_tool[:-1])
    return name == service_tool


async def _published(queue: Redis) -> tuple[Deployment | None, list[dict[str, Any]]]:
    try:
        raw_deployment, raw_tools = await queue.mget(keys.DEPLOYMENT, keys.TOOLS)
    except REDIS_ERRORS:
        return None, []
    try:
        deployment = Deployment.model_validate_json(raw_deployment) if raw_deployment else None
    except ValidationError:  # written by a worker of another version
        deployment = None
    tools = orjson.loads(raw_tools) if raw_tools else []
    return deployment, [tool for tool in tools if isinstance(tool, dict)]


async def probe(http: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None) -> Probe:
    """One GET of `url`: any HTTP answer is reachable."""
    try:
        response = await http.get(url, headers=headers)
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__
        return Probe(reachable=False, status=None, detail=f"no answer: {reason}")
    return Probe(reachable=True, status=response.status_code, detail=f"HTTP {response.status_code}")


def _model_request(model: ModelFacts, settings: Settings) -> tuple[str, dict[str, str]]:
    """The request listing the upstream's models: with this process's own key when its
    settings name the same upstream (one deployment's processes share them), else
    without (an answer still shows the upstream is there)."""
    same = (model.provider, model.base_url) in {
        (m.provider, m.base_url) for m in models_of(settings)
    }
    if same:  # its own URL: the published one has its password hidden
        return models_request(model.provider, base_url_of(model.provider, settings), settings)
    return models_request(model.provider, model.base_url or "")


async def _models(
    http: httpx.AsyncClient, settings: Settings, published: Deployment | None
) -> list[ModelStatus]:
    if published is None:
        return []
    asked: dict[tuple[str, str], asyncio.Task[Probe]] = {}
    for model in published.models:
        if model.demo:
            continue
        url, headers = _model_request(model, settings)
        key = (url, str(sorted(headers.items())))
        if key not in asked:  # both roles on one upstream: asked once
            asked[key] = asyncio.ensure_future(probe(http, url, headers))
    out = []
    for model in published.models:
        found = None
        if not model.demo:
            url, headers = _model_request(model, settings)
            found = await asked[(url, str(sorted(headers.items())))]
        out.append(ModelStatus(**model.model_dump(), probe=found))
    return out


async def _services(
    http: httpx.AsyncClient, published: Deployment | None
) -> list[tuple[str, ServiceStatus]]:
    if published is None:
        return []
    urls = sorted({service.url for service in published.services})
    probes = dict(zip(urls, await asyncio.gather(*(probe(http, url) for url in urls)), strict=True))
    return [
        (s.tool, ServiceStatus(tool=s.tool, variable=s.variable, url=s.url, probe=probes[s.url]))
        for s in published.services
    ]


async def _redis(data: Redis, queue: Redis) -> list[RedisStatus]:
    roles: list[tuple[list[Literal["data", "queue"]], Redis]] = []
    if queue is data:
        roles.append((["data", "queue"], data))
    else:
        roles += [(["data"], data), (["queue"], queue)]
    return list(await asyncio.gather(*(_one_redis(*role) for role in roles)))


async def _one_redis(roles: list[Literal["data", "queue"]], client: Redis) -> RedisStatus:
    backend = backend_of(client)
    kind, where = backend.kind, backend.describe()
    try:
        async with asyncio.timeout(REDIS_TIMEOUT_S):
            servers = await server_facts(client)
    except _REDIS_FAILURES as exc:
        reason = str(exc) or type(exc).__name__
        return RedisStatus(roles=roles, kind=kind, url=where, servers=[], error=reason)
    return RedisStatus(roles=roles, kind=kind, url=where, servers=servers, error=None)


async def _mcp_servers(queue: Redis) -> list[McpServerStatus]:
    try:
        async with asyncio.timeout(REDIS_TIMEOUT_S):
            return await mcp_servers(queue)
    except _REDIS_FAILURES:
        return []


async def _workers(queue: Redis) -> WorkersStatus:
    try:
        async with asyncio.timeout(REDIS_TIMEOUT_S):
            alive = await queue.zcount(keys.WORKERS, time.time() - keys.WORKER_FRESH_S, "+inf")
    except _REDIS_FAILURES:
        return WorkersStatus(alive=None, fresh_within_s=keys.WORKER_FRESH_S)
    return WorkersStatus(alive=int(alive), fresh_within_s=keys.WORKER_FRESH_S)
