"""A worker's liveness renewal (worker/liveness.py): what it tells the turns running here,
and the turns it lets go of, in one renewal against Redis."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import pytest
import redis.asyncio as redis_asyncio

from shared import keys
from shared.cancel import request_cancel
from shared.lifecycle import Cause
from shared.requests import AgentRequest, TurnRequest
from shared.settings import Settings
from shared.turn_record import TurnRecord
from shared.turns import TurnStore
from tests.support.session_redis import session_redis_url
from worker.liveness import LivenessKeeper


async def test_one_renewal_stops_the_cancelled_the_over_and_the_gone_and_ends_the_strays(
    redis: redis_asyncio.Redis,
) -> None:
    worker = f"worker-{uuid.uuid4().hex}"
    owner = f"owner-{uuid.uuid4().hex}"
    store = TurnStore(redis, retention_s=60, stream_maxlen=100)
    stopped: list[tuple[str, Cause]] = []
    keeper = LivenessKeeper(
        Settings(redis_url=session_redis_url()),
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
    assert ended.error["code"] == "store_failover", "ended as its let-go turn's reaper would"
    assert await redis.sismember(keys.worker_turns(worker), stray) == 0
    assert await redis.sismember(keys.worker_turns(worker), going) == 1
    assert await redis.pttl(keys.worker_alive(worker)) > 0
    await redis.delete(keys.worker_alive(worker), keys.worker_turns(worker))
    await redis.zrem(keys.WORKERS, worker)
    await redis.zrem(keys.RUNNING_TURNS, going, asked, gone)


async def test_a_data_role_that_does_not_answer_neither_holds_up_the_renewal_nor_strands_a_stray(
    redis: redis_asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The data role stops answering (a shard failing over) while the queue role is fine:
    the worker stays alive, and a turn it let go of without an ending is left to any
    reaper, which ends it `store_failover` once Redis takes the ending."""
    worker = f"worker-{uuid.uuid4().hex}"
    owner = f"owner-{uuid.uuid4().hex}"
    store = TurnStore(redis, retention_s=60, stream_maxlen=100)
    keeper = LivenessKeeper(
        Settings(redis_url=session_redis_url(), lease_renew_s=0.2),
        worker,
        lambda turn_id, cause: None,
        asyncio.get_running_loop(),
    )
    await keeper.keep_once(store.liveness)
    going, stray = uuid.uuid4().hex, uuid.uuid4().hex
    for turn_id in (going, stray):
        request = TurnRequest(AgentRequest([{"role": "user", "content": "hi"}]))
        record = TurnRecord(id=turn_id, owner=owner, request=request, model="bernard-v1")
        await store.create(record, ttl_s=60, queue_name=None)
        assert (await store.claim(turn_id, worker, overdue_s=60)).outcome == "claimed"
        keeper.add(turn_id)
    keeper.discard(stray)  # its job returned, and its ending never landed

    # A data role that takes connections and never answers.
    silent = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    data = redis_asyncio.Redis(host="127.0.0.1", port=port)
    unanswered = TurnStore(data, retention_s=60, stream_maxlen=100, queue=redis)
    try:
        started = time.monotonic()
        await asyncio.wait_for(keeper._renew(unanswered, store.liveness), 2.0)
        assert time.monotonic() - started < 1.0, "the renewal waited on the data role"
        assert await redis.pttl(keys.worker_alive(worker)) > 0
        # Not the worker's any more, and left in the running set for any reaper.
        assert await redis.sismember(keys.worker_turns(worker), stray) == 0
        assert await redis.zscore(keys.RUNNING_TURNS, stray) < 0
        assert (await store.get(stray)).status == "running"  # type: ignore[union-attr]

        # Another process's reaper, whose data role answers, ends it, and logs it so.
        with caplog.at_level(logging.WARNING, logger="bernard.turns"):
            assert stray in await TurnStore(redis, retention_s=60, stream_maxlen=100).reap_lapsed()
        [line] = [r for r in caplog.records if getattr(r, "turn_id", None) == stray]
        assert line.getMessage() == f"turn {stray} failed: its worker let go of it"
        assert (line.status, line.error) == ("failed", "store_failover")  # type: ignore[attr-defined]
        ended = await store.get(stray)
        assert ended is not None and ended.error is not None
        assert ended.error["code"] == "store_failover"
        assert (await store.get(going)).status == "running"  # type: ignore[union-attr]
        assert await redis.zscore(keys.RUNNING_TURNS, stray) is None
    finally:
        if keeper._looking is not None:
            keeper._looking.cancel()
        await data.aclose(close_connection_pool=True)
        silent.close()
        await redis.delete(keys.worker_alive(worker), keys.worker_turns(worker))
        await redis.zrem(keys.WORKERS, worker)
        await redis.zrem(keys.RUNNING_TURNS, going)
