"""The stream hub for a data role that is a Redis Cluster: readers woken by sharded pub/sub.

api/hub.py reads each lane's streams with one `XREAD BLOCK` over all of them; a Cluster
refuses that as soon as two of them hash to different slots, and a turn's streams hash
anywhere. One blocking read per stream is what the hub exists to avoid. So here nothing
blocks on the streams themselves: every writer of a stream `SPUBLISH`es to the stream's
wake channel (`keys.stream_wake`, in the stream's own slot, so on the same node, after the
append: shared/streams.py, shared/turns/moves.py, shared/timers.py), and the hub holds one
subscriber connection per primary, `SSUBSCRIBE`d to the wake channels of the streams its
readers watch on that node. A wake-up marks the stream; one task reads every marked stream
from the oldest cursor any of its readers holds, in one Cluster pipeline (one round trip
per node, all nodes at once), and hands the entries to the readers (`Reader.offer`, as
api/hub.py does). Streams marked while a read is in flight go together in the next one.

Wake-ups only say "read now"; the streams stay the truth. A reader's first read happens
once its channel's subscription is confirmed, so no entry falls between the two. A
wake-up can still go missing (a subscriber connection lost, a slot moving to another node,
which Redis 7 tells the subscriber with an `sunsubscribe`): the hub then subscribes again
where the slot now lives and reads those streams at once, and every `sweep_s` it reads
every watched stream anyway, so a lost wake-up delays entries by at most that, and never
drops one.

What it costs, per entry: the writer's `SPUBLISH` beside its `XADD` (same pipeline, no
extra round trip), and one `XREAD` per woken stream per read, instead of an `XREAD` over
a whole lane (docs/scaling.md has the measured figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisError,
    ResponseError,
    TryAgainError,
)

from api.hub import (
    UNCHECKED,
    Head,
    Reader,
    StreamReadError,
    check_at,
    hand_out,
    head_from,
    oldest_cursor,
)
from shared import keys
from shared.connection import REDIS_ERRORS
from shared.redis_pool import backoff_s
from shared.streams import Entry, parse_entries

logger = logging.getLogger("bernard.api")

# Every this often every watched stream is read, woken or not.
SWEEP_S = 2.0
_READ_COUNT = 1000
# How long a new reader waits for its subscription before its first read.
_SUBSCRIBE_WAIT_S = 2.0
# What a lost node or an unknown slot raise: the hub retries.
# Answers that say "not now" rather than "never": the read is tried again.
_PASSING = (AskError, ClusterDownError, MovedError, TryAgainError)


class ClusterHub:
    """Fans entries of many streams out to their readers; wakes on sharded pub/sub."""

    def __init__(
        self, redis: Redis, *, sweep_s: float = SWEEP_S, maxlen: int = _READ_COUNT
    ) -> None:
        """`maxlen`: as api/hub.py's `StreamHub` takes it (a batch that long is checked
        for a hole before it is handed out: `StreamHead`)."""
        self.redis = redis
        self.cluster = cast(RedisCluster, redis)
        self.sweep_s = sweep_s
        self.check_at = check_at(maxlen, _READ_COUNT)
        self._readers: dict[str, set[Reader]] = {}
        self._marked: set[str] = set()
        self._woken = asyncio.Event()
        # The subscriber of each primary (by node name), and where each stream's is.
        self._watches: dict[str, _NodeWatch] = {}
        self._watch_of: dict[str, _NodeWatch] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reader_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._reader_task = asyncio.create_task(self._read_forever())

    async def stop(self) -> None:
        tasks = [t for t in (self._reader_task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._reader_task = None
        for watch in list(self._watches.values()):
            await watch.stop()
        self._watches.clear()

    @contextlib.asynccontextmanager
    async def read(
        self, stream_id: str, after: str = "0-0", *, whole: bool = True
    ) -> AsyncIterator[Reader]:
        """Watch the stream `stream_id` (key `keys.events(stream_id)`) from strictly after `after`
        while the block runs (`whole`: see api/hub.py `Reader`)."""
        if self._reader_task is None:
            raise RuntimeError("the stream hub is not running")
        reader = Reader(stream_id, after, whole=whole)
        readers = self._readers.setdefault(stream_id, set())
        first = not readers
        readers.add(reader)
        try:
            if first:
                await self._subscribe(stream_id)
            self.mark(stream_id)
            yield reader
        finally:
            reader.close()
            left = self._readers.get(stream_id)
            if left is not None:
                left.discard(reader)
                if not left:
                    del self._readers[stream_id]
                    watch = self._watch_of.pop(stream_id, None)
                    if watch is not None:
                        watch.unsubscribe(keys.stream_wake(stream_id))

    def mark(self, stream_id: str) -> None:
        """Read `stream_id`'s stream in the next read."""
        if stream_id in self._readers:
            self._marked.add(stream_id)
            self._woken.set()

    # -- subscriptions -----------------------------------------------------------------

    async def _subscribe(self, stream_id: str) -> None:
        """Subscribe to the stream's wake channel where its slot lives; wait until Redis
        confirms (or `_SUBSCRIBE_WAIT_S`: the sweep covers a subscription that is late)."""
        channel = keys.stream_wake(stream_id)
        try:
            await self.cluster.initialize()  # nothing once it knows the cluster
            node = self.cluster.get_node_from_key(channel)
        except REDIS_ERRORS as exc:
            logger.warning("stream hub cannot locate %s (%s); relying on the sweep", channel, exc)
            self._later(self._rehome([stream_id]))
            return
        if node is None:
            self._later(self._rehome([stream_id]))
            return
        watch = self._watches.get(node.name)
        if watch is None:
            watch = self._watches[node.name] = _NodeWatch(self, node)
        self._watch_of[stream_id] = watch
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_SUBSCRIBE_WAIT_S):
                await watch.subscribe(channel)

    def moved(self, channels: list[str]) -> None:
        """Those channels' slots are no longer where they were subscribed: find them again."""
        stream_ids = []
        for channel in channels:
            stream_id = keys.id_of(channel)
            if self._watch_of.pop(stream_id, None) is not None or stream_id in self._readers:
                stream_ids.append(stream_id)
        if stream_ids:
            self._later(self._rehome(stream_ids))

    async def _rehome(self, stream_ids: list[str], attempt: int = 0) -> None:
        """Subscribe those streams where their slots live now, then read them at once."""
        await asyncio.sleep(backoff_s(attempt))
        missing = []
        for stream_id in stream_ids:
            if stream_id not in self._readers or stream_id in self._watch_of:
                continue
            try:
                # A keyed command through the Cluster client: a MOVED answer or a lost node
                # makes it learn where the slot lives now.
                await self.cluster.exists(keys.events(stream_id))
            except REDIS_ERRORS:
                missing.append(stream_id)
                continue
            await self._subscribe(stream_id)
            self.mark(stream_id)
        if missing:
            self._later(self._rehome(missing, attempt + 1))

    def _later(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- reading -----------------------------------------------------------------------

    async def _read_forever(self) -> None:
        failures = 0
        while True:
            try:
                async with asyncio.timeout(self.sweep_s):
                    await self._woken.wait()
            except TimeoutError:
                self._marked.update(self._readers)  # the sweep
            self._woken.clear()
            # A stream whose readers were all failed (`hand_out`) waits for them to leave.
            batch = [stream_id for stream_id in self._marked if self._readers.get(stream_id)]
            self._marked.clear()
            if not batch:
                continue
            try:
                await self._read(batch)
                failures = 0
            except Exception as exc:
                # Whatever a read raised, the hub reads on: every stream of this process
                # hangs on this loop (a client library's bug once ended it).
                failures += 1
                if isinstance(exc, REDIS_ERRORS):
                    logger.warning("stream hub lost Redis (%s); retrying", exc)
                else:
                    logger.exception("stream hub read failed; retrying")
                self._marked.update(batch)
                await asyncio.sleep(backoff_s(failures))
                self._woken.set()

    async def _read(self, batch: list[str]) -> None:
        """Read each stream of `batch` from its readers' oldest cursor; hand entries out."""
        await self.cluster.initialize()  # nothing once it knows the cluster
        cursors = {stream_id: oldest_cursor(self._readers[stream_id]) for stream_id in batch}
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream_id in batch:
                key = keys.events(stream_id)
                # Sent to the node that holds the stream: redis-py would otherwise ask a
                # node where XREAD's keys are (`COMMAND GETKEYS`), one round trip per read.
                pipe.execute_command(
                    "XREAD",
                    "COUNT",
                    _READ_COUNT,
                    "STREAMS",
                    key,
                    cursors[stream_id],
                    target_nodes=self.cluster.get_node_from_key(key),
                )
            replies = await pipe.execute(raise_on_error=False)
        retry = False
        read: dict[str, list[Entry]] = {}
        for stream_id, reply in zip(batch, replies, strict=True):
            if isinstance(reply, _PASSING):
                # The slot is moving or its shard failing over: read it again shortly.
                self._marked.add(stream_id)
                retry = True
                continue
            if isinstance(reply, ResponseError):
                logger.warning(
                    "stream %s cannot be read (%s); ending its readers", stream_id, reply
                )
                for reader in self._readers.get(stream_id, set()):
                    reader.fail(StreamReadError(str(reply)))
                continue
            if isinstance(reply, Exception):
                raise reply
            for _, raw_entries in reply or []:
                read[stream_id] = parse_entries(raw_entries)
        long = [stream_id for stream_id, entries in read.items() if len(entries) >= self.check_at]
        # A lost connection here raises: `_read_forever` reads the batch again.
        heads = await self._heads(long) if long else {}
        for stream_id, entries in read.items():
            readers = self._readers.get(stream_id, set())
            head = heads.get(stream_id) if stream_id in heads else UNCHECKED
            for reader in hand_out(readers, cursors[stream_id], entries, head):
                readers.discard(reader)
            if head is None:
                retry = True  # gone since, or its slot moving: read it again shortly
                self.mark(stream_id)
            elif len(entries) >= _READ_COUNT:
                self.mark(stream_id)  # more than one read's worth
        if retry:
            await asyncio.sleep(0.05)
            self._woken.set()

    async def _heads(self, stream_ids: list[str]) -> dict[str, Head]:
        """What each stream's head is (api/hub.py `head_from`), in one Cluster pipeline;
        None too for one whose slot is moving (read again shortly)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream_id in stream_ids:
                key = keys.events(stream_id)
                pipe.execute_command(
                    "XINFO", "STREAM", key, target_nodes=self.cluster.get_node_from_key(key)
                )
            replies = await pipe.execute(raise_on_error=False)
        heads: dict[str, Head] = {}
        for stream_id, reply in zip(stream_ids, replies, strict=True):
            if isinstance(reply, _PASSING):
                heads[stream_id] = None
            elif isinstance(reply, Exception) and not isinstance(reply, ResponseError):
                raise reply
            else:
                heads[stream_id] = head_from(reply)
        return heads


class _NodeWatch:
    """One subscriber connection to one primary, and the wake channels subscribed on it."""

    def __init__(self, hub: ClusterHub, node: ClusterNode) -> None:
        self.hub = hub
        self.node = node
        self.channels: set[str] = set()
        # Unsubscribes sent and not yet answered, per channel: their `sunsubscribe` is ours,
        # any other one says the slot has left this node.
        self._dropping: defaultdict[str, int] = defaultdict(int)
        self._confirmed: dict[str, asyncio.Event] = {}
        # `SSUBSCRIBE`s and `SUNSUBSCRIBE`s in the order they were asked for, sent by one
        # task: a reader leaving a stream and another coming to it in the same event-loop
        # tick must reach Redis as unsubscribe, then subscribe (sent apart, the subscribe
        # could go first and the channel end up unsubscribed while listed as watched).
        self._commands: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._task = asyncio.create_task(self._run())

    async def subscribe(self, channel: str) -> None:
        self.channels.add(channel)
        confirmed = self._confirmed.setdefault(channel, asyncio.Event())
        self._commands.put_nowait(("SSUBSCRIBE", channel))
        await confirmed.wait()

    def unsubscribe(self, channel: str) -> None:
        self.channels.discard(channel)
        self._confirmed.pop(channel, None)
        self._commands.put_nowait(("SUNSUBSCRIBE", channel))

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    @staticmethod
    async def _send(connection: AbstractConnection, commands: Sequence[tuple[str, ...]]) -> None:
        # A failed write is the read loop's to notice: it reconnects and subscribes again.
        with contextlib.suppress(RedisError, OSError):
            await connection.send_packed_command(connection.pack_commands(commands), False)

    async def _send_commands(self, connection: AbstractConnection) -> None:
        """Send the queued commands on `connection`, in order, those queued together in one
        write."""
        while True:
            batch = [await self._commands.get()]
            while not self._commands.empty():
                batch.append(self._commands.get_nowait())
            for command, channel in batch:
                if command == "SUNSUBSCRIBE":
                    self._dropping[channel] += 1
            await self._send(connection, batch)

    async def _run(self) -> None:
        failures = 0
        while True:
            kwargs = {
                **self.node.connection_kwargs,
                "socket_timeout": None,  # it waits for pushes as long as they take
                "socket_keepalive": True,
                "health_check_interval": 0,
                "retry": None,
                "retry_on_error": [],
            }
            connection = self.node.connection_class(**kwargs)
            sender: asyncio.Task[None] | None = None
            try:
                await connection.connect()
                # A new connection is subscribed to what is watched now: what was queued
                # for the last one (or while there was none) is moot.
                self._dropping.clear()
                while not self._commands.empty():
                    self._commands.get_nowait()
                # One command a channel: a Cluster refuses an `SSUBSCRIBE` naming channels
                # of two slots (CROSSSLOT), and a node's channels hash to many.
                if self.channels:
                    await self._send(connection, [("SSUBSCRIBE", c) for c in self.channels])
                sender = asyncio.create_task(self._send_commands(connection))
                for channel in self.channels:
                    self.hub.mark(keys.id_of(channel))  # wake-ups may have been missed
                failures = 0
                while True:
                    self._handle(await connection.read_response())
            except ResponseError as exc:
                # A subscribe this node refuses (MOVED: the slot is elsewhere now).
                logger.info("stream hub resubscribing off %s (%s)", self.node.name, exc)
                self.hub.moved(list(self.channels))
                self.channels.clear()
            except REDIS_ERRORS as exc:
                failures += 1
                logger.warning("stream hub lost node %s (%s); retrying", self.node.name, exc)
                if failures > 1:  # gone for good, or failed over: find where its slots went
                    self.hub.moved(list(self.channels))
                    self.channels.clear()
            finally:
                if sender is not None:
                    sender.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sender
                await connection.disconnect()
            if failures > 1 and not self.channels:
                # Nothing left to watch on a node that does not answer: let it go. A later
                # reader of one of its slots starts a new watch, should it come back.
                if self.hub._watches.get(self.node.name) is self:
                    del self.hub._watches[self.node.name]
                return
            await asyncio.sleep(backoff_s(failures))

    def _handle(self, reply: Any) -> None:
        kind, channel = reply[0], reply[1].decode()
        if kind == b"smessage":
            self.hub.mark(keys.id_of(channel))
        elif kind == b"ssubscribe":
            confirmed = self._confirmed.get(channel)
            if confirmed is not None:
                confirmed.set()
        elif kind == b"sunsubscribe":
            if self._dropping.get(channel, 0) > 0:
                self._dropping[channel] -= 1
            elif channel in self.channels:  # the slot moved to another node
                self.channels.discard(channel)
                self._confirmed.pop(channel, None)
                self.hub.moved([channel])
