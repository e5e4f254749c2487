"""How `bernard doctor` judges what it finds (cli/doctor.py): each finding ok, warn or fail,
and a fix for all but ok."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.client import Api
from cli.doctor import (
    Check,
    aof_check,
    eviction_check,
    mcp_checks,
    model_check,
    model_checks,
    redis_checks,
    redis_version_check,
    run_checks,
    server_redis_checks,
    status_checks,
    tool_checks,
    version_check,
    workers_check,
)
from launcher.children import stop_process
from launcher.redis_server import find_redis_binary, free_port, start_redis
from shared import keys
from shared.connection import redact
from shared.mcp_health import McpServerStatus
from shared.redis_checks import ServerFacts
from shared.status import (
    ModelStatus,
    Probe,
    RedisStatus,
    ServiceStatus,
    StatusReport,
    ToolStatus,
    WorkersStatus,
)


def test_no_check_shows_the_credentials_inside_a_url() -> None:
    """The API's URL and what its failure says, as the doctor prints them (nothing answers
    at this port)."""
    dead = free_port()
    api = Api(f"http://me:api-pa55@127.0.0.1:{dead}/?token=api-t0ken", timeout_s=1.0)
    try:
        checks = run_checks(api, None, None, lambda check: None)
    finally:
        api.close()
    said = " ".join(check.detail for check in checks)
    assert checks[0].status == "fail"
    assert f"http://me:***@127.0.0.1:{dead}/?token=***" in said
    assert "api-pa55" not in said and "api-t0ken" not in said


@pytest.mark.parametrize(
    ("version", "status"),
    [
        ("7.0.15", "ok"),
        ("7.2.4", "ok"),
        ("8.0.0", "ok"),
        ("6.2.14", "warn"),
        ("6.0.9", "fail"),
        ("5.0.7", "fail"),
        ("unknown", "warn"),
    ],
)
def test_redis_versions(version: str, status: str) -> None:
    assert redis_version_check(version).status == status


@pytest.mark.parametrize(
    ("policy", "maxmemory", "status"),
    [
        ("noeviction", 0, "ok"),
        ("noeviction", 2**30, "ok"),
        ("allkeys-lru", 2**30, "fail"),
        ("allkeys-lfu", 2**30, "fail"),
        ("allkeys-lru", 0, "warn"),
        ("volatile-lru", 2**30, "warn"),
        ("volatile-ttl", 0, "warn"),
        (None, 0, "warn"),
    ],
)
def test_eviction_policies(policy: str | None, maxmemory: int, status: str) -> None:
    assert eviction_check(policy, maxmemory).status == status


@pytest.mark.parametrize(
    ("check", "status"),
    [
        (aof_check(True), "ok"),
        (aof_check(False), "warn"),
        (workers_check(2), "ok"),
        (workers_check(0), "fail"),
    ],
)
def test_persistence_and_workers(check: Check, status: str) -> None:
    assert check.status == status


@pytest.mark.parametrize(
    "check",
    [
        redis_version_check("6.0.0"),
        eviction_check("allkeys-lru", 1),
        eviction_check("volatile-lru", 1),
        eviction_check(None, 0),
        aof_check(False),
        workers_check(0),
    ],
    ids=lambda c: f"{c.name}-{c.status}",
)
def test_every_warning_and_failure_says_how_to_fix_it(check: Check) -> None:
    assert check.status != "ok" and check.fix


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[int]:
    """The port of a Redis of this test's own (its `WORKERS` is nobody else's)."""
    port = free_port()
    proc = start_redis(find_redis_binary(), port, tmp_path)
    try:
        yield port
    finally:
        stop_process(proc)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://:s3cret@127.0.0.1:{0},127.0.0.1:{1}/bernard", "No master found"),
        ("redis+cluster://:s3cret@127.0.0.1:{0},127.0.0.1:{1}", "cannot be connected"),
        ("redis+sentinel://:s3cret@127.0.0.1:{0}", "name the Sentinel service"),
        ("redis+cluster://:s3cret@127.0.0.1:{0}/1", "only database 0"),
    ],
)
def test_an_unreachable_or_wrong_sentinel_or_cluster_url_is_one_clean_failure(
    url: str, says: str
) -> None:
    url = url.format(free_port(), free_port())
    checks = redis_checks(url)
    assert [(check.name, check.status) for check in checks] == [("Redis", "fail")]
    assert redact(url) in checks[0].detail and says in checks[0].detail
    assert "s3cret" not in checks[0].detail
    assert checks[0].fix


def test_workers_are_counted_on_the_queue_role_redis(own_redis: int) -> None:
    data, queue = f"redis://127.0.0.1:{own_redis}/1", f"redis://127.0.0.1:{own_redis}/0"
    with redis.Redis.from_url(queue) as client:
        client.zadd(keys.WORKERS, {"worker-a": time.time(), "worker-b": time.time()})
    checks = {check.name: check for check in redis_checks(data, queue_url=queue)}
    assert checks["Redis"].detail == f"{data} answers"
    assert (checks["Workers"].status, checks["Workers"].detail) == (
        "ok",
        "2 workers reported in the last 15 s",
    )
    # Without a queue role of its own, the data role's Redis is the queue's: none there.
    assert {check.name: check for check in redis_checks(data)}["Workers"].status == "fail"


def test_doctor_reads_the_workers_on_bernard_queue_redis_url(own_redis: int) -> None:
    data, queue = f"redis://127.0.0.1:{own_redis}/1", f"redis://127.0.0.1:{own_redis}/0"
    with redis.Redis.from_url(queue) as client:
        client.zadd(keys.WORKERS, {"worker-a": time.time()})
    api = Api(f"http://127.0.0.1:{free_port()}")  # nothing answers there: a failed check
    try:
        checks = {check.name: check for check in run_checks(api, data, queue, lambda _: None)}
    finally:
        api.close()
    assert checks["API"].status == "fail"
    assert (checks["Workers"].status, checks["Workers"].detail) == (
        "ok",
        "1 worker reported in the last 15 s",
    )


def test_a_queue_role_redis_that_does_not_answer_fails_the_workers_check_alone(
    own_redis: int,
) -> None:
    data, queue = f"redis://127.0.0.1:{own_redis}/0", f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    checks = {check.name: check for check in redis_checks(data, queue_url=queue)}
    assert checks["Redis"].status == "ok"
    assert checks["Workers"].status == "fail"
    assert redact(queue) in checks["Workers"].detail
    assert "s3cret" not in checks["Workers"].detail
    assert "BERNARD_QUEUE_REDIS_URL" in checks["Workers"].fix


# -- what the server's status says (GET /v1/status) --------------------------------------------

ANSWERS = Probe(reachable=True, status=200, detail="HTTP 200")


def model(probe: Probe | None, *, demo: bool = False, provider: str = "openai") -> ModelStatus:
    return ModelStatus(
        role="router",
        provider="demo" if demo else provider,  # type: ignore[arg-type]
        model="bernard-demo" if demo else "qwen",
        base_url=None if demo else "http://llm:8080/v1",
        demo=demo,
        probe=probe,
    )


@pytest.mark.parametrize(
    ("found", "status", "detail"),
    [
        (model(None, demo=True), "ok", "offline demo model"),
        (model(ANSWERS), "ok", "qwen at http://llm:8080/v1 answers"),
        (
            model(Probe(reachable=True, status=401, detail="HTTP 401")),
            "fail",
            "qwen at http://llm:8080/v1: the upstream refuses the key (HTTP 401)",
        ),
        (
            model(Probe(reachable=True, status=404, detail="HTTP 404")),
            "warn",
            "qwen at http://llm:8080/v1 answers HTTP 404 to GET /models",
        ),
        (
            model(Probe(reachable=False, status=None, detail="no answer: refused")),
            "fail",
            "qwen at http://llm:8080/v1: no answer: refused",
        ),
    ],
)
def test_a_model_as_the_server_reports_it(found: ModelStatus, status: str, detail: str) -> None:
    check = model_check(found)
    assert (check.name, check.status) == ("LLM (router)", status)
    assert check.detail.startswith(detail)
    assert check.status == "ok" or "where the workers run" in check.fix


def a_status(**values: Any) -> StatusReport:
    fields: dict[str, Any] = {
        "version": "0.1.0",
        "checked_at": 1.0,
        "published_at": 1.0,
        "workers_version": "0.1.0",
        "models": [],
        "tools": [],
        "mcp_servers": [],
        "redis": [],
        "workers": WorkersStatus(alive=1, fresh_within_s=15),
    }
    return StatusReport(**{**fields, **values})


def server(node: str, version: str = "7.2.4", policy: str | None = "noeviction") -> ServerFacts:
    return ServerFacts(
        node=node,
        version=version,
        role="master",
        maxmemory=0,
        maxmemory_policy=policy,
        aof_enabled=True,
    )


def lines(checks: list[Check]) -> list[tuple[str, str, str]]:
    return [(check.status, check.name, check.detail) for check in checks]


def test_the_servers_redis_is_judged_as_it_reports_it() -> None:
    one = RedisStatus(
        roles=["data", "queue"],
        kind="cluster",
        url="redis+cluster://10.0.0.1:7000",
        servers=[server("10.0.0.1:7000"), server("10.0.0.2:7000", version="6.2.1")],
        error=None,
    )
    assert lines(server_redis_checks(a_status(redis=[one]))) == [
        ("ok", "Redis", "redis+cluster://10.0.0.1:7000 answers (cluster; data and queue)"),
        (
            "warn",
            "Redis version",
            "Redis 6.2.1 (primary 10.0.0.2:7000)",
        ),
        ("ok", "Eviction policy", "noeviction (every primary)"),
        ("ok", "Persistence", "AOF on (every primary)"),
    ]
    down = RedisStatus(
        roles=["queue"], kind="single", url="redis://q:6379/0", servers=[], error="refused"
    )
    (check,) = server_redis_checks(a_status(redis=[down]))
    assert (check.status, check.detail) == (
        "fail",
        "the server cannot reach its queue Redis at redis://q:6379/0: refused",
    )


def test_the_tools_and_each_service_once() -> None:
    ha = ServiceStatus(
        tool="ha_*",
        variable="BERNARD_HA_URL",
        url="http://ha:8123",
        probe=Probe(reachable=False, status=None, detail="no answer: refused"),
    )
    search = ServiceStatus(
        tool="web_search", variable="BERNARD_SEARXNG_URL", url="http://searx", probe=ANSWERS
    )
    tools = [
        ToolStatus(name="web_search", requires_confirmation=False, services=[search]),
        ToolStatus(name="ha_list", requires_confirmation=False, services=[ha]),
        ToolStatus(name="ha_call_service", requires_confirmation=True, services=[ha]),
    ]
    assert lines(tool_checks(a_status(tools=tools))) == [
        ("ok", "Tools", "web_search, ha_list, ha_call_service"),
        ("ok", "Tool web_search", "http://searx answers (200)"),
        (
            "warn",
            "Tool ha_*",
            "http://ha:8123 does not answer the server (no answer: refused): the tool will fail",
        ),
    ]
    assert lines(tool_checks(a_status(tools=[]))) == [
        ("fail", "Tools", "no worker has published its tools")
    ]


def test_nothing_published_and_a_version_apart_are_said() -> None:
    assert lines(model_checks(a_status(published_at=None))) == [
        ("fail", "LLM", "no worker has said which models it runs")
    ]
    assert version_check(a_status(workers_version="0.0.9")).status == "warn"
    checks = {
        c.name: c
        for c in status_checks(a_status(workers=WorkersStatus(alive=None, fresh_within_s=15)))
    }
    assert checks["Workers"].status == "fail"
    assert "Workers" not in {c.name for c in status_checks(a_status(), with_redis=False)}


MCP_FIX = (
    "check its url and headers (or command) in BERNARD_MCP_CONFIG; the workers keep trying, "
    "and their log says why"
)


def mcp(state: str, ready: int, workers: int, error: str | None = None) -> McpServerStatus:
    return McpServerStatus.model_validate(
        {
            "name": "home",
            "transport": "http",
            "state": state,
            "tools": 7,
            "ready_workers": ready,
            "workers": workers,
            "error": error,
        }
    )


@pytest.mark.parametrize(
    ("server", "check"),
    [
        (mcp("ready", 2, 2), ("ok", "MCP home", "ready on 2 workers: 7 tools")),
        (mcp("ready", 1, 1), ("ok", "MCP home", "ready on 1 worker: 7 tools")),
        (
            mcp("down", 1, 2, "ConnectError: All connection attempts failed"),
            (
                "warn",
                "MCP home",
                "down on 1 of 2 workers: ConnectError: All connection attempts failed",
            ),
        ),
        (mcp("connecting", 0, 1), ("warn", "MCP home", "connecting on 1 of 1 worker")),
    ],
)
def test_an_mcp_server_not_ready_on_every_worker_is_a_warning(
    server: McpServerStatus, check: tuple[str, str, str]
) -> None:
    (found,) = mcp_checks(a_status(mcp_servers=[server]))
    assert (found.status, found.name, found.detail) == check
    assert found.fix == ("" if found.status == "ok" else MCP_FIX)


def test_no_mcp_server_means_no_mcp_check() -> None:
    assert mcp_checks(a_status()) == []


def test_a_ready_mcp_server_whose_tools_are_left_out_is_a_warning_naming_them() -> None:
    server = mcp("ready", 1, 1).model_copy(
        update={"warnings": ["1 tool left out, the input schema unusable: lookup (why)"]}
    )
    (found,) = mcp_checks(a_status(mcp_servers=[server]))
    assert (found.status, found.detail, found.fix) == (
        "warn",
        "ready on 1 worker: 7 tools; 1 tool left out, the input schema unusable: lookup (why)",
        "the tools named are not offered: fix them on the server, or the bound named",
    )
