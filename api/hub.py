"""A few readers per API process for every stream its clients are watching: a turn's, or an
owner's event stream (`GET /v1/events`, shared/keys.py `user_stream_id`), each by its id.

The hub spreads the watched streams over at most `LANES` lanes; each lane runs one
`XREAD BLOCK` over its streams and hands each entry to the readers that have not seen it,
rather than a connection and an XREAD per client. Lanes because one read over N streams costs
O(N) per token; few, because entries that land during a lane's read come back together in
its next. A Redis error naming a stream fails that stream's readers alone, and a reader that
fell behind what the stream keeps fails with `StreamTrimmedError` rather than read past a
hole (`StreamHead` says why that costs a reader that keeps up nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from shared import keys
from shared.connection import reply_text
from shared.redis_pool import HeldConnection, backoff_s
from shared.streams import Entry, entry_key, parse_sent_entries, read_streams

logger = logging.getLogger("bernard.api")

LANES = 8
_READ_COUNT = 1000
_WAKE_TTL_S = 3600
# KEYS: a lane's wake stream. ARGV: its TTL s. Wakes the lane's XREAD (an entry its read
# returns at once) and renews the stream, in one command: on every reader a lane takes.
_WAKE = """
redis.call('XADD', KEYS[1], 'MAXLEN', '16', '*', 'w', '1')
redis.call('EXPIRE', KEYS[1], ARGV[1])
"""


class StreamReadError(Exception):
    """Redis refused to read this reader's stream; the reader cannot go on."""


class StreamTrimmedError(StreamReadError):
    """Entries after this reader's cursor were trimmed from the stream (MAXLEN) before it
    read them: what is left would reach its client with a hole in it."""

    def __init__(self) -> None:
        super().__init__("entries after this reader's cursor were trimmed before it read them")


class Reader:
    """One client's view of one stream: entries strictly after `cursor`, in order.

    A reader waits for its next entry under one timer that it re-arms only when it fires
    early (the wait it was set for ended and a later one began): arming and cancelling a
    timeout for every entry was 5 µs a frame, a tenth of the API's CPU per relayed frame
    of 100 paced streams (docs/benchmarks.md, cost per token). `close()` drops the timer.
    """

    def __init__(self, stream_id: str, cursor: str, *, whole: bool = True) -> None:
        self.stream_id = stream_id
        self.cursor = cursor
        # Whether it needs every entry after its cursor (a relay: else it is failed with
        # `StreamTrimmedError` on a hole), or only what is left (a wait for the `done`).
        self.whole = whole
        # The cursor as it sorts (`entry_key`), kept beside it: the hub compares cursors at
        # every read, and parsing one is most of what a comparison costs.
        self.cursor_key = entry_key(cursor)
        # Where its cursor's entry stands among all the stream ever held (1 for the first
        # entry added; 0 from the start), once known (`StreamHead`): it tells a hole from a
        # cursor's entry trimmed after the reader had it. Counted on as it takes entries.
        self.ordinal: int | None = 0 if self.cursor_key == (0, 0) else None
        self._entries: deque[Entry] = deque()
        self._error: StreamReadError | None = None
        # The wait in progress, and when it gives up (the loop's clock).
        self._waiter: asyncio.Future[None] | None = None
        self._deadline = math.inf
        self._timer: asyncio.TimerHandle | None = None

    def fail(self, error: StreamReadError) -> None:
        """End this reader: once it has handed out what it holds, `next()` raises `error`."""
        self._error = error
        self._wake()

    def offer(self, read_from: str, entries: list[Entry]) -> None:
        """Take the entries after this reader's cursor from a batch read after `read_from`.

        A batch read from a later cursor than ours (it was in flight when we joined) would
        leave a gap: skip it; the next read starts at our cursor.
        """
        cursor = self.cursor_key
        if entry_key(read_from) > cursor:
            return
        taken = 0
        for entry_id, stamped in entries:
            key = entry_key(entry_id)
            if key > cursor:
                self._entries.append((entry_id, stamped))
                self.cursor, self.cursor_key = entry_id, key
                cursor = key
                taken += 1
        if self.ordinal is not None:
            self.ordinal += taken
        if self._entries:
            self._wake()

    async def next(self, wait_s: float | None = None) -> Entry:
        """The next entry; raises `TimeoutError` after `wait_s` seconds without one, and
        `StreamReadError` once the stream cannot be read."""
        if not self._entries and self._error is None:
            await self._wait(wait_s)
        if self._entries:
            return self._entries.popleft()
        assert self._error is not None
        raise self._error

    def ready(self) -> list[Entry]:
        """The entries already here, without waiting (a read error stays for `next`)."""
        entries = list(self._entries)
        self._entries.clear()
        return entries

    def close(self) -> None:
        """The reader's stream is no longer watched: drop its timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _wait(self, wait_s: float | None) -> None:
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        self._deadline = math.inf if wait_s is None else loop.time() + wait_s
        if wait_s is not None and (self._timer is None or self._timer.when() > self._deadline):
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(self._deadline, self._on_deadline)
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _on_deadline(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done() or self._deadline == math.inf:
            return  # not waiting, or waiting without a limit: the next wait arms its own
        loop = asyncio.get_running_loop()
        if loop.time() < self._deadline:  # set for an earlier wait: this one ends later
            self._timer = loop.call_at(self._deadline, self._on_deadline)
        else:
            waiter.set_exception(TimeoutError())


@dataclass(frozen=True, slots=True)
class StreamHead:
    """Where a stream starts and ends now, and how many entries it ever held, as `XINFO
    STREAM` says (`head_of`): what tells a reader's hole from a whole batch.

    Why a reader that keeps up never asks: a stream trimmed to `MAXLEN ~ N` keeps at
    least N entries, so once an entry after a reader's cursor is trimmed, at least N newer
    ones are there, all after its cursor, and its next read returns a full batch
    (`min(COUNT, N)` entries). A batch shorter than that cannot follow a hole, and a reader
    that keeps up only ever gets short ones: the head is asked (one command, pipelined over
    every such stream of a read) only for a batch that long, which only a reader about as
    far behind as the stream keeps, or one resuming or starting on a long stream, gets.

    Why more than the first entry: entry ids are times, not positions, so a cursor whose
    own entry is gone says nothing of whether the next one went too (Redis trims whole
    nodes of entries: the cursor's can go with its node while the next node stays). The
    count of entries the stream ever held (`entries-added`, Redis 7) gives positions: the
    first entry now is number `trimmed + 1`, and a reader that knows its cursor's number
    (`Reader.ordinal`: from the start it is 0; a check gives it to every reader whose batch
    reaches the stream's end or holds its first entry, and it counts on from there) lost
    entries exactly when the first entry after its cursor is not the next number. A reader
    that does not know it (a resume from a cursor, until a check) and whose cursor's entry
    is gone is taken to have lost entries: it is at least N entries behind.
    """

    # The first entry's key now (`entry_key`); None for an empty stream.
    first: tuple[int, int] | None
    # The last entry's key (the last id the stream generated).
    last: tuple[int, int] | None
    # Entries it holds now.
    length: int
    # Entries it ever held (`entries-added`); None before Redis 7.0.
    added: int | None

    @property
    def trimmed(self) -> int | None:
        """Entries trimmed from its start so far; None where Redis (before 7.0) does not
        say."""
        return None if self.added is None else self.added - self.length

    def _trimmed_since(self, entries: list[Entry]) -> int:
        """How many of `entries` (a batch read just before this head) were trimmed since:
        those before the first entry now."""
        first = self.first
        return sum(1 for entry_id, _ in entries if first is None or entry_key(entry_id) < first)

    def lost(self, cursor: tuple[int, int], ordinal: int | None, entries: list[Entry]) -> bool:
        """Whether a reader at `cursor` (its entry's number `ordinal`, if known) lost
        entries before `entries`, the batch a read after `cursor` returned just before this
        head was read."""
        if not entries or cursor >= entry_key(entries[0][0]):
            return False  # the batch holds its cursor's entry, or starts after it
        if self.first is None or self.first > entry_key(entries[-1][0]):
            return True  # all of it went since the read: not a reader that keeps up
        if cursor >= self.first:
            return False  # its cursor's entry, or one before it, is still there
        trimmed = self.trimmed
        if trimmed is None:
            # Its cursor's entry is gone, and nothing says where entries stand: lost,
            # unless it read from the start (as before this check, it goes on).
            return cursor != (0, 0)
        # The first entry now is in the batch: the batch's first is number
        # `trimmed + 1 - since` (those before it in the batch were trimmed since the read).
        return trimmed - self._trimmed_since(entries) > (ordinal or 0)

    def ordinal_of_last(self, entries: list[Entry]) -> int | None:
        """The number of the batch's last entry, if this head tells it."""
        trimmed = self.trimmed
        if trimmed is None or not entries:
            return None
        end = entry_key(entries[-1][0])
        if end == self.last:
            return self.added
        if self.first is not None and entry_key(entries[0][0]) <= self.first <= end:
            return trimmed + len(entries) - self._trimmed_since(entries)
        return None


def head_of(reply: Any) -> StreamHead:
    """The `StreamHead` of an `XINFO STREAM` reply (as sent: a flat list in RESP2, a map
    in RESP3)."""
    if isinstance(reply, dict):
        info = {reply_text(name): value for name, value in reply.items()}
    else:
        info = {reply_text(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}
    first = info.get("recorded-first-entry-id")
    if first is None and info.get("first-entry"):
        first = info["first-entry"][0]
    last = info.get("last-generated-id")
    length = int(info.get("length", 0))
    added = info.get("entries-added")
    return StreamHead(
        first=entry_key(reply_text(first)) if first is not None and length else None,
        last=entry_key(reply_text(last)) if last is not None and length else None,
        length=length,
        added=int(added) if added is not None else None,
    )


def check_at(maxlen: int, read_count: int) -> int:
    """The batch length from which a read's batch could follow a hole (`StreamHead`), for
    streams trimmed to at least `maxlen` entries read `read_count` at a time."""
    return max(1, min(maxlen, read_count))


class _Unchecked(Enum):
    UNCHECKED = "unchecked"


# A batch too short to follow a hole (`hand_out`).
UNCHECKED = _Unchecked.UNCHECKED
# What a read found of a stream's head (`hand_out`).
Head = StreamHead | StreamReadError | None | _Unchecked


def head_from(reply: Any) -> StreamHead | StreamReadError | None:
    """What an `XINFO STREAM` reply (or its error) says for `hand_out`."""
    if not isinstance(reply, Exception):
        return head_of(reply)
    return None if "no such key" in str(reply) else StreamReadError(str(reply))


def hand_out(
    readers: Iterable[Reader],
    read_from: str,
    entries: list[Entry],
    head: Head = UNCHECKED,
) -> list[Reader]:
    """Offer a batch read after `read_from` to the stream's readers (`Reader.offer`); the
    readers it failed.

    `head`: `UNCHECKED` for a batch too short to follow a hole; else the stream's head read
    after the batch, which fails each reader that lost entries (`StreamTrimmedError`); or
    the `StreamReadError` of Redis refusing to describe the stream, which fails each reader
    it would decide for; or None when the stream was gone by then: those readers take
    nothing from this batch, and the next read, from where they are, finds what is left.
    """
    if head is UNCHECKED:  # what a reader that keeps up gets: nothing more than offered
        for reader in list(readers):
            reader.offer(read_from, entries)
        return []
    failed = []
    start = entry_key(read_from)
    for reader in list(readers):
        if (
            reader.whole
            and start <= reader.cursor_key
            and (not entries or reader.cursor_key < entry_key(entries[0][0]))
        ):
            if head is None:
                continue
            if isinstance(head, StreamReadError):
                logger.warning("stream %s cannot be described (%s)", reader.stream_id, head)
                reader.fail(head)
                failed.append(reader)
                continue
            if head.lost(reader.cursor_key, reader.ordinal, entries):
                logger.warning(
                    "stream %s: entries after a reader's cursor were trimmed before it read"
                    " them (MAXLEN); ending it",
                    reader.stream_id,
                )
                reader.fail(StreamTrimmedError())
                failed.append(reader)
                continue
        reader.offer(read_from, entries)
        if isinstance(head, StreamHead) and entries and reader.cursor == entries[-1][0]:
            known = head.ordinal_of_last(entries)
            if known is not None:
                reader.ordinal = known
    return failed


def oldest_cursor(readers: Iterable[Reader]) -> str:
    """Where a read of the stream serves every one of `readers`: the oldest cursor."""
    return min(readers, key=_cursor_key).cursor


def _cursor_key(reader: Reader) -> tuple[int, int]:
    return reader.cursor_key


class Hub(Protocol):
    """What relays and routes need of a hub: a `StreamHub`, or on a Redis Cluster a
    `ClusterHub` (api/cluster_hub.py), which cannot read streams of many slots together."""

    def read(
        self, stream_id: str, after: str = "0-0", *, whole: bool = True
    ) -> contextlib.AbstractAsyncContextManager[Reader]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class StreamHub:
    """Fans entries of many streams out to their readers, a lane of streams per XREAD."""

    def __init__(
        self,
        redis: Redis,
        *,
        block_ms: int = 5000,
        lanes: int = LANES,
        maxlen: int = _READ_COUNT,
    ) -> None:
        """`maxlen`: the fewest entries its streams are trimmed to (the smallest `MAXLEN ~`
        any writer of them uses): from a batch that long, a reader may have lost entries
        (`StreamHead`)."""
        self.redis = redis
        self.block_ms = block_ms
        self.max_lanes = lanes
        self.check_at = check_at(maxlen, _READ_COUNT)
        self._id = uuid.uuid4().hex
        self._lanes: list[_Lane] = []
        self._lane_of: dict[str, _Lane] = {}
        self._started = False

    async def start(self) -> None:
        self._started = True

    async def stop(self) -> None:
        self._started = False
        for lane in self._lanes:
            await lane.stop()

    @contextlib.asynccontextmanager
    async def read(
        self, stream_id: str, after: str = "0-0", *, whole: bool = True
    ) -> AsyncIterator[Reader]:
        """Watch the stream `stream_id` (key `keys.events(stream_id)`) from strictly after `after`
        while the block runs (`whole`: see `Reader`)."""
        lane = self._lane_of.get(stream_id) or self._free_lane()
        self._lane_of[stream_id] = lane
        reader = Reader(stream_id, after, whole=whole)
        lane.add(reader)
        try:
            await lane.wake()
            yield reader
        finally:
            reader.close()
            lane.remove(reader)
            if stream_id not in lane.readers:  # the last reader left, or all were failed
                self._lane_of.pop(stream_id, None)

    def _free_lane(self) -> _Lane:
        """The lane with the fewest streams; a new one while there are fewer than `LANES`
        and none is empty."""
        if not self._started:
            raise RuntimeError("the stream hub is not running")
        lane = min(self._lanes, key=lambda lane: len(lane.readers), default=None)
        if lane is None or (lane.readers and len(self._lanes) < self.max_lanes):
            # Lanes stay once made: an idle one costs one blocked XREAD per `block_ms`.
            wake_key = keys.hub_wake(f"{self._id}:{len(self._lanes)}")
            lane = _Lane(self.redis, wake_key, self.block_ms, self.check_at)
            self._lanes.append(lane)
        return lane


class _Lane:
    """One XREAD BLOCK loop over some of the hub's streams and the lane's wake stream."""

    def __init__(
        self, redis: Redis, wake_key: str, block_ms: int, check_at: int = _READ_COUNT
    ) -> None:
        self.redis = redis
        self.wake_key = wake_key
        self.block_ms = block_ms
        self.check_at = check_at
        self.readers: dict[str, set[Reader]] = {}
        # What the next XREAD asks of each watched stream: its key and its readers' oldest
        # cursor. Kept up to date as readers join, leave and take entries, so a read works
        # out only the streams that moved: worked out for every stream at every read, it
        # was 0.5 to 0.9 ms of API CPU per XREAD of a lane of 125 streams on a busy two-core
        # box (1,000 paced streams, 8 lanes, a few tokens a read), 12 % of the API's CPU at
        # 1,000 answers of 10 tokens/s (py-spy); a copy of these is 20 µs.
        self._cursors: dict[str, str] = {}
        self._wake_cursor = "0-0"
        self._wake = redis.register_script(_WAKE)
        # Its reads go on one connection it keeps (a blocked XREAD holds one anyway), sent
        # and read without redis-py's client: an XREAD of two entries was 61–77 µs of CPU
        # through `Redis.xread` and 38–41 this way (docs/benchmarks.md, cost per token).
        self._held = HeldConnection(redis.connection_pool)
        self._task = asyncio.create_task(self._run())

    def add(self, reader: Reader) -> None:
        """Watch `reader`'s stream for it, from its cursor."""
        self.readers.setdefault(reader.stream_id, set()).add(reader)
        self._settle(reader.stream_id)

    def remove(self, reader: Reader) -> None:
        """Stop watching for `reader` (one the lane failed is already gone)."""
        readers = self.readers.get(reader.stream_id)
        if readers is None or reader not in readers:
            return
        readers.discard(reader)
        if not readers:
            del self.readers[reader.stream_id]
        self._settle(reader.stream_id)

    def _settle(self, stream_id: str) -> None:
        """Where the next read starts the stream `stream_id`: its readers' oldest cursor,
        or nowhere once it has none."""
        readers = self.readers.get(stream_id)
        if readers:
            self._cursors[keys.events(stream_id)] = oldest_cursor(readers)
        else:
            self._cursors.pop(keys.events(stream_id), None)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._held.aclose()
        # Best effort: the key expires anyway, and a dead Redis must not hold up shutdown.
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(1):
                await self.redis.delete(self.wake_key)

    async def wake(self) -> None:
        await self._wake(keys=[self.wake_key], args=[_WAKE_TTL_S])

    def _streams(self) -> dict[Any, Any]:
        # A copy: readers joining while the read is in flight must not change what it
        # was read from (`Reader.offer`).
        return {self.wake_key: self._wake_cursor, **self._cursors}

    async def _run(self) -> None:
        failures = 0
        while True:
            streams = self._streams()
            read = ("XREAD", "COUNT", _READ_COUNT, "BLOCK", self.block_ms, "STREAMS")
            try:
                (reply,) = await self._held.run([(*read, *streams, *streams.values())])
                failures = 0
            except (RedisError, OSError) as exc:
                failures += 1
                logger.warning("stream hub lost Redis (%s); retrying", exc)
                await asyncio.sleep(backoff_s(failures))
                continue
            if isinstance(reply, ResponseError):
                # Redis refused the read itself: find the streams it refuses and fail
                # their readers, rather than retrying a read that can never succeed.
                await self._fail_unreadable(streams, reply)
                continue
            batches: dict[str, list[Entry]] = {}
            for key, raw_entries in read_streams(reply):
                if key == self.wake_key:
                    self._wake_cursor = raw_entries[-1][0].decode()
                else:
                    batches[key] = parse_sent_entries(raw_entries)
            long = [key for key, entries in batches.items() if len(entries) >= self.check_at]
            try:
                heads = await self._heads(long) if long else {}
            except (RedisError, OSError) as exc:
                # Nothing handed out: the next read, from the same cursors, reads it again.
                failures += 1
                logger.warning("stream hub lost Redis (%s); retrying", exc)
                await asyncio.sleep(backoff_s(failures))
                continue
            for key, entries in batches.items():
                stream_id = keys.id_of(key)
                readers = self.readers.get(stream_id, set())
                head = heads.get(key) if key in heads else UNCHECKED
                for reader in hand_out(readers, streams[key], entries, head):
                    readers.discard(reader)
                if not readers:
                    self.readers.pop(stream_id, None)
                self._settle(stream_id)

    async def _heads(self, stream_keys: list[str]) -> dict[str, Head]:
        """What each stream's head is (`head_from`), in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in stream_keys:
                pipe.execute_command("XINFO", "STREAM", key)
            replies = await pipe.execute(raise_on_error=False)
        return {key: head_from(reply) for key, reply in zip(stream_keys, replies, strict=True)}

    async def _fail_unreadable(self, streams: dict[Any, Any], exc: ResponseError) -> None:
        """Read each stream alone once; fail the readers of those Redis refuses."""
        stream_keys = [key for key in streams if key != self.wake_key]
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in stream_keys:
                    pipe.xread({key: streams[key]}, count=1)
                replies = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError):
            await asyncio.sleep(0.05)  # the connection failed meanwhile: the loop retries
            return
        refused = [key for key, reply in zip(stream_keys, replies, strict=True) if _is_error(reply)]
        if not refused:
            # Not any one turn's stream (the wake stream?): start it over rather than spin.
            logger.warning("stream hub read refused (%s); resetting its wake cursor", exc)
            self._wake_cursor = "$"
            await asyncio.sleep(0.05)
            return
        for key in refused:
            stream_id = keys.id_of(key)
            logger.warning("stream %s cannot be read (%s); ending its readers", stream_id, exc)
            for reader in self.readers.pop(stream_id, set()):
                reader.fail(StreamReadError(str(exc)))
            self._settle(stream_id)


def _is_error(reply: object) -> bool:
    return isinstance(reply, Exception)
