"""`bernard doctor`: is this deployment healthy, and if not, what to do about it.

Each check ends `ok`, `warn` (Bernard runs, but something will hurt) or `fail` (something
Bernard needs is missing), with the fix. It checks what the processes share: Redis
(reachable, its version, its eviction policy, AOF), the workers (reporting in, as
`GET /readyz` counts them: shared/keys.py `WORKERS`), the API, the LLM endpoint (one
one-token call per model), and the tools (`GET /v1/tools`, and each configured service
answering). The LLM and the services are read from this process's settings (the
environment and `.env`, as `./run` reads them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import httpx
import redis
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cli.client import Api, ApiError
from launcher.redis_server import redact
from shared import keys
from shared.settings import Settings

Status = Literal["ok", "warn", "fail"]
# A worker renews its entry in `keys.WORKERS` every lease renewal; `/readyz` takes 15 s of
# silence for dead (api/routes/health.py), and so does this.
WORKER_FRESH_S = 15
MIN_REDIS = (6, 2)  # Streams with MINID (deploy/k8s/redis.md)
RECOMMENDED_REDIS = (7, 0)
# Where `./run` remembers the port of its own Redis (launcher/cli.py STATE_DIR).
EMBEDDED_PORT_FILE = Path(".bernard") / "redis.port"
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
    if "redis_url" in settings.model_fields_set:
        return settings.redis_url
    try:
        port = int(EMBEDDED_PORT_FILE.read_text().strip())
    except (OSError, ValueError):
        return settings.redis_url
    return f"redis://127.0.0.1:{port}/0"


def redis_checks(url: str) -> list[Check]:
    """Reachability, then (when it answers) version, eviction, AOF and workers."""
    client = redis.Redis.from_url(url, socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S)
    try:
        try:
            client.ping()
            info = cast(dict[str, Any], client.info())
        except (redis.RedisError, OSError) as exc:
            return [
                Check(
                    "Redis",
                    "fail",
                    f"no Redis answers at {redact(url)}: {exc}",
                    "start Redis, or point REDIS_URL (or --redis-url) at the one Bernard uses; "
                    "with REDIS_URL unset, ./run starts its own",
                )
            ]
        checks = [Check("Redis", "ok", f"{redact(url)} answers")]
        checks.append(redis_version_check(str(info.get("redis_version", "?"))))
        try:
            config = cast(dict[str, Any], client.config_get("maxmemory-policy"))
            policy: str | None = str(config.get("maxmemory-policy", ""))
        except redis.RedisError:
            policy = None
        checks.append(eviction_check(policy, int(info.get("maxmemory", 0) or 0)))
        checks.append(aof_check(bool(int(info.get("aof_enabled", 0) or 0))))
        workers = cast(int, client.zcount(keys.WORKERS, time.time() - WORKER_FRESH_S, "+inf"))
        checks.append(workers_check(workers))
        return checks
    finally:
        client.close()


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

    add(redis_checks(redis_url))
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
