"""A turn's Redis Stream: the worker's writer, and reading entries back.

The writer never delays an event: if no write is in flight it goes out at once. Events
that pile up while a write is in flight go out together in one pipeline, and adjacent
text deltas among them are joined into one entry, so a fast model costs fewer commands
without a slow one waiting for anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from redis.asyncio import Redis

from shared import keys
from shared.events import Delta, Event, Stamped, decode, encode
from shared.turns import STREAM_FIELD

Entry = tuple[str, Stamped]
# Above this many pending events, `write` waits for Redis instead of buffering more.
_BACKPRESSURE = 1000


class StreamWriter:
    """Appends one turn's events to its stream, in order."""

    def __init__(self, redis: Redis, turn_id: str, *, maxlen: int) -> None:
        self.redis = redis
        self.key = keys.events(turn_id)
        self.maxlen = maxlen
        self._pending: list[Event] = []
        self._flusher: asyncio.Task[None] | None = None

    async def write(self, event: Event) -> None:
        """Queue the event and start a write if none is in flight."""
        last = self._pending[-1] if self._pending else None
        if isinstance(event, Delta) and isinstance(last, Delta):
            self._pending[-1] = Delta(text=last.text + event.text)
        else:
            self._pending.append(event)
        if self._flusher is None or self._flusher.done():
            if self._flusher is not None:
                self._flusher.result()  # surface a failed earlier write
            self._flusher = asyncio.create_task(self._drain())
        if len(self._pending) > _BACKPRESSURE:
            await self.flush()
        # Let the flusher start its write before the producer yields the next event.
        await asyncio.sleep(0)

    async def flush(self) -> None:
        """Wait until everything written so far is in Redis; raises what a write raised."""
        while self._flusher is not None:
            flusher = self._flusher
            await flusher
            if self._flusher is flusher:
                self._flusher = None

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            if len(batch) == 1:
                await self._xadd(self.redis, batch[0])
            else:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for event in batch:
                        await self._xadd(pipe, event)
                    await pipe.execute()

    async def _xadd(self, target: Redis, event: Event) -> None:
        await target.xadd(
            self.key, {STREAM_FIELD: encode(event)}, maxlen=self.maxlen, approximate=True
        )


def parse_entries(raw: Sequence[tuple[bytes, dict[bytes, bytes]]]) -> list[Entry]:
    """Decode XRANGE/XREAD entries into (entry id, stamped event)."""
    return [(entry_id.decode(), decode(fields[STREAM_FIELD.encode()])) for entry_id, fields in raw]


async def read_entry(redis: Redis, turn_id: str, entry_id: str) -> list[Entry]:
    """The entry `entry_id` of the turn's stream: one entry, or none if it is gone."""
    raw = await redis.xrange(keys.events(turn_id), min=entry_id, max=entry_id)
    return parse_entries(raw)


def entry_key(entry_id: str) -> tuple[int, int]:
    """Sortable form of a stream entry id ("1700000000000-3" → (1700000000000, 3))."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
