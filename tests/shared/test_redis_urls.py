"""Redis URLs for either role: one server, a primary behind Sentinels, a Cluster
(shared/backends.py), and the settings that refuse a Cluster for the queue."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.backends import RedisAddress, parse_url
from shared.connection import connect
from shared.settings import Settings


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", RedisAddress("single", "redis://127.0.0.1:6379/0")),
        ("unix:///run/redis.sock", RedisAddress("single", "unix:///run/redis.sock")),
        (
            "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380,10.0.0.3/bernard",
            RedisAddress(
                "sentinel",
                "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380,10.0.0.3/bernard",
                hosts=(("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379)),
                service="bernard",
            ),
        ),
        (
            "rediss+sentinel://:s%40cret@s1:1,s2:2/svc/3?sentinel_password=other",
            RedisAddress(
                "sentinel",
                "rediss+sentinel://:s%40cret@s1:1,s2:2/svc/3?sentinel_password=other",
                hosts=(("s1", 1), ("s2", 2)),
                service="svc",
                db=3,
                password="s@cret",
                ssl=True,
                sentinel_password="other",
            ),
        ),
        (
            "redis+cluster://bernard:pw@n1:7000,n2,[::1]:7002",
            RedisAddress(
                "cluster",
                "redis+cluster://bernard:pw@n1:7000,n2,[::1]:7002",
                hosts=(("n1", 7000), ("n2", 6379), ("::1", 7002)),
                username="bernard",
                password="pw",
            ),
        ),
        (
            "rediss+cluster://n1:7000/0",
            RedisAddress("cluster", "rediss+cluster://n1:7000/0", hosts=(("n1", 7000),), ssl=True),
        ),
    ],
)
def test_urls_name_one_server_a_sentinel_service_or_a_cluster(
    url: str, expected: RedisAddress
) -> None:
    assert parse_url(url) == expected


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("127.0.0.1:6379", "not a Redis URL"),
        ("redis+sentinel://s1:26379", "name the Sentinel service"),
        ("redis+sentinel://s1:26379/a/b/c", "name the Sentinel service"),
        ("redis+sentinel://s1:26379/svc/x", "bad database"),
        ("redis+sentinel://s1:port/svc", "bad host:port"),
        ("redis+sentinel://s1/svc?timeout=3", "unknown option"),
        ("redis+cluster://n1:7000/2", "only database 0"),
        ("redis+cluster://n1:7000?sentinel_password=x", "unknown option"),
    ],
)
def test_urls_bernard_cannot_use_are_refused_saying_why(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://user:hunter2@s1:26379",
        "redis+sentinel://s1:26379/bernard?sentinel_password=hunter2&bogus=1",
        "redis+cluster://user:hunter2@n1:6379/3",
    ],
    ids=["server password", "sentinels' password", "cluster"],
)
def test_a_refused_url_never_shows_its_passwords(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_url(url)
    assert "hunter2" not in str(refused.value)


def test_the_queue_role_is_the_data_role_unless_named() -> None:
    alone = Settings(redis_url="redis://data:6379/0")
    apart = Settings(redis_url="redis://data:6379/0", queue_redis_url="redis://queue:6379/0")
    assert alone.queue_url == "redis://data:6379/0"
    assert apart.queue_url == "redis://queue:6379/0"


def test_a_cluster_is_refused_for_the_queue_role_which_arq_runs_on() -> None:
    with pytest.raises(ValidationError, match="arq has no Cluster support"):
        Settings(redis_url="redis+cluster://n1:7000")
    with pytest.raises(ValidationError, match="arq has no Cluster support"):
        Settings(redis_url="redis://data:6379/0", queue_redis_url="redis+cluster://n1:7000")
    assert Settings(redis_url="redis+cluster://n1:7000", queue_redis_url="redis://q:6379/0")
    with pytest.raises(ValueError, match="cannot use a Redis Cluster"):
        connect("redis+cluster://n1:7000")
