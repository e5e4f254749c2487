"""Per-user notes: what the user asked Bernard to remember, kept in Redis under the owner.

One hash per user (`keys.notes(owner)`), note id → `{id, text, created_at}`. It lives as long
as conversations do after its last use (`BERNARD_CONVERSATION_RETENTION_S`, renewed by every
read and write), and holds at most `MAX_NOTES` notes of at most `MAX_NOTE_CHARS` each.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import orjson
from redis.asyncio import Redis

from shared import keys
from shared.scripts import atomic

MAX_NOTES = 200
MAX_NOTE_CHARS = 2000


class NotesFullError(ValueError):
    """The user already has `MAX_NOTES` notes."""


@dataclass(frozen=True, slots=True)
class Note:
    id: str
    text: str
    created_at: float


class NoteStore:
    """One user's notes."""

    def __init__(self, redis: Redis, owner: str, *, retention_s: int) -> None:
        self.redis = redis
        self.key = keys.notes(owner)
        self.retention_s = retention_s

    async def add(self, text: str) -> Note:
        """Store a note; `ValueError` for an empty or over-long one, `NotesFullError` when
        the user has `MAX_NOTES`."""
        text = text.strip()
        if not text:
            raise ValueError("a note needs some text")
        if len(text) > MAX_NOTE_CHARS:
            raise ValueError(f"a note may hold at most {MAX_NOTE_CHARS} characters")
        if await self.redis.hlen(self.key) >= MAX_NOTES:  # type: ignore[misc]
            raise NotesFullError(f"you already have {MAX_NOTES} notes; forget some first")
        note = Note(id=f"note_{uuid.uuid4().hex[:12]}", text=text, created_at=time.time())
        async with atomic(self.redis) as pipe:
            pipe.hset(self.key, mapping={note.id: orjson.dumps(note)})
            pipe.expire(self.key, self.retention_s)
            await pipe.execute()
        return note

    async def all(self) -> list[Note]:
        """Every note, oldest first."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hvals(self.key)
            pipe.expire(self.key, self.retention_s)
            raw, _ = await pipe.execute()
        notes = [Note(**orjson.loads(value)) for value in raw]
        return sorted(notes, key=lambda note: note.created_at)

    async def forget(self, match: str) -> list[Note]:
        """Delete the notes whose text contains `match` (any case); the ones deleted."""
        needle = match.strip().casefold()
        gone = [note for note in await self.all() if needle and needle in note.text.casefold()]
        if gone:
            await self.redis.hdel(self.key, *(note.id for note in gone))  # type: ignore[misc]
        return gone
