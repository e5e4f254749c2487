"""`./run`, `bernard doctor` and `GET /v1/status` on a real Redis Cluster and a real
Sentinel set (tests/support/topologies.py): the URL forms shared/connection.py reads are accepted
and checked like a lone server's.

These start real servers for every test: they carry the `topology` marker, which the
default run leaves out; `./run test-topologies` runs them (docs/testing.md).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from cli.doctor import Check, redis_checks
from launcher import cli
from launcher.redis_server import ping_error
from shared import keys
from tests.support.processes import private_redis
from tests.support.stack import make_settings, run_stack
from tests.support.topologies import (
    RedisClusterTopology,
    SentinelTopology,
    client_of,
    topologies_missing,
)

pytestmark = [
    pytest.mark.topology,
    pytest.mark.skipif(topologies_missing() is not None, reason=str(topologies_missing())),
]


def by_name(checks: list[Check]) -> dict[str, tuple[str, str]]:
    return {check.name: (check.status, check.detail) for check in checks}


async def test_run_takes_a_cluster_redis_url_that_answers(
    redis_cluster: RedisClusterTopology,
    tmp_path: Path,
) -> None:
    assert await asyncio.to_thread(ping_error, redis_cluster.url, 5.0) is None
    chosen = await asyncio.to_thread(cli.choose_redis, redis_cluster.url, tmp_path / "state")
    assert (chosen.url, chosen.process) == (redis_cluster.url, None)
    assert chosen.description == f"Redis: using {redis_cluster.url} (REDIS_URL)"


async def test_run_takes_a_sentinel_redis_url_that_answers(
    redis_sentinel: SentinelTopology,
    tmp_path: Path,
) -> None:
    assert await asyncio.to_thread(ping_error, redis_sentinel.url, 5.0) is None
    chosen = await asyncio.to_thread(cli.choose_redis, redis_sentinel.url, tmp_path / "state")
    assert (chosen.url, chosen.process) == (redis_sentinel.url, None)


async def test_doctor_checks_every_primary_of_a_cluster_and_the_workers_on_the_queue_role(
    redis_cluster: RedisClusterTopology,
    tmp_path: Path,
) -> None:
    async with private_redis(tmp_path / "queue") as queue:
        async with client_of(queue) as client:
            await client.zadd(keys.WORKERS, {"worker-a": time.time()})
        checks = by_name(await asyncio.to_thread(redis_checks, redis_cluster.url, queue.url))
        assert checks["Redis"] == ("ok", f"{redis_cluster.url} answers")
        assert checks["Redis version"][0] == "ok"
        assert checks["Eviction policy"] == ("ok", "noeviction (every primary)")
        assert checks["Persistence"][0] == "warn"  # the test servers keep nothing on disk
        assert checks["Workers"] == ("ok", "1 worker reported in the last 15 s")

        # One primary that would evict turns fails the check, and is named.
        node = (await redis_cluster.primaries())[-1]
        async with node.client() as client:
            await client.config_set("maxmemory", "1gb")
            await client.config_set("maxmemory-policy", "allkeys-lru")
        checks = by_name(await asyncio.to_thread(redis_checks, redis_cluster.url, queue.url))
        status, detail = checks["Eviction policy"]
        assert status == "fail"
        assert detail.startswith("allkeys-lru") and f"127.0.0.1:{node.port}" in detail


async def test_doctor_checks_the_primary_the_sentinels_name(
    redis_sentinel: SentinelTopology,
) -> None:
    # The queue role defaults to the data role's URL: the workers report on that primary.
    async with client_of(redis_sentinel.primary) as client:
        await client.zadd(keys.WORKERS, {"worker-a": time.time(), "worker-b": time.time()})
    checks = by_name(await asyncio.to_thread(redis_checks, redis_sentinel.url))
    assert checks["Redis"] == ("ok", f"{redis_sentinel.url} answers")
    assert checks["Redis version"][0] == "ok"
    assert checks["Eviction policy"] == ("ok", "noeviction")
    assert checks["Persistence"][0] == "warn"
    assert checks["Workers"] == ("ok", "2 workers reported in the last 15 s")


async def test_status_reports_a_cluster_data_role_and_a_queue_role_apart(
    redis_cluster: RedisClusterTopology,
    tmp_path: Path,
) -> None:
    async with private_redis(tmp_path / "queue") as queue:
        settings = make_settings(None, redis_url=redis_cluster.url, queue_redis_url=queue.url)
        async with run_stack(settings) as stack:
            body = (await stack.client.get("/v1/status")).json()
        primaries = sorted(f"127.0.0.1:{node.port}" for node in await redis_cluster.primaries())

    data, queue_role = body["redis"]
    assert (data["roles"], data["kind"], data["error"]) == (["data"], "cluster", None)
    assert sorted(server["node"] for server in data["servers"]) == primaries
    assert {server["maxmemory_policy"] for server in data["servers"]} == {"noeviction"}
    assert (queue_role["roles"], queue_role["kind"], queue_role["url"]) == (
        ["queue"],
        "single",
        queue.url,
    )
    assert queue_role["servers"][0]["node"] == ""
