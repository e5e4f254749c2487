"""Replays of a turn's stream from its `start`, for an encoding that numbers its events from
the first (the Responses API's `sequence_number`: api/routes/responses.py): the work grows
with the stream (a 5,000-entry stream is some 35 ms of the event loop), so it is bounded.

- `replay` reads and encodes `ENTRIES_PER_READ` entries at a time, each read a round trip on
  which the loop serves everything else, and checks after each that the stream was not
  trimmed past what it read (the numbers after a hole would be wrong).
- `ReplayGate` lets `CONCURRENT` replays run at once in a process, and one per user: the
  loop's other work waits a few chunks at most, however many resumes are asked for; each
  holds one of its user's streams (`BERNARD_MAX_STREAMS_PER_USER`) before it waits here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import StrEnum

from redis.asyncio import Redis

from api.cursors import Resume, numbered
from api.encoding import Frame, Framing
from shared import keys
from shared.events import Done, Start
from shared.streams import entry_key, parse_entries

__all__ = ["CONCURRENT", "ENTRIES_PER_READ", "Replay", "ReplayGate", "Replayed", "replay"]

# Entries read and encoded between two round trips.
ENTRIES_PER_READ = 200
# Replays a process runs at once (each one user's).
CONCURRENT = 2


class Replayed(StrEnum):
    """What reading a stream from its start found."""

    WHOLE = "whole"  # every entry from its `start`: `Replay.resume` goes on after them
    EMPTY = "empty"  # no stream (its retention is over, or it never had an entry)
    TRIMMED = "trimmed"  # its `start` is gone, or went while it was read (MAXLEN)


@dataclass(slots=True)
class Replay:
    outcome: Replayed
    resume: Resume = field(default_factory=Resume)


async def replay(redis: Redis, turn_id: str, encoder: Framing) -> Replay:
    """The frames of every entry of the turn's stream from its `start` (which `encoder`
    numbers and drops up to where its client resumes), and where to go on after them."""
    stream = keys.events(turn_id)
    head: list[tuple[str | None, Frame]] = []
    last: str | None = None
    while True:
        async with redis.pipeline(transaction=False) as pipe:
            pipe.xrange(stream, min=f"({last}" if last is not None else "-", count=ENTRIES_PER_READ)
            # Read after the chunk: a trim in between is taken for a hole, never missed.
            pipe.xrange(stream, count=1)
            raw, first_raw = await pipe.execute()
        entries = parse_entries(raw)
        if last is None:
            if not entries:
                return Replay(Replayed.EMPTY)
            if not isinstance(entries[0][1].event, Start):
                return Replay(Replayed.TRIMMED)
        else:
            first = parse_entries(first_raw)
            # Trimming takes the oldest entries: while one at or before `last` is there,
            # none after it went.
            if not first or entry_key(first[0][0]) > entry_key(last):
                return Replay(Replayed.TRIMMED)
        for entry_id, stamped in entries:
            head += numbered(entry_id, encoder.frames(stamped.event))
        last = entries[-1][0] if entries else last
        finished = bool(entries) and isinstance(entries[-1][1].event, Done)
        if finished or len(entries) < ENTRIES_PER_READ:
            assert last is not None
            return Replay(Replayed.WHOLE, Resume(after=last, head=head, finished=finished))


@dataclass(slots=True)
class _Owner:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0


class ReplayGate:
    """Who may replay a stream now: `CONCURRENT` at once, one per user (their others wait
    their turn without holding a place: one user's many resumes leave room for others')."""

    def __init__(self, concurrent: int = CONCURRENT) -> None:
        self._all = asyncio.Semaphore(concurrent)
        self._owners: dict[str, _Owner] = {}

    @contextlib.asynccontextmanager
    async def slot(self, owner: str) -> AsyncIterator[None]:
        held = self._owners.setdefault(owner, _Owner())
        held.waiting += 1
        try:
            async with held.lock, self._all:
                yield
        finally:
            held.waiting -= 1
            if not held.waiting:
                del self._owners[owner]
