"""Turn records and their moves: admitted, created, claimed, renewed, ended once, reaped.

Each test drives `TurnStore` against the session's Redis with turn ids, owners and queue
names of its own, and deletes every key it wrote.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson
import pytest
import redis.asyncio as redis_asyncio
from arq.constants import job_key_prefix
from arq.jobs import deserialize_job

from shared import keys
from shared.cancel import request_cancel
from shared.endings import completed, ended
from shared.errors import ErrorCode
from shared.events import Delta, Done, Error, Start, ToolCall
from shared.lifecycle import SEALED_ID, STRANDED_AFTER_S, Cause, Finished
from shared.liveness import Kept
from shared.requests import SAMPLING_OPTIONS, AgentRequest, Delivery, RunMode, TurnRequest
from shared.results import TurnResult
from shared.streams import parse_entries
from shared.turn_record import TurnRecord
from shared.turns import TurnStore
from shared.turns.admission import Admitted, TooManyTurnsError, TurnAdmission, admission_of
from shared.webhooks import DELIVER_WEBHOOK, delivery_job_id, taken

RETENTION_S = 300
MAXLEN = 1000


@dataclass
class Scratch:
    """What a test wrote: turn ids, owners and queues, deleted afterwards."""

    redis: redis_asyncio.Redis
    turns: list[str] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)

    def turn_id(self) -> str:
        turn_id = uuid.uuid4().hex
        self.turns.append(turn_id)
        return turn_id

    def owner(self) -> str:
        owner = f"owner-{uuid.uuid4().hex}"
        self.owners.append(owner)
        return owner

    def queue(self) -> str:
        queue = f"bernard:test:{uuid.uuid4().hex}"
        self.queues.append(queue)
        return queue

    async def clean(self) -> None:
        doomed = [
            key(t)
            for t in self.turns
            for key in (keys.turn, keys.events, keys.cancel, keys.attached)
        ]
        doomed += [job_key_prefix + t for t in self.turns]
        doomed += [keys.active_turns(o) for o in self.owners]
        doomed += [k for q in self.queues for k in (q, keys.wake(q))]
        if doomed:
            await self.redis.delete(*doomed)
        if self.turns:
            await self.redis.zrem(keys.RUNNING_TURNS, *self.turns)
            await self.redis.zrem(keys.CANCELS, *self.turns)


@pytest.fixture
async def scratch(redis: redis_asyncio.Redis) -> AsyncIterator[Scratch]:
    written = Scratch(redis)
    yield written
    await written.clean()


@pytest.fixture
def store(redis: redis_asyncio.Redis) -> TurnStore:
    return TurnStore(redis, retention_s=RETENTION_S, stream_maxlen=MAXLEN)


def record_of(
    turn_id: str, owner: str, *, conversation_id: str | None = None, **options: object
) -> TurnRecord:
    # The options of both halves, flat, as a record stores them (`TurnRequest.stored`).
    stored = TurnRequest(AgentRequest([])).stored()
    request = TurnRequest.restored(
        {**stored, "messages": [{"role": "user", "content": "hello"}], **options}
    )
    return TurnRecord(
        id=turn_id,
        owner=owner,
        request=request,
        model="bernard-v1",
        conversation_id=conversation_id,
    )


async def stream_of(redis: redis_asyncio.Redis, turn_id: str) -> list[tuple[str, object]]:
    return [(i, s.event) for i, s in parse_entries(await redis.xrange(keys.events(turn_id)))]


async def created(
    store: TurnStore, scratch: Scratch, *, owner: str | None = None, **options: object
) -> TurnRecord:
    record = record_of(scratch.turn_id(), owner or scratch.owner(), **options)
    await store.create(record, ttl_s=3600, queue_name=None)
    return record


async def claimed(
    store: TurnStore, scratch: Scratch, *, worker: str = "worker-1", **options: object
) -> TurnRecord:
    """A turn `running` under `worker`, which is alive unless the test lets it lapse."""
    record = await created(store, scratch, **options)
    await store.liveness.keep(worker, 60, stale_s=3600)
    claim = await store.claim(record.id, worker, overdue_s=30)
    assert claim.outcome == "claimed"
    return record


async def reap_leftovers(store: TurnStore) -> None:
    """What earlier tests of the session left to reap (their dead workers, the turns a
    stopped worker let go of, which sort first) reaped, so that a sweep's `limit` counts only
    the test's own turns."""
    for _ in range(5):
        await store.reap_lapsed(limit=1000)


async def lapse(redis: redis_asyncio.Redis, worker: str) -> None:
    """The worker died: its liveness key lapsed (its entry among the workers stays)."""
    await redis.delete(keys.worker_alive(worker))


# -- the request and the record ----------------------------------------------------------


def test_a_request_passes_on_only_the_sampling_options_the_client_set() -> None:
    assert AgentRequest(messages=[]).sampling() == {}


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_tokens", 0),
        ("temperature", 0.0),
        ("top_p", 0.5),
        ("stop", []),
        ("seed", 0),
        ("presence_penalty", -1.5),
        ("frequency_penalty", 0.0),
        ("user", ""),
    ],
)
def test_a_sampling_option_set_to_a_falsy_value_is_still_passed_on(
    option: str, value: object
) -> None:
    assert AgentRequest(messages=[], **{option: value}).sampling() == {option: value}  # type: ignore[arg-type]


def test_every_sampling_option_is_passed_on_together() -> None:
    values = {name: f"v-{name}" for name in SAMPLING_OPTIONS}
    assert AgentRequest(messages=[], **values).sampling() == values  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "finished"),
    [
        ("queued", False),
        ("running", False),
        ("completed", True),
        ("failed", True),
        ("cancelled", True),
    ],
)
def test_a_record_is_finished_once_its_status_is_terminal(status: str, finished: bool) -> None:
    record = record_of("t", "o")
    record.status = status  # type: ignore[assignment]
    assert record.finished is finished


def test_the_stored_hash_keeps_the_messages_apart_from_the_options() -> None:
    record = record_of("t1", "alice", temperature=0.2, trace=True)
    record.created_at = 1700000000.25
    fields = record.to_redis()
    assert fields["id"] == "t1" and fields["owner"] == "alice"
    assert fields["model"] == "bernard-v1" and fields["status"] == "queued"
    assert float(fields["created_at"]) == 1700000000.25
    assert orjson.loads(fields["messages"]) == [{"role": "user", "content": "hello"}]
    request = orjson.loads(fields["request"])
    assert request["messages"] == [] and request["temperature"] == 0.2 and request["trace"]
    assert "conversation_id" not in fields
    assert record_of("t1", "alice", conversation_id="den").to_redis()["conversation_id"] == "den"


def test_a_request_is_stored_flat_with_its_encoding_as_kind() -> None:
    request = TurnRequest(
        AgentRequest([{"role": "user", "content": "hi"}], mode=RunMode.MODEL, rows=True),
        Delivery("completion", include_usage=True),
    )
    stored = request.stored()
    assert stored == {
        "messages": [],
        "mode": "model",
        "trace": False,
        "rows": True,
        "resends_history": True,
        "max_tokens": None,
        "temperature": None,
        "top_p": None,
        "stop": None,
        "seed": None,
        "presence_penalty": None,
        "frequency_penalty": None,
        "user": None,
        "resume": None,
        "history_of": None,
        "undo": False,
        "language": None,
        "client_tools": [],
        "tool_choice": None,
        "parallel_tool_calls": True,
        "follows": None,
        "kind": "completion",
        "stream": True,
        "include_usage": True,
        "tool_events": "bernard",
        "on_disconnect": "cancel",
        "background": False,
        "echo": {},
        "webhook_url": None,
        "kept": True,
    }
    assert TurnRequest.restored({**stored, "messages": request.agent.messages}) == request


async def test_a_record_reads_back_as_it_was_stored(
    redis: redis_asyncio.Redis, scratch: Scratch
) -> None:
    record = record_of(
        scratch.turn_id(),
        "alice",
        conversation_id="den",
        kind="completion",
        stream=False,
        include_usage=True,
        tool_events="delta",
        trace=True,
        on_disconnect="continue",
        background=True,
        max_tokens=7,
        stop=["\n"],
        user="u",
    )
    record.created_at = 1700000000.123456
    await redis.hset(keys.turn(record.id), mapping=record.to_redis())
    assert TurnRecord.from_redis(await redis.hgetall(keys.turn(record.id))) == record


async def test_a_finished_record_reads_back_its_times_error_and_result_without_the_prompt(
    redis: redis_asyncio.Redis, scratch: Scratch
) -> None:
    record = record_of(scratch.turn_id(), "alice")
    fields = {k: v for k, v in record.to_redis().items() if k != "messages"}
    error = {"message": "m", "type": "server_error", "code": "worker_lost"}
    result = {"finish_reason": "stop", "content": "hi"}
    fields |= {
        "status": "failed",
        "started_at": "1700000001.5",
        "finished_at": "1700000002.5",
        "error": orjson.dumps(error),
        "result": orjson.dumps(result),
    }
    await redis.hset(keys.turn(record.id), mapping=fields)
    read = TurnRecord.from_redis(await redis.hgetall(keys.turn(record.id)))
    assert read.request.agent.messages == [] and read.conversation_id is None
    assert (read.status, read.started_at, read.finished_at) == (
        "failed",
        1700000001.5,
        1700000002.5,
    )
    assert (read.error, read.result) == (error, TurnResult(content="hi"))


# -- admission ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "admission"),
    [
        (1, TurnAdmission(Admitted.ADMITTED)),
        (b"1", TurnAdmission(Admitted.ADMITTED)),
        (0, TurnAdmission(Admitted.AT_LIMIT)),
        (b"0", TurnAdmission(Admitted.AT_LIMIT)),
        (-1, TurnAdmission(Admitted.RATE_LIMITED, 1)),
        (-2500, TurnAdmission(Admitted.RATE_LIMITED, 2500)),
        (b"-40", TurnAdmission(Admitted.RATE_LIMITED, 40)),
    ],
)
def test_the_admission_scripts_reply_is_named(reply: int | bytes, admission: TurnAdmission) -> None:
    assert admission_of(reply) == admission


@pytest.mark.parametrize("reply", [2, b"7"])
def test_an_admission_reply_no_script_gives_is_refused(reply: int | bytes) -> None:
    with pytest.raises(ValueError, match="no admission replies"):
        admission_of(reply)


async def test_an_owner_is_admitted_up_to_the_limit_and_no_further(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    alice, bob = scratch.owner(), scratch.owner()
    for n in range(3):
        await store.admit(alice, f"t{n}", limit=3, ttl_s=60)
    with pytest.raises(TooManyTurnsError):
        await store.admit(alice, "t3", limit=3, ttl_s=60)
    await store.admit(bob, "t0", limit=3, ttl_s=60)  # another owner has slots of their own
    await store.release(alice, "t1")
    await store.admit(alice, "t3", limit=3, ttl_s=60)
    assert await redis.zrange(keys.active_turns(alice), 0, -1) == [b"t0", b"t2", b"t3"]


async def test_an_admitted_turn_counts_until_its_deadline_and_the_set_expires(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    owner = scratch.owner()
    before = time.time()
    await store.admit(owner, "t0", limit=1, ttl_s=120)
    deadline = await redis.zscore(keys.active_turns(owner), "t0")
    assert before + 120 <= deadline <= time.time() + 120
    assert 110 <= await redis.ttl(keys.active_turns(owner)) <= 120
    # An entry past its deadline no longer counts.
    await redis.zadd(keys.active_turns(owner), {"t0": time.time() - 1})
    await store.admit(owner, "t1", limit=1, ttl_s=120)


# -- creation ----------------------------------------------------------------------------


async def test_creating_stores_the_record_opens_the_stream_and_queues_the_job(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    record = record_of(scratch.turn_id(), scratch.owner())
    queue = scratch.queue()
    start_id = await store.create(record, ttl_s=600, queue_name=queue)
    assert await store.get(record.id) == record
    assert [(i, type(e)) for i, e in await stream_of(redis, record.id)] == [(start_id, Start)]
    for key in (keys.turn(record.id), keys.events(record.id)):
        assert 590 <= await redis.ttl(key) <= 600
    assert await redis.zscore(queue, record.id) is not None
    assert await redis.lrange(keys.wake(queue), 0, -1) == [record.id.encode()]
    assert await redis.exists(job_key_prefix + record.id) == 1
    assert await redis.exists(keys.attached(record.id)) == 0


async def test_a_turn_created_without_a_queue_has_no_job(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    record = await created(store, scratch)
    assert await redis.exists(job_key_prefix + record.id) == 0


async def test_a_stream_attached_at_creation_counts_until_its_expiry(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    record = record_of(scratch.turn_id(), scratch.owner())
    expiry = time.time() + 100
    await store.create(
        record, ttl_s=600, queue_name=None, attachment="a1", attachment_expiry=expiry
    )
    assert await redis.zrange(keys.attached(record.id), 0, -1, withscores=True) == [
        (b"a1", pytest.approx(expiry))
    ]
    assert 99 <= await redis.ttl(keys.attached(record.id)) <= 101


async def test_an_attachment_already_lapsed_still_expires_within_a_second(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    record = record_of(scratch.turn_id(), scratch.owner())
    await store.create(
        record, ttl_s=600, queue_name=None, attachment="a1", attachment_expiry=time.time() - 50
    )
    assert 0 < await redis.pttl(keys.attached(record.id)) <= 1000


async def test_a_turn_that_does_not_exist_reads_as_none(store: TurnStore) -> None:
    assert await store.get(uuid.uuid4().hex) is None


# -- claiming ----------------------------------------------------------------------------


async def test_claiming_moves_a_queued_turn_to_running_under_its_worker(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    record = await created(store, scratch)
    before = time.time()
    claim = await store.claim(record.id, "worker-1", overdue_s=7.5)
    after = time.time()
    assert claim.outcome == "claimed" and not claim.cancel_requested
    assert claim.record is not None
    assert claim.record.status == "running"
    assert claim.record.request == record.request  # the prompt comes with the claim
    assert before <= (claim.record.started_at or 0) <= after
    assert await redis.hget(keys.turn(record.id), "worker") == b"worker-1"
    assert await redis.sismember(keys.worker_turns("worker-1"), record.id) == 1
    assert 3500 <= await redis.ttl(keys.worker_turns("worker-1")) <= 3600
    deadline = await redis.zscore(keys.RUNNING_TURNS, record.id)
    assert before + 7.5 <= deadline <= after + 7.5


async def test_a_claim_hears_of_a_cancel_asked_before_it(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    record = await created(store, scratch)
    await redis.set(keys.cancel(record.id), b"1")
    claim = await store.claim(record.id, "worker-1", overdue_s=30)
    assert claim.outcome == "claimed" and claim.cancel_requested is True


async def test_a_turn_is_claimed_once_and_a_missing_one_never(
    store: TurnStore, scratch: Scratch
) -> None:
    record = await claimed(store, scratch)
    again = await store.claim(record.id, "worker-2", overdue_s=30)
    assert (again.outcome, again.record) == ("running", None)
    assert await store.redis.sismember(keys.worker_turns("worker-2"), record.id) == 0
    assert await store.redis.sismember(keys.worker_turns("worker-1"), record.id) == 1
    missing = await store.claim(scratch.turn_id(), "worker-2", overdue_s=30)
    assert (missing.outcome, missing.record) == ("missing", None)


# -- ending ------------------------------------------------------------------------------


async def test_finishing_appends_the_events_then_a_sealing_done_and_starts_retention(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    record = await claimed(store, scratch)
    await store.admit(record.owner, record.id, limit=5, ttl_s=60)
    done = completed("stop", {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3})
    before = time.time()
    finished = await store.finish(
        record.id,
        record.owner,
        done,
        before=[Delta(text="hi"), ToolCall(id="c", name="t", arguments="{}", index=0)],
        result=TurnResult(content="hi"),
    )
    assert finished is Finished.ENDED
    stream = await stream_of(redis, record.id)
    assert [e for _, e in stream[1:]] == [
        Delta(text="hi"),
        ToolCall(id="c", name="t", arguments="{}", index=0),
        done,
    ]
    assert stream[-1][0] == SEALED_ID
    finished = await store.get(record.id)
    assert finished is not None
    assert finished.status == "completed" and finished.result == TurnResult(content="hi")
    assert finished.error is None and finished.request.agent.messages == []
    assert before <= (finished.finished_at or 0) <= time.time()
    for key in (keys.turn(record.id), keys.events(record.id)):
        assert RETENTION_S - 5 <= await redis.ttl(key) <= RETENTION_S
    assert await redis.zscore(keys.RUNNING_TURNS, record.id) is None
    assert await redis.zscore(keys.active_turns(record.owner), record.id) is None


async def test_a_stream_ending_is_trimmed_to_the_stores_maxlen(
    redis: redis_asyncio.Redis, scratch: Scratch
) -> None:
    store = TurnStore(redis, retention_s=RETENTION_S, stream_maxlen=10)
    record = await claimed(store, scratch)
    before = [ToolCall(id=f"c{n}", name="t", arguments="{}", index=n) for n in range(300)]
    await store.finish(record.id, record.owner, completed(None, None), before=before)
    # `MAXLEN ~` trims whole nodes (100 entries by default), never below the cap.
    assert 10 <= await redis.xlen(keys.events(record.id)) <= 10 + 100


async def test_a_turn_ends_once(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    record = await claimed(store, scratch)
    assert await store.end(record.id, record.owner, Cause.CANCELLED) is Finished.ENDED
    assert await store.end(record.id, record.owner, Cause.OVER) is Finished.OVER
    assert await store.finish(record.id, record.owner, completed("stop", None)) is Finished.OVER
    stream = await stream_of(redis, record.id)
    assert [type(e) for _, e in stream].count(Done) == 1
    assert (await store.get(record.id)).status == "cancelled"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("cause", "code"),
    [(Cause.OVER, ErrorCode.WORKER_LOST), (Cause.UPSTREAM_FAILED, ErrorCode.UPSTREAM_ERROR)],
)
async def test_a_failed_turn_says_why_in_an_error_event_before_its_done(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch, cause: Cause, code: ErrorCode
) -> None:
    record = await claimed(store, scratch)
    assert await store.end(record.id, record.owner, cause, "it broke") is Finished.ENDED
    *_, (_, error), (_, done) = await stream_of(redis, record.id)
    assert error == Error(message="it broke", code=code)
    assert done == ended(code, "it broke")
    finished = await store.get(record.id)
    assert finished is not None and finished.status == "failed"
    assert finished.error == {"message": "it broke", "type": "server_error", "code": str(code)}


async def test_a_cancelled_turn_ends_with_its_done_alone(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    record = await claimed(store, scratch)
    assert await store.end(record.id, record.owner, Cause.CANCELLED) is Finished.ENDED
    assert [type(e) for _, e in await stream_of(redis, record.id)] == [Start, Done]


async def test_a_turn_a_worker_took_is_not_ended_as_queued(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    record = await claimed(store, scratch)
    refused = await store.end(record.id, record.owner, Cause.CANCELLED_QUEUED)
    assert refused is Finished.REFUSED
    assert (await store.get(record.id)).status == "running"  # type: ignore[union-attr]
    queued = await created(store, scratch)
    assert await store.end(queued.id, queued.owner, Cause.CANCELLED_QUEUED) is Finished.ENDED


# -- liveness ----------------------------------------------------------------------------


async def test_renewing_a_workers_liveness_says_which_of_its_turns_stop(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    going, asked, over, released, stray = [
        await claimed(store, scratch, worker="worker-9") for _ in range(5)
    ]
    other = await claimed(store, scratch, worker="worker-8")
    await request_cancel(redis, asked.id, ttl_s=60)
    await request_cancel(redis, other.id, ttl_s=60)  # another worker's: not worker-9's news
    await store.end(over.id, over.owner, Cause.OVER)
    await store.end(released.id, released.owner, Cause.CANCELLED)
    kept = await store.liveness.keep("worker-9", 12, [released.id, stray.id], stale_s=3600)
    assert kept == Kept(over=[over.id], cancelled=[asked.id], stray=[stray.id])
    assert await redis.get(keys.worker_alive("worker-9")) == b"worker-9"
    assert 11_000 < await redis.pttl(keys.worker_alive("worker-9")) <= 12_000
    turns = await redis.smembers(keys.worker_turns("worker-9"))
    # The over and the released ones leave, the stray too: it is no longer the worker's,
    # and its place in the running set (minus when) is any reaper's to end.
    assert turns == {going.id.encode(), asked.id.encode()}
    assert -time.time() - 5 < await redis.zscore(keys.RUNNING_TURNS, stray.id) < 0
    assert await redis.zscore(keys.WORKERS, "worker-9") is not None


async def test_only_the_turns_of_a_worker_whose_liveness_lapsed_are_reaped(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    held = await claimed(store, scratch, worker="worker-live")
    lapsed, skipped = [await claimed(store, scratch, worker="worker-dead") for _ in range(2)]
    await lapse(redis, "worker-dead")
    reaped = await store.reap_lapsed(skip={skipped.id})
    assert lapsed.id in reaped
    assert not {held.id, skipped.id} & set(reaped)
    failed = await store.get(lapsed.id)
    assert failed is not None and failed.status == "failed"
    assert failed.error is not None and failed.error["code"] == "worker_lost"
    for alive in (held, skipped):
        assert (await store.get(alive.id)).status == "running"  # type: ignore[union-attr]
    assert await redis.zscore(keys.RUNNING_TURNS, lapsed.id) is None
    assert await redis.zscore(keys.active_turns(lapsed.owner), lapsed.id) is None
    assert await redis.smembers(keys.worker_turns("worker-dead")) == {skipped.id.encode()}
    assert await redis.zscore(keys.WORKERS, "worker-dead") is not None, "a turn is left"


async def test_a_worker_whose_liveness_lapses_has_every_turn_ended_then_leaves(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    turns = [await claimed(store, scratch, worker="worker-gone") for _ in range(70)]
    await lapse(redis, "worker-gone")
    first = await store.reap_lapsed(limit=50)
    assert 0 < len(first) <= 50, "at most `limit` a sweep"
    for _ in range(3):  # other tests' dead workers may come first
        await store.reap_lapsed(limit=50)
    for record in turns:
        ended_lost = await store.get(record.id)
        assert ended_lost is not None and ended_lost.error == {
            **ended_lost.error,  # type: ignore[dict-item]
            "code": "worker_lost",
        }
    assert await redis.exists(keys.worker_turns("worker-gone")) == 0
    await store.reap_lapsed()
    assert await redis.zscore(keys.WORKERS, "worker-gone") is None


async def test_a_live_workers_thousand_turns_are_not_reaped_and_cost_the_sweep_nothing(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    turns = [await created(store, scratch) for _ in range(1000)]
    await store.liveness.keep("worker-busy", 60, stale_s=3600)
    for record in turns:
        assert (await store.claim(record.id, "worker-busy", overdue_s=30)).outcome == "claimed"
    await reap_leftovers(store)
    before = await _commands(redis)
    assert await store.reap_lapsed() == []
    swept = await _commands(redis) - before - 1  # the INFO of `before`
    workers = await redis.zcard(keys.WORKERS)
    # One range of the workers, one liveness look each, one range of the running set.
    assert swept == 2 + workers, swept
    async with redis.pipeline(transaction=False) as pipe:
        for record in turns:
            pipe.hget(keys.turn(record.id), "status")
        statuses = await pipe.execute()
    assert set(statuses) == {b"running"}
    await redis.delete(keys.worker_turns("worker-busy"), keys.worker_alive("worker-busy"))
    await redis.zrem(keys.WORKERS, "worker-busy")


async def _commands(redis: redis_asyncio.Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


async def test_a_turn_overdue_whatever_its_worker_is_reaped(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    """Past the deadline its claim set: its worker lost track of it, or the claim or the
    finish was cut off between its halves."""
    turns = [await claimed(store, scratch) for _ in range(3)]
    await reap_leftovers(store)
    for n, record in enumerate(turns):
        await redis.zadd(keys.RUNNING_TURNS, {record.id: (n + 1) / 1000})
    first = await store.reap_lapsed(limit=2)
    assert first[:2] == [turns[0].id, turns[1].id]
    assert await redis.zscore(keys.RUNNING_TURNS, turns[2].id) == 0.003


async def test_a_lapsed_turn_whose_record_is_gone_is_dropped_not_reported(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    gone = scratch.turn_id()
    await redis.xadd(keys.events(gone), {"e": b"{}"})
    await redis.zadd(keys.RUNNING_TURNS, {gone: 1})
    assert gone not in await store.reap_lapsed()
    assert await redis.zscore(keys.RUNNING_TURNS, gone) is None
    assert await redis.exists(keys.events(gone)) == 0


async def test_a_turn_no_script_can_end_does_not_stop_the_sweep(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    broken, lapsed = [await claimed(store, scratch) for _ in range(2)]
    await redis.delete(keys.events(broken.id))
    await redis.set(keys.events(broken.id), "clobbered")  # the finish script's XADD fails
    await redis.zadd(keys.RUNNING_TURNS, {broken.id: 1, lapsed.id: 2})
    reaped = await store.reap_lapsed()
    assert lapsed.id in reaped and broken.id not in reaped
    assert await redis.zscore(keys.RUNNING_TURNS, broken.id) is None, "not tried every sweep"
    assert (await store.get(lapsed.id)).status == "failed"  # type: ignore[union-attr]


async def test_at_the_limit_only_entries_of_ended_turns_make_room(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    owner = scratch.owner()
    first, second = [await claimed(store, scratch, owner=owner) for _ in range(2)]
    long_ago = time.time() + 60 - STRANDED_AFTER_S - 5  # admitted long enough ago to look at
    for record in (first, second):
        await store.admit(owner, record.id, limit=2, ttl_s=60)
        await redis.zadd(keys.active_turns(owner), {record.id: long_ago})
    with pytest.raises(TooManyTurnsError):
        await store.admit(owner, "third", limit=2, ttl_s=60)  # both still run: no room
    assert await redis.zcard(keys.active_turns(owner)) == 2
    await store.end(first.id, owner, Cause.CANCELLED)
    await redis.zadd(keys.active_turns(owner), {first.id: long_ago})  # as if never released
    await store.admit(owner, "third", limit=2, ttl_s=60)
    held = {raw.decode() for raw in await redis.zrange(keys.active_turns(owner), 0, -1)}
    assert held == {second.id, "third"}


async def test_at_the_limit_an_ended_turn_makes_room_before_its_finish_releases_it(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    """A client that read a turn's end may ask again before `finish` has released the
    turn's entry: the ended record is enough, however young the entry. An entry whose
    turn has no record yet (its creation under way) is still counted."""
    owner = scratch.owner()
    ended = await claimed(store, scratch, owner=owner)
    await store.end(ended.id, owner, Cause.CANCELLED)
    await store.admit(owner, ended.id, limit=2, ttl_s=60)  # as if not released yet
    await store.admit(owner, "being-created", limit=2, ttl_s=60)
    await store.admit(owner, "next", limit=2, ttl_s=60)
    held = {raw.decode() for raw in await redis.zrange(keys.active_turns(owner), 0, -1)}
    assert held == {"being-created", "next"}
    with pytest.raises(TooManyTurnsError):
        await store.admit(owner, "one-more", limit=2, ttl_s=60)


async def test_at_the_limit_each_old_entry_is_judged_by_its_own_turn(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    """Old entries of running, ended, gone and lapsed turns, interleaved: the entries of the
    ended and gone ones go, the lapsed turn is ended `worker_lost` and goes too, and the
    running ones, whatever their place among the others, stay."""
    owner = scratch.owner()
    running = [await claimed(store, scratch, owner=owner) for _ in range(2)]
    finished = [await claimed(store, scratch, owner=owner) for _ in range(2)]
    for record in finished:
        await store.end(record.id, owner, Cause.CANCELLED)
    lapsed = await claimed(store, scratch, owner=owner, worker="worker-died")
    await lapse(redis, "worker-died")
    gone = scratch.turn_id()
    admitted = [running[0].id, finished[0].id, gone, running[1].id, lapsed.id, finished[1].id]
    long_ago = time.time() + 60 - STRANDED_AFTER_S - 10  # admitted long enough ago to look at
    await redis.zadd(
        keys.active_turns(owner), {turn_id: long_ago + n for n, turn_id in enumerate(admitted)}
    )
    await store.admit(owner, "newcomer", limit=len(admitted), ttl_s=60)
    held = {raw.decode() for raw in await redis.zrange(keys.active_turns(owner), 0, -1)}
    assert held == {running[0].id, running[1].id, "newcomer"}
    assert [(await store.get(r.id)).status for r in running] == ["running", "running"]  # type: ignore[union-attr]
    ended_lapsed = await store.get(lapsed.id)
    assert ended_lapsed is not None and ended_lapsed.error is not None
    assert ended_lapsed.error["code"] == "worker_lost"


async def test_a_stranded_turn_ended_by_a_check_leaves_its_owners_count(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    """Queued past the grace with no job on the queue: `settle` ends it `turn_lost`, and the
    owner's slot goes with it."""
    owner = scratch.owner()
    record = await created(store, scratch, owner=owner)
    await store.admit(owner, record.id, limit=5, ttl_s=60)
    stamp = repr(time.time() - STRANDED_AFTER_S - 5)
    await redis.hset(keys.turn(record.id), "created_at", stamp)
    assert await store.settle(record.id) == "failed"
    ended_turn = await store.get(record.id)
    assert ended_turn is not None and ended_turn.error is not None
    assert ended_turn.error["code"] == "turn_lost"
    assert await redis.zscore(keys.active_turns(owner), record.id) is None


async def test_an_owners_turns_page_newest_first_and_say_when_more_follow(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    owner = scratch.owner()
    records = [await created(store, scratch, owner=owner) for _ in range(4)]
    newest_first = [r.id for r in reversed(records)]
    try:
        page, more = await store.recent(owner, limit=4)
        assert ([r.id for r in page], more) == (newest_first, False), "exactly the limit"
        await redis.delete(keys.turn(newest_first[1]))  # expired: dropped from the index
        page, more = await store.recent(owner, limit=2)
        assert ([r.id for r in page], more) == ([newest_first[0], newest_first[2]], True)
        page, more = await store.recent(owner, after=newest_first[2], limit=2)
        assert ([r.id for r in page], more) == ([newest_first[3]], False)
        assert await store.recent(owner, after="never-listed", limit=2) == ([], False)
    finally:
        await redis.delete(keys.turns(owner))


class _CutOff:
    """A queue role the process died on before its pipeline reached it: every pipeline's
    `execute` fails, and nothing of it is sent."""

    def __init__(self, queue: redis_asyncio.Redis) -> None:
        self.queue = queue

    def pipeline(self, transaction: bool = True) -> object:
        pipe = self.queue.pipeline(transaction=transaction)

        async def execute(raise_on_error: bool = True) -> list[object]:
            raise ConnectionError("the process died here")

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe


async def _queued_delivery(
    redis: redis_asyncio.Redis, queue: str, owner: str, turn_id: str
) -> tuple[str, tuple[object, ...]]:
    """The delivery job of the turn's webhook, as (its function, its arguments), once it is
    on `queue`."""
    job_id = delivery_job_id(owner, turn_id)
    assert await redis.zscore(queue, job_id) is not None, "no delivery waits on the queue"
    job = deserialize_job(await redis.get(job_key_prefix + job_id))
    return job.function, tuple(job.args)


async def test_a_webhook_a_finish_died_before_queueing_is_queued_by_the_next_ending(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    """FINISH ended the turn, then its queue half never ran: the turn stays on the running
    set and its worker's list, so the reaper ends it again; FINISH answers "over" with the
    target no delivery took yet, and that call queues the delivery of the turn's own ending
    (completed, at its `finished_at`), not of the reaper's. Once a delivery attempt took it
    (`taken`), a later ending queues nothing."""
    queue = scratch.queue()
    owner = scratch.owner()
    record = record_of(scratch.turn_id(), owner, background=True, webhook_url="http://h/hook")
    await store.create(record, ttl_s=3600, queue_name=queue)
    await store.liveness.keep("worker-cut", 60, stale_s=3600)
    assert (await store.claim(record.id, "worker-cut", overdue_s=30)).outcome == "claimed"
    job_key = job_key_prefix + delivery_job_id(owner, record.id)
    scratch.turns.append(delivery_job_id(owner, record.id))  # its job key goes at the end
    try:
        store.queue = _CutOff(redis)  # type: ignore[assignment]
        with pytest.raises(ConnectionError):
            await store.finish(record.id, owner, completed("stop", None))
    finally:
        store.queue = redis
    assert await redis.hget(keys.turn(record.id), "status") == b"completed"
    assert await redis.exists(job_key) == 0, "the delivery was lost with the process"

    await lapse(redis, "worker-cut")
    assert await store.reap_lapsed() == [], "it had ended: the reaper only releases it"
    finished_at = int(float(await redis.hget(keys.turn(record.id), "finished_at")))
    assert await _queued_delivery(redis, queue, owner, record.id) == (
        DELIVER_WEBHOOK,
        (owner, record.id, "response.completed", "http://h/hook", finished_at, record.id),
    )
    assert await redis.zscore(keys.RUNNING_TURNS, record.id) is None

    await redis.delete(job_key)
    async with redis.pipeline(transaction=False) as pipe:
        taken(pipe, record.id)
        await pipe.execute()
    assert await store.end(record.id, owner, Cause.OVER) is Finished.OVER
    assert await redis.exists(job_key) == 0, "a delivery its job took is not queued again"


async def test_a_webhook_a_queued_turns_ending_died_before_queueing_is_queued_by_its_claim(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    """A turn cancelled while queued, whose cancelling process died before its queue half:
    nothing reaps a turn no worker took, but its job is still queued, and the claim that
    job's worker makes (refused: the turn is over) queues the delivery of the turn's own
    ending. A claim of a turn that is running elsewhere queues nothing."""
    queue = scratch.queue()
    owner = scratch.owner()
    record = record_of(scratch.turn_id(), owner, background=True, webhook_url="http://h/hook")
    await store.create(record, ttl_s=3600, queue_name=queue)
    job_key = job_key_prefix + delivery_job_id(owner, record.id)
    scratch.turns.append(delivery_job_id(owner, record.id))  # its job key goes at the end
    try:
        store.queue = _CutOff(redis)  # type: ignore[assignment]
        with pytest.raises(ConnectionError):
            await store.end(record.id, owner, Cause.CANCELLED_QUEUED)
    finally:
        store.queue = redis
    assert await redis.hget(keys.turn(record.id), "status") == b"cancelled"
    assert await redis.exists(job_key) == 0, "the delivery was lost with the process"

    worker = f"worker-{uuid.uuid4().hex}"
    assert (await store.claim(record.id, worker, overdue_s=30)).outcome == "cancelled"
    finished_at = int(float(await redis.hget(keys.turn(record.id), "finished_at")))
    assert await _queued_delivery(redis, queue, owner, record.id) == (
        DELIVER_WEBHOOK,
        (owner, record.id, "response.cancelled", "http://h/hook", finished_at, record.id),
    )

    running = record_of(scratch.turn_id(), owner, background=True, webhook_url="http://h/hook")
    await store.create(running, ttl_s=3600, queue_name=queue)
    assert (await store.claim(running.id, worker, overdue_s=30)).outcome == "claimed"
    assert (await store.claim(running.id, "another", overdue_s=30)).outcome == "running"
    assert await redis.exists(job_key_prefix + delivery_job_id(owner, running.id)) == 0
    await redis.delete(keys.worker_turns(worker))
    await redis.zrem(keys.RUNNING_TURNS, running.id)


async def test_a_turn_costs_the_commands_it_did_when_this_was_written(
    redis: redis_asyncio.Redis, store: TurnStore, scratch: Scratch
) -> None:
    """A turn's own moves, as a streamed chat turn makes them (its job's queueing aside):
    admitted, created with its stream watched, claimed, finished. A command more here is
    one more on every turn (docs/benchmarks.md, "Redis cost"). The second turn is counted:
    the first loads the scripts."""
    worker = f"worker-{uuid.uuid4().hex}"
    spent = []
    for _ in range(2):
        record = record_of(scratch.turn_id(), scratch.owner())
        before = await _commands(redis)
        await store.admit(record.owner, record.id, limit=5, ttl_s=3600)
        await store.create(
            record,
            ttl_s=3600,
            queue_name=None,
            attachment="stream-1",
            attachment_expiry=time.time() + 60,
        )
        assert (await store.claim(record.id, worker, overdue_s=30)).outcome == "claimed"
        await store.finish(
            record.id, record.owner, completed("stop", None), result=TurnResult(content="hi")
        )
        spent.append(await _commands(redis) - before - 1)  # the INFO of `before`
    await redis.delete(keys.worker_turns(worker))
    # Admit: EVAL, ZCARD, ZADD, EXPIRE. Create: EVAL, HSET and EXPIRE of the record, XADD and
    # EXPIRE of the stream, ZADD and EXPIRE of the watchers; EVAL of the owner's index: ZADD,
    # ZREMRANGEBYRANK, EXPIRE. Claim: EVAL of ZADD running, SADD and EXPIRE of the worker's
    # turns; EVAL, HGETALL, HSET, GET. Finish: EVALSHA, HMGET, XADD, HSET, HDEL, EXPIRE twice,
    # DEL; EVAL of ZREM twice, HINCRBY. 4 + 11 + 8 + 12.
    assert spent[1] == 35, spent
