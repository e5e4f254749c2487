"""How `bernard doctor` judges what it finds (cli/doctor.py): each finding ok, warn or fail,
and a fix for all but ok."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.doctor import (
    Check,
    aof_check,
    default_redis_url,
    eviction_check,
    redis_version_check,
    service_urls,
    workers_check,
)
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
