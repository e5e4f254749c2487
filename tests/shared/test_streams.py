"""The worker's stream writer: one write in flight per process, every turn's order kept, and
nothing lands after a turn's end or in a stream that is gone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import redis.asyncio as redis_asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from launcher.redis_server import free_port
from shared import keys
from shared.events import (
    Delta,
    Done,
    Error,
    LlmCallComplete,
    LlmPrompt,
    Start,
    ToolCall,
    encode,
)
from shared.lifecycle import SEALED_ID, Cause
from shared.redis_pool import HeldConnection
from shared.streams import (
    _BUSY_ROUND,
    STREAM_FIELD,
    StreamBatcher,
    TurnOverError,
    entry_key,
    parse_entries,
    parse_sent_entries,
    read_streams,
)
from shared.turns import TurnStore


async def entries(redis: redis_asyncio.Redis, turn_id: str) -> list[object]:
    return [s.event for _, s in parse_entries(await redis.xrange(keys.events(turn_id)))]


@pytest.fixture
async def turn_ids(redis: redis_asyncio.Redis) -> AsyncIterator[list[str]]:
    """Three running turns whose streams the API opened, deleted afterwards."""
    ids = [uuid.uuid4().hex for _ in range(3)]
    for turn_id in ids:
        await redis.hset(keys.turn(turn_id), mapping={"id": turn_id, "status": "running"})
        await redis.xadd(keys.events(turn_id), {STREAM_FIELD: encode(Start())})
    yield ids
    await redis.delete(*(key(t) for t in ids for key in (keys.turn, keys.events)))


def batcher_of(redis: redis_asyncio.Redis) -> StreamBatcher:
    return StreamBatcher(redis, maxlen=1000)


async def written(redis: redis_asyncio.Redis, turn_id: str) -> list[object]:
    """The entries after the API's `start`."""
    return (await entries(redis, turn_id))[1:]


async def test_each_turn_keeps_its_order_and_its_queued_deltas_join(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    batcher = batcher_of(redis)
    writers = [batcher.writer(t) for t in turn_ids]
    for writer in writers:
        batcher.add(writer.key, ToolCall(id="c0", name="t", arguments="{}", index=0))
    for k, writer in enumerate(writers):
        # Queued before the round goes out: one entry per turn, joined.
        for piece in ("a", "b", "c"):
            batcher.add(writer.key, Delta(text=f"{k}{piece}"))
        batcher.add(writer.key, ToolCall(id="c1", name="t", arguments="{}", index=0))
    for writer in writers:
        await writer.flush()
    for k, turn_id in enumerate(turn_ids):
        assert await written(redis, turn_id) == [
            ToolCall(id="c0", name="t", arguments="{}", index=0),
            Delta(text=f"{k}a{k}b{k}c"),
            ToolCall(id="c1", name="t", arguments="{}", index=0),
        ]


async def test_a_failed_write_surfaces_at_its_own_turn_only(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    broken, healthy = turn_ids[0], turn_ids[1]
    await redis.delete(keys.events(broken))
    await redis.set(keys.events(broken), "not a stream")
    batcher = batcher_of(redis)
    bad, good = batcher.writer(broken), batcher.writer(healthy)
    await bad.write(Delta(text="x"))
    await good.write(Delta(text="y"))
    with pytest.raises(ResponseError):
        await bad.flush()
    await good.flush()
    assert await written(redis, healthy) == [Delta(text="y")]


async def test_a_discarded_turn_writes_nothing_more(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    batcher = batcher_of(redis)
    first, second = batcher.writer(turn_ids[0]), batcher.writer(turn_ids[1])
    batcher.add(first.key, Delta(text="in flight"))
    batcher.add(second.key, Delta(text="queued"))
    second.discard()
    await first.flush()
    await second.flush()
    assert await written(redis, turn_ids[1]) == []


@pytest.mark.parametrize("cause", [Cause.OVER, Cause.CANCELLED])
async def test_a_turn_ended_elsewhere_takes_no_more_writes(
    redis: redis_asyncio.Redis, turn_ids: list[str], cause: Cause
) -> None:
    ended, running = turn_ids[0], turn_ids[1]
    await redis.hset(keys.turn(ended), "owner", "someone")
    assert await TurnStore(redis, retention_s=60, stream_maxlen=100).end(ended, "someone", cause)
    batcher = batcher_of(redis)
    late, live = batcher.writer(ended), batcher.writer(running)
    await late.write(Delta(text="after the end"))
    await live.write(Delta(text="on time"))
    with pytest.raises(TurnOverError):
        await late.flush()
    await live.flush()
    stored = await entries(redis, ended)
    assert isinstance(stored[-1], Done) and Delta(text="after the end") not in stored
    assert await written(redis, running) == [Delta(text="on time")]


async def test_a_stream_that_is_gone_is_not_recreated(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    """Its record went with it (a Redis restart without persistence): a stream written now
    could never be read, and would never expire."""
    await redis.delete(keys.events(turn_ids[0]))
    writer = batcher_of(redis).writer(turn_ids[0])
    await writer.write(Delta(text="into nothing"))
    with pytest.raises(TurnOverError):
        await writer.flush()
    assert await redis.exists(keys.events(turn_ids[0])) == 0


async def test_a_stream_is_capped_near_its_maxlen(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    batcher = StreamBatcher(redis, maxlen=50)
    writer = batcher.writer(turn_ids[0])
    for n in range(500):
        await writer.write(ToolCall(id=f"c{n}", name="t", arguments="{}", index=n))
        await writer.flush()  # one entry per round: nothing joins
    # `MAXLEN ~` trims whole stream nodes (100 entries each by default), never below 50.
    assert 50 <= await redis.xlen(keys.events(turn_ids[0])) <= 50 + 100


@pytest.mark.parametrize(
    ("entry_id", "key"),
    [
        ("1700000000000-3", (1700000000000, 3)),
        ("0-0", (0, 0)),
        ("5", (5, 0)),
        (SEALED_ID, (2**64 - 1, 2**64 - 1)),
    ],
)
def test_an_entry_id_sorts_as_its_two_numbers(entry_id: str, key: tuple[int, int]) -> None:
    assert entry_key(entry_id) == key


_HELLO = encode(Delta(text="hello"), at=1.5)


@pytest.mark.parametrize(
    ("reply", "streams"),
    [
        (None, []),  # the block timed out
        ([], []),
        (
            [[b"bernard:a", [[b"1-1", [b"e", b"x"]]]], [b"bernard:b", [[b"2-0", [b"w", b"1"]]]]],
            [("bernard:a", [[b"1-1", [b"e", b"x"]]]), ("bernard:b", [[b"2-0", [b"w", b"1"]]])],
        ),
        (  # RESP3: a map of stream to entries
            {b"bernard:a": [[b"1-1", [b"e", b"x"]]]},
            [("bernard:a", [[b"1-1", [b"e", b"x"]]])],
        ),
    ],
)
def test_a_read_reply_as_sent_gives_each_stream_by_its_key(
    reply: object, streams: list[tuple[str, object]]
) -> None:
    assert read_streams(reply) == streams


@pytest.mark.parametrize(
    "fields",
    [[b"e", _HELLO], [b"e", _HELLO, b"extra", b"1"], [b"extra", b"1", b"e", _HELLO]],
)
def test_an_entry_as_sent_gives_its_event_whatever_else_it_holds(fields: list[bytes]) -> None:
    ((entry_id, stamped),) = parse_sent_entries([[b"7-2", fields]])

    assert entry_id == "7-2"
    assert stamped.event == Delta(text="hello")
    assert stamped.at == 1.5


@pytest.mark.parametrize("protocol", [2, 3])
async def test_a_held_read_parses_as_redis_pys_own(redis_url: str, protocol: int) -> None:
    client = redis_asyncio.Redis.from_url(redis_url, protocol=protocol)
    key = f"bernard:test:streams:{uuid.uuid4().hex}"
    await client.xadd(key, {STREAM_FIELD: _HELLO}, id="1-1")
    await client.xadd(key, {STREAM_FIELD: encode(Delta(text="again"), at=2.0)}, id="1-2")
    held = HeldConnection(client.connection_pool)
    try:
        (reply,) = await held.run([("XREAD", "COUNT", 10, "STREAMS", key, "0-0")])
        ours = [(name, parse_sent_entries(raw)) for name, raw in read_streams(reply)]
        theirs = await client.xread({key: "0-0"}, count=10)
    finally:
        await held.aclose()
        await client.delete(key)
        await client.aclose()

    assert [(name, [entry_id for entry_id, _ in entries]) for name, entries in ours] == [
        (key, ["1-1", "1-2"])
    ]
    # redis-py's RESP3 reply wraps each stream's entries in a list of one.
    their_entries = theirs[0][1] if protocol == 2 else theirs[key.encode()][0]
    assert ours[0][1] == parse_entries(their_entries)


def test_entry_ids_order_by_time_then_sequence_not_as_text() -> None:
    ids = ["10-0", "9-10", "9-9", "9-0", "100-1"]
    assert sorted(ids, key=entry_key) == ["9-0", "9-9", "9-10", "10-0", "100-1"]


async def test_a_write_error_is_raised_once_by_its_turns_next_write(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    broken, healthy = turn_ids[0], turn_ids[1]
    await redis.delete(keys.events(broken))
    await redis.set(keys.events(broken), "not a stream")
    batcher = batcher_of(redis)
    writer = batcher.writer(broken)
    batcher.add(broken, ToolCall(id="c0", name="t", arguments="{}", index=0))
    batcher.add(healthy, Delta(text="same round"))
    await batcher.flush(healthy)  # the round is over: the broken turn's write failed
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await writer.write(ToolCall(id="c1", name="t", arguments="{}", index=0))
    await redis.delete(keys.events(broken))
    await redis.xadd(keys.events(broken), {STREAM_FIELD: encode(Start())})
    await writer.write(Delta(text="mended"))
    await writer.flush()  # raised once: the mended stream takes writes again
    assert await written(redis, broken) == [Delta(text="mended")]


async def test_a_discarded_turn_forgets_its_write_error(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    broken = turn_ids[0]
    await redis.delete(keys.events(broken))
    batcher = batcher_of(redis)
    writer = batcher.writer(broken)
    await writer.write(Delta(text="into nothing"))
    with pytest.raises(TurnOverError):
        await writer.flush()
    await writer.write(Delta(text="again"))
    await asyncio.sleep(0.05)
    writer.discard()
    await writer.flush()  # nothing is raised: the turn is over and known to be


async def test_a_lost_connection_fails_every_turn_of_the_round() -> None:
    unreachable = redis_asyncio.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    batcher = batcher_of(unreachable)
    try:
        first, second = batcher.writer("t1"), batcher.writer("t2")
        batcher.add(first.key, Delta(text="a"))
        batcher.add(second.key, Delta(text="b"))
        for writer in (first, second):
            with pytest.raises(RedisConnectionError):
                await writer.flush()
    finally:
        await unreachable.aclose()


async def test_queued_deltas_join_only_when_adjacent(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    batcher = batcher_of(redis)
    key = turn_ids[0]
    call = ToolCall(id="c", name="t", arguments="{}", index=0)
    for event in (Delta(text="a"), Delta(text="b"), call, Delta(text="c"), Delta(text="d")):
        batcher.add(key, event)
    assert batcher.backlog(key) == 3
    await batcher.flush(key)
    assert batcher.backlog(key) == 0
    assert await written(redis, key) == [Delta(text="ab"), call, Delta(text="cd")]


async def test_a_model_call_event_goes_out_once_the_producer_next_waits(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    batcher = batcher_of(redis)
    writer = batcher.writer(turn_ids[0])
    prompt = LlmPrompt(stage="response", model="m", messages=[])
    await writer.write(prompt)
    assert batcher.backlog(writer.key) == 1, "still queued: the producer has not waited"
    await writer.write(Delta(text="a"))
    assert batcher.backlog(writer.key) == 0, "the round started before the producer went on"
    await writer.flush()
    assert await written(redis, turn_ids[0]) == [prompt, Delta(text="a")]


class Ticks:
    """Counts the event loop's turns at other tasks: a producer that yields lets it run."""

    def __init__(self) -> None:
        self.count = 0
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.count += 1


async def test_behind_a_round_in_flight_the_producer_goes_on_and_its_deltas_join(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    batcher = batcher_of(redis)
    writer = batcher.writer(turn_ids[0])
    await writer.write(Delta(text="a"))  # no round in flight: this one starts, at once
    assert batcher.backlog(writer.key) == 0
    ticks = Ticks()
    await asyncio.sleep(0)
    before = ticks.count
    for piece in "bcd":
        await writer.write(Delta(text=piece))
    assert ticks.count == before, "the producer went on without letting the loop run"
    assert batcher.backlog(writer.key) == 1, "joined, waiting for the round in flight"
    await writer.flush()
    ticks.task.cancel()
    assert await written(redis, turn_ids[0]) == [Delta(text="a"), Delta(text="bcd")]


async def test_a_producer_behind_rounds_still_lets_the_loop_run_every_32_events(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    """However much its upstream sent at once, one turn cannot hold up the worker's others."""
    batcher = batcher_of(redis)
    writer = batcher.writer(turn_ids[0])
    await writer.write(Delta(text="0"))
    ticks = Ticks()
    await asyncio.sleep(0)
    before = ticks.count
    for k in range(1, 101):
        await writer.write(Delta(text=str(k)))
    assert ticks.count - before == 100 // 32
    await writer.flush()
    ticks.task.cancel()
    assert "".join(e.text for e in await written(redis, turn_ids[0])) == "".join(
        str(k) for k in range(101)
    )


async def test_a_producer_that_never_waits_is_held_back_past_1000_queued_events(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    batcher = batcher_of(redis)
    writer = batcher.writer(turn_ids[0])
    done = LlmCallComplete(stage="response", model="m", latency_ms=1)
    for _ in range(1000):
        await writer.write(done)  # model-call events do not yield: they pile up
    assert batcher.backlog(writer.key) == 1000
    await writer.write(done)  # one too many: this write waits until all are in Redis
    assert batcher.backlog(writer.key) == 0
    assert await redis.xlen(keys.events(turn_ids[0])) == 1 + 1001


async def test_after_a_busy_round_a_turns_next_deltas_wait_a_moment_and_join(
    redis: redis_asyncio.Redis,
) -> None:
    """A round of many turns (a worker that keeps up with its upstreams sends one token per
    turn per round) is followed by a short pause, so the tokens arriving meanwhile go out
    as one entry per turn instead of one round, and one XADD, per token."""
    busy = [uuid.uuid4().hex for _ in range(_BUSY_ROUND)]
    for turn_id in busy:
        await redis.xadd(keys.events(turn_id), {STREAM_FIELD: encode(Start())})
    try:
        batcher = batcher_of(redis)
        for turn_id in busy:
            batcher.add(turn_id, Delta(text="a"))
        first = busy[0]
        await batcher.flush(first)  # the busy round is in Redis; its pause has begun
        for piece in ("b", "c", "d"):
            batcher.add(first, Delta(text=piece))
            await asyncio.sleep(0)  # a loop iteration: without the pause, a round each
        await batcher.flush(first)
        assert await written(redis, first) == [Delta(text="a"), Delta(text="bcd")]
    finally:
        await redis.delete(*(keys.events(t) for t in busy))


async def test_an_event_that_cannot_be_written_fails_its_own_turn_and_no_other(
    redis: redis_asyncio.Redis, turn_ids: list[str]
) -> None:
    broken, healthy = turn_ids[0], turn_ids[1]
    batcher = batcher_of(redis)
    batcher.add(healthy, Delta(text="fine"))
    # A field no JSON can hold, in the same round as the healthy turn's delta.
    batcher.add(broken, Error(message="x", code=cast(Any, {"not", "json"})))
    with pytest.raises(TypeError):
        await batcher.flush(broken)
    await batcher.flush(healthy)
    assert await written(redis, healthy) == [Delta(text="fine")]
    assert await written(redis, broken) == []
