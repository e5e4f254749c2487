"""The suite's hooks and fixtures; what they are built from is in tests/support/.

`stack` is Bernard's API and worker for one test (tests/support/stack.py) on the scripted
`upstream`; every test starts with its users' rate buckets full (`fresh_rate_buckets`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as redis_asyncio
from redis import Redis as SyncRedis

from shared import keys
from tests.support.session_redis import session_redis
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.upstream import ScriptedUpstream
from tests.support.users import Owners

# The Redis Cluster and Sentinel fixtures (`redis_cluster`, `redis_sentinel`) the topology
# tests ask for by name.
pytest_plugins = ["tests.support.topologies"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a `parametrize` that decorates something other than a test: a helper put
    between a test and its decorator takes the marks, and the test then fails for want of
    its parameters as fixtures."""
    modules = {item.module for item in items if isinstance(item, pytest.Function)}
    stray = [
        f"{module.__name__}.{name}"
        for module in modules
        for name, value in vars(module).items()
        if not name.startswith(("test", "Test"))
        and any(mark.name == "parametrize" for mark in getattr(value, "pytestmark", ()))
    ]
    if stray:
        raise pytest.UsageError(f"parametrize marks on what is not a test: {stray}")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's Redis (tests/support/session_redis.py), started on first use."""
    with session_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(autouse=True)
def fresh_rate_buckets(redis_url: str) -> None:
    """Each test starts as a household of its own, its users' rate buckets full
    (shared/rate_limit.py): the suite's tests share one Redis and the same user names, and
    one after another they ask faster than any household, as a script hammering the API
    would. The limit stays on at its defaults; a test that needs more says so."""
    with SyncRedis.from_url(redis_url) as client:
        buckets = list(client.scan_iter(match=f"{keys.PREFIX}:user:{{*}}:rate", count=1000))
        if buckets:
            client.delete(*buckets)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[redis_asyncio.Redis]:
    client = redis_asyncio.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    async with ScriptedUpstream() as server:
        yield server


@pytest.fixture
async def stack(upstream: ScriptedUpstream) -> AsyncIterator[Stack]:
    async with run_stack(make_settings(upstream)) as running:
        yield running


@pytest.fixture
def owners() -> Owners:
    return Owners.fresh()


@pytest.fixture
async def two_users(upstream: ScriptedUpstream, owners: Owners) -> AsyncIterator[Stack]:
    """A stack where `key-alice` and `key-bob` sign in as `owners`."""
    async with run_stack(make_settings(upstream, api_keys=owners.api_keys)) as running:
        yield running
