"""A worker's liveness renewal (worker/liveness.py): what it tells the turns running here,
and the turns it lets go of, in one renewal against Redis."""

from __future__ import annotations

import asyncio
import uuid

import redis.asyncio as redis_asyncio

from shared import keys
from shared.cancel import request_cancel
from shared.lifecycle import Cause
from shared.requests import AgentRequest, TurnRequest
from shared.settings import Settings
from shared.turn_record import TurnRecord
from shared.turns import TurnStore
from tests.conftest import TEST_REDIS_URL
from worker.liveness import LivenessKeeper


async def test_one_renewal_stops_the_cancelled_the_over_and_the_gone_and_ends_the_strays(
    redis: redis_asyncio.Redis,
) -> None:
    worker = f"worker-{uuid.uuid4().hex}"
    owner = f"owner-{uuid.uuid4().hex}"
    store = TurnStore(redis, retention_s=60, stream_maxlen=100)
    stopped: list[tuple[str, Cause]] = []
    keeper = LivenessKeeper(
        Settings(redis_url=TEST_REDIS_URL),
        worker,
        lambda turn_id, cause: stopped.append((turn_id, cause)),
        asyncio.get_running_loop(),
    )
    await keeper.keep_once(store.liveness)
    going, asked, over, gone, stray = (uuid.uuid4().hex for _ in range(5))
    for turn_id in (going, asked, over, gone, stray):
        request = TurnRequest(AgentRequest([{"role": "user", "content": "hi"}]))
        record = TurnRecord(id=turn_id, owner=owner, request=request, model="bernard-v1")
        await store.create(record, ttl_s=60, queue_name=None)
        assert (await store.claim(turn_id, worker, overdue_s=60)).outcome == "claimed"
        keeper.add(turn_id)
    await request_cancel(redis, asked, ttl_s=60)
    await store.end(over, owner, Cause.CONVERSATION_DELETED)  # another process ended it
    await redis.delete(keys.turn(gone))  # a Redis restart without persistence lost it
    keeper.discard(stray)  # its job returned, and no ending landed

    await keeper._renew(store, store.liveness)
    await asyncio.sleep(0)  # the stops are called on this loop

    assert sorted(stopped) == sorted(
        [(asked, Cause.CANCELLED), (over, Cause.OVER), (gone, Cause.OVER)]
    )
    ended = await store.get(stray)
    assert ended is not None and ended.error is not None
    assert ended.error["code"] == "worker_lost", "ended as a reaper would"
    assert await redis.sismember(keys.worker_turns(worker), stray) == 0
    assert await redis.sismember(keys.worker_turns(worker), going) == 1
    assert await redis.pttl(keys.worker_alive(worker)) > 0
    await redis.delete(keys.worker_alive(worker), keys.worker_turns(worker))
    await redis.zrem(keys.WORKERS, worker)
    await redis.zrem(keys.RUNNING_TURNS, going, asked, gone)
