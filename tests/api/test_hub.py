"""The API's stream hub: many turns' streams read in lanes, every entry to its readers."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path

import pytest
import redis.asyncio as redis_asyncio
from redis.exceptions import ResponseError

from api.cluster_hub import ClusterHub
from api.hub import Reader, StreamHead, StreamHub, StreamReadError, _Lane
from launcher.redis_server import free_port
from shared import keys
from shared.connection import connect_data
from shared.events import Delta, Stamped, encode
from shared.streams import STREAM_FIELD, Entry
from tests.support.processes import private_redis


async def append(redis: redis_asyncio.Redis, turn_id: str, text: str) -> None:
    await redis.xadd(keys.events(turn_id), {STREAM_FIELD: encode(Delta(text=text))})


async def texts(reader: Reader, count: int) -> list[str]:
    got = []
    for _ in range(count):
        _, stamped = await reader.next(wait_s=2)
        assert isinstance(stamped.event, Delta)
        got.append(stamped.event.text)
    return got


async def test_turns_spread_over_the_lanes_each_get_their_own_entries_in_order(
    redis: redis_asyncio.Redis,
) -> None:
    hub = StreamHub(redis, block_ms=1000, lanes=3)
    await hub.start()
    turn_ids = [uuid.uuid4().hex for _ in range(5)]
    try:
        async with contextlib.AsyncExitStack() as stack:
            readers = [await stack.enter_async_context(hub.read(t)) for t in turn_ids]
            assert sorted(len(lane.readers) for lane in hub._lanes) == [1, 2, 2]
            for k in range(3):
                for turn_id in turn_ids:
                    await append(redis, turn_id, f"{turn_id}:{k}")
            for turn_id, reader in zip(turn_ids, readers, strict=True):
                assert await texts(reader, 3) == [f"{turn_id}:{k}" for k in range(3)]
    finally:
        await hub.stop()
        await redis.delete(*(keys.events(t) for t in turn_ids))


async def test_a_second_reader_of_a_turn_shares_its_lane_and_sees_every_entry(
    redis: redis_asyncio.Redis,
) -> None:
    hub = StreamHub(redis, block_ms=1000, lanes=1)
    await hub.start()
    turn_id = uuid.uuid4().hex
    try:
        async with hub.read(turn_id) as first:
            await append(redis, turn_id, "a")
            assert await texts(first, 1) == ["a"]
            async with hub.read(turn_id) as second:
                assert len(hub._lanes) == 1
                await append(redis, turn_id, "b")
                assert await texts(first, 1) == ["b"]
                assert await texts(second, 2) == ["a", "b"]
    finally:
        await hub.stop()
        await redis.delete(keys.events(turn_id))


# -- one reader's view ---------------------------------------------------------------------


def entry(entry_id: str) -> Entry:
    return (entry_id, Stamped(event=Delta(text=entry_id)))


@pytest.mark.parametrize(
    ("cursor", "read_from", "batch", "taken", "cursor_after"),
    [
        # A batch read from the reader's own cursor: all of it, in order.
        ("9-5", "9-5", ["9-6", "10-0"], ["9-6", "10-0"], "10-0"),
        # Read from an older cursor (another reader of the turn): only what is after ours.
        ("9-5", "9-0", ["9-1", "9-5", "9-6", "10-0"], ["9-6", "10-0"], "10-0"),
        # Ids compare as numbers, not text: "10-0" is after "9-5", "9-10" after "9-9".
        ("9-9", "9-9", ["9-10", "10-0"], ["9-10", "10-0"], "10-0"),
        # Read from a later cursor than ours (in flight when we joined): it would leave a
        # gap, so nothing; the next read starts from ours.
        ("9-5", "9-6", ["9-7"], [], "9-5"),
        ("9-5", "10-0", ["10-1"], [], "9-5"),
        # Nothing new.
        ("9-5", "9-0", ["9-1", "9-5"], [], "9-5"),
    ],
)
async def test_a_reader_takes_exactly_the_entries_after_its_cursor(
    cursor: str, read_from: str, batch: list[str], taken: list[str], cursor_after: str
) -> None:
    reader = Reader("t", cursor)
    reader.offer(read_from, [entry(e) for e in batch])
    got = []
    with contextlib.suppress(TimeoutError):
        while True:
            got.append((await reader.next(wait_s=0))[0])
    assert (got, reader.cursor) == (taken, cursor_after)


async def test_a_reader_with_nothing_new_times_out() -> None:
    reader = Reader("t", "0-0")
    with pytest.raises(TimeoutError):
        await reader.next(wait_s=0.01)


@pytest.mark.parametrize(
    ("waits", "quiet_s"),
    [
        # A wait that got its entry leaves its timer set; a later wait is still given its
        # whole time, measured from its own start.
        ([0.2, 0.2], 0.2),
        # A shorter wait after a long one does not wait out the long one's timer.
        ([5.0, 0.05], 0.05),
    ],
    ids=["later wait, same limit", "shorter limit"],
)
async def test_a_reader_times_out_after_its_own_waits_limit(
    waits: list[float], quiet_s: float
) -> None:
    reader = Reader("t", "0-0")
    *earlier, last = waits
    for k, wait_s in enumerate(earlier):
        asyncio.get_running_loop().call_later(0.05, reader.offer, "0-0", [entry(f"{k + 1}-0")])
        await reader.next(wait_s=wait_s)
    await asyncio.sleep(0.1)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await reader.next(wait_s=last)
    assert quiet_s * 0.9 <= time.monotonic() - started < quiet_s + 0.5
    reader.close()


async def test_a_failed_reader_hands_out_what_it_holds_then_the_error() -> None:
    reader = Reader("t", "0-0")
    reader.offer("0-0", [entry("1-0")])
    reader.fail(StreamReadError("refused"))
    assert (await reader.next(wait_s=1))[0] == "1-0"
    with pytest.raises(StreamReadError, match="refused"):
        await reader.next(wait_s=1)


# -- the hub -------------------------------------------------------------------------------


async def test_a_hub_reads_nothing_before_it_starts_or_after_it_stops(
    redis: redis_asyncio.Redis,
) -> None:
    hub = StreamHub(redis, block_ms=100)
    with pytest.raises(RuntimeError, match="not running"):
        async with hub.read(uuid.uuid4().hex):
            pass
    await hub.start()
    await hub.stop()
    with pytest.raises(RuntimeError, match="not running"):
        async with hub.read(uuid.uuid4().hex):
            pass


async def test_a_reader_starts_strictly_after_the_entry_it_names(
    redis: redis_asyncio.Redis,
) -> None:
    hub = StreamHub(redis, block_ms=1000)
    await hub.start()
    turn_id = uuid.uuid4().hex
    try:
        for text in ("a", "b", "c"):
            await append(redis, turn_id, text)
        first = (await redis.xrange(keys.events(turn_id)))[0][0].decode()
        async with hub.read(turn_id, first) as reader:
            assert await texts(reader, 2) == ["b", "c"]
        async with hub.read(turn_id) as reader:
            assert await texts(reader, 3) == ["a", "b", "c"]
    finally:
        await hub.stop()
        await redis.delete(keys.events(turn_id))


async def test_a_lane_reads_each_stream_from_its_readers_oldest_cursor_as_they_come_and_go(
    redis: redis_asyncio.Redis,
) -> None:
    lane = _Lane(redis, keys.hub_wake(uuid.uuid4().hex), block_ms=1000)
    a, b = uuid.uuid4().hex, uuid.uuid4().hex

    def read_from() -> dict[str, str]:
        return {keys.id_of(k): v for k, v in lane._streams().items() if k != lane.wake_key}

    try:
        later, earlier = Reader(a, "10-0"), Reader(a, "9-5")
        lane.add(later)
        lane.add(earlier)
        assert read_from() == {a: "9-5"}  # ids compare as numbers
        lane.remove(earlier)
        assert read_from() == {a: "10-0"}
        fresh = Reader(b, "0-0")
        lane.add(fresh)
        assert read_from() == {a: "10-0", b: "0-0"}
        await lane.wake()  # the lane's read now names b too
        entry_id = (
            await redis.xadd(keys.events(b), {STREAM_FIELD: encode(Delta(text="x"))})
        ).decode()
        assert (await fresh.next(wait_s=2))[0] == entry_id
        assert read_from() == {a: "10-0", b: entry_id}  # b's next read starts after it
        lane.remove(later)
        lane.remove(later)  # a reader that already left changes nothing
        assert read_from() == {b: entry_id}
    finally:
        await lane.stop()
        await redis.delete(keys.events(b))


async def test_lanes_are_made_up_to_the_limit_and_reused_once_empty(
    redis: redis_asyncio.Redis,
) -> None:
    hub = StreamHub(redis, block_ms=1000, lanes=2)
    await hub.start()
    turn_ids = [uuid.uuid4().hex for _ in range(4)]
    try:
        async with hub.read(turn_ids[0]):
            assert len(hub._lanes) == 1
        # The only lane is empty again: the next turn takes it rather than a new one.
        async with hub.read(turn_ids[1]) as reader:
            assert len(hub._lanes) == 1
            assert hub._lanes[0].readers == {turn_ids[1]: {reader}}
            async with hub.read(turn_ids[2]), hub.read(turn_ids[3]):
                assert sorted(len(lane.readers) for lane in hub._lanes) == [1, 2]
        assert [lane.readers for lane in hub._lanes] == [{}, {}]
        assert hub._lane_of == {}, "a turn nobody reads is forgotten"
        for turn_id in turn_ids:
            await append(redis, turn_id, turn_id)
        async with hub.read(turn_ids[3]) as reader:
            assert await texts(reader, 1) == [turn_ids[3]]
    finally:
        await hub.stop()
        await redis.delete(*(keys.events(t) for t in turn_ids))


async def test_each_lane_has_a_bounded_wake_stream_that_expires_and_goes_with_the_hub(
    redis: redis_asyncio.Redis,
) -> None:
    hub = StreamHub(redis, block_ms=1000, lanes=2)
    await hub.start()
    turn_ids = [uuid.uuid4().hex for _ in range(2)]
    wake_keys = [keys.hub_wake(f"{hub._id}:{n}") for n in range(2)]
    try:
        async with hub.read(turn_ids[0]), hub.read(turn_ids[1]):
            assert [lane.wake_key for lane in hub._lanes] == wake_keys
            for _ in range(40):  # readers come and go
                async with hub.read(turn_ids[0]):
                    pass
            for key in wake_keys:
                assert 0 < await redis.xlen(key) <= 16
                assert 3500 < await redis.ttl(key) <= 3600
    finally:
        await hub.stop()
    assert await redis.exists(*wake_keys) == 0


async def test_a_new_reader_is_served_at_once_though_its_lane_is_blocked_reading(
    redis: redis_asyncio.Redis,
) -> None:
    hub = StreamHub(redis, block_ms=30_000, lanes=1)
    await hub.start()
    quiet, busy = uuid.uuid4().hex, uuid.uuid4().hex
    try:
        await append(redis, busy, "waiting")
        async with hub.read(quiet):
            await asyncio.sleep(0.05)  # the lane is now blocked in XREAD on `quiet` alone
            async with hub.read(busy) as reader:
                assert await texts(reader, 1) == ["waiting"]
    finally:
        await hub.stop()
        await redis.delete(keys.events(quiet), keys.events(busy))


async def test_readers_go_on_after_redis_comes_back(tmp_path: Path) -> None:
    async with private_redis(tmp_path / "redis") as server:
        redis = redis_asyncio.Redis.from_url(server.url)
        hub = StreamHub(redis, block_ms=200, lanes=1)
        await hub.start()
        turn_id = uuid.uuid4().hex
        try:
            async with hub.read(turn_id) as reader:
                await append(redis, turn_id, "before")
                assert await texts(reader, 1) == ["before"]
                await server.restart(down_s=0.3)
                await append(redis, turn_id, "after")
                assert await texts(reader, 1) == ["after"]
        finally:
            await hub.stop()
            await redis.aclose()


async def test_a_refused_stream_ends_only_its_own_readers(redis: redis_asyncio.Redis) -> None:
    hub = StreamHub(redis, block_ms=200, lanes=1)
    await hub.start()
    good, bad = uuid.uuid4().hex, uuid.uuid4().hex
    await redis.set(keys.events(bad), "not a stream")
    try:
        async with hub.read(good) as reader, hub.read(bad) as first, hub.read(bad) as second:
            for broken in (first, second):
                with pytest.raises(StreamReadError, match="WRONGTYPE"):
                    await broken.next(wait_s=5)
            assert bad not in hub._lanes[0].readers
            await append(redis, good, "still here")
            assert await texts(reader, 1) == ["still here"]
    finally:
        await hub.stop()
        await redis.delete(keys.events(good), keys.events(bad))


async def test_a_lane_whose_wake_stream_was_clobbered_reads_again_once_it_is_gone(
    redis: redis_asyncio.Redis,
) -> None:
    """Redis refusing the lane's own wake stream fails no reader: the lane starts that
    stream over and serves its readers as soon as the key is usable again."""
    hub = StreamHub(redis, block_ms=100, lanes=1)
    await hub.start()
    turn_id = uuid.uuid4().hex
    try:
        async with hub.read(turn_id) as reader:
            wake_key = hub._lanes[0].wake_key
            await redis.delete(wake_key)
            await redis.set(wake_key, "not a stream")
            await asyncio.sleep(0.3)  # a few refused reads
            await redis.delete(wake_key)
            await append(redis, turn_id, "back")
            assert await texts(reader, 1) == ["back"]
    finally:
        await hub.stop()
        await redis.delete(keys.events(turn_id))


async def test_a_lane_that_loses_redis_while_probing_a_refused_read_fails_nobody() -> None:
    unreachable = redis_asyncio.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    hub = StreamHub(unreachable, block_ms=100, lanes=1)
    await hub.start()
    try:
        lane = _Lane(unreachable, keys.hub_wake(uuid.uuid4().hex), 100)
        hub._lanes.append(lane)
        reader = Reader("t", "0-0")
        lane.readers["t"] = {reader}
        streams = {lane.wake_key: "0-0", keys.events("t"): "0-0"}
        async with asyncio.timeout(0.5):  # and promptly back to the read loop
            await lane._fail_unreadable(streams, ResponseError("WRONGTYPE"))
        assert lane.readers == {"t": {reader}}
        with pytest.raises(TimeoutError):
            await reader.next(wait_s=0.01)
    finally:
        await hub.stop()
        await unreachable.aclose()


async def test_a_cluster_hub_whose_cluster_cannot_be_reached_waits_and_does_not_die() -> None:
    unreachable = connect_data(f"redis+cluster://127.0.0.1:{free_port()}", retries=0)
    hub = ClusterHub(unreachable, sweep_s=0.1)
    await hub.start()
    try:
        async with hub.read(uuid.uuid4().hex) as reader:
            with pytest.raises(TimeoutError):
                await reader.next(wait_s=0.5)  # several sweeps failed meanwhile
            assert hub._reader_task is not None and not hub._reader_task.done()
    finally:
        await hub.stop()
        await unreachable.aclose()


def _batch(first: int, last: int) -> list[Entry]:
    """Entries `first-0` … `last-0`: entry `k-0` is the k-th the stream ever held."""
    return [(f"{k}-0", Stamped(Delta(text="t"), at=0.0)) for k in range(first, last + 1)]


def _head(first: int, last: int, length: int, added: int | None) -> StreamHead:
    return StreamHead(first=(first, 0), last=(last, 0), length=length, added=added)


@pytest.mark.parametrize(
    ("cursor", "ordinal", "batch", "head", "lost"),
    [
        # Entries 4-8 held, 1-3 trimmed: a reader that had entry 3 lost nothing...
        ((3, 0), 3, _batch(4, 8), _head(4, 8, 5, 8), False),
        # ...one that had only entry 2 lost entry 3.
        ((2, 0), 2, _batch(4, 8), _head(4, 8, 5, 8), True),
        # Entries 4 and 5 trimmed after the read that returned them: nothing lost.
        ((3, 0), 3, _batch(4, 8), _head(6, 8, 3, 8), False),
        # Its cursor's entry gone, and where it stood not known yet: taken as lost.
        ((3, 0), None, _batch(4, 8), _head(4, 8, 5, 8), True),
        # Its cursor's entry still held: nothing lost, whatever else went.
        ((4, 0), None, _batch(5, 8), _head(4, 8, 5, 8), False),
        # The whole batch trimmed since the read.
        ((3, 0), 3, _batch(4, 8), _head(9, 9, 1, 9), True),
        # Redis before 7.0 (no count): a reader from the start goes on, one from a cursor
        # whose entry is gone does not.
        ((0, 0), 0, _batch(4, 8), _head(4, 8, 5, None), False),
        ((3, 0), 3, _batch(4, 8), _head(4, 8, 5, None), True),
    ],
)
def test_a_stream_head_tells_a_hole_after_a_readers_cursor(
    cursor: tuple[int, int],
    ordinal: int | None,
    batch: list[Entry],
    head: StreamHead,
    lost: bool,
) -> None:
    assert head.lost(cursor, ordinal, batch) is lost


@pytest.mark.parametrize(
    ("batch", "head", "ordinal"),
    [
        (_batch(4, 8), _head(4, 8, 5, 8), 8),  # it reaches the stream's end
        (_batch(4, 6), _head(4, 8, 5, 8), 6),  # it holds the stream's first entry
        (_batch(3, 6), _head(4, 8, 5, 8), 6),  # ... entry 3 trimmed since it was read
        (_batch(5, 7), _head(4, 8, 5, 8), None),  # neither: the head does not tell
        (_batch(4, 8), _head(4, 8, 5, None), None),  # Redis before 7.0
    ],
)
def test_a_stream_head_numbers_a_batchs_last_entry(
    batch: list[Entry], head: StreamHead, ordinal: int | None
) -> None:
    assert head.ordinal_of_last(batch) == ordinal
