"""Per-user notes: what the user asked Bernard to remember, kept in Redis under the owner.

One hash per user (`keys.notes(owner)`), note id → `{id, text, created_at}`. It lives as long
as conversations do after its last use (`BERNARD_CONVERSATION_RETENTION_S`, renewed by every
read and write), and holds at most `BERNARD_MAX_NOTES_PER_USER` notes of at most
`BERNARD_MAX_NOTE_CHARS` characters each: a storage budget (shared/budgets.py), checked
and spent in one script, so turns saving notes at once cannot go past it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import orjson
from redis.asyncio import Redis

from shared import keys
from shared.settings import Settings

_DEFAULTS = Settings.model_fields

# KEYS: notes. ARGV: the most notes, note id, note json, retention s. Adds the note unless
# the user already has the most, in one step (an HLEN then an HSET, from two turns at once,
# could both pass). Returns 1 added, 0 full.
_ADD = """
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""


# KEYS: notes. ARGV: retention s. Every note, the hash renewed when it holds any: a read is a
# use (one command, on every turn's prompt).
_ALL = """
local notes = redis.call('HVALS', KEYS[1])
if #notes > 0 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return notes
"""


class NotesFullError(ValueError):
    """The user already has as many notes as they may."""


@dataclass(frozen=True, slots=True)
class Note:
    id: str
    text: str
    created_at: float


class NoteStore:
    """One user's notes; `of` takes the limits from the settings."""

    def __init__(
        self,
        redis: Redis,
        owner: str,
        *,
        retention_s: int,
        max_notes: int = _DEFAULTS["max_notes_per_user"].default,
        max_chars: int = _DEFAULTS["max_note_chars"].default,
    ) -> None:
        self.redis = redis
        self.key = keys.notes(owner)
        self.retention_s = retention_s
        self.max_notes = max_notes
        self.max_chars = max_chars
        self._add = redis.register_script(_ADD)
        self._all = redis.register_script(_ALL)

    @classmethod
    def of(cls, redis: Redis, owner: str, settings: Settings) -> NoteStore:
        return cls(
            redis,
            owner,
            retention_s=settings.conversation_retention_s,
            max_notes=settings.max_notes_per_user,
            max_chars=settings.max_note_chars,
        )

    async def add(self, text: str) -> Note:
        """Store a note; `ValueError` for an empty or over-long one, `NotesFullError` when
        the user has as many as they may."""
        text = text.strip()
        if not text:
            raise ValueError("a note needs some text")
        if len(text) > self.max_chars:
            raise ValueError(
                f"a note may hold at most {self.max_chars} characters (BERNARD_MAX_NOTE_CHARS)"
            )
        note = Note(id=f"note_{uuid.uuid4().hex[:12]}", text=text, created_at=time.time())
        added = await self._add(
            keys=[self.key], args=[self.max_notes, note.id, orjson.dumps(note), self.retention_s]
        )
        if not int(added):
            raise NotesFullError(
                f"you already have {self.max_notes} notes (BERNARD_MAX_NOTES_PER_USER); "
                "forget some first"
            )
        return note

    async def all(self) -> list[Note]:
        """Every note, oldest first."""
        raw = await self._all(keys=[self.key], args=[self.retention_s])
        notes = [Note(**orjson.loads(value)) for value in raw]
        return sorted(notes, key=lambda note: note.created_at)

    async def forget(self, match: str) -> list[Note]:
        """Delete the notes whose text contains `match` (any case); the ones deleted."""
        needle = match.strip().casefold()
        gone = [note for note in await self.all() if needle and needle in note.text.casefold()]
        if gone:
            await self.redis.hdel(self.key, *(note.id for note in gone))  # type: ignore[misc]
        return gone
