"""One reader per API process for every turn stream its clients are watching.

A client per blocking connection would cost one Redis connection and one XREAD per
client per entry. Instead the hub runs a single `XREAD BLOCK` over all watched streams
(each from the oldest cursor any of its readers holds) and hands each entry to the
readers that have not seen it. A new reader wakes the blocked read by adding an entry
to the hub's own wake stream, which the same XREAD watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared import keys
from shared.streams import Entry, entry_key, parse_entries

logger = logging.getLogger("bernard.api")

_READ_COUNT = 1000
_WAKE_TTL_S = 3600


class Reader:
    """One client's view of one turn stream: entries strictly after `cursor`, in order."""

    def __init__(self, turn_id: str, cursor: str) -> None:
        self.turn_id = turn_id
        self.cursor = cursor
        self._queue: asyncio.Queue[Entry] = asyncio.Queue()

    def offer(self, read_from: str, entries: list[Entry]) -> None:
        """Take the entries after this reader's cursor from a batch read after `read_from`.

        A batch read from a later cursor than ours (it was in flight when we joined) would
        leave a gap: skip it; the next read starts at our cursor.
        """
        if entry_key(read_from) > entry_key(self.cursor):
            return
        for entry_id, stamped in entries:
            if entry_key(entry_id) > entry_key(self.cursor):
                self._queue.put_nowait((entry_id, stamped))
                self.cursor = entry_id

    async def next(self, wait_s: float | None = None) -> Entry:
        """The next entry; raises `TimeoutError` after `wait_s` seconds without one."""
        async with asyncio.timeout(wait_s):
            return await self._queue.get()


class StreamHub:
    """Fans entries of many turn streams out to their readers from one XREAD loop."""

    def __init__(self, redis: Redis, *, block_ms: int = 5000) -> None:
        self.redis = redis
        self.block_ms = block_ms
        self.wake_key = keys.hub_wake(uuid.uuid4().hex)
        self._wake_cursor = "0-0"
        self._readers: dict[str, set[Reader]] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # Best effort: the key expires anyway, and a dead Redis must not hold up shutdown.
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(1):
                await self.redis.delete(self.wake_key)

    @contextlib.asynccontextmanager
    async def read(self, turn_id: str, after: str = "0-0") -> AsyncIterator[Reader]:
        """Watch `turn_id`'s stream from strictly after `after` while the block runs."""
        reader = Reader(turn_id, after)
        self._readers.setdefault(turn_id, set()).add(reader)
        try:
            await self._wake()
            yield reader
        finally:
            readers = self._readers.get(turn_id)
            if readers is not None:
                readers.discard(reader)
                if not readers:
                    del self._readers[turn_id]

    async def _wake(self) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(self.wake_key, {"w": 1}, maxlen=16, approximate=False)
            pipe.expire(self.wake_key, _WAKE_TTL_S)
            await pipe.execute()

    def _streams(self) -> dict[Any, Any]:
        streams: dict[Any, Any] = {self.wake_key: self._wake_cursor}
        for turn_id, readers in self._readers.items():
            oldest = min((r.cursor for r in readers), key=entry_key)
            streams[keys.events(turn_id)] = oldest
        return streams

    async def _run(self) -> None:
        failures = 0
        while True:
            streams = self._streams()
            try:
                reply = await self.redis.xread(streams, count=_READ_COUNT, block=self.block_ms)
                failures = 0
            except (RedisError, OSError) as exc:
                failures += 1
                logger.warning("stream hub lost Redis (%s); retrying", exc)
                await asyncio.sleep(min(0.05 * 2**failures, 1.0))
                continue
            for raw_key, raw_entries in reply or []:
                key = raw_key.decode()
                if key == self.wake_key:
                    self._wake_cursor = raw_entries[-1][0].decode()
                    continue
                turn_id = key.split("{", 1)[1].split("}", 1)[0]
                entries = parse_entries(raw_entries)
                for reader in list(self._readers.get(turn_id, ())):
                    reader.offer(streams[key], entries)
