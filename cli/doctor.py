"""`bernard doctor`: is this deployment healthy, and if not, what to do about it.

Each check ends `ok`, `warn` (Bernard runs, but something will hurt) or `fail` (something
Bernard needs is missing), with the fix. Doctor asks the server it is pointed at (`--url`,
`BERNARD_URL`) what only the server knows, through `GET /v1/status` (api/status.py): its
models and whether they answer, its tools and their services, the MCP servers its workers
connect to, its Redis (each primary of a Cluster: version, eviction policy, AOF) and the
workers alive. It checks itself what only
it can: that the URL answers and the key is accepted. It reads no settings of its own for
the server's facts, so a second terminal, or one outside the project folder, sees the
server as it is; `--redis-url` adds a check of a Redis from here (shared/connection.py
reads any of its forms).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

import httpx
from redis.asyncio import Redis
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cli.client import Api, ApiCallError
from shared import keys
from shared.connection import REDIS_ERRORS, connect, connect_data, redact
from shared.redaction import redact_urls
from shared.redis_checks import ServerFacts, redis_error_text, server_facts
from shared.status import ModelStatus, StatusReport

CheckStatus = Literal["ok", "warn", "fail"]
T = TypeVar("T")
MIN_REDIS = (6, 2)  # Streams with MINID (deploy/k8s/redis.md)
RECOMMENDED_REDIS = (7, 0)
REDIS_CHECK_TIMEOUT_S = 5.0
_STYLES = {"ok": "green", "warn": "yellow", "fail": "red"}


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: CheckStatus
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        # Every URL a check names (the API's, a service's, an error's) without credentials.
        object.__setattr__(self, "detail", redact_urls(self.detail))


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
        "start one: python -m worker (./run and bernard serve start one)",
    )


_RANK: dict[CheckStatus, int] = {"ok": 0, "warn": 1, "fail": 2}
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
        servers = await _on_redis(url, _ping_and_read, data=True)
    except _UNREACHABLE as exc:
        return [Check("Redis", "fail", _unreachable(exc, url), _REDIS_FIX)]
    checks = [Check("Redis", "ok", f"{redact(url)} answers"), *facts_checks(servers)]
    try:
        workers = await _on_redis(
            queue_url,
            lambda client: client.zcount(keys.WORKERS, time.time() - keys.WORKER_FRESH_S, "+inf"),
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


async def _ping_and_read(client: Redis) -> list[ServerFacts]:
    await client.ping()
    return await server_facts(client)


def facts_checks(servers: list[tuple[str, ServerFacts]] | list[ServerFacts]) -> list[Check]:
    """Version, eviction and AOF of each server (a name and its facts, or facts named by
    their Cluster node): for each, the worst, naming the server that differs."""
    named = [item if isinstance(item, tuple) else (item.node, item) for item in servers]

    def worst(check: Callable[[ServerFacts], Check]) -> Check:
        return _worst([(node, check(facts)) for node, facts in named])

    return [
        worst(lambda facts: redis_version_check(facts.version)),
        worst(lambda facts: eviction_check(facts.maxmemory_policy, facts.maxmemory)),
        worst(lambda facts: aof_check(facts.aof_enabled)),
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
    `REDIS_CHECK_TIMEOUT_S` and without retries; `ValueError` for a URL it cannot use."""
    client = connect_data(url, retries=0) if data else connect(url, retries=0)
    try:
        async with asyncio.timeout(REDIS_CHECK_TIMEOUT_S):
            return await use(client)
    finally:
        await client.aclose()


def _unreachable(exc: Exception, url: str) -> str:
    if isinstance(exc, ValueError):
        return f"cannot use {redact(url)}: {redis_error_text(exc, url)}"
    if isinstance(exc, TimeoutError) and not str(exc):  # the deadline of `_on_redis`
        return f"no Redis answers at {redact(url)} within {REDIS_CHECK_TIMEOUT_S:g} s"
    return f"no Redis answers at {redact(url)}: {redis_error_text(exc, url)}"


def api_checks(api: Api) -> tuple[list[Check], StatusReport | None]:
    """The URL answering and the key accepted, and the server's status (None when it
    cannot be read)."""
    try:
        api.http.get("/healthz").raise_for_status()
    except httpx.HTTPError as exc:
        return [
            Check(
                "API",
                "fail",
                f"nothing answers at {api.base_url}: {exc}",
                "start it (./run, or bernard serve), or pass --url / set BERNARD_URL",
            )
        ], None
    checks = [Check("API", "ok", f"{api.base_url} answers")]
    try:
        body = api.get("/v1/status")
    except ApiCallError as exc:
        if exc.status == 401:
            fix = "pass --key or set BERNARD_API_KEY to one of the server's BERNARD_API_KEYS"
            return [*checks, Check("Key", "fail", f"the API refuses it: {exc.message}", fix)], None
        fix = (
            "a server older than this command has no /v1/status: update it"
            if exc.status == 404
            else ""
        )
        return [*checks, Check("Status", "fail", f"GET /v1/status: {exc}", fix)], None
    checks.append(Check("Key", "ok", "accepted" if api.has_key else "the API needs none"))
    return checks, StatusReport.model_validate(body)


def status_checks(status: StatusReport, *, with_redis: bool = True) -> list[Check]:
    """What the server's status says, judged (`with_redis`: its Redis and workers too)."""
    checks = [version_check(status)]
    if with_redis:
        checks += server_redis_checks(status)
        checks.append(
            workers_check(status.workers.alive)
            if status.workers.alive is not None
            else Check(
                "Workers",
                "fail",
                "the server cannot count them: its queue role's Redis does not answer",
                "start it, or point BERNARD_QUEUE_REDIS_URL at the Redis the workers use",
            )
        )
    checks += model_checks(status)
    checks += tool_checks(status)
    checks += mcp_checks(status)
    return checks


def version_check(status: StatusReport) -> Check:
    if status.workers_version is None or status.workers_version == status.version:
        return Check("Version", "ok", f"Bernard {status.version}")
    return Check(
        "Version",
        "warn",
        f"the API runs Bernard {status.version}, the workers {status.workers_version}",
        "run one version everywhere (an upgrade half done?)",
    )


def server_redis_checks(status: StatusReport) -> list[Check]:
    """Each Redis the server uses answering it, then version, eviction and AOF: the worst
    of every server's, naming the one that differs."""
    checks: list[Check] = []
    servers: list[tuple[str, ServerFacts]] = []
    for redis in status.redis:
        roles = " and ".join(redis.roles)
        if redis.error is not None:
            checks.append(
                Check(
                    "Redis",
                    "fail",
                    f"the server cannot reach its {roles} Redis at {redis.url}: {redis.error}",
                    "start it, or point REDIS_URL (BERNARD_QUEUE_REDIS_URL for the queue) "
                    "where the server runs at the Redis Bernard uses",
                )
            )
            continue
        checks.append(Check("Redis", "ok", f"{redis.url} answers ({redis.kind}; {roles})"))
        servers += [(facts.node or redis.url, facts) for facts in redis.servers]
    return [*checks, *facts_checks(servers)] if servers else checks


def model_checks(status: StatusReport) -> list[Check]:
    """Each of the workers' two models: the demo model, or its upstream answering."""
    if status.published_at is None:
        return [
            Check(
                "LLM",
                "fail",
                "no worker has said which models it runs",
                "start a worker (it publishes them as it starts)",
            )
        ]
    return [model_check(model) for model in status.models]


def model_check(model: ModelStatus) -> Check:
    name = f"LLM ({model.role})"
    if model.demo or model.probe is None:
        return Check(
            name,
            "ok",
            "offline demo model (the workers have no OPENAI_BASE_URL, OPENAI_API_KEY or "
            "ANTHROPIC_* set)",
        )
    where = f"{model.model} at {model.base_url}"
    variables = (
        "ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY"
        if model.provider == "anthropic"
        else ("OPENAI_BASE_URL / OPENAI_API_KEY")
    )
    probe = model.probe
    if not probe.reachable:
        return Check(
            name, "fail", f"{where}: {probe.detail}", f"check {variables} where the workers run"
        )
    if probe.status in (401, 403):
        return Check(
            name,
            "fail",
            f"{where}: the upstream refuses the key ({probe.detail})",
            f"check {variables} where the workers run",
        )
    if probe.status is not None and probe.status >= 400:
        return Check(
            name,
            "warn",
            f"{where} answers {probe.detail} to GET /models",
            f"check {variables} and BERNARD_{model.role.upper()}_MODEL where the workers run",
        )
    return Check(name, "ok", f"{where} answers")


def tool_checks(status: StatusReport) -> list[Check]:
    """The tools the workers offer, then each service they reach answering (any HTTP
    answer: it is there)."""
    if not status.tools:
        return [
            Check(
                "Tools",
                "fail",
                "no worker has published its tools",
                "start a worker (it publishes them as it starts)",
            )
        ]
    checks = [Check("Tools", "ok", ", ".join(tool.name for tool in status.tools))]
    seen: set[tuple[str, str]] = set()
    for tool in status.tools:
        for service in tool.services:
            if (service.tool, service.variable) in seen:
                continue
            seen.add((service.tool, service.variable))
            name = f"Tool {service.tool}"
            if service.probe.reachable:
                checks.append(Check(name, "ok", f"{service.url} answers ({service.probe.status})"))
            else:
                checks.append(
                    Check(
                        name,
                        "warn",
                        f"{service.url} does not answer the server "
                        f"({service.probe.detail}): the tool will fail",
                        f"fix {service.variable}, or set it empty to turn the tool off",
                    )
                )
    return checks


def mcp_checks(status: StatusReport) -> list[Check]:
    """Each MCP server the workers connect to (shared/mcp_health.py): one that is not ready
    on every worker is a warning (Bernard runs without its tools; the workers keep trying),
    and so is one that lists tools Bernard leaves out (their schemas, or the bounds)."""
    checks = []
    for server in status.mcp_servers:
        name = f"MCP {server.name}"
        if server.state == "ready":
            ready = f"ready on {_count(server.workers, 'worker')}: {server.tools} tools"
            if not server.warnings:
                checks.append(Check(name, "ok", ready))
                continue
            fix = "the tools named are not offered: fix them on the server, or the bound named"
            checks.append(Check(name, "warn", "; ".join([ready, *server.warnings]), fix))
            continue
        detail = f"{server.state} on {server.workers - server.ready_workers} of " + _count(
            server.workers, "worker"
        )
        fix = (
            "check its url and headers (or command) in BERNARD_MCP_CONFIG; the workers keep "
            "trying, and their log says why"
        )
        checks.append(
            Check(name, "warn", f"{detail}: {server.error}" if server.error else detail, fix)
        )
    return checks


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def run_checks(
    api: Api,
    redis_url: str | None,
    queue_url: str | None,
    report: Callable[[Check], None],
) -> list[Check]:
    """Every check, in order, each `report`ed as soon as it is known: the API and the key,
    then (with `redis_url`) that Redis from here, then what the server's status says."""
    done: list[Check] = []

    def add(checks: list[Check]) -> None:
        for check in checks:
            done.append(check)
            report(check)

    found, status = api_checks(api)
    add(found)
    if redis_url is not None:
        add(redis_checks(redis_url, queue_url))
    if status is not None:
        add(status_checks(status, with_redis=redis_url is None))
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


def doctor(console: Console, api: Api, redis_url: str | None, queue_url: str | None) -> int:
    """Print every check; the exit code is 1 when any failed."""
    checks = run_checks(api, redis_url, queue_url, lambda check: print_check(console, check))
    failed = [check.name for check in checks if check.status == "fail"]
    warned = [check.name for check in checks if check.status == "warn"]
    if failed:
        console.print(f"\n[red]{len(failed)} failed[/]: {escape(', '.join(failed))}")
        return 1
    summary = f"{len(warned)} warning{'s' if len(warned) != 1 else ''}" if warned else "all ok"
    console.print(f"\n[green]Healthy[/] ({summary}).")
    return 0
