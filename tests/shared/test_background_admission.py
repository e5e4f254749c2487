"""A background job is queued only within its owner's budget and the deployment's, and
holds its slots until its worker gives them back or they lapse (shared/queue.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis_asyncio
from arq.constants import job_key_prefix

from shared import keys
from shared.queue import (
    SUMMARIZE,
    Admission,
    BackgroundKind,
    BackgroundLimits,
    background_job_id,
    enqueue_background,
    release_background,
)


@pytest.fixture
async def queue(redis: redis_asyncio.Redis) -> AsyncIterator[str]:
    """A queue of this test's own; its keys are deleted after."""
    name = f"bernard:test:{uuid.uuid4().hex[:8]}"
    yield name
    await redis.delete(name, keys.queued_background(name))


def limits(queue: str, per_user: int, total: int) -> BackgroundLimits:
    return BackgroundLimits(queue_name=queue, per_user=per_user, total=total, ttl_s=7200)


async def ask(
    redis: redis_asyncio.Redis, queue: str, owner: str, key: str, per_user: int, total: int
) -> Admission:
    """A summary of conversation `key` for `owner`, as a turn asks for it."""
    return await enqueue_background(
        redis, limits(queue, per_user, total), BackgroundKind.SUMMARY, owner, key, SUMMARIZE, key
    )


def owners() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"ann-{tag}", f"ben-{tag}"


async def test_a_users_jobs_stop_at_their_budget_and_a_refused_one_stores_nothing(
    redis: redis_asyncio.Redis, queue: str
) -> None:
    ann, _ = owners()
    got = [await ask(redis, queue, ann, f"c{n}", per_user=2, total=10) for n in range(3)]
    assert got == [Admission.QUEUED, Admission.QUEUED, Admission.OVER_USER_BUDGET]
    refused = background_job_id(BackgroundKind.SUMMARY, ann, "c2")
    assert await redis.exists(job_key_prefix + refused) == 0
    assert await redis.zscore(queue, refused) is None
    assert await redis.zcard(queue) == 2
    # The same conversation asked again while its job waits: one job, no second slot.
    assert await ask(redis, queue, ann, "c0", per_user=2, total=10) == Admission.ALREADY_QUEUED
    assert await redis.zcard(keys.background_jobs(ann)) == 2
    await redis.delete(
        keys.background_jobs(ann),
        *(job_key_prefix + j.decode() for j in await redis.zrange(queue, 0, -1)),
    )


async def test_the_deployments_budget_holds_across_users(
    redis: redis_asyncio.Redis, queue: str
) -> None:
    ann, ben = owners()
    assert await ask(redis, queue, ann, "c0", per_user=4, total=2) == Admission.QUEUED
    assert await ask(redis, queue, ann, "c1", per_user=4, total=2) == Admission.QUEUED
    assert await ask(redis, queue, ben, "c0", per_user=4, total=2) == (
        Admission.OVER_DEPLOYMENT_BUDGET
    )
    assert await redis.zcard(keys.background_jobs(ben)) == 0
    await redis.delete(keys.background_jobs(ann))


async def test_slots_come_back_when_the_job_ends_or_lapse(
    redis: redis_asyncio.Redis, queue: str
) -> None:
    ann, _ = owners()
    assert await ask(redis, queue, ann, "c0", per_user=1, total=10) == Admission.QUEUED
    assert await ask(redis, queue, ann, "c1", per_user=1, total=10) == Admission.OVER_USER_BUDGET
    # Its worker ended it: the slots are given back.
    await redis.delete(job_key_prefix + background_job_id(BackgroundKind.SUMMARY, ann, "c0"))
    await release_background(redis, queue, background_job_id(BackgroundKind.SUMMARY, ann, "c0"))
    assert await redis.zcard(keys.queued_background(queue)) == 0
    assert await ask(redis, queue, ann, "c1", per_user=1, total=10) == Admission.QUEUED
    # A crash left a slot held: at its lapse it goes, and the next ask takes it.
    held = background_job_id(BackgroundKind.SUMMARY, ann, "c1")
    await redis.delete(job_key_prefix + held)
    await redis.zadd(keys.background_jobs(ann), {held: time.time() - 1})
    assert await ask(redis, queue, ann, "c2", per_user=1, total=10) == Admission.QUEUED
    assert 0 < await redis.ttl(keys.background_jobs(ann)) <= 7200
    await redis.delete(
        keys.background_jobs(ann),
        job_key_prefix + background_job_id(BackgroundKind.SUMMARY, ann, "c2"),
    )
