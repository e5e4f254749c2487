"""The two Redis roles (shared/keys.py): each move of a turn writes the data role and the
queue role apart, and a crash between its two halves leaves nothing that hangs.

The roles are two databases of the session's Redis here (data 0, queue 1), so a key on
the wrong side shows. Each test uses ids of its own and deletes what it wrote.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import redis.asyncio as redis_asyncio
from arq.constants import in_progress_key_prefix, job_key_prefix
from redis.exceptions import ConnectionError

from shared import keys
from shared.connection import connect, queue_client
from shared.endings import completed
from shared.lifecycle import STRANDED_AFTER_S, Cause, Finished
from shared.requests import AgentRequest, TurnRequest
from shared.settings import Settings
from shared.turn_record import TurnRecord
from shared.turns import TurnStore
from shared.turns.admission import TooManyTurnsError
from tests.support.session_redis import session_redis_url

RETENTION_S = 300


@dataclass
class Roles:
    """A data client, a queue client on another database, and what the test wrote."""

    data: redis_asyncio.Redis
    queue: redis_asyncio.Redis
    turns: list[str] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)
    queue_name: str = field(default_factory=lambda: f"bernard:test:{uuid.uuid4().hex}")

    def store(self, queue: redis_asyncio.Redis | None = None) -> TurnStore:
        return TurnStore(
            self.data, retention_s=RETENTION_S, stream_maxlen=100, queue=queue or self.queue
        )

    def record(self, *, age_s: float = 0.0) -> TurnRecord:
        turn_id, owner = uuid.uuid4().hex, f"owner-{uuid.uuid4().hex}"
        self.turns.append(turn_id)
        self.owners.append(owner)
        return TurnRecord(
            id=turn_id,
            owner=owner,
            request=TurnRequest(AgentRequest([{"role": "user", "content": "hi"}])),
            model="bernard-v1",
            created_at=time.time() - age_s,
        )

    async def clean(self) -> None:
        per_turn = (keys.turn, keys.events, keys.cancel, keys.attached)
        await self.data.delete(
            *[key(t) for t in self.turns for key in per_turn],
            *[keys.turns(o) for o in self.owners],
        )
        await self.queue.delete(
            *[
                prefix + t
                for t in self.turns
                for prefix in (job_key_prefix, in_progress_key_prefix)
            ],
            *[keys.active_turns(o) for o in self.owners],
            self.queue_name,
            keys.wake(self.queue_name),
        )
        await self.queue.zrem(keys.RUNNING_TURNS, *self.turns)


def _database(url: str, db: int) -> str:
    return url.rsplit("/", 1)[0] + f"/{db}"


@pytest.fixture
async def roles() -> AsyncIterator[Roles]:
    data = connect(_database(session_redis_url(), 0))
    queue = connect(_database(session_redis_url(), 1))
    written = Roles(data, queue)
    try:
        yield written
    finally:
        await written.clean()
        await data.aclose()
        await queue.aclose()


async def status_of(roles: Roles, turn_id: str) -> tuple[str, str | None]:
    status, error = await roles.data.hmget(keys.turn(turn_id), ["status", "error"])
    code = None if error is None else orjson.loads(error)["code"]
    return status.decode(), code


def test_one_redis_for_both_roles_is_one_client_else_the_queue_role_gets_its_own() -> None:
    data: Any = object()
    own: Any = object()
    alone = Settings(redis_url="redis://data:6379/0")
    same = Settings(redis_url="redis://data:6379/0", queue_redis_url="redis://data:6379/0")
    apart = Settings(redis_url="redis://data:6379/0", queue_redis_url="redis://queue:6379/0")
    assert queue_client(alone, data, lambda: own) is data
    assert queue_client(same, data, lambda: own) is data
    assert queue_client(apart, data, lambda: own) is own


async def test_each_move_writes_its_data_and_its_queue_keys_apart(roles: Roles) -> None:
    store = roles.store()
    record = roles.record()
    await store.admit(record.owner, record.id, limit=5, ttl_s=60)
    await store.create(record, ttl_s=3600, queue_name=roles.queue_name)

    assert await roles.data.exists(keys.turn(record.id), keys.events(record.id)) == 2
    assert await roles.queue.exists(keys.turn(record.id), keys.events(record.id)) == 0
    assert await roles.queue.zscore(roles.queue_name, record.id) is not None
    assert await roles.queue.exists(job_key_prefix + record.id, keys.wake(roles.queue_name)) == 2
    assert await roles.data.exists(job_key_prefix + record.id, roles.queue_name) == 0
    assert await roles.queue.zscore(keys.active_turns(record.owner), record.id) is not None

    assert (await store.claim(record.id, "worker-1", overdue_s=30)).outcome == "claimed"
    assert await roles.queue.zscore(keys.RUNNING_TURNS, record.id) is not None
    assert await roles.data.zscore(keys.RUNNING_TURNS, record.id) is None
    assert await roles.queue.sismember(keys.worker_turns("worker-1"), record.id) == 1
    assert await roles.data.sismember(keys.worker_turns("worker-1"), record.id) == 0
    assert await roles.data.hget(keys.turn(record.id), "worker") == b"worker-1"

    ended_before = int(await roles.queue.hget(keys.METRICS, "completed") or 0)
    assert await store.finish(record.id, record.owner, completed("stop", None)) is Finished.ENDED
    assert await status_of(roles, record.id) == ("completed", None)
    assert await roles.queue.zscore(keys.RUNNING_TURNS, record.id) is None
    assert await roles.queue.zscore(keys.active_turns(record.owner), record.id) is None
    assert int(await roles.queue.hget(keys.METRICS, "completed") or 0) == ended_before + 1


async def test_a_turn_whose_enqueue_fails_is_ended_turn_lost_before_the_error_goes_on(
    roles: Roles,
) -> None:
    unreachable = connect("redis://127.0.0.1:1/0", retries=0)
    record = roles.record()
    try:
        with pytest.raises(ConnectionError):
            await roles.store(unreachable).create(record, ttl_s=3600, queue_name=roles.queue_name)
    finally:
        await unreachable.aclose()
    assert await status_of(roles, record.id) == ("failed", "turn_lost")


async def test_a_turn_stranded_between_its_halves_ends_turn_lost_once_looked_at(
    roles: Roles,
) -> None:
    store = roles.store()
    stranded, fresh, queued = (
        roles.record(age_s=STRANDED_AFTER_S + 5),
        roles.record(),
        roles.record(age_s=STRANDED_AFTER_S + 5),
    )
    for record in (stranded, fresh):  # stored, but the process died before the enqueue
        await store.create(record, ttl_s=3600, queue_name=None)
    await store.create(queued, ttl_s=3600, queue_name=roles.queue_name)

    assert await store.settle(stranded.id) == "failed"
    assert await status_of(roles, stranded.id) == ("failed", "turn_lost")
    # A young one may be a creation under way; a queued one with its job waits for a worker.
    assert await store.settle(fresh.id) == "queued"
    assert await store.settle(queued.id) == "queued"
    assert await store.settle(uuid.uuid4().hex) is None


async def test_a_running_turn_whose_worker_lapsed_ends_worker_lost_once_looked_at(
    roles: Roles,
) -> None:
    store = roles.store()
    record = roles.record()
    await store.create(record, ttl_s=3600, queue_name=None)
    await store.liveness.keep("worker-1", 30, stale_s=3600)  # on the queue role
    await store.claim(record.id, "worker-1", overdue_s=30)
    assert await store.settle(record.id) == "running"
    await roles.queue.delete(keys.worker_alive("worker-1"))  # the worker died

    assert await store.settle(record.id) == "failed"
    assert await status_of(roles, record.id) == ("failed", "worker_lost")


async def test_a_finish_cut_off_before_its_queue_half_is_released_by_the_reaper(
    roles: Roles,
) -> None:
    store = roles.store()
    record = roles.record()
    await store.admit(record.owner, record.id, limit=5, ttl_s=60)
    await store.create(record, ttl_s=3600, queue_name=None)
    await store.claim(record.id, "worker-1", overdue_s=0.2)
    unreachable = connect("redis://127.0.0.1:1/0", retries=0)
    try:
        with pytest.raises(ConnectionError):  # the data half ran, the release did not
            await roles.store(unreachable).finish(record.id, record.owner, completed("stop", None))
    finally:
        await unreachable.aclose()
    assert await status_of(roles, record.id) == ("completed", None)
    assert await roles.queue.zscore(keys.RUNNING_TURNS, record.id) is not None

    await asyncio.sleep(0.3)  # past the entry's deadline
    assert await store.reap_lapsed() == []  # it had ended: nothing to fail, only to release
    assert await roles.queue.zscore(keys.RUNNING_TURNS, record.id) is None
    assert await roles.queue.zscore(keys.active_turns(record.owner), record.id) is None
    assert await status_of(roles, record.id) == ("completed", None)


async def test_a_claim_cut_off_before_its_data_half_is_reaped_worker_lost(roles: Roles) -> None:
    store = roles.store()
    record = roles.record()
    await store.create(record, ttl_s=3600, queue_name=None)
    # The running set's entry went in, then the worker died before its claim.
    await roles.queue.zadd(keys.RUNNING_TURNS, {record.id: time.time() - 1})

    assert await store.reap_lapsed() == [record.id]
    assert await status_of(roles, record.id) == ("failed", "worker_lost")


async def test_a_refused_claim_leaves_no_running_entry(roles: Roles) -> None:
    store = roles.store()
    record = roles.record()
    await store.create(record, ttl_s=3600, queue_name=None)
    await store.end(record.id, record.owner, Cause.CANCELLED)

    assert (await store.claim(record.id, "worker-1", overdue_s=30)).outcome == "cancelled"
    assert await roles.queue.zscore(keys.RUNNING_TURNS, record.id) is None


async def test_admission_at_the_limit_first_drops_old_entries_of_turns_that_ended(
    roles: Roles,
) -> None:
    store = roles.store()
    gone, young, newcomer = roles.record(), roles.record(), roles.record()
    owner = gone.owner
    ttl_s = 60
    # An entry admitted long ago whose turn ended without its release (or is gone).
    admitted_long_ago = time.time() - STRANDED_AFTER_S - 5 + ttl_s
    await roles.queue.zadd(keys.active_turns(owner), {gone.id: admitted_long_ago})
    await store.admit(owner, newcomer.id, limit=1, ttl_s=ttl_s)
    assert await roles.queue.zscore(keys.active_turns(owner), gone.id) is None

    # A young entry without a record may be a creation under way: it still counts.
    with pytest.raises(TooManyTurnsError):
        await store.admit(owner, young.id, limit=1, ttl_s=ttl_s)
