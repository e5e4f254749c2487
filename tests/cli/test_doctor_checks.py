"""How `bernard doctor` judges what it finds (cli/doctor.py): each finding ok, warn or fail,
and a fix for all but ok."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cli.client import Api
from cli.doctor import (
    Check,
    aof_check,
    default_redis_url,
    eviction_check,
    redis_checks,
    redis_version_check,
    run_checks,
    service_urls,
    workers_check,
)
from launcher.children import stop_process
from launcher.redis_server import find_redis_binary, free_port, start_redis
from shared import keys
from shared.connection import redact
from shared.settings import Settings


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


def test_the_redis_checked_is_redis_url_else_the_one_run_started_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert default_redis_url(Settings(_env_file=None)) == "redis://127.0.0.1:6379/0"
    (tmp_path / ".bernard").mkdir()
    (tmp_path / ".bernard" / "redis.port").write_text("41234\n")
    assert default_redis_url(Settings(_env_file=None)) == "redis://127.0.0.1:41234/0"
    monkeypatch.setenv("REDIS_URL", "redis://elsewhere:6379/2")
    assert default_redis_url(Settings(_env_file=None)) == "redis://elsewhere:6379/2"


def test_only_configured_services_are_checked() -> None:
    off = Settings(_env_file=None, wikipedia_url="", open_meteo_url="", open_meteo_geocoding_url="")
    assert service_urls(off) == []
    on = Settings(
        _env_file=None,
        searxng_url="http://searx:8080",
        wikipedia_url="",
        open_meteo_url="",
        ha_url="http://ha:8123",
    )
    assert [(tool, variable) for tool, variable, _ in service_urls(on)] == [
        ("web_search", "BERNARD_SEARXNG_URL"),
        ("ha_*", "BERNARD_HA_URL"),
    ]


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
    offline = Settings(
        _env_file=None,
        queue_redis_url=queue,
        openai_base_url=None,
        openai_api_key=None,
        anthropic_base_url=None,
        anthropic_api_key=None,
        wikipedia_url="",
        open_meteo_url="",
        open_meteo_geocoding_url="",
    )
    api = Api(f"http://127.0.0.1:{free_port()}")  # nothing answers there: a failed check
    try:
        checks = {check.name: check for check in run_checks(api, offline, data, lambda _: None)}
    finally:
        api.close()
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
