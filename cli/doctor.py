"""`bernard doctor`: is this deployment healthy, and if not, what to do about it.

Each check ends `ok`, `warn` (Bernard runs, but something will hurt) or `fail` (something
Bernard needs is missing), with the fix. It checks what the processes share: Redis
(reachable, its version, its eviction policy, AOF; any URL shared/connection.py reads, each
primary of a Cluster), the workers (reporting in on the queue role's Redis, as `GET /readyz`
counts them: shared/keys.py `WORKERS`), the API, the LLM endpoint (one
one-token call per model), and the tools (`GET /v1/tools`, and each configured service
answering). The LLM and the services are read from this process's settings (the
environment and `.env`, as `./run` reads them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar, cast

import httpx
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisError
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cli.client import Api, ApiError
from launcher.cli import STATE_DIR, configured_redis_url
from launcher.redis_server import embedded_redis_url, error_text
from shared import keys
from shared.connection import REDIS_ERRORS, connect, connect_data, is_cluster, redact
from shared.settings import Settings

Status = Literal["ok", "warn", "fail"]
T = TypeVar("T")
# A worker renews its entry in `keys.WORKERS` every lease renewal; `/readyz` takes 15 s of
# silence for dead (api/routes/health.py), and so does this.
WORKER_FRESH_S = 15
MIN_REDIS = (6, 2)  # Streams with MINID (deploy/k8s/redis.md)
RECOMMENDED_REDIS = (7, 0)
TIMEOUT_S = 5.0
LLM_TIMEOUT_S = 30.0
_STYLES = {"ok": "green", "warn": "yellow", "fail": "red"}


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


def redis_version_check(version: str) -> Check:
    try:
        found = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return Check("Redis version", "warn", f"unrecognised version {version!r}")
    if found < MIN_REDIS:
        return Check(
            "Redis version",
            "fail",
            f"Redis {version} is older than 6.2",
            "upgrade to Redis 7 (Bernard's streams need 6.2 or newer)",
        )
    if found < RECOMMENDED_REDIS:
        return Check("Redis version", "warn", f"Redis {version}", "Redis 7 is recommended")
    return Check("Redis version", "ok", f"Redis {version}")


def eviction_check(policy: str | None, maxmemory: int) -> Check:
    """`noeviction` is the one policy under which Redis never drops a live stream, lease or
    queued job: a full Redis refuses writes, and turns fail visibly instead."""
    fix = "CONFIG SET maxmemory-policy noeviction (and maxmemory-policy noeviction in redis.conf)"
    if policy is None:
        return Check(
            "Eviction policy",
            "warn",
            "cannot read it (CONFIG is disabled on this Redis)",
            "make sure the server runs with maxmemory-policy noeviction",
        )
    if policy == "noeviction":
        return Check("Eviction policy", "ok", "noeviction")
    if policy.startswith("allkeys") and maxmemory > 0:
        return Check(
            "Eviction policy",
            "fail",
            f"{policy}: when memory runs out Redis evicts live turn streams and records",
            fix,
        )
    detail = f"{policy}: every turn key has a TTL, so Redis may evict live ones"
    if maxmemory == 0:
        detail = f"{policy}, without maxmemory: nothing is evicted until a maxmemory is set"
    return Check("Eviction policy", "warn", detail, fix)


def aof_check(enabled: bool) -> Check:
    if enabled:
        return Check("Persistence", "ok", "AOF on")
    return Check(
        "Persistence",
        "warn",
        "AOF off: a Redis restart loses queued turns, open streams and conversations",
        "CONFIG SET appendonly yes (and appendonly yes, appendfsync everysec in redis.conf)",
    )


def workers_check(count: int) -> Check:
    if count:
        plural = "s" if count > 1 else ""
        return Check("Workers", "ok", f"{count} worker{plural} reported in the last 15 s")
    return Check(
        "Workers",
        "fail",
        "no worker reported in the last 15 s: turns stay queued",
        "start one: arq worker.main.WorkerSettings (./run and bernard serve start one)",
    )


def default_redis_url(settings: Settings) -> str:
    """REDIS_URL when it is set; else the Redis `./run` started here, if it did; else the
    default."""
    configured = configured_redis_url(settings)
    if configured is not None:
        return configured
    return embedded_redis_url(STATE_DIR) or settings.redis_url


_RANK: dict[Status, int] = {"ok": 0, "warn": 1, "fail": 2}
# A URL the client cannot use, or a Redis that does not answer (`_on_redis`).
_UNREACHABLE: tuple[type[Exception], ...] = (ValueError, *REDIS_ERRORS)
_REDIS_FIX = (
    "start Redis, or point REDIS_URL (or --redis-url) at the one Bernard uses; "
    "with REDIS_URL unset, ./run starts its own"
)


def redis_checks(url: str, queue_url: str | None = None) -> list[Check]:
    """Reachability, then (when it answers) version, eviction and AOF of the Redis at `url`
    (each primary of a Cluster), and the workers reporting on the queue role's Redis,
    `queue_url` (`BERNARD_QUEUE_REDIS_URL`; `url` when None): shared/keys.py `WORKERS`.

    `url` is any form shared/connection.py reads. This runs its own short event loop.
    """
    return asyncio.run(_redis_checks(url, queue_url or url))


async def _redis_checks(url: str, queue_url: str) -> list[Check]:
    try:
        servers = await _on_redis(url, _server_facts, data=True)
    except _UNREACHABLE as exc:
        return [Check("Redis", "fail", _unreachable(exc, url), _REDIS_FIX)]

    def worst(check: Callable[[_Facts], Check]) -> Check:
        return _worst([(facts.node, check(facts)) for facts in servers])

    checks = [
        Check("Redis", "ok", f"{redact(url)} answers"),
        worst(lambda facts: redis_version_check(str(facts.info.get("redis_version", "?")))),
        worst(lambda facts: eviction_check(facts.policy, int(facts.info.get("maxmemory") or 0))),
        worst(lambda facts: aof_check(bool(int(facts.info.get("aof_enabled") or 0)))),
    ]
    try:
        workers = await _on_redis(
            queue_url,
            lambda client: client.zcount(keys.WORKERS, time.time() - WORKER_FRESH_S, "+inf"),
            data=False,
        )
    except _UNREACHABLE as exc:
        checks.append(
            Check(
                "Workers",
                "fail",
                f"cannot count them on the queue role's Redis: {_unreachable(exc, queue_url)}",
                "start it, or point BERNARD_QUEUE_REDIS_URL at the Redis the workers use",
            )
        )
    else:
        checks.append(workers_check(int(workers)))
    return checks


@dataclass(frozen=True, slots=True)
class _Facts:
    """What the checks read from one server: INFO and its eviction policy (None when
    CONFIG is disabled). `node` names it among a Cluster's ("" for a lone server)."""

    node: str
    info: dict[str, Any]
    policy: str | None


async def _server_facts(client: Redis) -> list[_Facts]:
    await client.ping()
    if not is_cluster(client):
        info = cast(dict[str, Any], await client.info())
        try:
            config = cast(dict[str, Any], await client.config_get("maxmemory-policy"))
            policy: str | None = str(config.get("maxmemory-policy", ""))
        except RedisError:
            policy = None
        return [_Facts("", info, policy)]
    # Each primary keeps its own configuration. (A replica is checked once it is promoted:
    # the client knows the primaries alone.)
    cluster = cast(RedisCluster, client)
    infos = cast(dict[str, Any], await cluster.info(target_nodes=RedisCluster.PRIMARIES))
    try:
        configs = cast(
            dict[str, Any],
            await cluster.config_get("maxmemory-policy", target_nodes=RedisCluster.PRIMARIES),
        )
    except RedisError:
        configs = {}
    return [
        _Facts(
            node,
            info,
            str(configs[node].get("maxmemory-policy", "")) if node in configs else None,
        )
        for node, info in sorted(infos.items())
    ]


def _worst(found: list[tuple[str, Check]]) -> Check:
    """One check for every server: the worst of theirs, naming a Cluster primary that differs."""
    node, worst = max(found, key=lambda pair: _RANK[pair[1].status])
    if len(found) == 1:
        return worst
    if all(check == worst for _, check in found):
        return replace(worst, detail=f"{worst.detail} (every primary)")
    return replace(worst, detail=f"{worst.detail} (primary {node})")


async def _on_redis(url: str, use: Callable[[Redis], Awaitable[T]], *, data: bool) -> T:
    """`use` a client of `url` (the data role's `connect_data`, else `connect`), within
    `TIMEOUT_S` and without retries; `ValueError` for a URL it cannot use."""
    client = connect_data(url, retries=0) if data else connect(url, retries=0)
    try:
        async with asyncio.timeout(TIMEOUT_S):
            return await use(client)
    finally:
        await client.aclose()


def _unreachable(exc: Exception, url: str) -> str:
    if isinstance(exc, ValueError):
        return f"cannot use {redact(url)}: {error_text(exc, url)}"
    if isinstance(exc, TimeoutError) and not str(exc):  # the deadline of `_on_redis`
        return f"no Redis answers at {redact(url)} within {TIMEOUT_S:g} s"
    return f"no Redis answers at {redact(url)}: {error_text(exc, url)}"


def api_checks(api: Api) -> tuple[list[Check], list[str] | None]:
    """The API answering, and the tools it lists (None when it cannot say)."""
    try:
        response = api.http.get("/readyz")
    except httpx.HTTPError as exc:
        return [
            Check(
                "API",
                "fail",
                f"nothing answers at {api.base_url}: {exc}",
                "start it (./run, or bernard serve), or pass --url / set BERNARD_URL",
            )
        ], None
    checks = [
        Check("API", "ok", f"{api.base_url} answers")
        if response.status_code == 200
        else Check(
            "API",
            "fail",
            f"{api.base_url}/readyz answers {response.status_code}: {response.text[:200]}",
            "the API cannot reach Redis or sees no worker: see the checks above",
        )
    ]
    try:
        tools = api.get("/v1/tools")["data"]
    except ApiError as exc:
        fix = "pass --key or set BERNARD_API_KEY" if exc.status == 401 else ""
        return [*checks, Check("Tools", "fail", f"GET /v1/tools: {exc}", fix)], None
    names = [str(tool["name"]) for tool in tools]
    if not names:
        checks.append(
            Check(
                "Tools",
                "fail",
                "no worker has published its tools",
                "start a worker (it publishes them as it starts)",
            )
        )
    else:
        checks.append(Check("Tools", "ok", ", ".join(names)))
    return checks, names


def _one_token(settings: Settings, role: str) -> tuple[str, str, dict[str, str], dict[str, object]]:
    """The URL, headers and body of a one-token call to `role`'s model."""
    provider = settings.router_provider if role == "router" else settings.response_provider
    model = settings.router_model if role == "router" else settings.response_model
    messages = [{"role": "user", "content": "Say OK."}]
    if provider == "anthropic":
        base = (settings.anthropic_base_url or "https://api.anthropic.com").rstrip("/")
        headers = {"anthropic-version": "2023-06-01"}
        if settings.anthropic_api_key:
            headers["x-api-key"] = settings.anthropic_api_key
        body: dict[str, object] = {"model": model, "max_tokens": 1, "messages": messages}
        return model, f"{base}/v1/messages", headers, body
    base = (settings.openai_base_url or "https://api.openai.com/v1").rstrip("/")
    headers = {}
    if settings.openai_api_key:
        headers["Authorization"] = f"Bearer {settings.openai_api_key}"
    body = {"model": model, "max_tokens": 1, "messages": messages}
    return model, f"{base}/chat/completions", headers, body


def llm_checks(settings: Settings) -> list[Check]:
    """A one-token call to each model the workers use (the offline demo model needs none)."""
    if settings.demo_mode:
        return [
            Check(
                "LLM",
                "ok",
                "offline demo model (no OPENAI_BASE_URL, OPENAI_API_KEY or ANTHROPIC_* set)",
            )
        ]
    checks: list[Check] = []
    asked: set[tuple[str, str]] = set()
    for role in ("router", "response"):
        model, url, headers, body = _one_token(settings, role)
        if (url, model) in asked:
            continue
        asked.add((url, model))
        name = f"LLM ({role})"
        fix = (
            "check OPENAI_BASE_URL / OPENAI_API_KEY (or ANTHROPIC_*) and "
            f"BERNARD_{role.upper()}_MODEL"
        )
        started = time.monotonic()
        try:
            response = httpx.post(
                url, json=body, headers=headers, timeout=LLM_TIMEOUT_S, trust_env=True
            )
        except httpx.HTTPError as exc:
            checks.append(Check(name, "fail", f"{model} at {url}: {exc}", fix))
            continue
        took_ms = (time.monotonic() - started) * 1000
        if response.status_code == 200:
            checks.append(Check(name, "ok", f"{model} answered in {took_ms:.0f} ms"))
        else:
            checks.append(
                Check(
                    name,
                    "fail",
                    f"{model} at {url}: {response.status_code} {response.text[:200]}",
                    fix,
                )
            )
    return checks


def service_urls(settings: Settings) -> list[tuple[str, str, str]]:
    """(tool, variable, URL) of each service a tool reaches that is configured."""
    found = []
    if settings.searxng_url:
        found.append(("web_search", "BERNARD_SEARXNG_URL", settings.searxng_url))
    if settings.wikipedia_url:
        found.append(("wikipedia", "BERNARD_WIKIPEDIA_URL", settings.wikipedia_url))
    if settings.open_meteo_url and settings.open_meteo_geocoding_url:
        found.append(("weather", "BERNARD_OPEN_METEO_URL", settings.open_meteo_url))
        found.append(
            ("weather", "BERNARD_OPEN_METEO_GEOCODING_URL", settings.open_meteo_geocoding_url)
        )
    if settings.ha_url:
        found.append(("ha_*", "BERNARD_HA_URL", settings.ha_url))
    return found


def service_checks(settings: Settings) -> list[Check]:
    """Each configured service answering HTTP at all (any status: it is there)."""
    checks = []
    for tool, variable, url in service_urls(settings):
        name = f"Tool {tool}"
        try:
            response = httpx.get(url, timeout=settings.tool_http_timeout_s, trust_env=True)
        except httpx.HTTPError as exc:
            checks.append(
                Check(
                    name,
                    "warn",
                    f"{url} does not answer ({exc or type(exc).__name__}): the tool will fail",
                    f"fix {variable}, or set it empty to turn the tool off",
                )
            )
            continue
        checks.append(Check(name, "ok", f"{url} answers ({response.status_code})"))
    return checks


def run_checks(
    api: Api, settings: Settings, redis_url: str, report: Callable[[Check], None]
) -> list[Check]:
    """Every check, in order, each `report`ed as soon as it is known."""
    done: list[Check] = []

    def add(checks: list[Check]) -> None:
        for check in checks:
            done.append(check)
            report(check)

    add(redis_checks(redis_url, settings.queue_redis_url))
    api_found, _ = api_checks(api)
    add(api_found)
    add(llm_checks(settings))
    add(service_checks(settings))
    return done


def print_check(console: Console, check: Check) -> None:
    line = Table.grid(padding=(0, 1))
    line.add_column(width=4)
    line.add_column(width=18)
    line.add_column()
    line.add_row(
        Text(check.status, style=f"bold {_STYLES[check.status]}"),
        Text(check.name, style="bold"),
        Text(check.detail),
    )
    console.print(line)
    if check.fix and check.status != "ok":
        console.print(f"{'':24}[dim]fix:[/] {escape(check.fix)}", highlight=False)


def doctor(console: Console, api: Api, settings: Settings, redis_url: str) -> int:
    """Print every check; the exit code is 1 when any failed."""
    checks = run_checks(api, settings, redis_url, lambda check: print_check(console, check))
    failed = [check.name for check in checks if check.status == "fail"]
    warned = [check.name for check in checks if check.status == "warn"]
    if failed:
        console.print(f"\n[red]{len(failed)} failed[/]: {escape(', '.join(failed))}")
        return 1
    summary = f"{len(warned)} warning{'s' if len(warned) != 1 else ''}" if warned else "all ok"
    console.print(f"\n[green]Healthy[/] ({summary}).")
    return 0
